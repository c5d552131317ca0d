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
from operator import attrgetter, itemgetter

import bpy
import numpy as np

from ..neural_network.data.dataset import ActionBatch
from ..neural_network.geometry.armature_fk import (
    BoneChain,
    axis_angle_quaternions,
    compute_dtype,
    euler_quaternions,
    normalized,
    product,
    quaternion_axis_angles,
    quaternion_matrices,
)
from ..neural_network.geometry.rotations import blender_axis_angle, matrix_to_axis_angle, matrix_to_quaternion
from ..neural_network.skeleton.roles import EFFECTOR_ROLES, ESSENTIAL_ROLES, NUM_ROLES, ROLES
from ..neural_network.skeleton.skeleton import Skeleton, nearest_mapped_parents

ROTATION_PROPERTY = {"QUATERNION": "rotation_quaternion", "AXIS_ANGLE": "rotation_axis_angle"}
_BONE_PATH = re.compile(r'^pose\.bones\["((?:[^"\\]|\\.)*)"\]\.(location|rotation_quaternion|rotation_euler|'
                        r'rotation_axis_angle|scale)$')
# A moving in-between bone changes bridges/offsets by more than this (radians / fraction of rig height): then the
# dataset carries them per frame.
MOVING_TOLERANCE = 1e-6
# Frames evaluated together: enough to amortise the per-call cost of NumPy over many actions, few enough that each
# (bones x frames) temporary stays below the allocator's mmap threshold (fresh pages for every temporary cost more
# than the arithmetic: about 9x for a 23-bone quaternion-to-matrix step at 2500 frames; 4096 measured slower).
BATCH_FRAMES = 2048


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


def all_action_fcurves(action):
    """Every F-curve of an action: those of each of its slots (Blender 4.4+), or action.fcurves (4.2 has no slots)."""
    slots = getattr(action, "slots", None)
    if slots is None:
        return action_fcurves(action, None)
    return [fc for slot in slots for fc in action_fcurves(action, slot)]


def curve_container(obj):
    """What holds the F-curves that drive obj through its assigned action (the slot's channelbag on Blender 5, the
    action itself on 4.2); None without an action (or, on Blender 5, without a slot)."""
    anim = obj.animation_data
    if anim is None or anim.action is None:
        return None
    if hasattr(anim, "action_slot"):
        return _curve_container(anim.action, anim.action_slot) if anim.action_slot is not None else None
    return _curve_container(anim.action, None)


def assign_action(obj, action):
    """Let `action` drive obj. On Blender 4.4+ the object also needs a slot: the one Blender picked on assignment,
    else the first suitable one (4.2's actions have no slots and need nothing more)."""
    anim = obj.animation_data_create()
    anim.action = action
    if action is None or not hasattr(anim, "action_slot") or anim.action_slot is not None:
        return
    slots = list(anim.action_suitable_slots) or list(action.slots)
    if slots:
        anim.action_slot = slots[0]


def _parse_layout(paths, indices):
    """[(position, (bone, property, index))] of the pose-bone transform curves among data paths."""
    layout = []
    for k, path in enumerate(paths):
        m = _BONE_PATH.match(path)
        if m:
            name = m.group(1)
            layout.append((k, (_unescape(name) if "\\" in name else name, m.group(2), int(indices[k]))))
    return Layout(layout)


def _curve_flags(fcurves, count, skip_muted):
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
    return indices, muted


def bone_channels(fcurves, skip_muted=False, layouts=None):
    """{(bone, property, index): fcurve} for the pose-bone transform curves among fcurves (a list or an F-curve
    collection; with a collection, indices and mute flags are read in one call each). skip_muted leaves out curves
    Blender does not evaluate (muted). layouts: a dict shared over one extraction; actions whose curves have the
    same paths and indices (every file of one BVH folder, every action of one rig) are parsed once."""
    curves = list(fcurves)
    indices, muted = _curve_flags(fcurves, len(curves), skip_muted)
    paths = tuple(map(_DATA_PATH, curves))
    key = (paths, indices.tobytes())
    layout = None if layouts is None else layouts.get(key)
    if layout is None:
        layout = _parse_layout(paths, indices)
        if layouts is not None:
            layouts[key] = layout
    if muted.any():
        return Channels({channel: curves[k] for k, channel in layout if not muted[k]}, layout=layout)
    return Channels(zip(layout.keys, itemgetter(*layout.positions)(curves)) if len(layout.positions) > 1 else
                    {channel: curves[k] for k, channel in layout}, layout=layout, bones=layout.bones)


