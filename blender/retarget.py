"""Retargeting in Blender: an imported armature's action carried onto the user's rig through both bone maps (the
math is `neural_network/data/retarget.py`). The result is a new action on the target with keys on its mapped bones,
the hips' location, and its in-between bones and the bones above the hips at rest; nothing of the target changes.

Raises DataError with a message for the user.
"""

import bpy
import numpy as np

from ..neural_network.data import retarget as core
from ..neural_network.skeleton.roles import ESSENTIAL_ROLES, ROLES
from . import bone_maps, pose_read, pose_write, rig_model
from .action_sources import action_source
from .errors import DataError
from .extract import usable_actions

CALIBRATION_FRAMES = 20000                  # frames of the target's own clips read to calibrate it


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


def _calibration(rig, rotations=None, positions=None):
    skel = rig.skeleton
    if rotations is None:              # no motion: the rest pose is the motion (its ankles stand on the ground)
        positions = skel.rest_positions[None]
    try:
        return core.calibrate(skel.role_mask, skel.rest_rotations, skel.rest_positions, rotations, positions)
    except ValueError as exc:
        raise DataError(str(exc)) from None


def _own_motion(obj, rig, skip=()):
    """(world rotations (N, 23, 3, 3), heads (N, 23, 3)) of the target's own clips (its library imports when it has
    no own clip), at most CALIBRATION_FRAMES frames; (None, None) when no action moves its mapped bones."""
    usable, _ = usable_actions(obj, rig)
    usable = [(a, c) for a, c in usable if a.name not in skip]
    own = [(a, c) for a, c in usable if action_source(a)["kind"] == "own"] or usable
    chunks, heads, count = [], [], 0
    for sample in pose_read.read_actions(rig, obj, [a for a, _ in own], channels=[c for _, c in own]):
        if not np.all(np.isfinite(sample.rotations)):
            continue
        chunks.append(sample.rotations)
        heads.append(sample.positions)
        count += len(sample.rotations)
        if count >= CALIBRATION_FRAMES:
            break
    if not chunks:
        return None, None
    return np.concatenate(chunks)[:CALIBRATION_FRAMES], np.concatenate(heads)[:CALIBRATION_FRAMES]


class Retargeter:
    """Carries imported actions onto one target armature: its map (stored, else auto-mapped, not stored) and its
    calibration (from its own clips, else its rest pose; not from the actions named in `skip`: a file being
    imported) are read once; each source skeleton's map once."""

    def __init__(self, target, skip=()):
        self.target_name = target.name
        self.mapping = _map_of(target, stored=True)
        self.rig = _read(target, self.mapping, f"the armature {target.name!r}")
        self.calibration = _calibration(self.rig, *_own_motion(target, self.rig, set(skip)))
        self._source_maps = {}

    def source_map(self, obj):
        key = tuple((b.name, b.parent.name if b.parent else "") for b in obj.data.bones)
        if key not in self._source_maps:
            self._source_maps[key] = _map_of(obj, stored=False)
        return self._source_maps[key]

    def carry(self, source, action, name):
        """A new action `name` on the target holding `action` (animating `source`, an armature of another
        skeleton) retargeted. Raises DataError saying why a file cannot be carried over."""
        target = bpy.data.objects.get(self.target_name)
        if target is None:
            raise DataError(f"the armature {self.target_name!r} being imported onto is gone")
        src_rig = _read(source, self.source_map(source), "its skeleton")
        sample = pose_read.read_action(src_rig, source, action)
        if not (np.all(np.isfinite(sample.rotations)) and np.all(np.isfinite(sample.hips_position))):
            raise DataError("its keys hold NaN or infinite values")
        turn = core.upright_turn(sample.positions)             # a file written with another up axis
        rotations, positions = turn @ sample.rotations, sample.positions @ turn.T
        skel = src_rig.skeleton
        try:
            calibration = core.calibrate(skel.role_mask, turn @ skel.rest_rotations, skel.rest_positions @ turn.T,
                                         rotations, positions)
        except ValueError as exc:
            raise DataError(str(exc)) from None
        local, _world, hips = core.retarget(calibration, self.calibration, rotations, sample.hips_position @ turn.T)
        return write_retargeted(target, self.rig, name, sample.frames, local, hips)


def write_retargeted(obj, rig, name, frames, local, hips_position):
    """A new action on obj: local rotations (F, 23, 3, 3) of the mapped bones (the hips' relative to its rest), the
    hips at character-space positions (F, 3), and every other bone the mapped bones hang from keyed at rest."""
    action = pose_write.write_action(obj, rig, name, frames, local)
    hips = int(rig.role_bones[0])
    rest = rig.rest[hips]
    rot = rest[:3, :3] / np.linalg.norm(rest[:3, :3], axis=0)
    armature = (np.asarray(hips_position, np.float64) @ rig.basis) / rig.scale
    location = (armature - rest[:3, 3]) @ rot          # R^T (x - t), rows
    values = {rig.bone_names[hips]: {"location": location}}
    mapped = set(int(b) for b in rig.role_bones if b >= 0)
    ends = np.asarray(frames, np.float64)[[0, -1]]
    for b in rig.needed:
        b = int(b)
        if b in mapped:
            continue
        mode = rig.rotation_modes[b]
        prop = rig_model.rotation_property(mode)
        identity = {"QUATERNION": (1.0, 0.0, 0.0, 0.0), "AXIS_ANGLE": (0.0, 0.0, 1.0, 0.0)}.get(mode, (0.0, 0.0, 0.0))
        values[rig.bone_names[b]] = {prop: np.tile(identity, (2, 1)), "location": np.zeros((2, 3))}
    pose_write.key_bone_values(obj, action, frames, {k: v for k, v in values.items() if k == rig.bone_names[hips]})
    rest_values = {k: v for k, v in values.items() if k != rig.bone_names[hips]}
    if rest_values:
        pose_write.key_bone_values(obj, action, ends, rest_values)
    return action

