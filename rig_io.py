"""The one module that reads armatures and actions from Blender and writes poses and keys back.

Everything the core (neural_network/) knows about a rig passes through here, converted once into *character
space*: the armature's own space turned by the rotation C of the object's world matrix and scaled by its scale s
(times the scene's unit scale), so +Z is up and lengths are metres. The core never sees Blender objects.

Reading an action never calls `scene.frame_set` and never changes the user's data: the F-curves of a temporary copy
of the action are sampled with `convert_to_samples` (Blender's own curve evaluation, all frames in one call) and the
copy is removed. Bone transforms then follow from a NumPy forward kinematics over the *whole* armature, the same
formula Blender uses: pose_j = pose_parent @ (rest_parent^-1 @ rest_j) @ basis_j.
"""

import math
import re
from dataclasses import dataclass, field

import bpy
import numpy as np

from .neural_network.roles import ESSENTIAL_ROLES, NUM_ROLES, ROLES
from .neural_network.rotations import (
    axis_angle_to_matrix,
    euler_to_matrix,
    matrix_to_axis_angle,
    matrix_to_quaternion,
)
from .neural_network.skeleton import Skeleton, nearest_mapped_parents

ROTATION_PROPERTY = {"QUATERNION": "rotation_quaternion", "AXIS_ANGLE": "rotation_axis_angle"}
EULER_ORDERS = ("XYZ", "XZY", "YXZ", "YZX", "ZXY", "ZYX")
_BONE_PATH = re.compile(r'^pose\.bones\["((?:[^"\\]|\\.)*)"\]\.(location|rotation_quaternion|rotation_euler|'
                        r'rotation_axis_angle|scale)$')
# A moving in-between bone changes bridges/offsets by more than this (radians / fraction of rig height): then the
# dataset carries them per frame.
MOVING_TOLERANCE = 1e-6


class RigError(ValueError):
    """A rig or bone map that cannot be used, with a message meant for the user."""


def rotation_property(mode):
    """The pose-bone property Blender reads for a rotation mode."""
    return ROTATION_PROPERTY.get(mode, "rotation_euler")


def _normalized_columns(m):
    """Rotation part of (..., 3, 3) matrices that may carry scale: columns normalised (exact for uniform scale)."""
    return m / np.linalg.norm(m, axis=-2, keepdims=True)


# ---- the rig -----------------------------------------------------------------------------------------------------


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
    rest_links: np.ndarray = None                # (B, 4, 4) rest_parent^-1 @ rest_j (rest_j for roots)
    level_cache: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.rest_links is None:
            inverse = np.linalg.inv(self.rest)
            self.rest_links = np.array([self.rest[b] if p < 0 else inverse[p] @ self.rest[b]
                                        for b, p in enumerate(self.parents)]).reshape(-1, 4, 4)

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
    twice, a role's bone is not below its parent role's bone, or (require_essentials) an essential role is unmapped.
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
    rest = np.array([np.array(bones[n].matrix_local, dtype=np.float64) for n in names]).reshape(-1, 4, 4)
    modes = [obj.pose.bones[n].rotation_mode for n in names]

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
    for r in range(NUM_ROLES):
        p = role_parents[r]
        if mask[r] and p >= 0 and not _is_ancestor(parents, role_bones[p], role_bones[r]):
            problems.append(f"{ROLES[r]} bone {names[role_bones[r]]!r} is not below {ROLES[p]} bone "
                            f"{names[role_bones[p]]!r}")
    if problems:
        raise RigError("; ".join(problems))

    needed = set()
    for b in role_bones[mask]:
        while b >= 0 and b not in needed:
            needed.add(int(b))
            b = parents[b]
    C, s = character_basis(obj)
    rig = RigModel(obj.name, names, parents, rest, modes, C, s, mapping, role_bones,
                   np.array(sorted(needed), dtype=np.int64), None, index)
    rig.skeleton = _rest_skeleton(rig)
    return rig


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


# ---- reading actions ----------------------------------------------------------------------------------------------


def _unescape(name):
    return re.sub(r"\\(.)", r"\1", name)


