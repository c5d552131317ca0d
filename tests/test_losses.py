"""Every training loss against central finite differences, through FK and the axis-angle map, on a real rig layout;
the values of the contact, limit, slip and smooth terms against answers worked out by hand (a sign error fails)."""

import numpy as np
import pytest
from synthetic import humanoid_skeleton, synthetic_dataset

from neural_ik.neural_network.geometry import kinematics, rotations
from neural_ik.neural_network.model import losses
from neural_ik.neural_network.model.trainer import TrainConfig, Trainer
from neural_ik.neural_network.skeleton.roles import NUM_ROLES

TERMS = ("fk", "orientation", "pose", "contact", "limit", "slip", "smooth")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    data = synthetic_dataset(frames_per_action=40, actions=4, seed=3)
    trainer = Trainer(data, TrainConfig(), tmp_path_factory.mktemp("out"))
    rows = np.array([5, 9, 21, 30, 33])
    both = np.concatenate([rows, trainer.train.prev[rows]])
    batch = {k: v.astype(np.float64) for k, v in trainer.train.batch(both).items()}
    batch["pair_valid"] = np.array([1.0, 1.0, 0.0, 1.0, 1.0])
    batch["contacts"][:] = [[1, 0], [1, 1], [0, 1], [1, 1], [0, 0], [1, 0], [1, 1], [0, 1], [1, 0], [0, 0]]
    batch["ground"] += 0.02
    ctx = trainer.loss_context
    ctx.limit_low = ctx.limit_low * 0.5        # tighter limits, so the penalty is active in the check
    ctx.limit_high = ctx.limit_high * 0.5
    rng = np.random.default_rng(0)
    deltas = rng.normal(size=(len(both), NUM_ROLES * 3)) * 0.4
    deltas[0, 3:6] = [1e-4, -2e-4, 1e-4]       # a near-zero rotation exercises the Taylor branch
    return ctx, batch, deltas


def central_differences(ctx, weights, deltas, batch, eps=1e-6):
    """d total / d deltas by central differences, one delta at a time."""
    deltas = deltas.copy()
    numeric = np.zeros_like(deltas)
    for i in range(deltas.shape[0]):
        for k in range(deltas.shape[1]):
            old = deltas[i, k]
            deltas[i, k] = old + eps
            up = losses.evaluate(ctx, weights, deltas, batch, need_grad=False).total
            deltas[i, k] = old - eps
            down = losses.evaluate(ctx, weights, deltas, batch, need_grad=False).total
            deltas[i, k] = old
            numeric[i, k] = (up - down) / (2 * eps)
    return numeric


def only(term):
    return losses.LossWeights(**{t: (1.0 if t == term else 0.0) for t in TERMS})


@pytest.mark.parametrize("term", TERMS)
def test_each_loss_gradient_matches_central_differences(setup, term):
    ctx, batch, deltas = setup
    deltas = deltas.copy()
    weights = only(term)
    result = losses.evaluate(ctx, weights, deltas, batch)
    assert result.total > 0, f"{term} is inactive in this check"
    numeric = central_differences(ctx, weights, deltas, batch)
    scale = np.abs(numeric).max()
    assert scale > 0
    assert np.allclose(result.grad, numeric, atol=1e-6 * scale + 1e-9, rtol=1e-4)


@pytest.mark.parametrize("term", ("fk", "pose"))
def test_style_weighted_rows_match_central_differences_and_weigh_what_they_say(setup, term):
    """Per-row style weights (library rows: their inner joints' positions and the rotations count less): the gradient
    against central differences; weights of 1 change nothing; a row of weight 0 keeps only its non-inner positions
    (fk) or nothing (pose) in the loss."""
    ctx, batch, deltas = setup
    deltas = deltas.copy()
    weights = only(term)
    styled = dict(batch, style=np.linspace(0.0, 1.0, len(deltas)))
    result = losses.evaluate(ctx, weights, deltas, styled)
    numeric = central_differences(ctx, weights, deltas, styled)
    assert np.allclose(result.grad, numeric, atol=1e-6 * np.abs(numeric).max() + 1e-9, rtol=1e-4)
    plain = losses.evaluate(ctx, weights, deltas, batch)
    ones = losses.evaluate(ctx, weights, deltas, dict(batch, style=np.ones(len(deltas))))
    assert np.isclose(ones.total, plain.total) and np.allclose(ones.grad, plain.grad)
    zero_first = np.ones(len(deltas))
    zero_first[0] = 0.0
    grad = losses.evaluate(ctx, weights, deltas, dict(batch, style=zero_first)).grad.reshape(len(deltas), NUM_ROLES, 3)
    if term == "pose":
        assert np.abs(grad[0]).max() == 0.0 and np.abs(grad[1:]).max() > 0
    else:                 # only the non-inner positions of row 0 remain: its gradient differs from the plain one
        assert np.abs(grad[0]).max() > 0 and not np.allclose(grad[0], plain.grad.reshape(grad.shape)[0])
        np.testing.assert_allclose(grad[1:], plain.grad.reshape(grad.shape)[1:], rtol=1e-6, atol=1e-12)


