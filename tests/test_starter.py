"""Train Starter Model (#34): the starter motion's file (round trip, resampling, refusals), its retarget onto a rig in
NumPy against Blender's own evaluation of the same motion written as an action, and the first hour on rigs the tests
generate with no actions (a Rigify rig, a Mixamo-named rig): Auto Map, Train Starter Model, Create Targets, Run IK.
The starter motion of these tests is made here from BVH files of a CMU-like skeleton (tests/other_skeletons.py);
one test reads the shipped file."""

import os

import numpy as np
import pytest

from neural_ik.neural_network.data import retarget as core
from neural_ik.neural_network.data.files import FileRefused, load_npz, save_npz
from neural_ik.neural_network.data.starter_motion import KIND, StarterMotion, resample
from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix, matrix_to_quaternion
from neural_ik.neural_network.skeleton.roles import NUM_ROLES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _motion(frames=(12, 7), seed=0):
    """A small StarterMotion of random joint-frame orientations (all roles) and hips paths."""
    rng = np.random.default_rng(seed)
    mask = np.ones(NUM_ROLES, bool)
    rest = rng.normal(0, 0.3, (NUM_ROLES, 3)) + np.linspace(0, 1, NUM_ROLES)[:, None] * [0, 0, 1]
    calibration = core.Calibration(mask, axis_angle_to_matrix(rng.normal(0, 1, (NUM_ROLES, 3))),
                                   np.broadcast_to(np.eye(3), (NUM_ROLES, 3, 3)).copy(), rest, 0.9, 0.1)
    clips = []
    for i, count in enumerate(frames):
        turns = axis_angle_to_matrix(np.cumsum(rng.normal(0, 0.05, (count, NUM_ROLES, 3)), axis=0))
        clips.append((f"clip{i}", f"walk number {i}", "locomotion", matrix_to_quaternion(turns),
                      rng.normal(0, 0.1, (count, 3)) + [0, 0, 1]))
    return StarterMotion.from_clips(calibration, 30.0, clips, "made in the test")


def test_starter_motion_round_trip_keeps_every_frame_within_the_quantisation(tmp_path):
    motion = _motion()
    path = tmp_path / "starter.npz"
    motion.save(path)
    back = StarterMotion.load(path)
    assert back.names == motion.names and back.tasks == ["locomotion"] * 2 and back.fps == 30.0
    assert back.descriptions == motion.descriptions and back.credit == "made in the test"
    np.testing.assert_array_equal(back.starts, [0, 12, 19])
    for i in range(2):
        r0, h0 = motion.clip(i)
        r1, h1 = back.clip(i)
        angle = np.arccos(np.clip((np.trace(np.swapaxes(r0, -1, -2) @ r1, axis1=-2, axis2=-1) - 1) / 2, -1, 1))
        assert angle.max() < np.radians(0.01)                       # int16 quaternions: under 0.01 degrees
        np.testing.assert_allclose(h1, h0, atol=1e-6)
    np.testing.assert_allclose(back.calibration.frames, motion.calibration.frames)
    assert back.calibration.leg_length == 0.9 and back.calibration.planted_height == 0.1


def test_resampling_keeps_the_duration_and_the_frames_that_fall_on_the_new_rate():
    motion = _motion(frames=(13,))
    q, hips = motion.quaternions, motion.hips
    half, half_hips = resample(q, hips, 30.0, 15.0)
    assert len(half) == 7                                           # 12 steps at 30 fps are 6 steps at 15 fps
    np.testing.assert_allclose(np.abs(np.sum(half * q[::2], axis=-1)), 1.0, atol=1e-12)
    np.testing.assert_allclose(half_hips, hips[::2], atol=1e-12)
    double, double_hips = resample(q, hips, 30.0, 60.0)
    assert len(double) == 25
    np.testing.assert_allclose(double_hips[1], (hips[0] + hips[1]) / 2, atol=1e-12)
    mid = q[0] + q[1] * np.sign(np.sum(q[0] * q[1], axis=-1, keepdims=True))
    np.testing.assert_allclose(np.abs(np.sum(double[1] * mid / np.linalg.norm(mid, axis=-1, keepdims=True), -1)), 1.0,
                               atol=1e-12)
    same, _ = resample(q, hips, 30.0, 30.0)
    np.testing.assert_allclose(same, q, atol=1e-12)


@pytest.mark.parametrize("damage, words", [
    ("kind", "expected .neural_ik.starter_motion"),
    ("starts", "do not fit together"),
    ("nan", "non-finite"),
    ("layout", "layout"),
])
def test_a_damaged_starter_motion_file_is_refused_in_words(tmp_path, damage, words):
    path = tmp_path / "starter.npz"
    _motion().save(path)
    meta, arrays = load_npz(path, KIND)
    if damage == "kind":
        meta["kind"] = "neural_ik.dataset"
    elif damage == "starts":
        arrays["starts"] = np.array([0, 12, 30])
    elif damage == "nan":
        arrays["hips"][3, 1] = np.nan
    else:
        meta["layout_version"] = 99
    save_npz(path, arrays, meta)
    with pytest.raises(FileRefused, match=words):
        StarterMotion.load(path)