def action_slot_for(obj, action):
    """The slot of `action` that animates `obj`: the assigned one, else the OBJECT slot named like the object,
    else the first OBJECT slot. None for a legacy (Blender 4.2) action or an action without an object slot."""
    slots = getattr(action, "slots", None)
    if slots is None or not len(slots):
        return None
    anim = obj.animation_data
    if anim is not None and anim.action == action and getattr(anim, "action_slot", None) is not None:
        return anim.action_slot
    object_slots = [s for s in slots if s.target_id_type in ("OBJECT", "UNSPECIFIED")]
    for s in object_slots:
        if s.name_display == obj.name:
            return s
    return object_slots[0] if object_slots else None


def action_slot_for_any(action):
    """The first OBJECT slot of an action (None for a legacy action): the slot an importer created."""
    slots = getattr(action, "slots", None)
    if not slots:
        return None
    return next((s for s in slots if s.target_id_type in ("OBJECT", "UNSPECIFIED")), slots[0])


def _curve_container(action, slot):
    """The channelbag of a slot (Blender 5) or the legacy action (4.2): whatever holds `.fcurves` and `.groups`."""
    if slot is not None:
        from bpy_extras.anim_utils import action_get_channelbag_for_slot

        return action_get_channelbag_for_slot(action, slot)
    return action if getattr(action, "fcurves", None) is not None else None


def action_fcurves(action, slot):
    """The F-curves of one slot of an action (Blender 5 channelbag), or action.fcurves on Blender 4.2."""
    container = _curve_container(action, slot)
    return list(container.fcurves) if container is not None else []


def bone_channels(fcurves, skip_muted=False):
    """{(bone, property, index): fcurve} for the pose-bone transform curves among fcurves (a list or an F-curve
    collection; with a collection, indices and mute flags are read in one call each). skip_muted leaves out curves
    Blender does not evaluate (muted, or in a muted group)."""
    count = len(fcurves)
    indices = np.zeros(count, dtype=np.int32)
    muted = np.zeros(count, dtype=bool)
    if hasattr(fcurves, "foreach_get"):
        fcurves.foreach_get("array_index", indices)
        if skip_muted:
            fcurves.foreach_get("mute", muted)
    else:
        indices[:] = [fc.array_index for fc in fcurves]
        if skip_muted:
            muted[:] = [fc.mute for fc in fcurves]
    out = {}
    for k, fc in enumerate(fcurves):
        if muted[k]:
            continue
        m = _BONE_PATH.match(fc.data_path)
        if m:
            name = m.group(1)
            out[(_unescape(name) if "\\" in name else name, m.group(2), int(indices[k]))] = fc
    return out


def _channels_of(action, slot):
    """bone_channels of the curves Blender would evaluate for a slot."""
    container = _curve_container(action, slot)
    if container is None:
        return {}
    out = bone_channels(container.fcurves, skip_muted=True)
    if out and any(g.mute for g in container.groups):
        out = {key: fc for key, fc in out.items() if fc.group is None or not fc.group.mute}
    return out


def action_channels(obj, action):
    """{(bone, property, index): fcurve} of the curves that would drive obj (unmuted, through its slot)."""
    return _channels_of(action, action_slot_for(obj, action))


def animated_bones(obj, action, channels=None):
    """Names of the bones whose transform the action animates (through the slot that would drive obj)."""
    return {bone for bone, _, _ in (action_channels(obj, action) if channels is None else channels)}


def action_frame_range(action):
    """Integer (first, last) frame of an action: its manual range when set, else its keys."""
    start, end = action.frame_range
    return int(math.ceil(start - 1e-6)), int(math.floor(end + 1e-6))


def _current_channels(obj, names):
    """Current pose-bone channel values of `names` (what Blender uses where an action has no curve)."""
    pose_bones = obj.pose.bones
    n = len(pose_bones)
    order = {pb.name: i for i, pb in enumerate(pose_bones)}
    values = {}
    for prop, width in (("location", 3), ("rotation_quaternion", 4), ("rotation_euler", 3),
                        ("rotation_axis_angle", 4), ("scale", 3)):
        buf = np.empty(n * width, dtype=np.float32)
        pose_bones.foreach_get(prop, buf)
        buf = buf.reshape(n, width).astype(np.float64)
        values[prop] = buf[[order[name] for name in names]]
    return values