class Layout(list):
    """[(position, (bone, property, index))] of one list of curves, with the same as columns and the bone names."""

    def __init__(self, items):
        super().__init__(items)
        self.positions = [k for k, _ in items]
        self.keys = [channel for _, channel in items]
        self.bones = frozenset(bone for bone, _, _ in self.keys)


class Channels(dict):
    """{(bone, property, index): fcurve}; `layout` is the parsed curve list shared by every action with the same
    curves, so per-rig work on it (which channels the chain reads) is done once per layout; `bones` the animated
    bone names when known."""

    def __init__(self, items=(), layout=None, bones=None):
        super().__init__(items)
        self.layout = layout
        self.bones = bones


def _channels_of(action, slot, layouts=None):
    """bone_channels of the curves Blender would evaluate for a slot (muted curves and groups left out)."""
    container = _curve_container(action, slot)
    if container is None:
        return {}
    out = bone_channels(container.fcurves, skip_muted=True, layouts=layouts)
    groups = container.groups
    if out and len(groups):
        group_muted = np.zeros(len(groups), dtype=bool)
        groups.foreach_get("mute", group_muted)
        if group_muted.any():
            out = Channels({key: fc for key, fc in out.items() if fc.group is None or not fc.group.mute})
    return out


def action_channels(obj, action, layouts=None):
    """{(bone, property, index): fcurve} of the curves that would drive obj (unmuted, through its slot).
    layouts: see bone_channels (one dict per extraction)."""
    return _channels_of(action, action_slot_for(obj, action), layouts)


def animated_bones(obj, action, channels=None):
    """Names of the bones whose transform the action animates (through the slot that would drive obj)."""
    channels = action_channels(obj, action) if channels is None else channels
    known = getattr(channels, "bones", None)
    return set(known) if known is not None else {bone for bone, _, _ in channels}


def action_frame_range(action):
    """Integer (first, last) frame of an action: its manual range when set, else its keys."""
    start, end = action.frame_range
    return int(math.ceil(start - 1e-6)), int(math.floor(end + 1e-6))


_DATA_PATH = attrgetter("data_path")
CHANNEL_WIDTHS = {"location": 3, "rotation_quaternion": 4, "rotation_euler": 3, "rotation_axis_angle": 4, "scale": 3}


def _current_channels(obj, names):
    """Current pose-bone channel values of `names` as {property: (width, len(names))}: what Blender uses where an
    action has no curve."""
    pose_bones = obj.pose.bones
    n = len(pose_bones)
    order = {pb.name: i for i, pb in enumerate(pose_bones)}
    rows = [order[name] for name in names]
    values = {}
    for prop, width in CHANNEL_WIDTHS.items():
        buf = np.empty(n * width, dtype=np.float32)
        pose_bones.foreach_get(prop, buf)
        values[prop] = np.ascontiguousarray(buf.reshape(n, width)[rows].T, dtype=np.float64)
    return values


def bone_chain(rig):
    """The BoneChain of the bones extraction reads (rig.needed), built once per rig."""
    chain = rig.level_cache.get("chain")
    if chain is None:
        chain = BoneChain.build(rig.parents, rig.rest_links, rig.needed)
        rig.level_cache["chain"] = chain
    return chain


@dataclass
class PoseBatch:
    """Every frame of several actions evaluated at once, frames on the last axis (armature space).

    Rows start[a]:start[a+1] are action a's frames. K = the chain's bones (BoneChain order)."""
    actions: list
    frames: np.ndarray            # (N,) scene frames
    starts: np.ndarray            # (A+1,) row offsets
    ranges: list                  # (first, last) frame range of each action
    animated: list                # set of animated bone names per action
    local: np.ndarray             # (4, K, N) unit quaternions of matrix_basis' rotation
    matrices: np.ndarray          # (3, 3, K, N) pose rotations (normalised when the pose has scale)
    heads: np.ndarray             # (3, K, N) bone heads
    moving: np.ndarray            # (A,) bool: the rest skeleton's bridges/offsets do not hold for the action
    matrix_rows: np.ndarray = None  # (K,) index of each chain position in matrices (-1: not kept); None: all K

    def rows(self, a):
        return slice(int(self.starts[a]), int(self.starts[a + 1]))


