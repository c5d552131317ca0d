"""The rig as the core sees it: `read_rig` reads an armature once into a RigModel (every bone, rest matrices,
rotation modes, the Skeleton of the mapped roles) and converts to *character space*: the armature's own space turned
by the rotation C of the object's world matrix and scaled by its scale s (times the scene's unit scale), so +Z is up
and lengths are metres. The core never sees Blender objects.
"""

from dataclasses import dataclass, field

import bpy
import numpy as np

from ...neural_network.geometry.armature_fk import BoneChain
from ...neural_network.skeleton.roles import ESSENTIAL_ROLES, NUM_ROLES, ROLES
from ...neural_network.skeleton.skeleton import Skeleton, nearest_mapped_parents

ROTATION_PROPERTY = {"QUATERNION": "rotation_quaternion", "AXIS_ANGLE": "rotation_axis_angle"}

class RigError(ValueError):
    """A rig or bone map that cannot be used, with a message meant for the user."""

def rotation_property(mode):
    """The pose-bone property Blender reads for a rotation mode."""
    return ROTATION_PROPERTY.get(mode, "rotation_euler")

def _normalized_columns(m):
    """Rotation part of (..., 3, 3) matrices that may carry scale: columns normalised (exact for uniform scale)."""
    return m / np.linalg.norm(m, axis=-2, keepdims=True)

@dataclass
class RigModel:
    """Everything about an armature that extraction and writing need, read once."""
    object_name: str
    bone_names: list            # every bone, parents before children
    parents: np.ndarray         # (B,) parent index, -1 for roots
    rest: np.ndarray            # (B, 4, 4) Bone.matrix_local (armature space)
    rotation_modes: list        # (B,) pose-bone rotation mode
    basis: np.ndarray           # (3, 3) C: armature space -> character space rotation
    scale: float                # s: armature units -> metres
    bone_map: dict              # role -> bone name ("" for unmapped)
    role_bones: np.ndarray      # (23,) bone index per role, -1 where unmapped
    needed: np.ndarray          # bone indices in the ancestor closure of the mapped bones, parents first
    skeleton: Skeleton
    index: dict = field(default_factory=dict)   # bone name -> index
    driven: list = field(default_factory=list)  # why the mapped bones' keys do not give their pose (see driven_reasons)
    rest_links: np.ndarray = None                # (B, 4, 4) rest_parent^-1 @ rest_j (rest_j for roots)
    level_cache: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.rest_links is None:      # rest matrices are rigid: rest_p^-1 = [R_p^T, -R_p^T t_p]
            parent = np.where(self.parents < 0, 0, self.parents)
            r_pt = np.swapaxes(self.rest[parent, :3, :3], -1, -2)
            links = np.array(self.rest, dtype=np.float64)
            links[:, :3, :3] = r_pt @ self.rest[:, :3, :3]
            links[:, :3, 3] = (r_pt @ (self.rest[:, :3, 3] - self.rest[parent, :3, 3])[..., None])[..., 0]
            roots = self.parents < 0
            links[roots] = self.rest[roots]
            self.rest_links = links

    @property
    def role_mask(self):
        return self.role_bones >= 0

    def to_character_positions(self, armature_positions):
        positions = np.asarray(armature_positions, np.float64)
        if self._identity_basis and self.scale == 1.0:
            return positions.copy()
        return self.scale * (positions @ self.basis.T)

    def to_character_rotations(self, armature_rotations, normalize=True):
        rotations = np.asarray(armature_rotations, np.float64)
        if normalize:
            rotations = _normalized_columns(rotations)
        return rotations if self._identity_basis else self.basis @ rotations

    @property
    def _identity_basis(self):
        return bool(np.array_equal(self.basis, np.eye(3)))

def world_to_character(obj, rig):
    """(4, 4) world space -> the rig's character space (+Z up, metres), for the object as it is placed now."""
    basis = np.eye(4)
    basis[:3, :3] = rig.scale * rig.basis
    return basis @ np.linalg.inv(np.array(obj.matrix_world, np.float64))


def character_basis(obj):
    """(C, s): the rotation and uniform scale of the object's world matrix, times the scene's unit scale."""
    m = np.array(obj.matrix_world, dtype=np.float64)[:3, :3]
    scales = np.linalg.norm(m, axis=0)
    if np.any(scales < 1e-12):
        raise RigError(f"armature {obj.name!r} has a zero scale; apply or fix its scale first")
    C = m / scales
    u, _, vt = np.linalg.svd(C)
    C = u @ vt
    unit = float(bpy.context.scene.unit_settings.scale_length or 1.0)
    return C, float(np.mean(scales)) * unit

