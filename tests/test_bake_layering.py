"""Layering in Bake on the demo rig: a walk plays with the right hand pinned to an empty (influence 1), and with the
pin faded in over 10 frames (keyed influence), measured from Blender's evaluated pose."""

import numpy as np
import pytest
from live_helpers import assign_action, demo_armature, evaluated_effectors, follow_empties

from neural_ik.neural_network.skeleton.roles import EFFECTORS

RIGHT_HAND = EFFECTORS.index("RightHand")


@pytest.fixture
def walk_with_pin(empty_scene):
    """The demo rig with its targets, and the right hand's empty keyed along a rail: a straight line at hip height
    beside the walk's path, held 25 cm to the side of the hips and 15 cm ahead (a hand sliding on a banister)."""
    import bpy

    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.properties import get_bone_map

    obj = demo_armature()
    walk = bpy.data.actions["walk_normal_03"]
    assign_action(obj, walk)
    start, end = (int(f) for f in walk.frame_range)
    bpy.context.scene.frame_set(start)
    bpy.ops.neural_ik.create_targets()
    follow_empties(obj, 0.0, 0.0)                # the walk plays; only the right hand will be pinned
    pin = obj.neural_ik.target_right_hand
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    hips = pose_read.read_action(rig, obj, walk).hips_position
    forward = hips[-1] - hips[0]
    forward[2] = 0.0
    forward /= np.linalg.norm(forward)
    side = np.cross(forward, [0.0, 0.0, 1.0])
    height = hips[:, 2].mean() + 0.05
    for i, frame in enumerate(range(start, end + 1)):
        along = hips[0] + forward * float(np.dot(hips[i] - hips[0], forward))
        pin.location = tuple(along + 0.25 * side + 0.15 * forward)
        pin.location.z = height
        pin.keyframe_insert("location", frame=frame)
    return obj, walk, pin


def _largest_turns(obj, action, frames):
    """(F - 1,) the largest change of any mapped bone's local rotation between two frames (degrees)."""
    import bpy

    from neural_ik.blender.rig import rig_model
    from neural_ik.properties import get_bone_map

    rig = rig_model.read_rig(obj, get_bone_map(obj))
    assign_action(obj, action)
    local = []
    for f in frames:
        bpy.context.scene.frame_set(int(f))
        local.append([np.array(obj.pose.bones[rig.bone_names[b]].matrix_basis.to_3x3()) for b in rig.role_bones
                      if b >= 0])
    local = np.array(local)
    rel = np.swapaxes(local[:-1], -1, -2) @ local[1:]
    return np.degrees(np.arccos(np.clip((np.trace(rel, axis1=-2, axis2=-1) - 1) / 2, -1, 1))).max(axis=1)


def test_a_pinned_hand_stays_on_its_empty_while_the_walk_plays(walk_with_pin):
    import bpy

    from neural_ik.blender.rig import rig_model
    from neural_ik.properties import get_bone_map

    obj, walk, pin = walk_with_pin
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    start, end = (int(f) for f in walk.frame_range)
    frames = list(range(start, end + 1))
    clip = evaluated_effectors(obj, rig, walk, frames)
    obj.neural_ik.layer_right_hand.position = 1.0
    obj.neural_ik.layer_right_hand.rotation = 1.0
    assign_action(obj, walk)
    assert bpy.ops.neural_ik.bake(source_action=walk.name, refine_iterations=4) == {"FINISHED"}
    baked = evaluated_effectors(obj, rig, obj.animation_data.action, frames)
    empty = []
    for f in frames:
        bpy.context.scene.frame_set(f)
        empty.append(rig.to_character_positions(np.array(pin.matrix_world.translation)))
    empty = np.array(empty)
    hand = np.linalg.norm(baked[:, RIGHT_HAND] - empty, axis=-1)
    others = [k for k in range(5) if k != RIGHT_HAND]
    rest = np.linalg.norm(baked[:, others] - clip[:, others], axis=-1)
    moved = np.linalg.norm(clip[:, RIGHT_HAND] - empty, axis=-1)
    print(f"\npinned hand: {hand.max() * 1000:.3f} mm from its empty (the walk's hand passes {moved.min() * 100:.0f}-"
          f"{moved.max() * 100:.0f} cm from it); other effectors {rest.max() * 1000:.3f} mm from the walk's")
    assert moved.max() > 0.1                     # the rail is somewhere the walk's hand is not
    assert hand.max() < 1e-3 and rest.max() < 1e-3


def test_a_pin_faded_in_over_ten_frames_does_not_pop(walk_with_pin):
    import bpy

    from neural_ik.blender.rig import action_layouts

    obj, walk, _pin = walk_with_pin
    start, end = (int(f) for f in walk.frame_range)
    frames = list(range(start, end + 1))
    layer = obj.neural_ik.layer_right_hand
    # the influences keyed on the armature (its own action holds the pose keys: a copy of the walk takes them)
    keyed = walk.copy()
    keyed.name = "walk_with_pin"
    assign_action(obj, keyed)
    for frame, value in ((start + 30, 0.0), (start + 40, 1.0)):
        layer.position = layer.rotation = value
        obj.keyframe_insert('neural_ik.layer_right_hand.position', frame=frame)
        obj.keyframe_insert('neural_ik.layer_right_hand.rotation', frame=frame)
    assert any(fc.data_path.startswith("neural_ik.layer_") for fc in action_layouts.all_action_fcurves(keyed))
    assert bpy.ops.neural_ik.bake(source_action=keyed.name, refine_iterations=4) == {"FINISHED"}
    baked = obj.animation_data.action
    turns, clip_turns = _largest_turns(obj, baked, frames), _largest_turns(obj, walk, frames)
    print(f"\nfade-in: largest turn {turns.max():.1f} deg (during the fade {turns[29:41].max():.1f}), "
          f"the walk's own {clip_turns.max():.1f}")
    assert turns.max() <= 1.5 * clip_turns.max()