def read_pose_batches(rig, obj, actions, frame_start=None, frame_end=None, batch_frames=None, channels=None,
                      ranges=None, dtype=np.float64, keep_rotations=None):
    """PoseBatch of up to `batch_frames` frames (at least one action) at a time, for every action in turn, without
    frame_set and without changing anything. channels: each action's action_channels when the caller has them;
    ranges: each action's action_frame_range likewise (Blender scans every curve for it). dtype: of the FK
    (float32, as Blender's own pose evaluation, for a training set; float64 for solving and baking).
    keep_rotations: chain positions whose pose rotations the caller needs (None: all; all are kept anyway for a
    batch where an action's links move); see PoseBatch.matrix_rows."""
    chain = bone_chain(rig)
    names = [rig.bone_names[b] for b in chain.bones]
    current = _current_channels(obj, names)
    layouts = {}
    batch_frames = BATCH_FRAMES if batch_frames is None else batch_frames
    pending, pending_frames = [], 0
    for n, action in enumerate(actions):
        first, last = action_frame_range(action) if ranges is None else ranges[n]
        first = first if frame_start is None else int(frame_start)
        last = last if frame_end is None else int(frame_end)
        if last < first:
            raise RigError(f"action {action.name!r} has no frames in {first}..{last}")
        own = _channels_of(action, action_slot_for(obj, action), layouts) if channels is None else channels[n]
        pending.append((action, first, last, own))
        pending_frames += last - first + 1
        if pending_frames >= batch_frames:
            yield _pose_batch(rig, obj, chain, names, current, pending, dtype, keep_rotations)
            pending, pending_frames = [], 0
    if pending:
        yield _pose_batch(rig, obj, chain, names, current, pending, dtype, keep_rotations)


def _pose_batch(rig, obj, chain, names, current, pending, dtype=np.float64, keep_rotations=None):
    counts = np.array([last - first + 1 for _, first, last, _ in pending])
    starts = np.concatenate([[0], np.cumsum(counts)])
    frames = np.concatenate([np.arange(first, last + 1) for _, first, last, _ in pending])
    values, animated = _read_channels(rig, obj, chain, names, current, pending, starts, dtype)
    local = _basis_quaternions(rig, chain, values)
    scale = values.get("scale")
    moving_rows = _moving_rows(rig, chain, local, values)
    moving = np.logical_or.reduceat(moving_rows, starts[:-1]) if len(moving_rows) else np.zeros(len(pending), bool)
    matrix_rows = None
    if scale is None:
        location = values.get("location")
        moved = None
        if location is not None:
            ks = np.where(np.any(location != 0.0, axis=(0, 2)))[0]
            moved = (ks, location[:, ks]) if len(ks) else None
        keep = None if keep_rotations is None or moving.any() else np.asarray(keep_rotations, dtype=np.int64)
        matrices, heads = chain.forward(local, moved, keep)
        if keep is not None:
            matrix_rows = np.full(len(chain.bones), -1, dtype=np.int64)
            matrix_rows[keep] = np.arange(len(keep))
    else:       # the general form: rotation @ scale, orientations are the normalised columns
        location = values.get("location")
        if location is None:
            location = np.zeros((3,) + local.shape[1:])
        rot = quaternion_matrices(local) * scale[None]
        scaled, heads = chain.forward_scaled(rot, location)
        matrices = scaled / np.sqrt(np.sum(scaled * scaled, axis=0, keepdims=True))
    return PoseBatch([p[0] for p in pending], frames, starts, [(p[1], p[2]) for p in pending], animated, local,
                     matrices, heads, moving, matrix_rows)


def _read_channels(rig, obj, chain, names, current, pending, starts, dtype=np.float64):
    """{property: (width, K, N)} channel values of the chain's bones for every frame of the pending actions, and
    the animated bone names of each action. Location and scale are left out (None) where nothing moves them.
    dtype: float32 holds Blender's keys and pose channels exactly, in half the memory. Only channels that some
    action lacks a curve for are filled with the pose's current value; the rest is written once by the keys."""
    N = int(starts[-1])
    used = {rotation_property(rig.rotation_modes[b]) for b in chain.bones}
    reads = []            # per action: (plan, its curves in plan order, None where the action lacks one)
    everywhere = None     # {property: (width, K) bool}: channels every pending action has a curve for
    for _, _, _, channels in pending:
        plan = _read_plan(rig, names, chain, channels)
        curves = [channels.get(key) for key in plan.keys]
        complete = None not in curves
        used.update(plan.prop_set if complete else (plan.props[j] for j, fc in enumerate(curves) if fc is not None))
        have = plan.covered if complete else _covered(plan, [fc is not None for fc in curves], len(names))
        everywhere = have if everywhere is None else {p: everywhere.get(p, False) & have.get(p, False)
                                                      for p in everywhere.keys() | have.keys()}
        reads.append((plan, curves, complete))
    if "location" in used or np.any(current["location"]):
        used.add("location")
    if "scale" in used or not np.all(current["scale"] == 1.0):
        used.add("scale")
    else:
        used.discard("scale")
    values = {}
    for prop in used:
        values[prop] = np.empty((CHANNEL_WIDTHS[prop], len(names), N), dtype)
        missing = ~np.asarray(everywhere.get(prop, False), bool) & np.ones((CHANNEL_WIDTHS[prop], len(names)), bool)
        if missing.any():
            values[prop][missing] = current[prop][missing][:, None]
    animated = []
    for (action, first, last, _), (plan, curves, complete), row in zip(pending, reads, starts[:-1]):
        animated.append(set(plan.bone_names) if complete else
                        {names[plan.ks[j]] for j, fc in enumerate(curves) if fc is not None})
        _read_action_keys(action, obj, first, last, plan, curves, values, int(row))
    return values, animated


