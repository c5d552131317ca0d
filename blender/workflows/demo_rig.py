"""Build the demo rig in Blender: the 54-bone armature of `neural_network.demo_motion` and all its actions.

Why: the extension must be able to train with no data of the user's. The rig and the motion are computed in the
core (pure NumPy, deterministic from a seed); this module only turns them into Blender data: edit bones from
head/tail/roll, pose bones in quaternion mode, and one real action per motion with a key on every frame.
Actions are slotted actions in Blender 5 (one slot for the armature object) and plain F-curve actions in 4.2.
"""

import bpy
import numpy as np

from ...neural_network.data import demo_motion, demo_skeleton
from ...neural_network.skeleton import bone_map
from ...properties import set_bone_map


def build_armature(context, name, bones):
    """A new armature object `name` in the scene, active and the only one selected, from edit bones [(name, parent
    or None, head, tail, roll, connected)] (parents first; armature space); its pose bones in quaternion mode."""
    data = bpy.data.armatures.new(name)
    obj = bpy.data.objects.new(name, data)
    context.scene.collection.objects.link(obj)
    view_layer = context.view_layer
    for other in view_layer.objects:
        other.select_set(False)
    view_layer.objects.active = obj
    obj.select_set(True)
    bpy.ops.object.mode_set(mode="EDIT")
    try:
        edit_bones = data.edit_bones
        for bone_name, parent, head, tail, roll, connect in bones:
            bone = edit_bones.new(bone_name)
            bone.head, bone.tail, bone.roll = head, tail, roll
            if parent:
                bone.parent = edit_bones[parent]
                bone.use_connect = connect
    finally:
        bpy.ops.object.mode_set(mode="OBJECT")
    for pose_bone in obj.pose.bones:
        pose_bone.rotation_mode = "QUATERNION"
    return obj


def _fcurve_collection(action, obj):
    """(F-curves, slot or None, group keyword): a channelbag for a new object slot in Blender 5, action.fcurves in 4.2."""
    if hasattr(action, "slots"):
        from bpy_extras.anim_utils import action_ensure_channelbag_for_slot

        slot = action.slots.new(id_type="OBJECT", name=obj.name)
        return action_ensure_channelbag_for_slot(action, slot).fcurves, slot, "group_name"
    return action.fcurves, None, "action_group"


def _add_curve(fcurves, group_keyword, data_path, index, group, frames, values):
    curve = fcurves.new(data_path, index=index, **{group_keyword: group})
    curve.keyframe_points.add(len(frames))
    co = np.empty((len(frames), 2), dtype=np.float32)
    co[:, 0], co[:, 1] = frames, values
    curve.keyframe_points.foreach_set("co", co.ravel())
    curve.update()


def _write_action(obj, motion):
    action = bpy.data.actions.new(motion.name)
    action.use_fake_user = True
    fcurves, slot, group_keyword = _fcurve_collection(action, obj)
    frames = np.arange(motion.frame_start, motion.frame_end + 1, dtype=np.float32)
    for i, bone_name in enumerate(demo_skeleton.BONE_NAMES):
        if bone_name in demo_skeleton.END_BONES:
            continue
        path = f'pose.bones["{bone_name}"].rotation_quaternion'
        for k in range(4):
            _add_curve(fcurves, group_keyword, path, k, bone_name, frames, motion.rotations[:, i, k])
    for k in range(3):
        _add_curve(fcurves, group_keyword, 'pose.bones["Hips"].location', k, "Hips", frames, motion.hips_location[:, k])
    return action, slot


def create_demo_rig(context, seed=0, name="NeuralIK_Demo", reach_clips=0):
    """Create the demo armature with every demo action for `seed`; the same seed gives identical keys."""
    return build_demo(context, seed, name, reach_clips)[0]


def build_demo(context, seed=0, name="NeuralIK_Demo", reach_clips=0):
    """(armature object, [bpy actions]) of a new demo rig; see create_demo_rig. reach_clips: add that many actions of
    hands reaching all around the body (demo_motion.generate_reach_actions) after the standard ones."""
    motions = demo_motion.generate_actions(seed)
    if reach_clips:
        motions += demo_motion.generate_reach_actions(seed, reach_clips)
    obj = build_armature(context, name, demo_skeleton.rig_bones())
    written = [_write_action(obj, motion) for motion in motions]
    obj.animation_data_create()
    first_action, first_slot = written[0]
    obj.animation_data.action = first_action
    if first_slot is not None:
        obj.animation_data.action_slot = first_slot
    scene = context.scene
    scene.render.fps, scene.render.fps_base = demo_motion.FPS, 1.0
    scene.frame_start, scene.frame_end = motions[0].frame_start, motions[0].frame_end
    bones = [(b.name, b.parent.name if b.parent else None) for b in obj.data.bones]
    result = bone_map.auto_map(bones, {b.name: tuple(b.head_local) for b in obj.data.bones})
    set_bone_map(obj, result.mapping)
    obj.neural_ik.preset = result.preset
    scene.neural_ik.armature = obj
    return obj, [action for action, _slot in written]
