"""Metrics of a solved motion against its reference: exact zeros on the reference itself, and known errors found."""

import numpy as np
import pytest

from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix
from neural_ik.neural_network.report import metrics
from neural_ik.neural_network.skeleton.roles import FOOT_ROLES, INNER_ROLES, NUM_ROLES, ROLE_INDEX, ROLES

FPS = 30.0
HEIGHT = 1.7


def random_rotations(rng, shape):
    return axis_angle_to_matrix(rng.normal(size=shape + (3,)) * 0.8)


def make_motion(rng, n=60, clips=2):
    """A standing character moving smoothly, feet planted; positions in metres."""
    t = np.arange(n)[:, None, None]
    base = rng.normal(size=(1, NUM_ROLES, 3)) * 0.3 + np.array([0.0, 0.0, 1.0])
    positions = base + 0.01 * np.sin(0.2 * t + rng.normal(size=(1, NUM_ROLES, 1)))
    for f in FOOT_ROLES:
        positions[:, f] = [0.1 * (1 if f == FOOT_ROLES[0] else -1), 0.0, 0.08]
    rotations = random_rotations(rng, (n, NUM_ROLES))
    local = random_rotations(rng, (n, NUM_ROLES))
    actions = np.repeat(np.arange(clips), n // clips)
    return metrics.Motion(positions, rotations, local), actions


def mask_without(*roles):
    mask = np.ones(NUM_ROLES, bool)
    for r in roles:
        mask[ROLE_INDEX[r]] = False
    return mask


def limits_around(motion, rng):
    mean = random_rotations(rng, (NUM_ROLES,))
    delta = metrics.matrix_to_axis_angle(np.swapaxes(mean, -1, -2)[None] @ motion.local_rotations)
    return mean, delta.min(axis=0) - 0.01, delta.max(axis=0) + 0.01


def all_numbers(tree):
    if isinstance(tree, dict):
        for value in tree.values():
            yield from all_numbers(value)
    elif isinstance(tree, (int, float)):
        yield float(tree)


def test_reference_against_itself_is_zero_everywhere():
    rng = np.random.default_rng(0)
    ref, actions = make_motion(rng)
    mask = mask_without("Spine2", "NeckUpper")
    tasks = np.where(actions == 0, 1, 3)
    result, frames = metrics.evaluate(ref, metrics.Motion(ref.positions.copy(), ref.rotations.copy(),
                                                          ref.local_rotations.copy()),
                                      mask, actions, FPS, HEIGHT, tasks=tasks, action_names=["a", "b"],
                                      limits=limits_around(ref, rng))
    skip = {"frames", "foot_skating_cm", "foot_skating_reference_cm", "acceleration_cm", "acceleration_reference_cm"}

    for summary in [result] + list(result["per_action"].values()) + list(result["per_task"].values()):
        values = list(all_numbers({k: v for k, v in summary.items() if k not in skip | {"per_action", "per_task"}}))
        assert len(values) > 40
        assert max(abs(v) for v in values) == 0.0
    assert result["foot_skating_cm"] == result["foot_skating_reference_cm"]
    assert set(result["per_task"]) == {"locomotion", "grab"}
    assert np.all(frames["effector_cm"] == 0.0)


def test_known_offsets_are_found_where_they_were_put():
    rng = np.random.default_rng(1)
    ref, actions = make_motion(rng)
    mask = mask_without("Spine2", "NeckUpper")
    solved = metrics.Motion(ref.positions.copy(), ref.rotations.copy(), ref.local_rotations.copy())
    elbow, hand = ROLE_INDEX["LeftForeArm"], ROLE_INDEX["RightHand"]
    solved.positions[:, elbow] += [0.03, 0.0, 0.0]                       # 3 cm on an inner joint
    solved.positions[:, hand] += [0.0, 0.0, 0.02]                        # 2 cm on an effector
    turn = axis_angle_to_matrix(np.array([0.0, 0.0, np.radians(0.01)]))  # 0.01 degree: below an arccos floor
    solved.rotations[:, ROLE_INDEX["Head"]] = solved.rotations[:, ROLE_INDEX["Head"]].astype(np.float32) @ turn
    result, _ = metrics.evaluate(ref, solved, mask, actions, FPS, HEIGHT)
    inner = [j for j in INNER_ROLES if mask[j]]
    assert result["per_role_cm"]["LeftForeArm"] == pytest.approx(3.0)
    assert result["per_role_cm"]["RightHand"] == pytest.approx(2.0)
    assert result["inner_mpjpe_cm"] == pytest.approx(3.0 / len(inner))
    assert result["mpjpe_cm"] == pytest.approx(5.0 / mask.sum())
    assert result["per_effector_cm"]["RightHand"] == pytest.approx(2.0)
    assert result["per_effector_p95_cm"]["RightHand"] == pytest.approx(2.0) and result["per_effector_p95_cm"]["Head"] == 0.0
    assert result["effector_cm"]["max"] == pytest.approx(2.0)
    assert result["per_effector_deg"]["Head"] == pytest.approx(0.01, rel=0.02)
    assert result["per_effector_deg"]["LeftHand"] == 0.0
    assert result["effector_miss_1cm"] == 1.0
    assert "Spine2" not in result["per_role_cm"]


def test_sliding_planted_foot_sinking_and_jitter():
    n = 40
    positions = np.zeros((n, NUM_ROLES, 3))
    positions[:, :, 2] = np.linspace(0.5, 1.5, NUM_ROLES)
    positions[:, :, 0] = np.linspace(0, 0.2, n)[:, None]        # the body glides at constant speed: no acceleration
    left, right = FOOT_ROLES
    positions[:, left] = [0.1, 0.0, 0.05]                          # both feet stay planted
    positions[:, right] = [-0.1, 0.0, 0.05]
    ident = np.broadcast_to(np.eye(3), (n, NUM_ROLES, 3, 3)).copy()
    ref = metrics.Motion(positions, ident, ident)
    actions = np.zeros(n, int)
    sol_pos = positions.copy()
    sol_pos[:, left, 1] += 0.01 * np.arange(n)                     # slides 1 cm per frame
    sol_pos[:, left, 2] -= 0.02                                    # and sinks 2 cm
    hand = ROLE_INDEX["LeftHand"]
    sol_pos[:, hand, 2] += 0.005 * (-1.0) ** np.arange(n)          # +-0.5 cm flicker: second difference 2 cm
    result, _ = metrics.evaluate(ref, metrics.Motion(sol_pos, ident, ident), np.ones(NUM_ROLES, bool), actions,
                                 FPS, HEIGHT)
    assert result["foot_skating_reference_cm"] == 0.0
    assert result["foot_skating_cm"] == pytest.approx(0.5)         # left slides 1 cm, right is still
    assert result["foot_skating_excess_cm"] == pytest.approx(0.5)
    assert result["penetration_cm"]["max"] == pytest.approx(2.0)
    # the left foot (constant velocity) and the hand (flicker) accelerate; 23 joints
    assert result["jitter_cm"] == pytest.approx(2.0 / NUM_ROLES)


def test_clip_boundaries_are_not_crossed():
    n = 20
    positions = np.zeros((n, NUM_ROLES, 3))
    positions[:, :, 2] = np.linspace(0.5, 1.5, NUM_ROLES)
    positions[10:] += [5.0, 0.0, 0.0]                              # the second clip starts elsewhere
    ident = np.broadcast_to(np.eye(3), (n, NUM_ROLES, 3, 3)).copy()
    motion = metrics.Motion(positions, ident, ident)
    actions = np.repeat([0, 1], 10)
    acc = metrics.joint_acceleration(motion, np.ones(NUM_ROLES, bool), actions)
    assert np.nanmax(acc) == 0.0
    slide = metrics.foot_slide(motion, np.ones((n, 2)), actions)
    assert np.nanmax(slide) == 0.0 and np.isnan(slide[10]).all()
    assert metrics.clip_bounds(actions) == [(0, 10), (10, 20)]


def test_joint_limit_excess_in_degrees():
    rng = np.random.default_rng(2)
    mean = random_rotations(rng, (NUM_ROLES,))
    low, high = np.full((NUM_ROLES, 3), -0.5), np.full((NUM_ROLES, 3), 0.5)
    delta = np.zeros((3, NUM_ROLES, 3))
    delta[1, 5, 0] = 0.5 + np.radians(5.0)
    delta[2, 7, 2] = -0.5 - np.radians(12.0)
    local = mean[None] @ axis_angle_to_matrix(delta)
    excess = metrics.limit_excess(local, mean, low, high)
    assert excess[1, 5, 0] == pytest.approx(5.0, abs=1e-6)
    assert excess[2, 7, 2] == pytest.approx(12.0, abs=1e-6)
    excess[1, 5, 0] = excess[2, 7, 2] = 0.0
    assert np.max(excess) < 1e-9
    ref = metrics.Motion(np.zeros((3, NUM_ROLES, 3)), local, mean[None].repeat(3, 0))
    sol = metrics.Motion(np.zeros((3, NUM_ROLES, 3)), local, local)
    result, _ = metrics.evaluate(ref, sol, np.ones(NUM_ROLES, bool), np.zeros(3, int), FPS, HEIGHT,
                                 limits=(mean, low, high))
    assert result["limit_violations"]["count"] == 2
    assert result["limit_violations"]["max_deg"] == pytest.approx(12.0, abs=1e-6)
    assert result["limit_violations_per_role"] == {ROLES[5]: 1, ROLES[7]: 1}
    assert len(ROLES) == NUM_ROLES


def test_a_rig_without_toes_is_measured_without_warnings():
    """A DAZ-style rig has no toe bones: their positions are NaN in every frame; penetration is read from the feet
    alone and numpy says nothing about all-NaN columns."""
    import warnings

    rng = np.random.default_rng(5)
    ref, actions = make_motion(rng)
    positions = np.array(ref.positions)
    for name in ("LeftToeBase", "RightToeBase"):
        positions[:, ROLE_INDEX[name]] = np.nan
    ref = metrics.Motion(positions, ref.rotations, ref.local_rotations)
    sunk = positions.copy()
    sunk[:, FOOT_ROLES[0], 2] -= 0.03
    mask = np.ones(NUM_ROLES, bool)
    mask[[ROLE_INDEX["LeftToeBase"], ROLE_INDEX["RightToeBase"]]] = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result, _ = metrics.evaluate(ref, metrics.Motion(sunk, ref.rotations, ref.local_rotations), mask, actions,
                                     FPS, HEIGHT)
    assert result["penetration_cm"]["max"] == pytest.approx(3.0)
