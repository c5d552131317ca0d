"""Reading poses: every frame of many actions at once, and Blender's own evaluated pose.

Reading an action never calls `scene.frame_set` and never changes the user's data: the F-curves of a temporary copy
of the action are sampled with `convert_to_samples` (Blender's own curve evaluation, all frames in one call) and the
copy is removed. Bone transforms then follow from a NumPy forward kinematics over the *whole* armature, the same
formula Blender uses: pose_j = pose_parent @ (rest_parent^-1 @ rest_j) @ basis_j.
"""

from dataclasses import dataclass

import bpy
import numpy as np

from ...neural_network.data.dataset import ActionBatch
from ...neural_network.geometry.armature_fk import (
    axis_angle_quaternions,
    compute_dtype,
    euler_quaternions,
    normalized,
    product,
    quaternion_axis_angles,
    quaternion_matrices,
)
from ...neural_network.geometry.rotations import matrix_to_quaternion
from ...neural_network.skeleton.roles import EFFECTOR_ROLES, NUM_ROLES
from ...neural_network.skeleton.skeleton import nearest_mapped_parents
from . import evaluated_pose
from .action_layouts import CHANNEL_WIDTHS, _channels_of, action_frame_range, action_slot_for
from .rig_model import RigError, _link_masks, bone_chain, rotation_property

# A moving in-between bone changes bridges/offsets by more than this (radians / fraction of rig height): then the
# dataset carries them per frame.
MOVING_TOLERANCE = 1e-6

# Frames evaluated together: enough to amortise the per-call cost of NumPy over many actions, few enough that each
# (bones x frames) temporary stays below the allocator's mmap threshold (fresh pages for every temporary cost more
# than the arithmetic: about 9x for a 23-bone quaternion-to-matrix step at 2500 frames; 4096 measured slower).
BATCH_FRAMES = 2048

# Evaluated pose (a driven rig): role offsets that move by more than this fraction of the rig height make an action's
# links per frame (Blender's evaluated matrices are float32).
EVALUATED_TOLERANCE = 1e-5

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
    make_batch = _pose_batch if not rig.driven else _evaluated_pose_batch
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
            yield make_batch(rig, obj, chain, names, current, pending, dtype, keep_rotations)
            pending, pending_frames = [], 0
    if pending:
        yield make_batch(rig, obj, chain, names, current, pending, dtype, keep_rotations)

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

def role_locals(rig, rotations):
    """(F, 23, 3, 3) local rotations of a driven rig's roles from their evaluated armature-space orientations
    (F, 23, 3, 3): L_j = bridge_j^T R_p^T R_j against the nearest mapped parent role p (the hips against their rest),
    so the role chain's FK reproduces the evaluated orientations whatever Blender's parent links are. Extract stores
    these for such a rig; the model's mean pose and limits are in them."""
    mask = rig.role_mask
    parents = nearest_mapped_parents(mask)
    out = np.broadcast_to(np.eye(3), rotations.shape).copy()
    for j in np.flatnonzero(mask):
        p = parents[j]
        if p < 0:
            rest = rig.rest[rig.role_bones[j], :3, :3]
            out[:, j] = (rest / np.linalg.norm(rest, axis=0)).T @ rotations[:, j]
        else:
            out[:, j] = rig.skeleton.bridges[j].T @ np.swapaxes(rotations[:, p], -1, -2) @ rotations[:, j]
    return out


def _evaluated_pose_batch(rig, obj, chain, names, current, pending, dtype=np.float64, keep_rotations=None):
    """The PoseBatch of a rig whose mapped bones are driven (rig.driven): Blender's evaluated pose of the chain's
    bones (evaluated_pose; the scene is left as it was), with each role's local rotation taken against its *role*
    parent (role_locals). Actions whose role offsets move (stretch) are marked moving: their per-frame
    bridges/offsets go into the dataset."""
    counts = np.array([last - first + 1 for _, first, last, _ in pending])
    starts = np.concatenate([[0], np.cumsum(counts)])
    frames = np.concatenate([np.arange(first, last + 1) for _, first, last, _ in pending])
    order = {pb.name: i for i, pb in enumerate(obj.pose.bones)}
    with evaluated_pose.KeptScene(bpy.context.scene, obj):
        mats = evaluated_pose.evaluated_matrices(bpy.context.scene, obj, [(a, first, last) for a, first, last, _ in pending],
                                                 [order[n] for n in names])
    heads = mats[:, :3, 3].transpose(1, 0, 2)                                      # (3, K, N)
    rot = mats[:, :3, :3]
    rot = rot / np.sqrt(np.sum(rot * rot, axis=1, keepdims=True))                 # columns normalised
    matrices = rot.transpose(1, 2, 0, 3)                                            # (3, 3, K, N)
    K, N = len(names), len(frames)
    local = np.zeros((4, K, N))
    local[0] = 1.0
    roles, ks = _role_positions(rig, chain)
    world = np.moveaxis(rot[ks], -1, 0)                                              # (N, R, 3, 3)
    skel = rig.skeleton
    parents = nearest_mapped_parents(rig.role_mask)
    place = {int(r): i for i, r in enumerate(roles)}
    by_role = np.broadcast_to(np.eye(3), (N, NUM_ROLES, 3, 3)).copy()
    by_role[:, roles] = world
    rel = role_locals(rig, by_role)[:, roles]
    local[:, ks] = np.moveaxis(matrix_to_quaternion(rel), -1, 0).transpose(0, 2, 1)
    children = [i for i, r in enumerate(roles.tolist()) if parents[r] >= 0]
    moving = np.zeros(len(pending), bool)
    if children:
        kj = ks[children]
        kp = ks[[place[int(parents[roles[i]])] for i in children]]
        d = heads[:, kj] - heads[:, kp]                                                  # (3, C, N)
        offsets = rig.scale * np.einsum("ackn,akn->ckn", matrices[:, :, kp], d)          # R_p^T d
        rest = skel.offsets[roles[children]].T[:, :, None]
        rows = np.any(np.abs(offsets - rest) > EVALUATED_TOLERANCE * skel.height, axis=(0, 1))
        moving = np.logical_or.reduceat(rows, starts[:-1])
    animated = [{rig.bone_names[b] for b in rig.role_bones if b >= 0}] * len(pending)
    return PoseBatch([p[0] for p in pending], frames, starts, [(p[1], p[2]) for p in pending], animated,
                     local.astype(dtype), matrices.astype(dtype), heads.astype(dtype), moving)

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