def _covered(plan, present, count):
    """{property: (width, count) bool} of the plan's channels whose curve is present."""
    out = {}
    for prop, (js, indices, ks) in plan.groups.items():
        mask = np.zeros((CHANNEL_WIDTHS[prop], count), bool)
        keep = np.asarray(present, bool)[js]
        mask[indices[keep], ks[keep]] = True
        out[prop] = mask
    return out


@dataclass
class _ReadPlan:
    """Which of a curve layout's channels the chain reads: keys, and per property the plan positions, channel
    indices and chain positions (one scatter per property)."""
    layout: object
    keys: list
    props: list
    ks: list
    groups: dict
    prop_set: frozenset = frozenset()     # the properties of the plan's channels
    covered: dict = None                  # {property: (width, K) bool} channels the layout has a curve for
    bone_names: frozenset = frozenset()   # the chain bones the layout animates


def _read_plan(rig, names, chain, channels):
    """The _ReadPlan of an action's channels, made once per curve layout (see Channels)."""
    plans = rig.level_cache.setdefault("plans", {})
    layout = getattr(channels, "layout", None)
    plan = plans.get(id(layout)) if layout is not None else None
    if plan is not None and plan.layout is layout:
        return plan
    local = {name: k for k, name in enumerate(names)}
    rotation_props = [rotation_property(rig.rotation_modes[b]) for b in chain.bones]
    keys, props, ks, groups = [], [], [], {}
    for key in (channels if layout is None else dict.fromkeys(channel for _, channel in layout)):
        bone, prop, i = key
        k = local.get(bone)
        if k is None or i >= CHANNEL_WIDTHS[prop] or prop not in ("location", "scale", rotation_props[k]):
            continue
        group = groups.setdefault(prop, ([], [], []))
        group[0].append(len(keys))
        group[1].append(i)
        group[2].append(k)
        keys.append(key)
        props.append(prop)
        ks.append(k)
    groups = {prop: tuple(np.array(g, dtype=np.int64) for g in group) for prop, group in groups.items()}
    plan = _ReadPlan(layout, keys, props, ks, groups, frozenset(props), None, frozenset(names[k] for k in ks))
    plan.covered = _covered(plan, [True] * len(keys), len(names))
    if layout is not None:
        if len(plans) > 64:
            plans.clear()
        plans[id(layout)] = plan
    return plan


def _read_action_keys(action, obj, first, last, plan, curves, values, row):
    """Write one action's curve values for frames first..last into values[prop][i, k, row:row + count]."""
    count = last - first + 1
    rows = slice(row, row + count)
    keys = np.empty((len(curves), 2 * count), dtype=np.float32)
    unread = []
    for j, (fc, buffer) in enumerate(zip(curves, keys)):   # keys exactly on every frame (BVH imports, baked actions):
        if fc is None:                                      # the value is the key's
            unread.append(j)
            continue
        points = fc.keyframe_points
        if len(points) == count and not fc.modifiers:
            points.foreach_get("co", buffer)
        else:
            unread.append(j)
    direct = np.all(keys[:, 0::2] == np.arange(first, last + 1, dtype=np.float32), axis=1)
    if unread:
        direct[unread] = False
    for prop, (js, indices, ks) in plan.groups.items():        # one scatter per property
        ok = direct[js]
        if ok.all():
            values[prop][indices, ks, rows] = keys[js, 1::2]
        elif ok.any():
            values[prop][indices[ok], ks[ok], rows] = keys[js[ok], 1::2]
    remaining = [(plan.props[j], plan.ks[j], plan.keys[j][2], curves[j]) for j in np.flatnonzero(~direct).tolist()
                 if curves[j] is not None]
    if remaining:
        _sample_curves(action, obj, first, last, remaining, values, rows)