def sample_channels(rig, obj, action, frame_start=None, frame_end=None, bones=None, current=None, channels=None):
    """Per-frame channel values of `bones` (indices into rig.bone_names; default rig.needed) for every integer
    frame of the action, without frame_set and without changing the action.

    current: the pose's own channel values of `bones` (read once by read_actions); channels without a curve keep
    them, as in Blender. channels: the action's parsed curves when the caller has them (see action_channels).
    Returns (frames (F,), {property: (F, len(bones), width)}, animated: bone names with curves).
    """
    bones = rig.needed if bones is None else np.asarray(bones, dtype=np.int64)
    names = [rig.bone_names[b] for b in bones]
    first, last = action_frame_range(action)
    first = first if frame_start is None else int(frame_start)
    last = last if frame_end is None else int(frame_end)
    if last < first:
        raise RigError(f"action {action.name!r} has no frames in {first}..{last}")
    frames = np.arange(first, last + 1)
    count = len(frames)
    current = _current_channels(obj, names) if current is None else current
    values = {prop: np.broadcast_to(v, (count,) + v.shape).copy() for prop, v in current.items()}
    wanted = {}
    local = {name: k for k, name in enumerate(names)}
    slot = action_slot_for(obj, action)
    channels = _channels_of(action, slot) if channels is None else channels
    for key, fc in channels.items():     # muted curves are left out, as Blender does
        bone, prop, i = key
        k = local.get(bone)
        if k is None or i >= values[prop].shape[2] or prop not in ("location", "scale", rotation_property(
                rig.rotation_modes[bones[k]])):
            continue
        wanted[key] = (prop, k, i, fc)
    animated = {names[k] for (_, k, _, _) in wanted.values()}
    # Keys exactly on every frame (BVH imports, baked actions): the curve's value there is the key's value.
    remaining = {}
    direct = []
    keys = np.empty((len(wanted), 2 * count), dtype=np.float32)
    for key, (prop, k, i, fc) in wanted.items():
        row = len(direct)
        points = fc.keyframe_points
        if len(points) == count and not len(fc.modifiers):
            points.foreach_get("co", keys[row])
            direct.append((key, prop, k, i, fc))
        else:
            remaining[key] = (prop, k, i)
    if direct:
        keys = keys[:len(direct)]
        on_frames = np.all(keys[:, 0::2] == frames[None, :], axis=1)
        for row, (key, prop, k, i, _) in enumerate(direct):
            if on_frames[row]:
                values[prop][:, k, i] = keys[row, 1::2]
            else:
                remaining[key] = (prop, k, i)
    buf = np.empty(2 * count, dtype=np.float32)
    if not remaining:
        return frames, values, animated
    copy = action.copy()       # convert_to_samples replaces keys, so it runs on a throwaway copy
    try:
        copy_slot = None
        if slot is not None:
            copy_slot = next((s for s in copy.slots if s.identifier == slot.identifier), None)
        for key, fc in _channels_of(copy, copy_slot).items():
            target = remaining.get(key)
            if target is None:
                continue
            prop, k, i = target
            fc.convert_to_samples(first, last + 1)
            points = fc.sampled_points
            if len(points) != count:   # a curve that refuses sampling: evaluate it point by point
                values[prop][:, k, i] = [fc.evaluate(float(f)) for f in frames]
                continue
            points.foreach_get("co", buf)
            values[prop][:, k, i] = buf[1::2]
    finally:
        bpy.data.actions.remove(copy)
    return frames, values, animated


