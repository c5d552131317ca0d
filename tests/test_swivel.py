"""The arm swivel stage (ik/swivel.py): its derivative against finite differences, the hands it never moves, the
bones it never touches, the limits it never crosses further, and a swivel turned away from the mean pose coming back."""

import numpy as np
import pytest
from live_helpers import humanoid_skeleton, limits, mean_pose

from neural_ik.neural_network.geometry.quaternion_math import (
    multiply_quaternions,
    quaternion_axis_angle,
    quaternion_product,
    quaternions_to_matrices,
    turn_quaternion,
)
from neural_ik.neural_network.geometry.rotations import axis_angle_to_quaternion, matrix_to_quaternion
from neural_ik.neural_network.ik import swivel
from neural_ik.neural_network.ik.refine import Refiner
from neural_ik.neural_network.skeleton.roles import ROLE_INDEX


@pytest.fixture(scope="module")
def stage():
    skel = humanoid_skeleton()
    mean = mean_pose()
    low, high = limits()
    refiner = Refiner(skel, mean, low, high)
    mean_q = matrix_to_quaternion(np.asarray(mean, np.float64))
    return skel, refiner, mean_q, low, high, swivel.ArmSwivel(skel, mean_q, low, high, refiner.slot_of)


def poses(mean_q, n, spread, seed):
    rng = np.random.default_rng(seed)
    return multiply_quaternions(np.broadcast_to(mean_q, (n, 23, 4)), axis_angle_to_quaternion(
        rng.normal(size=(n, 23, 3)) * spread))


def test_the_inverse_jacobian_is_the_log_maps_derivative():
    """d/dt log(exp(v) exp(t a)) at t = 0 is J_r^-1(v) a, for small and large rotations."""
    rng = np.random.default_rng(1)
    for scale in (1e-5, 0.3, 1.5, 2.8):
        v = rng.normal(size=3)
        v *= scale / np.linalg.norm(v)
        a = rng.normal(size=3)
        a /= np.linalg.norm(a)
        base = tuple(axis_angle_to_quaternion(v))
        h = 1e-6

        def log_at(t, base=base, a=a):
            return np.array(quaternion_axis_angle(quaternion_product(base, turn_quaternion(tuple(a), t))))

        numeric = (log_at(h) - log_at(-h)) / (2 * h)
        np.testing.assert_allclose(swivel._inverse_jacobian_times_array(v, a), numeric, atol=1e-6)


def test_hands_stay_where_and_as_they_are_and_only_the_upper_arms_and_hands_turn(stage):
    skel, refiner, mean_q, low, high, arm_stage = stage
    q = poses(mean_q, 40, 0.35, seed=2)
    hips = np.broadcast_to(np.eye(4), (40, 4, 4)).copy()
    before = refiner.chain_forward(q, hips).copy()
    settled = q.copy()
    turned = arm_stage.settle(settled, before)
    assert turned > 20                                   # random arms sit far from the mean: most turn
    after = refiner.chain_forward(settled, hips)
    for hand in ("LeftHand", "RightHand"):
        slot = refiner.slot_of[ROLE_INDEX[hand]]
        np.testing.assert_allclose(after[:, slot], before[:, slot], atol=1e-9)
    changed = np.abs(settled - q).max(axis=(0, 2)) > 1e-12
    allowed = {ROLE_INDEX[r] for r in ("LeftArm", "RightArm", "LeftHand", "RightHand")}
    assert set(np.nonzero(changed)[0]) <= allowed and changed.any()
    for elbow in ("LeftForeArm", "RightForeArm"):        # the elbow's own rotation is untouched; the elbow moves
        j = ROLE_INDEX[elbow]
        np.testing.assert_array_equal(settled[:, j], q[:, j])
        slot = refiner.slot_of[j]
        assert np.abs(after[:, slot, :3, 3] - before[:, slot, :3, 3]).max() > 1e-3


def deltas(mean_q, q, roles):
    inverse = mean_q[roles] * np.array([1.0, -1.0, -1.0, -1.0])
    return np.array([[quaternion_axis_angle(quaternion_product(tuple(inverse[i]), tuple(row[j])))
                      for i, j in enumerate(roles)] for row in q])


def test_the_turn_lowers_the_cost_and_never_goes_further_past_the_limits(stage):
    skel, refiner, mean_q, low, high, arm_stage = stage
    q = poses(mean_q, 60, 0.6, seed=3)                  # wide: some joints start past their limits
    hips = np.broadcast_to(np.eye(4), (60, 4, 4)).copy()
    settled = q.copy()
    arm_stage.settle(settled, refiner.chain_forward(q, hips).copy())
    roles = [ROLE_INDEX[r] for r in ("LeftArm", "LeftHand", "RightArm", "RightHand")]
    d0, d1 = deltas(mean_q, q, roles), deltas(mean_q, settled, roles)
    low, high = np.asarray(low)[roles], np.asarray(high)[roles]
    past0 = (np.maximum(d0 - high, 0) + np.maximum(low - d0, 0)).sum(-1)
    past1 = (np.maximum(d1 - high, 0) + np.maximum(low - d1, 0)).sum(-1)
    assert past0.max() > 0                               # the case is exercised
    for arm in (slice(0, 2), slice(2, 4)):               # per arm, the shoulder and the wrist together
        assert np.all(past1[:, arm].sum(1) <= past0[:, arm].sum(1) + 1e-9)
    scale = 1.0 / np.maximum(0.5 * (high - low), 0.05)
    weight = np.array([1.0, swivel.WRIST, 1.0, swivel.WRIST])[None, :, None]
    cost0 = (weight * (d0 * scale) ** 2).sum(-1)
    cost1 = (weight * (d1 * scale) ** 2).sum(-1)
    for arm in (slice(0, 2), slice(2, 4)):               # lower without the turn's own cost, which only adds
        assert np.all(cost1[:, arm].sum(1) <= cost0[:, arm].sum(1) + 1e-12)


