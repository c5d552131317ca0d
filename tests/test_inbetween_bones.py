"""Unmapped in-between bones that move (CMU's CC_Base_Pelvis between the Hips role and the thighs): the solver's FK,
inputs and run-time graph take their bridges/offsets, Bake keys them like the hips, and live IK uses the armature's
pose at session start. Checked against kinematics with the true links, and on a CMU file through Blender's own
evaluated pose: one made in the test (tests/other_skeletons.py), and the real one where ../shared/mocap is."""

import numpy as np
import pytest
from conftest import MADE_AND_REAL
from live_helpers import (
    assign_action,
    fitted_model,
    follow_empties,
    humanoid_skeleton,
    inputs_of,
    linear_model_for,
    random_poses,
    targets_of,
)

from neural_ik.neural_network.geometry import kinematics
from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix
from neural_ik.neural_network.runtime.solver import Solver
from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES, ROLE_INDEX

EFF = list(EFFECTOR_ROLES)
THIGHS = [ROLE_INDEX["LeftThigh"], ROLE_INDEX["RightThigh"]]
CMU_FILE = "006_08.bvh"          # the smallest real CMU file; its pelvis is off its rest pose in every frame, as the made one's
# frames of that file the tests use: a span to bake, two target poses and a start for live IK, a still pose
FRAMES = {"made": {"bake": (20, 49), "goals": (30, 70), "start": 50, "still": 40},
          "real": {"bake": (40, 79), "goals": (90, 130), "start": 60, "still": 100}}
PELVIS = "CC_Base_Pelvis"


# ---- the core, on a small humanoid with a pelvis of its own ----------------------------------------------------

@pytest.fixture(scope="module")
def model():
    return fitted_model(humanoid_skeleton())


def pelvis_links(skeleton, angles):
    """Per-character (bridges, offsets) of a pelvis bone at the hips head, turned by axis-angles (K, 3): the thighs'
    bridges and offsets turn with it."""
    k = len(angles)
    P = axis_angle_to_matrix(np.asarray(angles, np.float64))
    bridges = np.broadcast_to(skeleton.bridges, (k,) + skeleton.bridges.shape).copy()
    offsets = np.broadcast_to(skeleton.offsets, (k,) + skeleton.offsets.shape).copy()
    for j in THIGHS:
        bridges[:, j] = P @ skeleton.bridges[j]
        offsets[:, j] = (P @ skeleton.offsets[j][:, None])[..., 0]
    return bridges, offsets


def posed(model, n, seed, spread=0.3):
    """n poses with a pelvis turned up to ~0.35 rad: (targets, links, FK pose with those links, hips rotations)."""
    skel = model.skeleton
    local, hips_R, hips_p, _ = random_poses(skel, n, seed=seed, spread=spread, mean=model.mean_pose)
    links = pelvis_links(skel, np.random.default_rng(seed + 1).normal(0, 0.2, (n, 3)))
    pose = kinematics.forward(skel, local, hips_R, hips_p, *links)
    return targets_of(pose, hips_R, hips_p), links, pose, hips_R


@pytest.mark.parametrize("engine", ["numpy", "onnxruntime"])
def test_inputs_follow_the_pelvis(model, engine):
    """The heading comes from the thighs, which the pelvis carries: the solver's inputs are the training inputs of the
    pose built with the same links (what extraction stores for such clips)."""
    targets, links, pose, hips_R = posed(model, 32, seed=5)
    solver = Solver(model, characters=32, engine=engine, links=links)
    assert solver.per_character_links and solver.runtime is None
    solver.solve(targets, contact=np.zeros((32, 2)))
    np.testing.assert_allclose(solver.engine.inputs[:32], inputs_of(model.feature_spec, pose, hips_R), atol=2e-5)
    rest = Solver(model, characters=32, engine=engine)
    rest.solve(targets, contact=np.zeros((32, 2)))
    assert np.abs(rest.engine.inputs[:32] - solver.engine.inputs[:32]).max() > 1e-2   # the heading did change


def test_refinement_lands_with_the_pelvis_links(model):
    """Refined effectors land within 1 mm by FK with the true links (the errors the solver reports are those); the rest
    links leave the feet centimetres off."""
    targets, links, pose, _ = posed(model, 200, seed=9)
    skel = model.skeleton
    result = Solver(model, characters=200, links=links).solve(targets, refine_iterations=4)
    check = kinematics.forward(skel, result.local, result.hips_rotation, result.hips_position, *links)
    miss = np.linalg.norm(check.positions[:, EFF] - pose.positions[:, EFF], axis=-1)
    np.testing.assert_allclose(miss, result.errors, atol=1e-6)
    assert np.mean(miss.max(axis=1) < 1e-3) >= 0.95          # as without a pelvis (test_solver): random poses
    blind = Solver(model, characters=200).solve(targets, refine_iterations=4)
    real = kinematics.forward(skel, blind.local, blind.hips_rotation, blind.hips_position, *links)
    blind_miss = np.linalg.norm(real.positions[:, EFF[2:4]] - pose.positions[:, EFF[2:4]], axis=-1)
    assert np.median(blind_miss) > 0.01


