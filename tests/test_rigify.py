"""Rigify, generated in the bpy wheel from Blender's human meta-rig (once per session, tests/conftest.py): auto-map,
and extraction reading Blender's evaluated pose of the DEF- bones (their keys live on controls)."""

import numpy as np
from rigify_helpers import RIGIFY_MAP, key_controls
from test_rig_io import state_hash


def _evaluated_heads(obj, frames, bones):
    """(F, B, 3) heads of `bones` from Blender's evaluated pose at each frame (the naive frame_set loop)."""
    import bpy

    scene = bpy.context.scene
    now = scene.frame_current
    out = np.empty((len(frames), len(bones), 3))
    for i, f in enumerate(frames):
        scene.frame_set(int(f))
        ev = obj.evaluated_get(bpy.context.evaluated_depsgraph_get())
        out[i] = [tuple(ev.pose.bones[b].head) for b in bones]
    scene.frame_set(now)
    return out


def test_auto_map_maps_the_deform_bones(rigify_rig):
    import bpy

    from neural_ik.blender.bone_maps import bone_map_of

    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    assert bone_map_of(rigify_rig) == RIGIFY_MAP


def test_extract_reads_the_evaluated_deform_bones_and_leaves_the_scene(rigify_rig):
    import bpy

    from neural_ik.blender import rig_model
    from neural_ik.blender.evaluated_pose import number_properties
    from neural_ik.blender.extract import extract_dataset
    from neural_ik.neural_network.geometry import kinematics
    from neural_ik.neural_network.skeleton.roles import ROLES

    obj = rigify_rig
    key_controls(obj, "sway", frames=12, seed=1)
    bpy.context.scene.frame_set(5)
    obj.pose.bones["upper_arm_parent.L"]["IK_FK"] = 0.25          # a switch the user left half-way
    before, switches = state_hash(obj), number_properties(obj)
    rig = rig_model.read_rig(obj, RIGIFY_MAP)
    assert rig.driven and "constraints" in rig.driven[0]
    dataset, notes = extract_dataset(bpy.context, obj, dict(RIGIFY_MAP))
    assert state_hash(obj) == before and number_properties(obj) == switches
    assert any("evaluated pose" in n for n in notes)
    assert dataset.meta["pose_source"].startswith("evaluated")
    assert list(dataset.action_names) == ["sway"] and len(dataset) == 12
    height = dataset.skeleton.height
    bones = [RIGIFY_MAP[r] for r in ROLES]
    expected = _evaluated_heads(obj, dataset.frame, bones) @ rig.basis.T * rig.scale
    assert np.max(np.abs(dataset.positions - expected)) < 1e-4 * height
    # the role chain's FK (the network's) reproduces them from the stored local rotations
    from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix

    pose = kinematics.forward(dataset.skeleton, axis_angle_to_matrix(dataset.rotations.astype(np.float64)),
                              dataset.hips_rotation.astype(np.float64), dataset.hips_position.astype(np.float64),
                              dataset.arrays.get("bridges"), dataset.arrays.get("offsets"))
    assert np.max(np.abs(pose.positions - expected)) < 1e-4 * height