def _sample_curves(action, obj, first, last, items, values, rows):
    """Curves whose keys are not on every frame: Blender's own evaluation of a throwaway copy's curves
    (convert_to_samples replaces keys, so it never runs on the user's action)."""
    count = last - first + 1
    slot = action_slot_for(obj, action)
    targets = {}
    for prop, k, i, fc in items:
        targets[(fc.data_path, fc.array_index)] = (prop, k, i)
    buf = np.empty(2 * count, dtype=np.float32)
    copy = action.copy()
    try:
        copy_slot = None
        if slot is not None:
            copy_slot = next((s for s in copy.slots if s.identifier == slot.identifier), None)
        for fc in _channels_of(copy, copy_slot).values():
            target = targets.get((fc.data_path, fc.array_index))
            if target is None:
                continue
            prop, k, i = target
            fc.convert_to_samples(first, last + 1)
            points = fc.sampled_points
            if len(points) != count:   # a curve that refuses sampling: evaluate it point by point
                values[prop][i, k, rows] = [fc.evaluate(float(f)) for f in range(first, last + 1)]
                continue
            points.foreach_get("co", buf)
            values[prop][i, k, rows] = buf[1::2]
    finally:
        bpy.data.actions.remove(copy)


def _basis_quaternions(rig, chain, values):
    """(4, K, N) unit quaternions of each bone's matrix_basis rotation, per bone in its rotation mode (Blender's
    conversions; bones sharing a mode in one batch)."""
    K = len(chain.bones)
    N = next(iter(values.values())).shape[2]
    out = np.empty((4, K, N), compute_dtype(next(iter(values.values()))))
    modes = [rig.rotation_modes[b] for b in chain.bones]
    for mode in set(modes):
        ks = [k for k, m in enumerate(modes) if m == mode]
        ks = slice(ks[0], ks[-1] + 1) if ks == list(range(ks[0], ks[-1] + 1)) else np.array(ks)
        if mode == "QUATERNION" and isinstance(ks, slice):
            normalized(values["rotation_quaternion"][:, ks], out=out[:, ks])
        elif mode == "QUATERNION":
            out[:, ks] = normalized(values["rotation_quaternion"][:, ks])
        elif mode == "AXIS_ANGLE":
            out[:, ks] = axis_angle_quaternions(values["rotation_axis_angle"][:, ks])
        else:
            out[:, ks] = euler_quaternions(values["rotation_euler"][:, ks], mode)
    return out


def _moving_rows(rig, chain, local, values):
    """(N,) True where the rest skeleton's bridges/offsets would not hold: an unmapped bone between mapped ones is
    off its rest pose, or a mapped bone below the hips has a location or a scale."""
    between, below_chain, moved = _link_masks(rig, chain)
    rows = np.zeros(local.shape[2], dtype=bool)
    loc, scale = values.get("location"), values.get("scale")
    half = 0.5 * MOVING_TOLERANCE      # a quaternion's vector part is half the rotation angle
    if len(between):
        rows |= np.any(np.abs(local[1:, between]) > half, axis=(0, 1))
        if loc is not None:
            rows |= np.any(np.abs(loc[:, between]) > MOVING_TOLERANCE, axis=(0, 1))
    if scale is not None:
        rows |= np.any(np.abs(scale[:, below_chain] - 1.0) > MOVING_TOLERANCE, axis=(0, 1))
        if len(between):
            rows |= np.any(np.abs(scale[:, between] - 1.0) > MOVING_TOLERANCE, axis=(0, 1))
    if loc is not None and len(moved):
        rows |= np.any(np.abs(loc[:, moved]) > MOVING_TOLERANCE, axis=(0, 1))
    return rows


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


def _role_positions(rig, chain):
    """(mapped roles, their positions in the chain)."""
    cached = rig.level_cache.get("roles")
    if cached is None:
        position = {int(b): k for k, b in enumerate(chain.bones)}
        roles = np.where(rig.role_mask)[0]
        cached = (roles, np.array([position[int(rig.role_bones[r])] for r in roles], dtype=np.int64))
        rig.level_cache["roles"] = cached
    return cached


def _rows_last(a):
    """(..., N) -> (N, ...)"""
    return np.moveaxis(a, -1, 0)