def _topological_order(names, parent_names):
    index = {n: i for i, n in enumerate(names)}
    order, placed = [], set()
    pending = list(range(len(names)))
    while pending:
        rest = []
        for i in pending:
            p = parent_names[i]
            if p is None or p in placed:
                order.append(i)
                placed.add(names[i])
            else:
                rest.append(i)
        if len(rest) == len(pending):
            raise RigError("the armature's bone hierarchy has a cycle")
        pending = rest
    return order, index

def read_rig(obj, bone_map, require_essentials=True):
    """Read an armature object and a {role: bone} map into a RigModel (with its core Skeleton).

    Raises RigError in plain words when the object is not an armature, a mapped bone does not exist, a bone is used
    twice, a role's bone is not below its parent role's bone (allowed when the mapped bones are driven: then the
    role chain is the roles', see driven_reasons), or (require_essentials) an essential role is unmapped.
    """
    if obj is None or obj.type != "ARMATURE":
        raise RigError("select an armature first" if obj is None else f"{obj.name!r} is not an armature")
    bones = obj.data.bones
    raw_names = [b.name for b in bones]
    raw_parents = [b.parent.name if b.parent else None for b in bones]
    order, _ = _topological_order(raw_names, raw_parents)
    names = [raw_names[i] for i in order]
    index = {n: i for i, n in enumerate(names)}
    parents = np.array([index[raw_parents[i]] if raw_parents[i] else -1 for i in order], dtype=np.int64)
    flat = np.empty(16 * len(bones), dtype=np.float32)
    bones.foreach_get("matrix_local", flat)          # column-major 4x4s
    rest = np.swapaxes(flat.reshape(-1, 4, 4), -1, -2).astype(np.float64)[order]
    rest[:, 3] = (0.0, 0.0, 0.0, 1.0)
    pose_modes = {pb.name: pb.rotation_mode for pb in obj.pose.bones}
    modes = [pose_modes[n] for n in names]

    mapping = {role: (bone_map.get(role, "") or "") for role in ROLES}
    problems = []
    used = {}
    role_bones = np.full(NUM_ROLES, -1, dtype=np.int64)
    for r, role in enumerate(ROLES):
        bone = mapping[role]
        if not bone:
            continue
        if bone not in index:
            problems.append(f"bone {bone!r} (mapped to {role}) is not in armature {obj.name!r}")
            continue
        if bone in used:
            problems.append(f"bone {bone!r} is mapped to both {used[bone]} and {role}")
            continue
        used[bone] = role
        role_bones[r] = index[bone]
    if require_essentials:
        missing = [role for role in ESSENTIAL_ROLES if role_bones[ROLES.index(role)] < 0]
        if missing:
            problems.append(f"the bone map of {obj.name!r} lacks the essential roles {', '.join(missing)}")
    mask = role_bones >= 0
    role_parents = nearest_mapped_parents(mask)
    needed = set()
    for b in role_bones[mask]:
        while b >= 0 and b not in needed:
            needed.add(int(b))
            b = parents[b]
    driven = driven_reasons(obj, [names[b] for b in sorted(needed)])
    for r in range(NUM_ROLES):
        if driven:
            break
        p = role_parents[r]
        if mask[r] and p >= 0 and not _is_ancestor(parents, role_bones[p], role_bones[r]):
            problems.append(f"{ROLES[r]} bone {names[role_bones[r]]!r} is not below {ROLES[p]} bone "
                            f"{names[role_bones[p]]!r}")
    if problems:
        raise RigError("; ".join(problems))

    C, s = character_basis(obj)
    rig = RigModel(obj.name, names, parents, rest, modes, C, s, mapping, role_bones,
                   np.array(sorted(needed), dtype=np.int64), None, index, driven)
    rig.skeleton = _rest_skeleton(rig)
    return rig

def driven_reasons(obj, bones):
    """Why the keys of `bones` (the mapped bones and their ancestors) do not give what Blender shows, in words:
    enabled constraints on them, drivers on their channels, NLA tracks on the armature. Empty for a plain rig (its
    pose follows from its keys alone)."""
    reasons = []
    pose_bones = obj.pose.bones
    constrained = [n for n in bones if any(not c.mute and c.influence > 0.0 for c in pose_bones[n].constraints)]
    if constrained:
        more = f" and {len(constrained) - 2} more" if len(constrained) > 2 else ""
        reasons.append(f"constraints on {', '.join(repr(n) for n in constrained[:2])}{more}")
    ad = obj.animation_data
    if ad is not None:
        paths = {f'pose.bones["{bpy.utils.escape_identifier(n)}"]' for n in bones}
        if any(not d.mute and d.data_path.split("]", 1)[0] + "]" in paths for d in ad.drivers):
            reasons.append("drivers on mapped bones")
        if any(not t.mute and len(t.strips) for t in ad.nla_tracks):
            reasons.append("NLA strips")
    return reasons