def basis_matrices(rig, bones, values):
    """matrix_basis of `bones` from channel values, per bone in its rotation mode (Blender's formula), as its 3x3
    part (F, len(bones), 3, 3) (rotation @ scale) and its location (F, len(bones), 3); bones sharing a mode are
    converted in one batch."""
    count = values["location"].shape[0]
    nb = len(bones)
    rot = np.empty((count, nb, 3, 3))
    modes = [rig.rotation_modes[b] for b in bones]
    for mode in set(modes):
        ks = [k for k, m in enumerate(modes) if m == mode]
        ks = slice(ks[0], ks[-1] + 1) if ks == list(range(ks[0], ks[-1] + 1)) else ks
        if mode == "QUATERNION":
            rot[:, ks] = _quaternion_matrices(values["rotation_quaternion"][:, ks])
        elif mode == "AXIS_ANGLE":
            aa = values["rotation_axis_angle"][:, ks]
            axis = aa[..., 1:]
            length = np.linalg.norm(axis, axis=-1, keepdims=True)
            unit = np.where(length > 1e-12, axis / np.maximum(length, 1e-12), 0.0)
            rot[:, ks] = axis_angle_to_matrix(unit * aa[..., :1])
        else:
            rot[:, ks] = euler_to_matrix(values["rotation_euler"][:, ks], mode)
    scale = values["scale"]
    if not np.all(scale == 1.0):
        rot *= scale[:, :, None, :]
    return rot, values["location"]


def _quaternion_matrices(q):
    """(..., 4) quaternions as Blender turns them into rotations: normalised first (zero -> identity)."""
    w, x, y, z = np.moveaxis(q, -1, 0).copy()       # contiguous components: the products below run at full speed
    norm2 = w * w + x * x + y * y + z * z
    s = np.where(norm2 > 1e-24, 2.0 / np.where(norm2 > 1e-24, norm2, 1.0), 0.0)
    xs, ys, zs = x * s, y * s, z * s
    wx, wy, wz = w * xs, w * ys, w * zs
    xx, xy, xz = x * xs, x * ys, x * zs
    yy, yz, zz = y * ys, y * zs, z * zs
    out = np.empty(q.shape[:-1] + (3, 3))
    out[..., 0, 0] = 1.0 - (yy + zz)
    out[..., 0, 1] = xy - wz
    out[..., 0, 2] = xz + wy
    out[..., 1, 0] = xy + wz
    out[..., 1, 1] = 1.0 - (xx + zz)
    out[..., 1, 2] = yz - wx
    out[..., 2, 0] = xz - wy
    out[..., 2, 1] = yz + wx
    out[..., 2, 2] = 1.0 - (xx + yy)
    return out


def _constant_times(constants, matrices):
    """constants (k, 3, 3) @ matrices (F, k, 3, 3), one BLAS product per bone (much faster than a batched matmul
    of tiny matrices)."""
    out = np.empty_like(matrices)
    for j in range(constants.shape[0]):
        out[:, j] = np.tensordot(matrices[:, j], constants[j], axes=([1], [1])).transpose(0, 2, 1)
    return out


def _batched_product(a, b):
    """a @ b for (..., 3, 3) stacks, written out per entry (faster than np.matmul on tiny matrices)."""
    out = np.empty(np.broadcast_shapes(a.shape, b.shape))
    for i in range(3):
        for j in range(3):
            out[..., i, j] = a[..., i, 0] * b[..., 0, j] + a[..., i, 1] * b[..., 1, j] + a[..., i, 2] * b[..., 2, j]
    return out


def forward_all(rig, bones, basis):
    """Armature-space pose of `bones` (closed under parents, parents first) from basis_matrices' (3x3, location):
    (F, len(bones), 3, 3) matrix parts and (F, len(bones), 3) heads; one batched product per depth of the hierarchy.
    Equal to Blender's pose_j = pose_parent @ rest_parent^-1 @ rest_j @ basis_j, split into its 3x3 and translation.
    """
    m3, loc = basis
    R = np.empty_like(m3)
    T = np.empty_like(loc)
    link_r, link_t = rig.rest_links[:, :3, :3], rig.rest_links[:, :3, 3]
    for ks, bone_ids, parent_ks in _levels(rig, bones):
        lr = link_r[bone_ids]
        own_r = _constant_times(lr, m3[:, ks])
        own_t = np.einsum("kij,fkj->fki", lr, loc[:, ks]) + link_t[bone_ids]
        if parent_ks is None:
            R[:, ks], T[:, ks] = own_r, own_t
        else:
            rp = R[:, parent_ks]
            R[:, ks] = _batched_product(rp, own_r)
            T[:, ks] = T[:, parent_ks] + np.einsum("fkij,fkj->fki", rp, own_t)
    return R, T