def batch_role_arrays(rig, batch, rotations="effectors", dtype=np.float64):
    """Role-order arrays (N, 23, ...) in character space from a PoseBatch:

    local_axis_angle (N, 23, 3) (zero where unmapped), positions (N, 23, 3) (NaN where unmapped), hips_rotation
    (N, 3, 3), hips_position (N, 3), and `rotations`: "effectors" gives effector_rotations (N, 5, 3, 3), "all" gives
    rotations and local_rotations (N, 23, 3, 3) (identity where unmapped). bridges (N, 23, 3, 3) and offsets
    (N, 23, 3) are computed for the rows of moving actions (None when no action of the batch moves).
    dtype: of the arrays (the dataset keeps float32; each array is written once, straight from the frames-last
    batch, since fresh memory costs more than the arithmetic).
    """
    roles, ks = _role_positions(rig, bone_chain(rig))
    n = len(batch.frames)
    full = len(roles) == NUM_ROLES
    out = {}
    local_aa = np.empty((n, NUM_ROLES, 3), dtype) if full else np.zeros((n, NUM_ROLES, 3), dtype)
    _frames_last(local_aa)[:, roles] = quaternion_axis_angles(batch.local[:, ks])
    out["local_axis_angle"] = local_aa
    heads = batch.heads[:, ks]
    if not _identity(rig.basis):
        heads = np.tensordot(rig.basis, heads, axes=([1], [0]))
    positions = np.empty((n, NUM_ROLES, 3), dtype) if full else np.full((n, NUM_ROLES, 3), np.nan, dtype)
    _frames_last(positions)[:, roles] = heads
    if rig.scale != 1.0:
        positions *= rig.scale
    out["positions"] = positions
    out["hips_position"] = positions[:, 0]
    needed_roles = EFFECTOR_ROLES if rotations == "effectors" else tuple(range(NUM_ROLES))
    chain_of = dict(zip(roles.tolist(), ks.tolist()))
    which = [r for r in needed_roles if r in chain_of]
    hips = chain_of.get(0, ks[0])
    wanted = [hips] + [chain_of[r] for r in which]
    if batch.matrix_rows is not None:
        wanted = batch.matrix_rows[wanted]
        if np.any(wanted < 0):
            raise ValueError("batch_role_arrays needs rotations the PoseBatch did not keep")
    mats = _character_rotations(rig, batch.matrices[:, :, wanted])                  # (3, 3, S, N)
    hips_rotation = np.empty((n, 3, 3), dtype)
    _frames_last(hips_rotation)[...] = mats[:, :, 0].swapaxes(0, 1)
    out["hips_rotation"] = hips_rotation
    if rotations == "effectors":
        places = [EFFECTOR_ROLES.index(r) for r in which]
        if len(places) == len(EFFECTOR_ROLES):
            eff = np.empty((n, len(EFFECTOR_ROLES), 3, 3), dtype)
        else:
            eff = np.broadcast_to(np.eye(3, dtype=dtype), (n, len(EFFECTOR_ROLES), 3, 3)).copy()
        _frames_last(eff)[:, :, places] = mats[:, :, 1:].swapaxes(0, 1)
        out["effector_rotations"] = eff
    else:
        world = _rows_last(mats).transpose(0, 3, 1, 2)                   # (N, 1 + len(which), 3, 3)
        rot = np.broadcast_to(np.eye(3, dtype=dtype), (n, NUM_ROLES, 3, 3)).copy()
        rot[:, which] = world[:, 1:]
        out["rotations"] = rot
        local = np.broadcast_to(np.eye(3, dtype=dtype), (n, NUM_ROLES, 3, 3)).copy()
        local[:, roles] = _rows_last(quaternion_matrices(batch.local[:, ks])).transpose(0, 3, 1, 2)
        out["local_rotations"] = local
    out["bridges"], out["offsets"] = _batch_links(rig, batch, roles, ks) if batch.moving.any() else (None, None)
    return out


def _frames_last(a):
    """A writable view of a rows-first array (N, ...) with the axes reversed (..., N): frames-last results go in
    with one strided copy (matrices (N, S, 3, 3) come out as (3, 3, S, N) with rows and columns swapped, so callers
    swap them back)."""
    return a.transpose(tuple(range(a.ndim - 1, -1, -1)))


def _hips_and_effectors(rig):
    """Chain positions of the hips and the mapped effectors: the rotations a training set stores."""
    roles, ks = _role_positions(rig, bone_chain(rig))
    chain_of = dict(zip(roles.tolist(), ks.tolist()))
    return [chain_of.get(0, int(ks[0]))] + [chain_of[r] for r in EFFECTOR_ROLES if r in chain_of]


def _identity(m):
    return bool(np.array_equal(m, np.eye(3)))


def _character_rotations(rig, matrices):
    """(3, 3, ...) armature-space rotations -> character space (C @ R)."""
    if _identity(rig.basis):
        return matrices
    return np.tensordot(rig.basis, matrices, axes=([1], [0]))


