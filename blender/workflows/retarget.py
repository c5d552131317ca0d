"""Retargeting in Blender: an imported armature's action carried onto the user's rig through both bone maps (the
math is `neural_network/data/retarget.py`). The result is a new action on the target with keys on its mapped bones,
the hips' location, and its in-between bones and the bones above the hips at their mean over the target's own clips
(at rest without clips); nothing of the target changes.

Raises DataError with a message for the user.
"""

import bpy
import numpy as np

from ...neural_network.data import retarget as core
from ...neural_network.geometry.rotations import (
    axis_angle_to_matrix,
    blender_axis_angle,
    chordal_mean,
    euler_to_matrix,
    matrix_to_axis_angle,
    matrix_to_euler,
    matrix_to_quaternion,
    quaternion_to_matrix,
)
from ...neural_network.skeleton.roles import ESSENTIAL_ROLES, ROLES
from ...neural_network.skeleton.skeleton import nearest_mapped_parents
from ..errors import DataError
from ..rig import action_layouts, bone_maps, pose_read, pose_write, rig_model
from ..rig.action_sources import action_source
from .extract import usable_actions

CALIBRATION_FRAMES = 20000                  # frames of the target's own clips read to calibrate it
POOL_FRAMES = 400                           # frames of each file that calibrates a source skeleton


def _map_of(obj, stored):
    mapping = bone_maps.bone_map_of(obj) if stored else bone_maps.auto_map(obj).mapping
    return {role: mapping.get(role, "") or "" for role in ROLES}


