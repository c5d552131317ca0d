"""Writing poses and keys: a solved pose onto the mapped bones (`write_pose`), and a new action of solved frames
(`write_action`), in each bone's own rotation mode.
"""

import bpy
import numpy as np

from ...neural_network.geometry.rotations import blender_axis_angle, matrix_to_axis_angle, matrix_to_quaternion
from ...neural_network.skeleton.roles import NUM_ROLES
from .action_layouts import _key_curve, action_slot_for, new_action
from .rig_model import _normalized_columns


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

def write_action(obj, rig, name, frames, local_rotations, hips_rotation=None, hips_position=None, key_hips=True):
    """Key the mapped bones' rotations (F, 23, 3, 3) (and the hips' character-space transform) at `frames` into a
    NEW action (slotted on Blender 5) that is returned; the object's assigned action is not changed.

    The hips' location/rotation keys are solved against the current pose of the hips' parent (a rig whose hips
    have an animated parent should have that parent's action assigned while baking). key_hips=False leaves the hips
    bone out (the caller keys it, as a bake from an action whose hips move under a root bone does).
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
        if b < 0 or (r == 0 and not key_hips):
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
    if hips_position is not None and key_hips:
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