def _batch_links(rig, batch, roles, ks):
    """Per-frame bridges (N, 23, 3, 3) and offsets (N, 23, 3): bridge_j = R_p^T R_j L_j^T and
    offset_j = R_p^T (x_j - x_p) for each mapped role j with mapped parent p (identity / zero elsewhere)."""
    n = len(batch.frames)
    parents = nearest_mapped_parents(rig.role_mask)
    chain_of = dict(zip(roles.tolist(), ks.tolist()))
    js = [int(j) for j in roles if parents[j] >= 0]
    bridges = np.broadcast_to(np.eye(3), (n, NUM_ROLES, 3, 3)).copy()
    offsets = np.zeros((n, NUM_ROLES, 3))
    if not js:
        return bridges, offsets
    kj = [chain_of[j] for j in js]
    kp = [chain_of[int(parents[j])] for j in js]
    r_p = batch.matrices[:, :, kp]
    relative = product(r_p.swapaxes(0, 1), batch.matrices[:, :, kj])
    rel = product(relative, quaternion_matrices(batch.local[:, kj]).swapaxes(0, 1))
    bridges[:, js] = _rows_last(rel).transpose(0, 3, 1, 2)
    d = batch.heads[:, kj] - batch.heads[:, kp]
    local_d = r_p[0] * d[0] + r_p[1] * d[1] + r_p[2] * d[2]          # R_p^T d: row i = column i of R_p dotted with d
    offsets[:, js] = rig.scale * _rows_last(local_d).swapaxes(1, 2)
    return bridges, offsets


def read_dataset_batches(rig, obj, actions, tasks, channels=None, batch_frames=None, ranges=None):
    """dataset.ActionBatch of up to `batch_frames` frames at a time (whole actions), for every action in turn: what
    DatasetBuilder.add_batch takes. tasks: the task index of each action; channels, ranges: see read_pose_batches."""
    done = 0
    for batch in read_pose_batches(rig, obj, actions, batch_frames=batch_frames, channels=channels, ranges=ranges,
                                   dtype=np.float32, keep_rotations=_hips_and_effectors(rig)):
        arrays = batch_role_arrays(rig, batch, dtype=np.float32)
        count = len(batch.actions)
        ranges = np.array(batch.ranges).reshape(-1, 2)
        yield ActionBatch(
            names=[a.name for a in batch.actions], frame_start=ranges[:, 0], frame_end=ranges[:, 1],
            starts=batch.starts, frames=batch.frames, local_axis_angle=arrays["local_axis_angle"],
            positions=arrays["positions"], hips_rotation=arrays["hips_rotation"],
            hips_position=arrays["hips_position"], effector_rotations=arrays["effector_rotations"],
            tasks=np.asarray(tasks[done:done + count], dtype=np.int64), moving=batch.moving,
            bridges=arrays["bridges"], offsets=arrays["offsets"])
        done += count


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


def read_actions(rig, obj, actions, frame_start=None, frame_end=None, batch_frames=None, channels=None):
    """ActionSample of each action in turn (see read_pose_batches; the NumPy side runs on batches of actions)."""
    skel = rig.skeleton
    mask = rig.role_mask
    for batch in read_pose_batches(rig, obj, actions, frame_start, frame_end, batch_frames, channels):
        arrays = batch_role_arrays(rig, batch, rotations="all")
        for a, action in enumerate(batch.actions):
            rows = batch.rows(a)
            n = rows.stop - rows.start
            if batch.moving[a]:
                bridges, offsets = arrays["bridges"][rows], arrays["offsets"][rows]
            else:
                bridges = np.broadcast_to(skel.bridges, (n, NUM_ROLES, 3, 3))
                offsets = np.broadcast_to(skel.offsets, (n, NUM_ROLES, 3))
            first, last = action_frame_range(action)
            animated = batch.animated[a]
            yield ActionSample(
                name=action.name, frames=batch.frames[rows], frame_start=first, frame_end=last,
                local_rotations=arrays["local_rotations"][rows], rotations=arrays["rotations"][rows],
                positions=arrays["positions"][rows], hips_rotation=arrays["hips_rotation"][rows],
                hips_position=arrays["hips_position"][rows], bridges=bridges, offsets=offsets,
                moving_links=bool(batch.moving[a]),
                animated_roles=np.array([bool(mask[r]) and rig.bone_names[rig.role_bones[r]] in animated
                                         for r in range(NUM_ROLES)]),
            )


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


def euler_sequence(matrices, order, compat=None):
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
            pb.rotation_axis_angle = blender_axis_angle(matrix_to_axis_angle(m)).tolist()
        else:
            pb.rotation_euler = euler_sequence(m[None], mode, pb.rotation_euler.copy())[0]
    if any_quat:
        pose_bones.foreach_set("rotation_quaternion", quats.ravel())
    if hips_loc is not None:
        pose_bones[rig.bone_names[int(rig.role_bones[0])]].location = hips_loc
    obj.update_tag()