def test_shared_links_rebuild_the_run_time_graph(model):
    """One set of links for every character goes into the skeleton the graph is built from (no per-tick input): the
    graph's solve equals the per-character NumPy path's for the same links, and rest links change nothing."""
    targets, links, _pose, _ = posed(model, 6, seed=13)
    per_character = Solver(model, characters=6, engine="numpy", links=links).solve(targets)
    for k in range(6):
        shared = Solver(model, characters=1, engine="onnxruntime", links=(links[0][k], links[1][k]))
        assert shared.runtime is not None and not shared.per_character_links
        np.testing.assert_allclose(shared.skeleton.bridges, links[0][k])
        one = shared.solve(targets[k:k + 1])
        assert shared.used_runtime
        assert np.abs(one.local[0] - per_character.local[k]).max() < 1e-5     # float32 graph, float64 NumPy
    same = Solver(model, characters=3, links=(np.stack([links[0][0]] * 3), np.stack([links[1][0]] * 3)))
    assert not same.per_character_links and same.runtime is not None
    assert Solver(model, links=(model.skeleton.bridges, model.skeleton.offsets)).skeleton is model.skeleton


# ---- a CMU file in Blender: made in the test (tests/other_skeletons.py) and real --------------------------------

@pytest.fixture
def cmu_rig(empty_scene, libraries, request):
    """The CMU file imported and auto-mapped, with a linear model fitted to its own frames (a weak network that
    refinement must correct), and the frames the tests use."""
    import addon_utils
    import bpy

    from neural_ik.blender import models
    from neural_ik.blender.live import session as live_session
    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.properties import get_bone_map

    path = libraries.cmu.path(CMU_FILE)
    addon_utils.enable("io_anim_bvh", default_set=True)
    bpy.ops.import_anim.bvh(filepath=path, global_scale=0.01)
    obj = bpy.context.active_object
    bpy.ops.neural_ik.auto_map()
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    source = obj.animation_data.action
    sample = pose_read.read_action(rig, obj, source)
    assert sample.moving_links and rig_model.inbetween_bones(rig) == [PELVIS]
    model = linear_model_for(rig.skeleton, [sample])
    models.loaded_models[obj.name] = ("", model, None)
    yield obj, rig, model, source, FRAMES[request.node.callspec.params["libraries"]]
    models.loaded_models.pop(obj.name, None)
    live_session.stop_all("")


def _evaluated(obj, rig, frames):
    """Blender's evaluated pose per frame: mapped heads (character space) and the pelvis' pose matrix."""
    import bpy

    from neural_ik.blender.rig import pose_read

    heads, pelvis = [], []
    for f in frames:
        bpy.context.scene.frame_set(int(f))
        heads.append(pose_read.armature_pose_heads(obj, rig))
        pelvis.append(np.array(obj.pose.bones[PELVIS].matrix))
    return np.array(heads), np.array(pelvis)


@pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
def test_bake_of_a_cmu_clip_lands_the_feet_and_keys_the_pelvis(cmu_rig):
    """Bake with refinement from the clip itself, then play the baked action with the pelvis left somewhere else (the
    rest pose): Blender's evaluated effectors land within 1 mm of the source's and the pelvis follows the source."""
    import bpy

    obj, rig, model, source, frames_of = cmu_rig
    first, last = frames_of["bake"]
    frames = np.arange(first, last + 1)
    assign_action(obj, source)
    reference, reference_pelvis = _evaluated(obj, rig, frames)
    bpy.ops.neural_ik.bake(source_action=source.name, frame_start=first, frame_end=last, refine_iterations=4)
    baked = obj.animation_data.action
    assert baked.name == f"{source.name}.nik"
    obj.pose.bones[PELVIS].rotation_euler = (0.0, 0.0, 0.0)      # the pose the user left the pelvis in since
    heads, pelvis = _evaluated(obj, rig, frames)
    miss = np.linalg.norm(heads[:, EFF] - reference[:, EFF], axis=-1)
    mask = rig.role_mask
    mpjpe = np.linalg.norm(heads[:, mask] - reference[:, mask], axis=-1).mean()
    print(f"\n{CMU_FILE} {first}-{last} baked (refined): effector error mean {100 * miss.mean():.3f} cm, max "
          f"{100 * miss.max():.3f} cm, MPJPE {100 * mpjpe:.2f} cm")
    assert np.abs(pelvis - reference_pelvis).max() < 1e-5
    assert miss.max() < 1e-3
    np.testing.assert_allclose(heads[:, THIGHS], reference[:, THIGHS], atol=1e-5)


@pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
def test_live_tick_on_a_cmu_rig_with_a_turned_pelvis(cmu_rig):
    """Live IK with the pelvis turned beyond anything in the data: the session takes its pose at start, and the
    refined effectors land within 1 mm (Blender's evaluated pose) on targets placed from another frame posed with
    the same pelvis, through the run-time graph rebuilt with those links."""
    import bpy
    from mathutils import Matrix

    from neural_ik.blender.live.tick import LiveTick
    from neural_ik.blender.live.tick import targets_of as target_objects
    from neural_ik.blender.rig import pose_read

    obj, rig, model, source, frames_of = cmu_rig
    scene = bpy.context.scene
    pelvis = obj.pose.bones[PELVIS]
    assign_action(obj, source)
    world = np.array(obj.matrix_world)
    goals = []
    for frame in frames_of["goals"]:             # target poses: these frames with the turned pelvis
        scene.frame_set(frame)
        pelvis.rotation_euler = (pelvis.rotation_euler[0] + 0.25, 0.15, -0.2)
        bpy.context.view_layer.update()
        goals.append(world @ pose_read.armature_pose_matrices(obj, rig)[[0] + EFF])
    scene.frame_set(frames_of["start"])
    pelvis.rotation_euler = (pelvis.rotation_euler[0] + 0.25, 0.15, -0.2)
    turned = tuple(pelvis.rotation_euler)
    bpy.context.view_layer.update()
    bpy.ops.neural_ik.create_targets()
    follow_empties(obj)                          # the empties drive, over the action
    tick = LiveTick([(obj, model, None)])
    tick.start()
    solver = tick.live_groups[0].solver
    assert solver.runtime is not None and solver.skeleton is not model.skeleton
    obj.neural_ik.refine_iterations = 4
    try:
        for goal in goals:
            for target, m in zip(target_objects(obj), goal):
                m = m.copy()
                m[:3, :3] /= np.linalg.norm(m[:3, :3], axis=0)
                target.matrix_world = Matrix(m.tolist())
            tick.tick(scene)
            bpy.context.view_layer.update()
            assert solver.used_runtime
            heads = np.array([obj.pose.bones[rig.bone_names[rig.role_bones[r]]].head for r in EFF])
            want = (np.linalg.inv(world) @ goal[1:, :, 3].T).T[:, :3]
            miss = np.linalg.norm(heads - want, axis=-1) * rig.scale
            print(f"\nlive tick, turned pelvis: effector miss max {100 * miss.max():.4f} cm")
            assert miss.max() < 1e-3
            assert tuple(pelvis.rotation_euler) == turned
    finally:
        tick.stop()


@pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
def test_bake_from_empties_keeps_the_pelvis_as_it_stands(cmu_rig):
    """Bake from the target empties on a rig whose pelvis is turned (no action playing): the solve takes the pelvis as
    it is, the baked action holds it there, and the evaluated feet land on their targets."""
    import bpy

    from neural_ik.blender.rig import pose_read

    obj, rig, model, source, frames_of = cmu_rig
    assign_action(obj, source)
    bpy.context.scene.frame_set(frames_of["still"])
    obj.animation_data.action = None
    pelvis = obj.pose.bones[PELVIS]
    pelvis.rotation_euler = (pelvis.rotation_euler[0] - 0.2, -0.1, 0.25)
    turned = np.array(pelvis.rotation_euler)
    bpy.context.view_layer.update()
    bpy.ops.neural_ik.create_targets()
    goal = np.array([np.array(t.matrix_world.translation) for t in
                     (obj.neural_ik.target_left_foot, obj.neural_ik.target_right_foot, obj.neural_ik.target_left_hand)])
    bpy.ops.neural_ik.bake(frame_start=1, frame_end=3, refine_iterations=4)
    assert obj.animation_data.action.name == f"{obj.name}.nik"
    pelvis.rotation_euler = (0.0, 0.0, 0.0)
    bpy.context.scene.frame_set(2)
    np.testing.assert_allclose(np.array(pelvis.rotation_euler), turned, atol=1e-6)
    world = np.array(obj.matrix_world)
    heads = [world @ np.append(obj.pose.bones[rig.bone_names[rig.role_bones[r]]].head, 1.0) for r in (EFF[2], EFF[3], EFF[0])]
    miss = np.linalg.norm(np.array(heads)[:, :3] - goal, axis=-1) * rig.scale
    assert miss.max() < 1e-3, miss
    assert pose_read.current_links(obj, rig) is not None
