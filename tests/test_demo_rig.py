"""The demo rig in real Blender: its bones, its actions, and that Blender's own pose is the pose the core solved."""

import numpy as np
import pytest

from neural_ik.neural_network.data import demo_motion, demo_skeleton
from neural_ik.neural_network.skeleton.roles import ROLES, TASKS, task_from_name


def _make_rig(seed=0):
    import bpy

    bpy.ops.neural_ik.create_demo_rig(seed=seed)
    return bpy.context.scene.neural_ik.armature


def _all_keys(obj):
    """{(action, data_path, index): keyframe co array} for every demo action (names without Blender's .001)."""
    import bpy

    from neural_ik.blender.rig import action_layouts

    keys = {}
    for action in bpy.data.actions:
        for fc in action_layouts.all_action_fcurves(action):
            co = np.empty(2 * len(fc.keyframe_points), dtype=np.float32)
            fc.keyframe_points.foreach_get("co", co)
            keys[(action.name, fc.data_path, fc.array_index)] = co
    return keys


def _use_action(obj, name):
    import bpy

    from neural_ik.blender.rig import action_layouts

    action = bpy.data.actions[name]
    action_layouts.assign_action(obj, action)
    return action


def test_demo_rig_bones_match_the_core_definition(empty_scene):
    from mathutils import Matrix  # noqa: F401  (bpy's own math: the comparison target)

    obj = _make_rig()
    bones = obj.data.bones
    assert len(bones) == 54
    assert set(ROLES) <= set(bones.keys())
    assert set(demo_skeleton.END_BONES) <= set(bones.keys())
    assert sum(1 for b in bones if "Hand" in b.name and b.name[-1].isdigit()) == 28
    for i, name in enumerate(demo_skeleton.BONE_NAMES):
        bone = bones[name]
        rest = np.array(bone.matrix_local)
        np.testing.assert_allclose(rest[:3, :3], demo_skeleton.REST_FRAMES[i], atol=1e-5, err_msg=name)
        np.testing.assert_allclose(rest[:3, 3], demo_skeleton.REST_HEADS[i], atol=1e-6, err_msg=name)
        parent = demo_skeleton.BONES[i].parent
        assert (bone.parent.name if bone.parent else "") == parent
    assert all(pb.rotation_mode == "QUATERNION" for pb in obj.pose.bones)
    # standing height of a human in metres, feet on the ground
    assert 1.7 < bones["HeadTop_End"].tail_local.z < 1.9
    assert abs(bones["LeftToeBase"].head_local.z) < 0.05


def test_actions_are_real_slotted_actions_over_all_six_tasks(empty_scene):
    import bpy

    obj = _make_rig()
    actions = list(bpy.data.actions)
    assert 20 <= len(actions) <= 30
    assert {TASKS[task_from_name(a.name)] for a in actions} == set(TASKS)
    for action in actions:
        assert action.use_fake_user
        start, end = action.frame_range
        assert 60 <= end - start + 1 <= 120
        assert len(getattr(action, "slots", [None])) == 1     # Blender 4.2's actions have no slots
    first = bpy.data.actions[demo_motion.generate_actions(0)[0].name]
    assert obj.animation_data.action == first
    if hasattr(first, "slots"):
        assert obj.animation_data.action_slot == first.slots[0]
    assert empty_scene.render.fps == 30
    assert empty_scene.neural_ik.armature == obj
    stored = {item.role: item.bone for item in obj.neural_ik.bone_map}
    assert stored == {role: role for role in ROLES}


def test_same_seed_same_keys_other_seed_other_keys(empty_scene):
    import bpy

    first = _all_keys(_make_rig(seed=7))
    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    again = _all_keys(_make_rig(seed=7))
    assert first.keys() == again.keys()
    assert all(np.array_equal(first[k], again[k]) for k in first)
    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    other = _all_keys(_make_rig(seed=8))
    assert first.keys() == other.keys()
    # every action moves differently under another seed (its heading and parameters are drawn from the seed)
    for action in {k[0] for k in first}:
        thigh = [k for k in first if k[0] == action and '"LeftThigh"' in k[1]]
        assert any(not np.allclose(first[k], other[k], atol=1e-4) for k in thigh), action