def test_an_arm_turned_away_from_the_mean_pose_about_its_line_comes_back(stage):
    """The mean pose with the elbows bent 70 degrees, each arm then turned 25 degrees about its shoulder-hand line
    (the hand kept as it was): the stage turns it most of the way back."""
    skel, refiner, mean_q, low, high, arm_stage = stage
    q = np.broadcast_to(mean_q, (1, 23, 4)).copy()
    for side in ("Left", "Right"):
        j = ROLE_INDEX[side + "ForeArm"]
        q[0, j] = quaternion_product(tuple(q[0, j]), turn_quaternion((0.0, 0.0, 1.0), np.radians(70)))
    hips = np.eye(4)[None]
    rest = refiner.chain_forward(q, hips).copy()
    turned = q.copy()
    for side in ("Left", "Right"):
        arm, hand = ROLE_INDEX[side + "Arm"], ROLE_INDEX[side + "Hand"]
        s, h = rest[0, refiner.slot_of[arm]], rest[0, refiner.slot_of[hand]]
        line = (h[:3, 3] - s[:3, 3]) / np.linalg.norm(h[:3, 3] - s[:3, 3])
        angle = np.radians(25)
        turned[0, arm] = quaternion_product(tuple(q[0, arm]), turn_quaternion(tuple(s[:3, :3].T @ line), angle))
        turned[0, hand] = quaternion_product(tuple(q[0, hand]), turn_quaternion(tuple(h[:3, :3].T @ line), -angle))
    away = refiner.chain_forward(turned, hips).copy()
    settled = turned.copy()
    assert arm_stage.settle(settled, away) == 2
    back = refiner.chain_forward(settled, hips)
    for side in ("Left", "Right"):
        elbow = refiner.slot_of[ROLE_INDEX[side + "ForeArm"]]
        moved = np.linalg.norm(away[0, elbow, :3, 3] - rest[0, elbow, :3, 3])
        left = np.linalg.norm(back[0, elbow, :3, 3] - rest[0, elbow, :3, 3])
        assert moved > 0.02 and left < 0.5 * moved
    rotations = quaternions_to_matrices(settled)
    assert np.isfinite(rotations).all()


def test_a_shoulder_or_wrist_far_from_anything_the_model_knows_is_left_alone(stage):
    """Past FADE (in half ranges) from the mean pose the mean pose says little and the turn could flip from tick to
    tick: none. A wrist turned 2.7 half ranges (of 1.2 rad) away: no turn, however far the arm sits from its mean."""
    skel, refiner, mean_q, low, high, arm_stage = stage
    q = poses(mean_q, 30, 0.35, seed=4)
    hips = np.broadcast_to(np.eye(4), (30, 4, 4)).copy()
    for side in ("Left", "Right"):
        j = ROLE_INDEX[side + "Hand"]
        q[:, j] = quaternion_product(tuple(mean_q[j]), turn_quaternion((1.0, 0.0, 0.0), 2.7 * 1.2))
    settled = q.copy()
    assert arm_stage.settle(settled, refiner.chain_forward(q, hips).copy()) == 0
    np.testing.assert_array_equal(settled, q)