def test_the_shipped_starter_motion_is_cmu_only_compact_and_credited():
    from neural_ik.blender.workflows.starter import STARTER_MOTION

    motion = StarterMotion.load(STARTER_MOTION)
    assert os.path.getsize(STARTER_MOTION) < 4e6
    assert len(motion) == 37 and motion.frame_count > 8000 and motion.fps == 30.0
    assert all(name[:3] in ("001", "005", "006") for name in motion.names)          # CMU subjects 1, 5 and 6
    assert "CMU Graphics Lab" in motion.credit
    assert motion.calibration.mask.all()


# ---- in Blender -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def made_starter(other_skeletons, tmp_path_factory):
    """Starter motion made by build_starter_motion from the CMU-like library the tests write."""
    from neural_ik.blender.workflows.starter import build_starter_motion

    folder = other_skeletons.cmu.folder
    motion = build_starter_motion([folder], fps=24.0)
    path = tmp_path_factory.mktemp("starter") / "starter.npz"
    motion.save(path)
    return path


def _daz(empty_scene):
    import bpy
    from daz_rig import daz_style_rig

    from neural_ik.blender.rig import bone_maps

    empty_scene.render.fps = 24
    obj = daz_style_rig()
    bone_maps.auto_map_object(obj)
    bpy.context.view_layer.objects.active = obj
    return obj


def test_starter_rows_are_what_blender_shows_of_the_same_motion_keyed_as_an_action(empty_scene, made_starter):
    """The NumPy retarget into dataset rows against the same local rotations written as an action
    (retarget.write_retargeted, as Import BVH Folder onto the rig writes them) and read back through Blender's own
    evaluation (Extract), on the DAZ-style rig whose pelvis sits between the hips and the thighs."""
    import bpy

    from neural_ik.blender.rig import pose_read
    from neural_ik.blender.workflows import starter
    from neural_ik.blender.workflows.retarget import write_retargeted

    obj = _daz(empty_scene)
    actions_before = len(bpy.data.actions)
    _, retargeter = starter.usable_rig(bpy.context)
    motion = StarterMotion.load(made_starter)
    dataset, _notes, rows = starter.starter_dataset(bpy.context, obj, retargeter, motion)
    assert len(bpy.data.actions) == actions_before                  # nothing was written into the file
    assert not dataset.own_action_mask().any() and len(dataset.action_names) == len(motion)
    np.testing.assert_array_equal(rows, np.arange(len(dataset)))
    assert dataset.meta["fps"] == 24.0
    i, local, world, hips = next(motion.retargeted(retargeter.calibration, 24.0))
    action = write_retargeted(obj, retargeter.rig, "keyed", np.arange(1, len(local) + 1), local, hips,
                              retargeter.pose, retargeter.hips_frame)
    sample = pose_read.read_action(retargeter.rig, obj, action)
    rows = np.asarray(dataset.action) == 0
    mask = retargeter.rig.role_mask
    np.testing.assert_allclose(dataset.positions[rows][:, mask], sample.positions[:, mask], atol=2e-5)
    np.testing.assert_allclose(dataset.hips_rotation[rows], sample.hips_rotation, atol=2e-5)


def test_train_starter_refuses_in_words_before_any_work(empty_scene, tmp_path):
    import bpy

    with pytest.raises(RuntimeError, match="Select an armature"):
        bpy.ops.neural_ik.train_starter(directory=str(tmp_path), time_limit=5)
    from neural_ik.blender.rig import bone_maps
    from neural_ik.blender.workflows.demo_rig import build_armature
    from neural_ik.properties import set_bone_map

    stick = build_armature(bpy.context, "stick", [("a", None, (0, 0, 0), (0, 0, 1), 0.0, False),
                                                  ("b", "a", (0, 0, 1), (0, 0, 2), 0.0, False)])
    bpy.context.view_layer.objects.active = stick
    with pytest.raises(RuntimeError, match="stick"):
        bpy.ops.neural_ik.train_starter(directory=str(tmp_path), time_limit=5)
    obj = _daz(empty_scene)

    mapping = bone_maps.auto_map(obj).mapping
    mapping["LeftThigh"] = ""
    set_bone_map(obj, mapping)
    with pytest.raises(RuntimeError, match="LeftThigh"):
        bpy.ops.neural_ik.train_starter(directory=str(tmp_path), time_limit=5)
    assert os.listdir(tmp_path) == [] and obj.neural_ik.model_path == ""


def _mixamo_rig_without_actions():
    """A rig as a Mixamo download without animations: the demo rig's bones under Mixamo names, no actions, no model,
    no bone map yet."""
    import bpy
    from other_skeletons import mixamo_named_demo_rig

    from neural_ik.properties import set_bone_map

    obj = mixamo_named_demo_rig(seed=0)
    for action in list(bpy.data.actions):
        bpy.data.actions.remove(action)
    obj.neural_ik.model_path = ""
    set_bone_map(obj, {})
    bpy.context.view_layer.objects.active = obj
    return obj