def _levels(rig, bones):
    """[(positions in `bones`, bone indices, parents' positions or None for roots)] grouped by depth."""
    key = tuple(int(b) for b in bones)
    cached = rig.level_cache.get(key)
    if cached is not None:
        return cached
    local = {b: k for k, b in enumerate(key)}
    depth = {}
    for b in key:
        p = int(rig.parents[b])
        depth[b] = 0 if p < 0 else depth[p] + 1
    levels = []
    for d in range(max(depth.values()) + 1 if depth else 0):
        ids = [b for b in key if depth[b] == d]
        ks = np.array([local[b] for b in ids])
        parent_ks = None if d == 0 else np.array([local[int(rig.parents[b])] for b in ids])
        levels.append((ks, np.array(ids), parent_ks))
    rig.level_cache[key] = levels
    return levels


@dataclass
class ActionSample:
    """One action read from Blender, in character space, role order."""
    name: str
    frames: np.ndarray            # (F,) scene frames
    frame_start: int
    frame_end: int
    local_rotations: np.ndarray   # (F, 23, 3, 3) rotation of matrix_basis (identity where unmapped)
    rotations: np.ndarray         # (F, 23, 3, 3) character-space orientations (identity where unmapped)
    positions: np.ndarray         # (F, 23, 3) heads (NaN where unmapped)
    hips_rotation: np.ndarray     # (F, 3, 3)
    hips_position: np.ndarray     # (F, 3)
    bridges: np.ndarray           # (F, 23, 3, 3) what FK needs per frame
    offsets: np.ndarray           # (F, 23, 3)
    moving_links: bool            # True when bridges/offsets differ from the rest skeleton's
    animated_roles: np.ndarray    # (23,) bool: roles whose bone the action animates


def read_action(rig, obj, action, frame_start=None, frame_end=None):
    """Every integer frame of an action on this rig, without frame_set and without changing anything."""
    return next(read_actions(rig, obj, [action], frame_start, frame_end))


def read_actions(rig, obj, actions, frame_start=None, frame_end=None, batch_frames=20000, channels=None):
    """ActionSample of each action in turn. The Blender side (curve sampling) runs per action; the NumPy side (FK,
    links) runs on batches of up to `batch_frames` frames of several actions at once, so short actions cost little
    and memory stays bounded. channels: each action's action_channels, when the caller parsed them already."""
    bones = rig.needed
    current = _current_channels(obj, [rig.bone_names[b] for b in bones])
    pending, pending_frames = [], 0
    for n, action in enumerate(actions):
        frames, values, animated = sample_channels(rig, obj, action, frame_start, frame_end, bones, current,
                                                   None if channels is None else channels[n])
        pending.append((action, frames, values, animated))
        pending_frames += len(frames)
        if pending_frames >= batch_frames:
            yield from _evaluate_batch(rig, pending)
            pending, pending_frames = [], 0
    if pending:
        yield from _evaluate_batch(rig, pending)