def test_with_a_memory_a_turn_moves_at_most_speed_times_dt_a_tick(stage):
    """Live (and Bake, frame to frame) an arm's turn follows its target no faster than SPEED: the same arm turned
    25 degrees one way, then the other, gives turns far apart alone and within SPEED * dt with a memory."""
    from neural_ik.neural_network.ik.refine_memory import RefineMemory
    skel, refiner, mean_q, low, high, arm_stage = stage
    hips = np.eye(4)[None]
    base = np.broadcast_to(mean_q, (1, 23, 4)).copy()
    for side in ("Left", "Right"):
        j = ROLE_INDEX[side + "ForeArm"]
        base[0, j] = quaternion_product(tuple(base[0, j]), turn_quaternion((0.0, 0.0, 1.0), np.radians(70)))
    rest = refiner.chain_forward(base, hips).copy()

    def turned(angle):
        q = base.copy()
        for side in ("Left", "Right"):
            arm, hand = ROLE_INDEX[side + "Arm"], ROLE_INDEX[side + "Hand"]
            s, h = rest[0, refiner.slot_of[arm]], rest[0, refiner.slot_of[hand]]
            line = (h[:3, 3] - s[:3, 3]) / np.linalg.norm(h[:3, 3] - s[:3, 3])
            q[0, arm] = quaternion_product(tuple(q[0, arm]), turn_quaternion(tuple(s[:3, :3].T @ line), angle))
            q[0, hand] = quaternion_product(tuple(q[0, hand]), turn_quaternion(tuple(h[:3, :3].T @ line), -angle))
        return q, refiner.chain_forward(q, hips).copy()

    alone = []
    for angle in (np.radians(25), np.radians(-25)):
        memory = RefineMemory(1, 0)
        q, world = turned(angle)
        arm_stage.settle(q, world, memory)
        alone.append(memory.swivel[0].copy())
    assert np.abs(alone[1] - alone[0]).min() > 0.2
    memory = RefineMemory(1, 0)
    memory.dt = 1 / 60
    for angle in (np.radians(25), np.radians(-25)):
        q, world = turned(angle)
        arm_stage.settle(q, world, memory)
    np.testing.assert_allclose(np.abs(memory.swivel[0] - alone[0]), swivel.SPEED / 60, rtol=1e-9)
    memory.reset()
    q, world = turned(np.radians(-25))
    arm_stage.settle(q, world, memory)                   # forgotten: the turn alone again
    np.testing.assert_allclose(memory.swivel[0], alone[1], atol=1e-12)


def test_bake_gives_what_live_ticks_give_with_the_turn_limited_frame_to_frame():
    """A Solver ticking one character frame by frame and a Bake's Solver (every frame in one call, `sequence`) give
    the same poses, the arms turned by the stage in both, and no arm's turn moves more than SPEED * dt from one frame
    to the next. The targets: where a network fitted to random poses puts the effectors, 5 mm off (within reach; its
    arms' swivels are off the mean pose's)."""
    from live_helpers import fitted_model, random_poses, targets_of

    from neural_ik.neural_network.runtime.solver import Solver
    model = fitted_model(humanoid_skeleton())
    n, dt = 40, 1 / 30
    _local, hips_R, hips_p, pose = random_poses(model.skeleton, n, seed=31, spread=0.3, mean=model.mean_pose)
    targets = targets_of(pose, hips_R, hips_p)
    network = Solver(model, characters=n, engine="numpy")
    network.step(targets, refine_iterations=0, contact=np.zeros((n, 2)))
    world = network.refiner.chain_forward(network.q, targets[:, 0])
    targets[:, 1:] = world[:, network.effector_slots]
    targets[:, 1:, 2, 3] -= 0.005
    contact = np.zeros((n, 2))
    live = Solver(model, characters=1, engine="numpy")
    turns, poses = [], []
    for i in range(n):
        live.step(targets[i:i + 1], refine_iterations=2, dt=dt, contact=contact[i:i + 1])
        poses.append(live.q[0].copy())
        turns.append(live.memory.swivel[0].copy())
    baked = Solver(model, characters=n, engine="numpy", sequence=True).solve(targets, refine_iterations=2, dt=dt,
                                                                             contact=contact)
    np.testing.assert_allclose(np.abs(np.sum(np.array(poses) * baked.quaternions, axis=-1)), 1.0, atol=1e-12)
    turns = np.array(turns)
    assert np.abs(turns).max() > 0.01
    assert np.abs(np.diff(turns, axis=0)).max() <= swivel.SPEED * dt + 1e-12


@pytest.mark.parametrize("spread", [0.35, 0.6])
def test_many_characters_at_once_turn_as_each_alone(stage, spread):
    """From BATCH_FROM characters on the stage runs as array operations: the same turns as one character at a time
    (the Python-float path), with and without a memory (whose limit binds on the second tick), including characters
    past their limits (0.6) and far from the mean (faded out)."""
    from neural_ik.neural_network.ik.refine_memory import RefineMemory
    skel, refiner, mean_q, low, high, arm_stage = stage
    n = 3 * swivel.BATCH_FROM
    hips = np.broadcast_to(np.eye(4), (n, 4, 4)).copy()
    ticks = [poses(mean_q, n, spread, seed=s) for s in (5, 6)]
    worlds = [refiner.chain_forward(t, hips).copy() for t in ticks]
    together, alone = RefineMemory(n, 0), [RefineMemory(1, 0) for _ in range(n)]
    for tick, world in zip(ticks, worlds):
        batch = tick.copy()
        assert arm_stage.settle(batch, world, together) > n // 2
        for i in range(n):
            single = tick[i:i + 1].copy()
            arm_stage.settle(single, world[i:i + 1], alone[i])
            np.testing.assert_allclose(np.abs(np.sum(single[0] * batch[i], axis=-1)), 1.0, atol=1e-12)
            np.testing.assert_allclose(alone[i].swivel[0], together.swivel[i], atol=1e-9)
    free_batch, free_single = ticks[0].copy(), ticks[0].copy()
    arm_stage.settle(free_batch, worlds[0])
    for i in range(n):
        arm_stage.settle(free_single[i:i + 1], worlds[0][i:i + 1])
    np.testing.assert_allclose(np.abs(np.sum(free_batch * free_single, axis=-1)), 1.0, atol=1e-12)