def test_weighted_sum_of_terms_is_the_total_and_its_gradient(setup):
    ctx, batch, deltas = setup
    weights = losses.LossWeights(fk=1.0, orientation=0.5, pose=0.3, contact=0.5, limit=0.1, slip=0.2, smooth=0.05)
    total = losses.evaluate(ctx, weights, deltas, batch)
    parts = [losses.evaluate(ctx, only(t), deltas, batch) for t in TERMS]
    w = [getattr(weights, t) for t in TERMS]
    assert np.isclose(total.total, sum(wi * p.total for wi, p in zip(w, parts)))
    assert np.allclose(total.grad, sum(wi * p.grad for wi, p in zip(w, parts)))
    assert set(total.parts) == set(TERMS)


def test_masked_roles_and_the_hips_get_no_gradient(setup):
    ctx, batch, deltas = setup
    result = losses.evaluate(ctx, losses.LossWeights(smooth=0.1), deltas, batch).grad.reshape(len(deltas), NUM_ROLES, 3)
    unused = ~ctx.skeleton.role_mask
    unused[0] = True
    assert unused.sum() >= 3
    assert not np.any(result[:, unused])
    assert np.all(np.abs(result[:, ~unused]).sum(axis=(0, 2)) > 0)


def test_fused_exp_map_matches_rotations_module_including_tiny_and_near_pi_angles():
    rng = np.random.default_rng(5)
    v = rng.normal(size=(40, 3))
    v[0] = 0.0
    v[1] = [1e-7, 0, 0]
    v[2] = [0.049, 0.0, 0.01]
    v[3] = [0.0, np.pi - 1e-4, 0.0]
    G = rng.normal(size=(40, 3, 3))
    exp = losses.ExpMap(v)
    assert np.allclose(exp.matrix, rotations.axis_angle_to_matrix(v), atol=1e-13)
    assert np.allclose(exp.vjp(G), rotations.axis_angle_vjp(v, G), atol=1e-10)


def test_losses_vanish_on_the_true_pose(setup):
    ctx, batch, _ = setup
    truth = rotations.matrix_to_axis_angle(batch["pose_targets"]).reshape(len(batch["positions"]), -1)
    result = losses.evaluate(ctx, losses.LossWeights(contact=0, limit=0, slip=0), truth, batch)
    # float32 targets: the true pose's positions round-trip to about 1e-7 m, a loss of about 1e-12 (a wrong pose: 1e-2)
    assert result.parts["fk"] < 1e-10 and result.parts["pose"] < 1e-10 and result.parts["orientation"] < 1e-10
    assert np.abs(result.grad).max() < 1e-5


@pytest.mark.parametrize("per_sample", [False, True])
def test_batched_fk_path_equals_the_small_batch_path(per_sample):
    """kinematics switches to a batch-last layout for large batches (training); it must give the same numbers."""
    rng = np.random.default_rng(7)
    skel = humanoid_skeleton()
    n = 2 * kinematics.BATCH_LAST_FROM
    local = rotations.axis_angle_to_matrix(rng.normal(size=(n, NUM_ROLES, 3)))
    hips_R = rotations.axis_angle_to_matrix(rng.normal(size=(n, 3)))
    hips_x = rng.normal(size=(n, 3))
    bridges = rotations.axis_angle_to_matrix(rng.normal(size=(n, NUM_ROLES, 3))) if per_sample else None
    offsets = rng.normal(size=(n, NUM_ROLES, 3)) * 0.2 if per_sample else None
    g_rot, g_pos = rng.normal(size=(n, NUM_ROLES, 3, 3)), rng.normal(size=(n, NUM_ROLES, 3))
    big = kinematics.forward(skel, local, hips_R, hips_x, bridges, offsets)
    assert big.soa is not None
    g_big = kinematics.backward(skel, big, g_rot, g_pos)
    half = kinematics.BATCH_LAST_FROM // 2
    for start in range(0, n, half):
        part = slice(start, start + half)
        small = kinematics.forward(skel, local[part], hips_R[part], hips_x[part],
                                   None if bridges is None else bridges[part], None if offsets is None else offsets[part])
        assert small.soa is None
        assert np.allclose(small.rotations, big.rotations[part], atol=1e-12)
        assert np.allclose(small.positions, big.positions[part], atol=1e-12)
        assert np.allclose(kinematics.backward(skel, small, g_rot[part], g_pos[part]), g_big[part], atol=1e-10)


# ---- values against answers worked out by hand ----------------------------------------------------------------------

def hand_checked(drop=()):
    """A LossContext on the T-posed humanoid of live_helpers (bridges identity, mean pose identity): with zero deltas
    every bone keeps its rest offset, so an ankle is 0.05 + 0.42 + 0.42 m below the hips (thigh, shin, foot)."""
    from live_helpers import humanoid_skeleton as t_posed

    skeleton = t_posed(drop=drop)
    low, high = np.full((NUM_ROLES, 3), -0.3), np.full((NUM_ROLES, 3), 0.2)
    ctx = losses.LossContext(skeleton, np.broadcast_to(np.eye(3), (NUM_ROLES, 3, 3)), low, high,
                             contact_height=np.array([0.08, 0.05]), position_unit=0.5)    # 2 loss units per metre
    return ctx, 0.05 + 0.42 + 0.42