def _evaluate_batch(rig, pending):
    bones = rig.needed
    values = {prop: np.concatenate([p[2][prop] for p in pending]) for prop in pending[0][2]}
    unscaled = bool(np.all(values["scale"] == 1.0))
    basis = basis_matrices(rig, bones, values)
    pose_r, pose_t = forward_all(rig, bones, basis)
    local_index = {int(b): k for k, b in enumerate(bones)}
    mask = rig.role_mask
    count = pose_t.shape[0]
    roles = np.where(mask)[0]
    ks = [local_index[int(rig.role_bones[r])] for r in roles]
    if len(roles) == NUM_ROLES:
        own, rotations = basis[0][:, ks], pose_r[:, ks]
        local = own if unscaled else _normalized_columns(own)
        positions = rig.to_character_positions(pose_t[:, ks])
        rotations = rig.to_character_rotations(rotations, normalize=not unscaled)
    else:
        eye = np.eye(3)
        local = np.broadcast_to(eye, (count, NUM_ROLES, 3, 3)).copy()
        rotations = np.broadcast_to(eye, (count, NUM_ROLES, 3, 3)).copy()
        positions = np.full((count, NUM_ROLES, 3), np.nan)
        own = basis[0][:, ks]
        local[:, roles] = own if unscaled else _normalized_columns(own)
        # without any scale in the pose, the rotation parts are exact rotations (rest matrices are orthonormal)
        rotations[:, roles] = rig.to_character_rotations(pose_r[:, ks], normalize=not unscaled)
        positions[:, roles] = rig.to_character_positions(pose_t[:, ks])
    moving_rows = _moving_rows(rig, bones, basis, values)
    skel = rig.skeleton
    start = 0
    for action, frames, _, animated in pending:
        rows = slice(start, start + len(frames))
        start = rows.stop
        n = len(frames)
        moving = bool(np.any(moving_rows[rows]))
        if moving:   # an in-between bone moves, or a mapped bone translates or scales: links per frame
            bridges, offsets = relative_links(mask, rotations[rows], np.nan_to_num(positions[rows]), local[rows])
        else:        # every in-between bone at rest: the rest skeleton's links hold exactly
            bridges = np.broadcast_to(skel.bridges, (n, NUM_ROLES, 3, 3))
            offsets = np.broadcast_to(skel.offsets, (n, NUM_ROLES, 3))
        first, last = action_frame_range(action)
        yield ActionSample(
            name=action.name, frames=frames, frame_start=first, frame_end=last,
            local_rotations=local[rows], rotations=rotations[rows], positions=positions[rows],
            hips_rotation=rotations[rows, 0], hips_position=positions[rows, 0],
            bridges=bridges, offsets=offsets, moving_links=moving,
            animated_roles=np.array([bool(mask[r]) and rig.bone_names[rig.role_bones[r]] in animated
                                     for r in range(NUM_ROLES)]),
        )


def _moving_rows(rig, bones, basis, values):
    """(F,) True where the rest skeleton's bridges/offsets would not hold: an unmapped bone between mapped ones
    is off its rest pose, or a mapped bone below the hips has a location or a scale."""
    between, chain, moved = _link_masks(rig, bones)
    m3, loc = basis
    rows = np.zeros(m3.shape[0], dtype=bool)
    if len(between):
        rows |= np.any(np.abs(m3[:, between] - np.eye(3)) > MOVING_TOLERANCE, axis=(1, 2, 3))
        rows |= np.any(np.abs(loc[:, between]) > MOVING_TOLERANCE, axis=(1, 2))
    rows |= np.any(np.abs(values["scale"][:, chain] - 1.0) > MOVING_TOLERANCE, axis=(1, 2))
    if len(moved):
        rows |= np.any(np.abs(loc[:, moved]) > MOVING_TOLERANCE, axis=(1, 2))
    return rows


def _link_masks(rig, bones):
    """Positions in `bones` of the in-between bones, the hips and mapped bones below, and mapped bones below the
    hips (cached per rig)."""
    key = ("links",) + tuple(int(b) for b in bones)
    cached = rig.level_cache.get(key)
    if cached is None:
        hips = int(rig.role_bones[0])
        below = np.array([_is_ancestor(rig.parents, hips, int(b)) for b in bones])
        mapped = np.isin(bones, rig.role_bones[rig.role_mask])
        cached = (np.where(below & ~mapped)[0], np.where((below & mapped) | (np.asarray(bones) == hips))[0],
                  np.where(below & mapped)[0])
        rig.level_cache[key] = cached
    return cached


# ---- Blender's own evaluated pose (tests, evaluation, the naive benchmark) ----------------------------------------


def armature_pose_heads(obj, rig):
    """(23, 3) heads of the mapped bones from Blender's evaluated pose (pose_bone.head), character space; NaN
    where unmapped."""
    out = np.full((NUM_ROLES, 3), np.nan)
    for r in range(NUM_ROLES):
        if rig.role_bones[r] >= 0:
            out[r] = np.array(obj.pose.bones[rig.bone_names[rig.role_bones[r]]].head)
    return rig.to_character_positions(out)


