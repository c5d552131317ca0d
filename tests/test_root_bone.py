"""A plain rig whose hips move under a root bone above them (game rigs' `root`, BVH conversions with a root joint):
the hips' place is the evaluated hips bone, whatever moves it, in extraction and in a bake from an action."""

import math

import numpy as np
from live_helpers import assign_action, demo_armature, drive_with, evaluated_effectors, linear_model_for, runs


def _add_moving_root(obj, action, frames):
    """A bone `root` at the origin above the demo rig's Hips, keyed in `action` (travel, bob and a turn)."""
    import bpy

    bpy.context.view_layer.objects.active = obj
    bpy.ops.object.mode_set(mode="EDIT")
    edit = obj.data.edit_bones
    root = edit.new("root")
    root.head, root.tail = (0, 0, 0), (0, 0.3, 0)
    edit["Hips"].parent = root
    bpy.ops.object.mode_set(mode="OBJECT")
    assign_action(obj, action)
    pb = obj.pose.bones["root"]
    pb.rotation_mode = "QUATERNION"
    for f in frames:
        t = (f - frames[0]) / max(len(frames) - 1, 1)
        pb.location = (0.4 * t, 0.1 * math.sin(6 * t), 0.05 * math.sin(9 * t))
        pb.rotation_quaternion = (math.cos(0.4 * t), 0.05 * math.sin(5 * t), 0.0, math.sin(0.4 * t))
        pb.keyframe_insert("location", frame=f)
        pb.keyframe_insert("rotation_quaternion", frame=f)


def test_hips_under_a_moving_root_extract_and_bake(empty_scene):
    import bpy

    from neural_ik.blender import models
    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.blender.workflows.extract import extract_dataset
    from neural_ik.properties import get_bone_map

    obj = demo_armature()
    names = sorted(a.name for a in bpy.data.actions)
    source = bpy.data.actions[names[0]]
    first, last = (int(v) for v in source.frame_range)
    frames = list(range(first, min(last, first + 23) + 1))
    _add_moving_root(obj, source, frames)
    mapping = get_bone_map(obj)
    rig = rig_model.read_rig(obj, mapping)
    assert not rig.driven                                     # a plain rig keeps the key-reading path
    dataset, _ = extract_dataset(bpy.context, obj, mapping, actions=[source.name])
    rows = np.isin(dataset.frame, frames)
    assign_action(obj, source)
    heads = []
    for f in dataset.frame[rows]:
        bpy.context.scene.frame_set(int(f))
        heads.append(pose_read.armature_pose_heads(obj, rig))
    height = dataset.skeleton.height
    assert np.max(np.abs(dataset.positions[rows] - np.array(heads))) < 1e-4 * height
    assert np.ptp(dataset.hips_position[rows, 0]) > 0.3          # the root's travel is in the hips' input

    train = [pose_read.read_action(rig, obj, bpy.data.actions[n]) for n in names]
    model = linear_model_for(rig.skeleton, train)
    drive_with(obj, model)
    try:
        assert bpy.ops.neural_ik.bake(source_action=source.name, frame_start=frames[0], frame_end=frames[-1],
                                      refine_iterations=4) == {"FINISHED"}
        assert runs(obj, model)                    # the model fitted to this rig's clips, not the shipped one
    finally:
        models.loaded_models.pop(obj.name, None)
    baked = obj.animation_data.action
    want = evaluated_effectors(obj, rig, source, frames)
    got = evaluated_effectors(obj, rig, baked, frames)
    assign_action(obj, source)
    bpy.context.scene.frame_set(frames[5])
    hips_source = pose_read.armature_pose_heads(obj, rig)[0]
    assign_action(obj, baked)
    bpy.context.scene.frame_set(frames[5])
    assert np.max(np.abs(pose_read.armature_pose_heads(obj, rig)[0] - hips_source)) < 1e-4 * height
    assert np.max(np.linalg.norm(got - want, axis=-1)) < 1e-3