def new_action(obj, name):
    """(action, slot, container): a new action with what will hold its F-curves for obj: an OBJECT slot named
    like obj and its channelbag on Blender 4.4+, the action itself (slot None) on 4.2. Not assigned to obj."""
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
    action, _slot, container = new_action(obj, name)
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
            values = blender_axis_angle(matrix_to_axis_angle(mats))
            for i in range(4):
                _key_curve(container, path + "rotation_axis_angle", i, bone, frames, values[:, i])
        else:
            e = euler_sequence(mats, mode)
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



# ---- unmapped in-between bones (CMU's CC_Base_Pelvis): given, as the hips are -------------------------------------


def inbetween_bones(rig):
    """Names of the unmapped bones of the mapped chain below the hips, each an ancestor of a mapped bone (CMU's
    CC_Base_Pelvis between CC_Base_Hip and the thighs): FK's bridges/offsets follow their pose."""
    chain = bone_chain(rig)
    between = _link_masks(rig, chain)[0]
    return [rig.bone_names[int(chain.bones[k])] for k in between]


def read_bone_values(rig, obj, action, bones, frame_start, frame_end):
    """{bone: {property: (F, width)}} channel values of `bones` (chain bones, e.g. inbetween_bones) at every frame
    frame_start..frame_end of an action, read as extraction reads them (channels without a curve keep the pose's
    current value, as Blender does): the rotation property of each bone's mode, plus location and scale where the
    action or the current pose moves them."""
    chain = bone_chain(rig)
    names = [rig.bone_names[b] for b in chain.bones]
    position = {name: k for k, name in enumerate(names)}
    first, last = int(frame_start), int(frame_end)
    channels = _channels_of(action, action_slot_for(obj, action))
    values, _ = _read_channels(rig, obj, chain, names, _current_channels(obj, names), [(action, first, last, channels)],
                               np.array([0, last - first + 1]))
    out = {}
    for bone in bones:
        k = position[bone]
        props = [rotation_property(rig.rotation_modes[rig.index[bone]])] + [p for p in ("location", "scale") if p in values]
        out[bone] = {prop: values[prop][:, k].T.copy() for prop in props}
    return out


def key_bone_values(obj, action, frames, values):
    """Key {bone: {property: (F, width)}} at `frames` (LINEAR) into `action`, a new action made by write_action
    (its slot for obj), one curve per channel grouped by bone."""
    slot = action_slot_for(obj, action)
    if slot is not None:
        from bpy_extras.anim_utils import action_ensure_channelbag_for_slot

        container = action_ensure_channelbag_for_slot(action, slot)
    else:
        container = action
    frames = np.asarray(frames, np.float64)
    for bone, props in values.items():
        path = f'pose.bones["{bpy.utils.escape_identifier(bone)}"].'
        for prop, column in props.items():
            column = np.asarray(column, np.float64)
            for i in range(column.shape[1]):
                _key_curve(container, path + prop, i, bone, frames, column[:, i])


def current_links(obj, rig):
    """Bridges (23, 3, 3) and offsets (23, 3) of the armature's current pose (its pose-bone channels: what Blender
    shows with no action assigned, as in live IK), through extraction's FK; None when the rest skeleton's hold (no
    in-between bone is off its rest pose and no mapped bone below the hips is moved or scaled)."""
    chain = bone_chain(rig)
    names = [rig.bone_names[b] for b in chain.bones]
    values = {prop: v[:, :, None] for prop, v in _current_channels(obj, names).items()}
    local = _basis_quaternions(rig, chain, values)
    if not _moving_rows(rig, chain, local, values).any():
        return None
    scaled, heads = chain.forward_scaled(quaternion_matrices(local) * values["scale"][None], values["location"])
    matrices = scaled / np.sqrt(np.sum(scaled * scaled, axis=0, keepdims=True))
    batch = PoseBatch([None], np.zeros(1), np.array([0, 1]), [(0, 0)], [set()], local, matrices, heads, np.array([True]))
    bridges, offsets = _batch_links(rig, batch, *_role_positions(rig, chain))
    return bridges[0], offsets[0]


def current_bone_values(rig, obj, bones, count):
    """{bone: {property: (count, width)}}: the current channel values of `bones` repeated `count` times (keys that
    hold an in-between bone where the solve assumed it): the rotation property of each bone's mode, plus location
    and scale where they are not at their defaults."""
    values = _current_channels(obj, bones)
    out = {}
    for k, bone in enumerate(bones):
        props = [rotation_property(rig.rotation_modes[rig.index[bone]])]
        props += [p for p, rest in (("location", 0.0), ("scale", 1.0)) if np.any(values[p][:, k] != rest)]
        out[bone] = {prop: np.repeat(values[prop][None, :, k], count, axis=0) for prop in props}
    return out