def _read(obj, mapping, what):
    missing = [r for r in ESSENTIAL_ROLES if not mapping.get(r)]
    if missing:
        raise DataError(f"{what} lacks the essential role{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    try:
        return rig_model.read_rig(obj, mapping)
    except rig_model.RigError as exc:
        raise DataError(f"{what}: {exc}") from None


def _own_actions(obj, rig, skip=()):
    """The target's own motion: its clips that were not retargeted from another skeleton (the user's own and BVH
    files of its own skeleton; every clip when all were retargeted), [(action, channels)], never the actions named
    in `skip`."""
    usable, _ = usable_actions(obj, rig)
    usable = [(a, c) for a, c in usable if a.name not in skip]
    return [(a, c) for a, c in usable if not action_source(a).get("retargeted")] or usable


def _own_motion(obj, rig, own):
    """(world rotations (N, 23, 3, 3), heads (N, 23, 3), [actions read]) of the clips `own`, at most
    CALIBRATION_FRAMES frames; (None, None, []) when none can be read."""
    chunks, heads, used, count = [], [], [], 0
    for (action, _), sample in zip(own, pose_read.read_actions(rig, obj, [a for a, _ in own],
                                                               channels=[c for _, c in own])):
        if not np.all(np.isfinite(sample.rotations)):
            continue
        chunks.append(sample.rotations)
        heads.append(sample.positions)
        used.append(action)
        count += len(sample.rotations)
        if count >= CALIBRATION_FRAMES:
            break
    if not chunks:
        return None, None, []
    return np.concatenate(chunks)[:CALIBRATION_FRAMES], np.concatenate(heads)[:CALIBRATION_FRAMES], used


def _mode_matrices(values, mode):
    values = np.asarray(values, np.float64)
    if mode == "QUATERNION":
        return quaternion_to_matrix(values / np.maximum(np.linalg.norm(values, axis=-1, keepdims=True), 1e-12))
    if mode == "AXIS_ANGLE":
        axis = values[:, 1:] / np.maximum(np.linalg.norm(values[:, 1:], axis=-1, keepdims=True), 1e-12)
        return axis_angle_to_matrix(axis * values[:, :1])
    return euler_to_matrix(values, mode)


def _mode_values(matrix, mode):
    if mode == "QUATERNION":
        return matrix_to_quaternion(matrix)
    if mode == "AXIS_ANGLE":
        return blender_axis_angle(matrix_to_axis_angle(matrix))
    return matrix_to_euler(matrix, mode)


def typical_pose(obj, rig, actions):
    """{bone: {property: (width,)}}: the unmapped bones the mapped ones hang from (in-between bones such as CMU's
    pelvis, bones above the hips), each at its mean over `actions` (rotation: chordal mean in the bone's mode;
    location and scale: mean); at rest (identity) without actions. Retargeted clips key them so, which keeps the
    rig's usual proportions between hips, thighs and spine where its own clips move such bones far from rest."""
    mapped = {int(b) for b in rig.role_bones if b >= 0}
    bones = [rig.bone_names[int(b)] for b in rig.needed if int(b) not in mapped]
    out = {}
    if not bones:
        return out
    gathered = {bone: {} for bone in bones}
    for action in actions:
        first, last = action_layouts.action_frame_range(action)
        for bone, props in pose_read.read_bone_values(rig, obj, action, bones, first, last).items():
            for prop, value in props.items():
                gathered[bone].setdefault(prop, []).append(value)
    for bone in bones:
        mode = rig.rotation_modes[rig.index[bone]]
        prop = rig_model.rotation_property(mode)
        values = {k: np.concatenate(v) for k, v in gathered[bone].items()}
        if prop in values:
            mean = _mode_values(chordal_mean(_mode_matrices(values[prop], mode)), mode)
        else:
            mean = {"QUATERNION": (1.0, 0.0, 0.0, 0.0), "AXIS_ANGLE": (0.0, 0.0, 1.0, 0.0)}.get(mode, (0.0, 0.0, 0.0))
        out[bone] = {prop: np.asarray(mean, np.float64),
                     "location": values["location"].mean(0) if "location" in values else np.zeros(3)}
        if "scale" in values:
            out[bone]["scale"] = values["scale"].mean(0)
    return out


def typical_frames(rig, pose):
    """(bridges (23, 3, 3) and offsets (23, 3) in character space, hips frame (4, 4) in armature space) with the
    bones of `pose` at their values and every mapped bone at identity: the frames in which the mapped bones'
    matrix_basis act, and where each mapped bone's head sits in its mapped parent's frame."""
    frames = {}
    for b in rig.needed:
        b = int(b)
        basis = np.eye(4)
        values = pose.get(rig.bone_names[b])
        if values is not None:
            mode = rig.rotation_modes[b]
            basis[:3, :3] = _mode_matrices(values[rig_model.rotation_property(mode)][None], mode)[0]
            basis[:3, :3] = basis[:3, :3] * values.get("scale", np.ones(3))[None, :]
            basis[:3, 3] = values["location"]
        parent = int(rig.parents[b])
        frames[b] = (frames[parent] if parent >= 0 else np.eye(4)) @ rig.rest_links[b] @ basis
    mask = rig.role_mask
    parents = nearest_mapped_parents(mask)
    world = {j: rig.to_character_rotations(frames[int(rig.role_bones[j])][:3, :3]) for j in np.where(mask)[0]}
    head = {j: rig.to_character_positions(frames[int(rig.role_bones[j])][:3, 3]) for j in world}
    bridges = np.broadcast_to(np.eye(3), (len(mask), 3, 3)).copy()
    offsets = np.zeros((len(mask), 3))
    for j, rotation in world.items():
        p = parents[j]
        bridges[j] = rotation if p < 0 else world[p].T @ rotation
        if p >= 0:
            offsets[j] = world[p].T @ (head[j] - head[p])
    return bridges, offsets, frames[int(rig.role_bones[0])]


class Retargeter:
    """Carries imported actions onto one target armature: its map (stored, else auto-mapped, not stored) and its
    calibration (from its own clips, else its rest pose; not from the actions named in `skip`: a file being
    imported) are read once; each source skeleton's map once."""

    def __init__(self, target, skip=()):
        self.target_name = target.name
        self.mapping = _map_of(target, stored=True)
        self.rig = _read(target, self.mapping, f"the armature {target.name!r}")
        rotations, positions, used = _own_motion(target, self.rig, _own_actions(target, self.rig, set(skip)))
        self.pose = typical_pose(target, self.rig, used)
        bridges, offsets, self.hips_frame = typical_frames(self.rig, self.pose)
        skel = self.rig.skeleton
        if rotations is None:              # no motion: the rest pose is the motion (its ankles stand on the ground)
            positions = skel.rest_positions[None]
        try:
            self.calibration = core.calibrate(skel.role_mask, skel.rest_rotations, skel.rest_positions, rotations,
                                              positions, bridges)
        except ValueError as exc:
            raise DataError(str(exc)) from None
        self.calibration.offsets = offsets
        self._source_maps, self._pools, self._calibrations, self._lifts = {}, {}, {}, {}

    def source_map(self, obj):
        key = _skeleton_key(obj)
        if key not in self._source_maps:
            self._source_maps[key] = _map_of(obj, stored=False)
        return self._source_maps[key]

    def _read_source(self, source, action):
        return read_source_motion(source, self.source_map(source), action)

    def calibrated(self, source):
        """True when files of `source`'s skeleton have their calibration (later files of that skeleton share it)."""
        return _skeleton_key(source) in self._calibrations

    def add_to_calibration(self, source, action):
        """Let one more file of a skeleton inform its calibration (before the skeleton's first file is carried)."""
        key = _skeleton_key(source)
        if key in self._calibrations:
            return
        _, _, rest, rotations, positions, hips = self._read_source(source, action)
        step = max(1, len(rotations) // POOL_FRAMES)
        # BVH joint frames (W rest^T): the importer's rest roll of end bones differs between files of one skeleton
        self._pools.setdefault(key, []).append((rotations[::step] @ np.swapaxes(rest, -1, -2)[None], positions[::step],
                                                hips[::step]))

    def _source_calibration(self, source, src_rig, rest):
        """The skeleton's calibration in joint frames (from its pooled files), expressed in this file's bones."""
        key = _skeleton_key(source)
        if key not in self._calibrations:
            joints = np.concatenate([r for r, _, _ in self._pools[key]])
            heads = np.concatenate([x for _, x, _ in self._pools[key]])
            hips = np.concatenate([h for _, _, h in self._pools[key]])
            skel = src_rig.skeleton
            eye = np.broadcast_to(np.eye(3), rest.shape)
            try:
                self._calibrations[key] = core.calibrate(skel.role_mask, eye, skel.rest_positions,
                                                         joints, heads)
            except ValueError as exc:
                raise DataError(str(exc)) from None
            self._lifts[key] = core.lift(self._calibrations[key], self.calibration, joints, hips)
            self._pools.pop(key, None)
        joint = self._calibrations[key]
        return core.Calibration(joint.mask, np.swapaxes(rest, -1, -2) @ joint.frames, rest, joint.rest_positions,
                                joint.leg_length, joint.planted_height)

    def carry(self, source, action, name):
        """A new action `name` on the target holding `action` (animating `source`, an armature of another
        skeleton) retargeted. The first file of a skeleton fixes its calibration (with the files given to
        add_to_calibration before it), so every file of a library is carried the same way. Raises DataError saying
        why a file cannot be carried over."""
        target = bpy.data.objects.get(self.target_name)
        if target is None:
            raise DataError(f"the armature {self.target_name!r} being imported onto is gone")
        if not self.calibrated(source):
            self.add_to_calibration(source, action)
        src_rig, sample, rest, rotations, _positions, hips = self._read_source(source, action)
        calibration = self._source_calibration(source, src_rig, rest)
        local, _world, hips = core.retarget(calibration, self.calibration, rotations, hips,
                                            lift_by=self._lifts[_skeleton_key(source)])
        return write_retargeted(target, self.rig, name, sample.frames, local, hips, self.pose, self.hips_frame)


def read_source_motion(source, mapping, action):
    """An imported armature's action in the retarget's terms: (rig, sample, turned rest rotations (23, 3, 3), turned
    world rotations (F, 23, 3, 3), turned heads (F, 23, 3), turned hips (F, 3)); a file written with another up axis
    is stood up. Raises DataError for a skeleton without the essential roles or keys that are not finite."""
    src_rig = _read(source, mapping, "its skeleton")
    sample = pose_read.read_action(src_rig, source, action)
    if not (np.all(np.isfinite(sample.rotations)) and np.all(np.isfinite(sample.hips_position))):
        raise DataError("its keys hold NaN or infinite values")
    turn = core.upright_turn(sample.positions)
    rest = turn @ src_rig.skeleton.rest_rotations
    return (src_rig, sample, rest, turn @ sample.rotations, sample.positions @ turn.T,
            sample.hips_position @ turn.T)


def source_map(obj):
    """The bone map of an imported armature of another skeleton (auto-detected, not stored)."""
    return _map_of(obj, stored=False)


def _skeleton_key(obj):
    return tuple((b.name, b.parent.name if b.parent else "") for b in obj.data.bones)


def write_retargeted(obj, rig, name, frames, local, hips_position, pose, hips_frame):
    """A new action on obj: local rotations (F, 23, 3, 3) of the mapped bones (matrix_basis), the hips at
    character-space positions (F, 3) given its frame `hips_frame` (typical_frames), and the bones of `pose`
    (typical_pose) keyed at their values."""
    action = pose_write.write_action(obj, rig, name, frames, local)
    armature = (np.asarray(hips_position, np.float64) @ rig.basis) / rig.scale
    location = np.linalg.solve(hips_frame[:3, :3], (armature - hips_frame[:3, 3]).T).T
    hips = rig.bone_names[int(rig.role_bones[0])]
    pose_write.key_bone_values(obj, action, frames, {hips: {"location": location}})
    if pose:
        ends = np.asarray(frames, np.float64)[[0, -1]]
        pose_write.key_bone_values(obj, action, ends, {bone: {prop: np.tile(value, (2, 1)) for prop, value in props.items()}
                                                       for bone, props in pose.items()})
    return action