def batch_of(hips_positions, **arrays):
    n = len(hips_positions)
    return dict(hips_rotation=np.broadcast_to(np.eye(3), (n, 3, 3)).copy(),
                hips_position=np.array(hips_positions, np.float64), **arrays)


def value_of(term, ctx, deltas, batch):
    """The term's unweighted value, also checked to be what a weight of 2 doubles in the total."""
    part = losses.evaluate(ctx, only(term), deltas.reshape(len(deltas), -1), batch).parts[term]
    weights = losses.LossWeights(**{t: (2.0 if t == term else 0.0) for t in TERMS})
    assert losses.evaluate(ctx, weights, deltas.reshape(len(deltas), -1), batch).total == pytest.approx(2 * part)
    return part


def test_contact_value_is_the_planted_ankles_height_error():
    """A planted ankle belongs at the ground under it plus its planted height; a foot not in contact costs nothing."""
    ctx, leg = hand_checked()
    batch = batch_of([(0, 0, 1.0), (0.3, 0, 0.95)], contacts=np.array([[1.0, 0.0], [1.0, 1.0]]),
                     ground=np.array([[0.01, 0.0], [0.0, -0.02]]))
    ankle = np.array([1.0, 0.95]) - leg                                            # 0.11 m, 0.06 m
    errors = 2.0 * np.array([ankle[0] - 0.01 - 0.08,                               # row 0, left:  0.04
                             ankle[1] - 0.00 - 0.08,                               # row 1, left: -0.04
                             ankle[1] + 0.02 - 0.05])                              # row 1, right: 0.06
    assert np.sum(errors ** 2) / 2 == pytest.approx(0.0034)
    assert value_of("contact", ctx, np.zeros((2, NUM_ROLES, 3)), batch) == pytest.approx(0.0034, rel=1e-5)


def test_limit_value_is_the_squared_distance_outside_the_range():
    """Limits [-0.3, 0.2] rad: only what lies outside counts, on either side; the hips (given, not predicted) and an
    unmapped role never count."""
    from neural_ik.neural_network.skeleton.roles import ROLE_INDEX

    ctx, _leg = hand_checked(drop=("Spine2",))
    d = np.zeros((2, NUM_ROLES, 3))
    d[0, ROLE_INDEX["LeftArm"]] = (0.5, -0.7, 0.1)         # 0.3 over, 0.4 under, inside
    d[1, ROLE_INDEX["Head"]] = (-0.35, 0.0, 0.31)          # 0.05 under, inside, 0.11 over
    d[0, ROLE_INDEX["Hips"]] = (2.0, 2.0, 2.0)
    d[1, ROLE_INDEX["Spine2"]] = (3.0, -3.0, 0.0)
    expected = (0.3 ** 2 + 0.4 ** 2 + 0.05 ** 2 + 0.11 ** 2) / 2                  # 0.1323
    assert value_of("limit", ctx, d, batch_of([(0, 0, 1.0)] * 2)) == pytest.approx(expected, rel=1e-5)


def test_slip_value_is_how_far_a_foot_planted_on_both_frames_moved():
    """Rows 0-1 are frames, rows 2-3 their previous frames. Pair 0: the hips moved 5 cm, the left foot is planted on
    both frames (the right only on one: free); pair 1 is not a valid pair (another clip), however far it moved."""
    ctx, _leg = hand_checked()
    batch = batch_of([(0, 0, 1.0), (1.0, 0, 1.0), (-0.03, -0.04, 1.0), (0.5, 0, 1.0)],
                     contacts=np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]),
                     ground=np.zeros((4, 2)), pair_valid=np.array([1.0, 0.0]))
    expected = (2.0 * 0.05) ** 2 / 2                                               # one foot, 0.1 loss units, 2 pairs
    assert value_of("slip", ctx, np.zeros((4, NUM_ROLES, 3)), batch) == pytest.approx(expected, rel=1e-5)


def test_smooth_value_is_the_mean_squared_step_between_paired_frames():
    from neural_ik.neural_network.skeleton.roles import ROLE_INDEX

    ctx, _leg = hand_checked()
    d = np.zeros((4, NUM_ROLES, 3))
    d[0, ROLE_INDEX["LeftForeArm"]] = (0.1, 0.0, -0.2)     # pair 0: a step of (0.1, 0, -0.2)
    d[2, ROLE_INDEX["Hips"]] = (1.0, 0.0, 0.0)             # the hips do not count
    d[1, ROLE_INDEX["LeftArm"]] = (0.5, 0.5, 0.5)          # pair 1 is not a valid pair
    batch = batch_of([(0, 0, 1.0)] * 4, pair_valid=np.array([1.0, 0.0]))
    expected = (0.1 ** 2 + 0.2 ** 2) / (2 * 3 * (NUM_ROLES - 1))                  # mean over 2 pairs, 22 roles x 3
    assert value_of("smooth", ctx, d, batch) == pytest.approx(expected, rel=1e-5)