def _is_ancestor(parents, ancestor, bone):
    b = parents[bone]
    while b >= 0:
        if b == ancestor:
            return True
        b = parents[b]
    return False

def _rest_skeleton(rig):
    """The Skeleton at the rest pose: every in-between bone at identity, so bridges are pure rest rotations."""
    mask = rig.role_mask
    safe = np.where(mask, rig.role_bones, 0)
    rot = rig.to_character_rotations(rig.rest[safe, :3, :3])
    pos = rig.to_character_positions(rig.rest[safe, :3, 3])
    bridges, offsets = relative_links(mask, rot, pos)
    eye = np.broadcast_to(np.eye(3), (NUM_ROLES, 3, 3))
    return Skeleton(
        bone_names=[rig.bone_map[role] if mask[r] else "" for r, role in enumerate(ROLES)],
        offsets=offsets[0], bridges=bridges[0],
        rest_rotations=np.where(mask[:, None, None], rot, eye),
        rest_positions=np.where(mask[:, None], pos, 0.0),
        name=rig.object_name,
        extra={"basis": rig.basis.tolist(), "scale": rig.scale},
    )

def relative_links(mask, rotations, positions, local_rotations=None):
    """Bridges and offsets that FK needs to reproduce given character-space orientations and heads.

    rotations (..., 23, 3, 3), positions (..., 23, 3); local_rotations (..., 23, 3, 3) are the bones' own pose
    rotations (identity at rest). bridge_j = R_p^T R_j L_j^T and offset_j = R_p^T (x_j - x_p) for the mapped parent p.
    Returns (N, 23, 3, 3), (N, 23, 3) with identity / zero for the hips and unmapped roles.
    """
    rotations = np.asarray(rotations, np.float64).reshape(-1, NUM_ROLES, 3, 3)
    positions = np.asarray(positions, np.float64).reshape(-1, NUM_ROLES, 3)
    n = rotations.shape[0]
    bridges = np.broadcast_to(np.eye(3), (n, NUM_ROLES, 3, 3)).copy()
    offsets = np.zeros((n, NUM_ROLES, 3))
    parents = nearest_mapped_parents(mask)
    idx = np.array([j for j in range(NUM_ROLES) if mask[j] and parents[j] >= 0], dtype=np.int64)
    if len(idx):
        par = parents[idx]
        r_pt = np.swapaxes(rotations[:, par], -1, -2)
        rel = r_pt @ rotations[:, idx]
        if local_rotations is not None:
            local = np.asarray(local_rotations, np.float64).reshape(-1, NUM_ROLES, 3, 3)
            rel = rel @ np.swapaxes(local[:, idx], -1, -2)
        bridges[:, idx] = rel
        offsets[:, idx] = (r_pt @ (positions[:, idx] - positions[:, par])[..., None])[..., 0]
    return bridges, offsets

def bone_chain(rig):
    """The BoneChain of the bones extraction reads (rig.needed), built once per rig."""
    chain = rig.level_cache.get("chain")
    if chain is None:
        chain = BoneChain.build(rig.parents, rig.rest_links, rig.needed)
        rig.level_cache["chain"] = chain
    return chain

def _link_masks(rig, chain):
    """Positions in the chain of the in-between bones, the hips and mapped bones below, and mapped bones below the
    hips (cached per rig)."""
    cached = rig.level_cache.get("links")
    if cached is None:
        bones = chain.bones
        hips = int(rig.role_bones[0])
        below = np.array([_is_ancestor(rig.parents, hips, int(b)) for b in bones])
        mapped = np.isin(bones, rig.role_bones[rig.role_mask])
        cached = (np.where(below & ~mapped)[0], np.where((below & mapped) | (bones == hips))[0],
                  np.where(below & mapped)[0])
        rig.level_cache["links"] = cached
    return cached

def inbetween_bones(rig):
    """Names of the unmapped bones of the mapped chain below the hips, each an ancestor of a mapped bone (CMU's
    CC_Base_Pelvis between CC_Base_Hip and the thighs): FK's bridges/offsets follow their pose."""
    chain = bone_chain(rig)
    between = _link_masks(rig, chain)[0]
    return [rig.bone_names[int(chain.bones[k])] for k in between]