def armature_pose_matrices(obj, rig):
    """(23, 4, 4) pose_bone.matrix of the mapped bones (armature space; identity where unmapped)."""
    out = np.broadcast_to(np.eye(4), (NUM_ROLES, 4, 4)).copy()
    for r in range(NUM_ROLES):
        if rig.role_bones[r] >= 0:
            out[r] = np.array(obj.pose.bones[rig.bone_names[rig.role_bones[r]]].matrix)
    return out


def armature_pose_rotations(obj, rig):
    """(23, 3, 3) character-space orientations of the mapped bones from Blender's evaluated pose."""
    return rig.to_character_rotations(armature_pose_matrices(obj, rig)[:, :3, :3])


# ---- writing -------------------------------------------------------------------------------------------------------


def _to_euler(matrices, order, compat=None):
    """(K, 3, 3) -> (K, 3) Euler angles in `order` with mathutils, each compatible with the one before."""
    from mathutils import Matrix

    out = np.empty((len(matrices), 3))
    prev = compat
    for k, m in enumerate(matrices):
        e = Matrix(m.tolist()).to_euler(order, prev) if prev is not None else Matrix(m.tolist()).to_euler(order)
        out[k] = e
        prev = e
    return out


def _hips_frame(obj, rig):
    """Armature-space frame in which the hips' matrix_basis acts: parent's current pose @ parent-to-hips rest."""
    b = int(rig.role_bones[0])
    p = int(rig.parents[b])
    if p < 0:
        return rig.rest[b]
    parent = np.array(obj.pose.bones[rig.bone_names[p]].matrix, dtype=np.float64)
    return parent @ np.linalg.inv(rig.rest[p]) @ rig.rest[b]


def _hips_basis(obj, rig, hips_rotation, hips_position):
    """matrix_basis rotation (3, 3) and location (3,) that put the hips at a character-space transform, given the
    current pose of the hips' parent."""
    frame = _hips_frame(obj, rig)
    frame_rot = _normalized_columns(frame[:3, :3])
    rot = loc = None
    if hips_rotation is not None:
        rot = frame_rot.T @ rig.basis.T @ np.asarray(hips_rotation, np.float64)
    if hips_position is not None:
        arm = rig.basis.T @ np.asarray(hips_position, np.float64) / rig.scale
        loc = np.linalg.solve(frame[:3, :3], arm - frame[:3, 3])
    return rot, loc


def write_pose(obj, rig, local_rotations, hips_rotation=None, hips_position=None):
    """Set the mapped bones' pose rotations (23, 3, 3) and optionally the hips' character-space transform.

    Quaternion bones are written with one foreach_set; Euler and axis-angle bones per bone in their own mode.
    Touches nothing else, and tags the object so Blender re-evaluates it.
    """
    pose_bones = obj.pose.bones
    local_rotations = np.asarray(local_rotations, np.float64)
    hips_rot, hips_loc = (None, None)
    if hips_rotation is not None or hips_position is not None:
        hips_rot, hips_loc = _hips_basis(obj, rig, hips_rotation, hips_position)
    rotations = {}
    for r in range(NUM_ROLES):
        b = int(rig.role_bones[r])
        if b >= 0:
            rotations[rig.bone_names[b]] = (hips_rot if (r == 0 and hips_rot is not None) else local_rotations[r])
    count = len(pose_bones)
    quats = np.empty(count * 4, dtype=np.float32)
    pose_bones.foreach_get("rotation_quaternion", quats)
    quats = quats.reshape(count, 4)
    any_quat = False
    for i, pb in enumerate(pose_bones):
        m = rotations.get(pb.name)
        if m is None:
            continue
        mode = pb.rotation_mode
        if mode == "QUATERNION":
            quats[i] = matrix_to_quaternion(m)
            any_quat = True
        elif mode == "AXIS_ANGLE":
            aa = matrix_to_axis_angle(m)
            angle = float(np.linalg.norm(aa))
            axis = aa / angle if angle > 1e-12 else np.array([0.0, 1.0, 0.0])
            pb.rotation_axis_angle = (angle, *axis)
        else:
            pb.rotation_euler = _to_euler(m[None], mode, pb.rotation_euler.copy())[0]
    if any_quat:
        pose_bones.foreach_set("rotation_quaternion", quats.ravel())
    if hips_loc is not None:
        pose_bones[rig.bone_names[int(rig.role_bones[0])]].location = hips_loc
    obj.update_tag()