@pytest.mark.parametrize("prefix", ["walk_", "run_", "crouch_", "jump_"])
def test_blender_pose_puts_the_feet_on_the_solved_ankle_targets(empty_scene, prefix):
    """Blender evaluates the keys into the pose the core solved: ankles on their (planted) targets."""
    obj = _make_rig(seed=0)
    motion = next(m for m in demo_motion.generate_actions(0) if m.name.startswith(prefix))
    _use_action(obj, motion.name)
    frames = np.linspace(motion.frame_start, motion.frame_end, 12).astype(int)
    for frame in frames:
        empty_scene.frame_set(int(frame))
        i = frame - motion.frame_start
        for side in ("Left", "Right"):
            head = np.array(obj.pose.bones[f"{side}Foot"].head)
            assert motion.reached[f"{side}Foot"][i]
            np.testing.assert_allclose(head, motion.ankle_targets[side][i], atol=2e-4, err_msg=f"{side} frame {frame}")


def test_planted_feet_do_not_slide_in_blender(empty_scene):
    obj = _make_rig(seed=0)
    motion = next(m for m in demo_motion.generate_actions(0) if m.name.startswith("walk_normal"))
    _use_action(obj, motion.name)
    contact = motion.contact["Left"]
    # the first full stance of the left foot: a run of contact frames, flat foot (no heel roll yet: first half)
    starts = np.flatnonzero(contact[1:] & ~contact[:-1]) + 1
    start = int(starts[0])
    end = start + int(np.argmin(contact[start:]))
    balls = []
    for i in range(start, end):
        empty_scene.frame_set(motion.frame_start + i)
        balls.append(np.array(obj.pose.bones["LeftToeBase"].head))
    balls = np.array(balls)
    assert len(balls) >= 10
    assert np.max(np.linalg.norm(balls - balls[0], axis=-1)) < 1e-3      # the ball of the foot stays put
    assert balls[:, 2].max() < 0.05                                        # ... on the ground
    hips = []
    for i in (start, end - 1):
        empty_scene.frame_set(motion.frame_start + i)
        hips.append(np.array(obj.pose.bones["Hips"].head))
    assert np.linalg.norm(hips[1][:2] - hips[0][:2]) > 0.3                 # while the body walks over it


def test_reach_hand_lands_on_its_target_in_blender(empty_scene):
    obj = _make_rig(seed=0)
    motion = next(m for m in demo_motion.generate_actions(0) if m.name.startswith("reach_"))
    _use_action(obj, motion.name)
    side = next(iter(motion.hand_targets))
    for frame in np.linspace(motion.frame_start, motion.frame_end, 10).astype(int):
        empty_scene.frame_set(int(frame))
        i = frame - motion.frame_start
        hand = np.array(obj.pose.bones[f"{side}Hand"].head)
        np.testing.assert_allclose(hand, motion.hand_targets[side][i], atol=2e-4)
    # the hand really travels: the reach is a motion, not a pose
    travel = np.linalg.norm(motion.hand_targets[side].max(0) - motion.hand_targets[side].min(0))
    assert travel > 0.2


def test_knees_bend_with_the_crouch(empty_scene):
    motion = next(m for m in demo_motion.generate_actions(0) if m.name.startswith("crouch_deep"))
    from neural_ik.neural_network.geometry.rotations import quaternion_to_axis_angle

    knee = quaternion_to_axis_angle(motion.rotations[:, demo_skeleton.BONE_INDEX["LeftShin"]])
    hips_height = motion.hips_location[:, 1]          # the hips bone's local Y is up at rest
    assert np.allclose(knee[:, 1:], 0.0, atol=1e-6)   # a hinge: the knee turns about its own X axis only
    assert np.corrcoef(knee[:, 0], -hips_height)[0, 1] > 0.95
    assert np.degrees(knee[:, 0].max()) > 90


