"""The runtime solver: same inputs as training, ORT equal to NumPy, batching, task blending, and no non-finite pose."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_helpers import fitted_model, humanoid_skeleton, inputs_of, random_model, random_poses, targets_of

from neural_ik.neural_network.runtime.runtime_graph import PYTHON_CHECK_CHARACTERS
from neural_ik.neural_network.runtime.solver import Solver
from neural_ik.neural_network.runtime.status import HELD_BAD_TARGETS, MISSED, OK, describe


@pytest.fixture(scope="module")
def model():
    return fitted_model(humanoid_skeleton())


@pytest.fixture(scope="module")
def poses(model):
    local, hips_R, hips_p, pose = random_poses(model.skeleton, 64, seed=21, spread=0.3, mean=model.mean_pose)
    return targets_of(pose, hips_R, hips_p), pose, hips_R


def test_inputs_are_the_training_inputs(model, poses):
    targets, pose, hips_R = poses
    solver = Solver(model, characters=len(targets), engine="numpy")
    solver.solve(targets, ground=0.0, desired_contact=1.0, task=0, phase=0.0, contact=np.zeros((len(targets), 2)))
    expected = inputs_of(model.feature_spec, pose, hips_R)
    np.testing.assert_allclose(solver.engine.inputs[:len(targets)], expected, atol=2e-5)


def test_onnxruntime_and_numpy_engines_agree(model, poses):
    targets = poses[0]
    a = Solver(model, characters=len(targets), engine="onnxruntime").solve(targets, refine_iterations=0)
    b = Solver(model, characters=len(targets), engine="numpy").solve(targets, refine_iterations=0)
    assert np.max(np.abs(a.local - b.local)) < 1e-5


@pytest.mark.parametrize("engine", ["onnxruntime", "numpy"])
def test_batch_equals_single_characters(model, poses, engine):
    targets = poses[0][:10]
    batch = Solver(model, characters=10, engine=engine).solve(targets, refine_iterations=2)
    for k in range(10):
        one = Solver(model, characters=1, engine=engine).solve(targets[k:k + 1], refine_iterations=2)
        np.testing.assert_allclose(one.local[0], batch.local[k], atol=1e-9)


def test_refinement_lands_and_statuses(model, poses):
    targets = poses[0].copy()
    result = Solver(model, characters=len(targets)).solve(targets, refine_iterations=6)
    assert np.mean(result.errors.max(axis=1) < 1e-3) >= 0.95
    assert np.all(result.status[result.errors.max(axis=1) < 1e-3] == OK)
    far = targets[:1].copy()
    far[0, 1, :3, 3] = far[0, 0, :3, 3] + np.array([3.0, 0.0, 0.0])   # a hand target 3 m from the hips
    out = Solver(model, characters=1).solve(far, refine_iterations=6)
    assert out.status[0] & MISSED and np.isfinite(out.local).all()


def test_task_change_blends_over_ticks(model, poses):
    targets = poses[0][:1]
    model = random_model(model.skeleton)          # its output depends on the task input
    solver = Solver(model, characters=1, blend_ticks=4)
    old = solver.solve(targets, task=0).local[0]
    new = Solver(model, characters=1).solve(targets, task=5).local[0]
    assert np.abs(old - new).max() > 1e-3
    steps = [solver.solve(targets, task=5).local[0] for _ in range(6)]
    distance = [np.abs(s - new).max() for s in steps]
    # first tick: still the old task (to float32 rounding: the blending tick runs the network on two rows, and ONNX
    # Runtime's float32 sums for two rows and for one round apart in the last bits)
    assert distance[0] == pytest.approx(np.abs(old - new).max(), rel=1e-5)
    assert all(b < a for a, b in zip(distance[:4], distance[1:5])), distance   # then strictly closer each tick
    assert distance[4] < 1e-9 and distance[5] < 1e-9


def test_falls_back_to_numpy_without_onnxruntime(model, poses, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ort(name, *args, **kwargs):
        if name == "onnxruntime":
            raise ImportError("no onnxruntime here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ort)
    solver = Solver(model, characters=2)
    assert solver.engine_name == "numpy"
    assert np.isfinite(solver.solve(poses[0][:2]).local).all()


special = st.sampled_from([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, 1e-12])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_never_gives_non_finite_rotations(model, poses, data):
    """Arbitrary finite and non-finite target matrices: no exception, finite rotations, bad ticks flagged as held."""
    targets = poses[0][:3].copy()
    solver = Solver(model, characters=3, engine="numpy")
    good = solver.solve(targets, refine_iterations=1)
    mess = targets.copy()
    for _ in range(data.draw(st.integers(1, 6))):
        k, t = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 5))
        i, j = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))
        value = data.draw(st.one_of(special, st.floats(-1e6, 1e6, allow_nan=False)))
        mess[k, t, i, j] = value
    result = solver.solve(mess, refine_iterations=data.draw(st.integers(0, 3)))
    for arr in (result.local, result.quaternions, result.hips_rotation, result.hips_position):
        assert np.isfinite(arr).all()
    for k in range(3):
        if not np.isfinite(mess[k]).all():
            assert result.status[k] & HELD_BAD_TARGETS
            np.testing.assert_array_equal(result.local[k], good.local[k])


def test_describe_says_what_happened():
    assert "holding the last good pose" in describe(HELD_BAD_TARGETS)
    assert describe(OK) == "ok"


def test_fast_quaternion_equals_the_careful_one():
    """The copysign form (the closed form's local rotations, from double-precision products) against Shepperd's
    method, on exact rotations (single-precision input is another matter: tests/test_refine.py)."""
    from neural_ik.neural_network.geometry.quaternion_math import matrices_to_quaternions
    from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix, matrix_to_quaternion

    rng = np.random.default_rng(3)
    v = rng.normal(size=(2000, 3))
    v *= (rng.uniform(0, np.pi, 2000) / np.linalg.norm(v, axis=-1))[:, None]
    v[:10] *= 1e-9
    R = axis_angle_to_matrix(v)
    a, b = matrices_to_quaternions(R), matrix_to_quaternion(R)
    assert np.max(np.abs(a - b)) < 1e-7


def test_runtime_graph_equals_the_numpy_path(model, poses):
    """The run-time ONNX graph (raw world matrices -> quaternions) builds the training inputs and the NumPy path's
    quaternions, from matrices given in another world frame (to_character) like a live tick reads them."""
    from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix
    from neural_ik.neural_network.runtime.runtime_graph import RuntimeEngine

    targets, pose, hips_R = poses
    k = len(targets)
    reference = Solver(model, characters=k, engine="numpy").solve(targets, contact=np.zeros((k, 2)))
    rt = RuntimeEngine(model, Solver(model, characters=1, engine="numpy").build_inputs, model.skeleton.height, k,
                       debug=True)
    to_character = np.eye(4)
    to_character[:3, :3] = axis_angle_to_matrix(np.array([0.3, -1.0, 0.5]))
    to_character[:3, 3] = (0.4, -2.0, 0.1)
    world = np.linalg.inv(to_character) @ targets
    rt.world[:, 1:] = np.swapaxes(world, -1, -2)
    rt.set_to_character(to_character)
    rt.settings[:] = (0.0, 0.0, 1.0, 1.0, 0.0, 0.0)
    rt.z_limits[:] = -np.inf                     # contact flags 0, as given to the reference
    from neural_ik.neural_network.geometry.quaternion_math import MATRIX_TO_SQUARES, SQUARES_BIAS

    turn, shift = axis_angle_to_matrix(np.array([2.0, 0.5, -1.0])), np.random.default_rng(5).normal(size=(3, 4))
    hips_map = np.zeros((1, 16, 10))             # as live.LiveCharacter.hips_map builds one: a turn, then an affine map
    for u in range(16):
        probe = np.zeros(16)
        probe[u] = 1.0
        probe = probe.reshape(4, 4)
        hips_map[0, u, :7] = (turn @ probe[:3, :3]).reshape(9) @ MATRIX_TO_SQUARES + SQUARES_BIAS * probe[3, 3]
        hips_map[0, u, 7:] = shift @ probe[:, 3]
    rt.set_hips_map(hips_map[0])
    assert rt.run()
    np.testing.assert_allclose(rt.inputs, inputs_of(model.feature_spec, pose, hips_R), atol=2e-5)
    np.testing.assert_allclose(rt.q.reshape(k, -1, 4), reference.quaternions, atol=2e-6)
    np.testing.assert_allclose(rt.targets, targets, atol=2e-6)
    mapped = targets[:, 0].reshape(k, 16) @ hips_map[0]
    np.testing.assert_allclose(rt.hips_location, mapped[:, 7:], rtol=1e-5, atol=1e-5)
    from neural_ik.neural_network.geometry.quaternion_math import squares_to_quaternions
    np.testing.assert_allclose(rt.hips_q, squares_to_quaternions(mapped[:, :7]), atol=1e-5)


@pytest.mark.parametrize("characters", [4, PYTHON_CHECK_CHARACTERS + 4])     # the check in Python, then in NumPy
def test_runtime_graph_hands_bad_targets_to_the_careful_path(model, poses, characters):
    """Scaled, mirrored, non-finite or absurd targets fail the graph's check: the tick is redone in NumPy, which
    normalises a scaled target (same pose as unscaled) and holds the last pose for the others."""
    targets = poses[0][:characters].copy()
    solver = Solver(model, characters=characters)
    assert solver.runtime is not None
    good = solver.solve(targets)
    assert solver.fallbacks == 0
    mess = targets.copy()
    mess[0, 2, :3, :3] *= 2.0                     # a scaled empty: usable, but not by the graph
    mess[1, 3, :3, 0] *= -1.0                     # a mirrored one
    mess[3, 0, :3, 3] = 1e6
    finite = Solver(model, characters=characters)
    finite.solve(mess)                            # finite numbers: only the graph's own check can send these on
    assert finite.fallbacks == 1
    mess[2, 4, 0, 3] = np.nan
    result = solver.solve(mess)
    assert solver.fallbacks == 1
    np.testing.assert_allclose(result.local[0], good.local[0], atol=1e-5)
    assert result.status[0] == OK and np.all(result.status[1:4] & HELD_BAD_TARGETS)
    np.testing.assert_array_equal(result.local[1:4], good.local[1:4])
    assert np.all(result.status[4:] == OK)


def test_runtime_pose_buffers_equal_the_numpy_path(model, poses):
    """With a pose layout the graph also writes each rig's whole rotation_quaternion buffer: the solved roles at their
    bones, the hips' quaternion at the hips, and the unmapped bones' own rotations (pose_base) everywhere else."""
    from neural_ik.neural_network.runtime.runtime_graph import RuntimeEngine

    targets = poses[0][:3]
    k, count = len(targets), 30
    rng = np.random.default_rng(8)
    roles = np.arange(1, 23)
    bones = rng.permutation(np.arange(1, count))[:len(roles)]
    hips_index = 0
    reference = Solver(model, characters=k, engine="numpy").solve(targets, contact=np.zeros((k, 2)))
    rt = RuntimeEngine(model, Solver(model, characters=1, engine="numpy").build_inputs, model.skeleton.height, k,
                       pose_layout=(count, bones, roles, hips_index))
    rt.world[:, 1:] = np.swapaxes(targets, -1, -2)
    rt.settings[:] = (0.0, 0.0, 1.0, 1.0, 0.0, 0.0)
    rt.z_limits[:] = -np.inf
    base = rng.normal(size=(k, count, 4)).astype(np.float32)
    base[:, bones] = 0.0
    base[:, hips_index] = 0.0
    rt.pose_base[:, :count] = base
    hips_map = np.zeros((16, 10))
    hips_map[15, 0] = 4.0                        # a hips map whose squares say "identity" (4 w^2 = 4)
    rt.set_hips_map(hips_map)
    assert rt.run()
    pose = rt.pose.reshape(k, count, 4)
    np.testing.assert_allclose(pose[:, bones], reference.quaternions[:, roles], atol=2e-6)
    np.testing.assert_allclose(pose[:, hips_index], rt.hips_q, atol=0)
    np.testing.assert_allclose(rt.hips_q, np.tile([1.0, 0.0, 0.0, 0.0], (k, 1)), atol=1e-7)
    others = np.setdiff1d(np.arange(count), np.concatenate([bones, [hips_index]]))
    np.testing.assert_array_equal(pose[:, others], base[:, others])


def test_fast_ticks_keep_the_last_good_pose_in_the_graph_buffers(model, poses):
    """A tick through the graph without refinement leaves its results in the graph's buffers; a following tick the
    check rejects must still hold exactly that pose (the other binding's buffers), like the NumPy engine does."""
    targets = poses[0][:2]
    fast, careful = Solver(model, characters=2), Solver(model, characters=2, engine="numpy")
    for solver in (fast, careful):
        solver.step(targets, contact=np.zeros((2, 2)), measure_errors=False)
    assert fast.used_runtime and fast.pending is not None
    first = fast.q.copy()
    np.testing.assert_allclose(first, careful.q, atol=2e-6)
    fast.step(poses[0][2:4], contact=np.zeros((2, 2)), measure_errors=False)   # another good tick, other buffers
    second = fast.q.copy()
    mess = poses[0][4:6].copy()
    mess[1, 2, 0, 3] = np.nan
    fast.step(mess, contact=np.zeros((2, 2)), measure_errors=False)
    assert not fast.used_runtime and fast.status[1] & HELD_BAD_TARGETS
    np.testing.assert_array_equal(fast.q[1], second[1])
    assert np.abs(fast.q[0] - second[0]).max() > 1e-3                          # the good character moved on


@pytest.mark.parametrize("engine", ["onnxruntime", "numpy"])
def test_given_contacts_with_nan_rows_are_detected_per_character(poses, engine):
    """A live group mixing a Lock Feet character (its contacts given) with others (NaN: detected as usual): each
    character's pose is the one it gets solved alone, with its contacts given or detected; and after such ticks the
    plain detection is back (no limits left at 'always' or 'never'). A random network: its pose depends on the
    contact inputs (the fitted one was fitted with none)."""
    model = random_model(humanoid_skeleton())
    targets = poses[0][:3].copy()
    targets[:, :, 2, 3] -= targets[:, 3:5, 2, 3].min(axis=1)[:, None] - 0.05     # the lower foot 5 cm up: in contact
    given = np.array([[1.0, 0.0], [np.nan, np.nan], [0.0, 1.0]])
    mixed = Solver(model, characters=3, engine=engine)
    singles = [Solver(model, characters=1, engine=engine) for _ in range(3)]
    for _tick in range(2):                     # plain ticks first (their step limits set)
        mixed.solve(targets, refine_iterations=0)
        for k, single in enumerate(singles):
            single.solve(targets[k:k + 1], refine_iterations=0)
    for tick in range(3):                      # the contact detection compares the feet with the tick before
        moved = targets.copy()
        moved[:, :, :3, 3] += 0.002 * tick
        got = mixed.solve(moved, contact=given, refine_iterations=0)
        for k, single in enumerate(singles):
            alone = single.solve(moved[k:k + 1], contact=None if np.isnan(given[k]).all() else given[k:k + 1],
                                 refine_iterations=0)
            np.testing.assert_allclose(got.local[k], alone.local[0], atol=1e-5)
    plain = Solver(model, characters=3, engine=engine)
    for _tick in range(2):
        plain.solve(targets, refine_iterations=0)
    plain.solve(moved, refine_iterations=0)
    for tick in range(3):                      # feet sliding 30 cm a tick: not in contact, however low
        fast = targets.copy()
        fast[:, :, 0, 3] += 0.3 * (tick + 1)
        np.testing.assert_allclose(mixed.solve(fast, refine_iterations=0).local,
                                   plain.solve(fast, refine_iterations=0).local, atol=1e-5)


@pytest.mark.parametrize("engine", ["onnxruntime", "numpy"])
def test_live_contacts_use_the_models_planted_ankle_height(poses, engine):
    """A live tick has no clip to take the lowest ankle from: a foot is in contact when its ankle is less than 8 % of
    the body's height above the height training saw planted ankles at (the model's), else, for a model saved
    without it, the rest pose's. Held still 7 % above it: in contact; 9 %: not. (A random network: its pose depends
    on the contact inputs.)"""
    from dataclasses import replace

    from neural_ik.neural_network.runtime.solver import planted_ankle_height
    model = random_model(humanoid_skeleton())
    planted_model = replace(model, feature_spec=replace(model.feature_spec, contact_height=(0.3, 0.3)))
    for m, ankle in ((planted_model, 0.3), (model, planted_ankle_height(model))):
        assert planted_ankle_height(m) == pytest.approx(ankle)
        h = m.skeleton.height
        for above, expected in ((0.07, 1.0), (0.09, 0.0)):
            targets = poses[0][:1].copy()
            targets[0, :, 2, 3] -= targets[0, 3:5, 2, 3].min() - ankle - above * h   # the lower foot that high
            lower = 3 + int(np.argmin(targets[0, 3:5, 2, 3]))
            solver = Solver(m, characters=1, engine=engine)
            for _tick in range(3):
                solver.solve(targets, ground=0.0, refine_iterations=0)
            ref = Solver(m, characters=1, engine="numpy")
            given = np.zeros((1, 2))
            given[0, lower - 3] = expected
            given[0, 4 - lower] = 0.0
            np.testing.assert_allclose(solver.solve(targets, ground=0.0, refine_iterations=0).local,
                                       ref.solve(targets, ground=0.0, contact=given, refine_iterations=0).local,
                                       atol=1e-5)