def _new_action(obj, name):
    action = bpy.data.actions.new(name)    # Blender appends .001 on a clash; nothing is overwritten
    slot = None
    if hasattr(action, "slots"):
        slot = action.slots.new(id_type="OBJECT", name=obj.name)
        from bpy_extras.anim_utils import action_ensure_channelbag_for_slot

        container = action_ensure_channelbag_for_slot(action, slot)
    else:
        container = action
    return action, slot, container


def _key_curve(container, data_path, index, group, frames, values):
    try:
        fc = container.fcurves.new(data_path, index=index, group_name=group)
    except TypeError:      # Blender 4.2: a legacy action's fcurves.new names the group action_group
        fc = container.fcurves.new(data_path, index=index, action_group=group)
    fc.keyframe_points.add(len(frames))
    co = np.empty(2 * len(frames), dtype=np.float32)
    co[0::2] = frames
    co[1::2] = values
    fc.keyframe_points.foreach_set("co", co)
    fc.keyframe_points.foreach_set("interpolation", np.full(len(frames), 2, dtype=np.int32))   # LINEAR
    fc.update()
    return fc


def write_action(obj, rig, name, frames, local_rotations, hips_rotation=None, hips_position=None):
    """Key the mapped bones' rotations (F, 23, 3, 3) (and the hips' character-space transform) at `frames` into a
    NEW action (slotted on Blender 5) that is returned; the object's assigned action is not changed.

    The hips' location/rotation keys are solved against the current pose of the hips' parent (a rig whose hips
    have an animated parent should have that parent's action assigned while baking).
    """
    frames = np.asarray(frames, dtype=np.float64)
    local_rotations = np.asarray(local_rotations, np.float64)
    action, _slot, container = _new_action(obj, name)
    action.use_fake_user = True
    hips_b = int(rig.role_bones[0])
    frame = _hips_frame(obj, rig)
    frame_rot = _normalized_columns(frame[:3, :3])
    for r in range(NUM_ROLES):
        b = int(rig.role_bones[r])
        if b < 0:
            continue
        bone = rig.bone_names[b]
        mats = local_rotations[:, r]
        if r == 0 and hips_rotation is not None:
            mats = frame_rot.T @ rig.basis.T @ np.asarray(hips_rotation, np.float64)
        mode = rig.rotation_modes[b]
        path = f'pose.bones["{bpy.utils.escape_identifier(bone)}"].'
        if mode == "QUATERNION":
            q = matrix_to_quaternion(mats)
            q = continuous_quaternions(q)
            for i in range(4):
                _key_curve(container, path + "rotation_quaternion", i, bone, frames, q[:, i])
        elif mode == "AXIS_ANGLE":
            aa = matrix_to_axis_angle(mats)
            angle = np.linalg.norm(aa, axis=-1)
            axis = np.where(angle[:, None] > 1e-12, aa / np.maximum(angle, 1e-12)[:, None], [0.0, 1.0, 0.0])
            for i, column in enumerate([angle, axis[:, 0], axis[:, 1], axis[:, 2]]):
                _key_curve(container, path + "rotation_axis_angle", i, bone, frames, column)
        else:
            e = _to_euler(mats, mode)
            for i in range(3):
                _key_curve(container, path + "rotation_euler", i, bone, frames, e[:, i])
    if hips_position is not None:
        arm = (np.asarray(hips_position, np.float64) @ rig.basis) / rig.scale
        loc = np.linalg.solve(frame[:3, :3], (arm - frame[:3, 3]).T).T
        bone = rig.bone_names[hips_b]
        path = f'pose.bones["{bpy.utils.escape_identifier(bone)}"].location'
        for i in range(3):
            _key_curve(container, path, i, bone, frames, loc[:, i])
    return action


def continuous_quaternions(q):
    """Flip signs so consecutive quaternions lie in the same hemisphere (smooth interpolation between keys)."""
    q = np.array(q, copy=True)
    for k in range(1, len(q)):
        if np.dot(q[k], q[k - 1]) < 0:
            q[k] = -q[k]
    return q