def test_actions_survive_save_and_reload(empty_scene, tmp_path):
    import bpy

    _make_rig(seed=0)
    names = sorted(a.name for a in bpy.data.actions)
    path = str(tmp_path / "demo.blend")
    bpy.ops.wm.save_as_mainfile(filepath=path)
    bpy.ops.wm.open_mainfile(filepath=path)
    assert sorted(a.name for a in bpy.data.actions) == names
    assert bpy.context.scene.neural_ik.armature.name == "NeuralIK_Demo"


def test_create_demo_rig_refuses_outside_object_mode(empty_scene):
    import bpy

    obj = _make_rig()
    bpy.context.view_layer.objects.active = obj
    bpy.ops.object.mode_set(mode="POSE")
    try:
        assert not bpy.ops.neural_ik.create_demo_rig.poll()
    finally:
        bpy.ops.object.mode_set(mode="OBJECT")
    assert bpy.ops.neural_ik.create_demo_rig.poll()


def test_reach_clips_take_the_hands_all_around_the_shoulders_smoothly(empty_scene):
    """Create Demo Rig with reach clips (what the shipped model learns from besides the standard set): the standard
    27 actions stay as they were, the added ones are real actions whose hands, read from Blender's evaluated pose,
    land on the solve's targets where the arm reaches, visit front, side, overhead, low, across the body and behind
    at 0.6-1.05 arm lengths from the shoulder, and never turn a mapped bone more than 15 degrees in a frame."""
    import bpy

    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.neural_network.geometry.rotations import angle_between
    from neural_ik.neural_network.skeleton.roles import ROLE_INDEX
    from neural_ik.properties import get_bone_map

    bpy.ops.neural_ik.create_demo_rig(seed=0, reach_clips=9)
    obj = bpy.context.scene.neural_ik.armature
    standard = [m.name for m in demo_motion.generate_actions(0)]
    reach = demo_motion.generate_reach_actions(0, 9)
    assert sorted(a.name for a in bpy.data.actions) == sorted(standard + [m.name for m in reach])
    assert [TASKS[m.task] for m in reach[:2]] == ["reach", "idle"]
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    regions = set()
    for motion in reach:
        sample = pose_read.read_action(rig, obj, bpy.data.actions[motion.name])
        turns = np.degrees(angle_between(sample.rotations[:-1], sample.rotations[1:]))
        assert turns.max() < 15.0, motion.name
        for side, goal in motion.hand_targets.items():
            _use_action(obj, motion.name)
            reached = np.flatnonzero(motion.reached[f"{side}Hand"])
            for i in reached[:: max(1, len(reached) // 5)]:
                empty_scene.frame_set(motion.frame_start + int(i))
                np.testing.assert_allclose(np.array(obj.pose.bones[f"{side}Hand"].head), goal[i], atol=2e-4)
            sx = 1.0 if side == "Left" else -1.0
            shoulder = sample.positions[:, ROLE_INDEX[f"{side}Arm"]]
            offset = sample.positions[:, ROLE_INDEX[f"{side}Hand"]] - shoulder
            rest = demo_skeleton.REST_FRAMES[demo_skeleton.BONE_INDEX["Hips"]]
            hips = sample.hips_rotation @ rest.T                    # the body's axes: x left, -y forward, z up
            body = np.einsum("fji,fj->fi", hips, offset)
            distance = np.linalg.norm(body, axis=-1) / demo_motion.ARM_LENGTH
            forward, out, up = -body[:, 1] / np.linalg.norm(body, axis=-1), sx * body[:, 0], body[:, 2]
            out, up = out / np.linalg.norm(body, axis=-1), up / np.linalg.norm(body, axis=-1)
            assert distance.min() > 0.5 and distance.max() < 1.1
            for name, where in {"front": forward > 0.85, "side": out > 0.8, "overhead": up > 0.8, "low": up < -0.9,
                                "across": out < -0.5, "behind": forward < -0.5}.items():
                if where.any():
                    regions.add(name)
    assert regions == {"front", "side", "overhead", "low", "across", "behind"}