def _first_hour(obj, folder):
    """Auto Map, Train Starter Model, Create Targets, Run IK as a new user does them, no other step; then a hand
    target moved 8 cm: the tick puts Blender's evaluated hand on it. Returns the hand's miss in metres."""
    import bpy
    from live_helpers import Event, StandInContext, runner_reporting_to

    from neural_ik import state
    from neural_ik.blender.rig.bone_maps import bone_map_of

    actions_before = {a.name for a in bpy.data.actions}
    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    assert bpy.ops.neural_ik.train_starter(directory=str(folder), time_limit=10, seed=0) == {"FINISHED"}
    assert obj.neural_ik.model_path == os.path.join(str(folder), "model.npz")
    assert {a.name for a in bpy.data.actions} == actions_before                 # Train changes nothing in the file
    assert bpy.ops.neural_ik.create_targets() == {"FINISHED"}
    target = obj.neural_ik.target_right_hand
    start = np.array(target.matrix_world.translation)
    reports = []
    runner = runner_reporting_to(reports)()
    context = StandInContext()
    assert runner.invoke(context, Event("NONE")) == {"RUNNING_MODAL"}, reports
    try:
        target.location = start + np.array([0.0, -0.08, 0.05])                    # forward and up
        bpy.context.view_layer.update()
        for _ in range(3):
            runner.last_tick = 0.0
            assert runner.modal(context, Event("TIMER")) == {"RUNNING_MODAL"}, reports
        bpy.context.view_layer.update()
        hand = obj.pose.bones[bone_map_of(obj)["RightHand"]]               # Blender's evaluated pose
        world = np.array(obj.matrix_world) @ np.append(np.array(hand.head), 1.0)
        return float(np.linalg.norm(world[:3] - np.array(target.matrix_world.translation)))
    finally:
        runner.modal(context, Event("ESC"))
        assert not state.live_sessions


def test_first_hour_on_a_generated_rigify_rig_with_no_actions(rigify_rig, tmp_path):
    miss = _first_hour(rigify_rig, tmp_path)
    assert miss < 1e-3, miss


def test_first_hour_on_a_mixamo_named_rig_with_no_actions(empty_scene, tmp_path):
    obj = _mixamo_rig_without_actions()
    miss = _first_hour(obj, tmp_path)
    assert miss < 1e-3, miss


def test_a_later_run_with_own_clips_starts_from_the_starter_model_and_cancel_keeps_the_best(
        empty_scene, made_starter, other_skeletons, tmp_path):
    """Train Starter Model twice: first with no clips (from scratch here), then, after the user has clips of their
    own, in the background: the second run says it starts from the rig's model, trains on the own clips as own
    motion beside the starter motion, and Cancel keeps its best checkpoint as the rig's model."""
    import bpy
    from test_train_operator import wait_for

    from neural_ik import state
    from neural_ik.blender.rig.action_sources import SOURCE_PROPERTY
    from neural_ik.blender.workflows import starter
    from neural_ik.blender.workflows import training as train_module
    from neural_ik.blender.workflows.bvh_import import import_bvh_files
    from neural_ik.neural_network.model import checkpoint

    obj = _daz(empty_scene)
    starter.train_starter(bpy.context, str(tmp_path / "first"), 3.0, mode="SYNC", motion_path=str(made_starter),
                          network_path=None)
    assert obj.neural_ik.model_path == str(tmp_path / "first" / "model.npz")
    # one of each prior, whatever the scene says Train trains: the time limit goes to the network
    first = checkpoint.load_model(obj.neural_ik.model_path)
    assert bpy.context.scene.neural_ik.prior_members == 2 and first.prior.layer_sizes[1] == 128
    assert "members" not in first.prior.meta and "members" not in first.clip_prior.meta
    _, imported, _ = import_bvh_files(bpy.context, other_skeletons.cmu.folder, 0.01, onto=obj)
    for name in imported:                             # the user's own clips from here on
        del bpy.data.actions[name][SOURCE_PROPERTY]
    message, _ = starter.train_starter(bpy.context, str(tmp_path / "second"), 120.0, mode="THREAD",
                                       motion_path=str(made_starter), network_path=None)
    assert f"with {len(imported)} clips of its own" in message and "starting from its current model" in message
    thread = train_module._Run.thread
    wait_for(lambda: state.training.epoch >= 1, thread)
    assert thread.is_alive()
    bpy.ops.neural_ik.cancel_training()
    assert not thread.is_alive() and not state.training.running
    assert obj.neural_ik.model_path == str(tmp_path / "second" / "model.npz")
    sources = checkpoint.load_model(obj.neural_ik.model_path).meta["sources"]
    assert sources["own_frames"] > 0 and sources["retargeted_frames"] > 0 and sources["validation"].startswith("own")
