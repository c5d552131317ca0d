"""Free targets without Blender: the target prior (model/prior.py) learns where free targets go, is relative to the
pinned ones, round-trips in checkpoints, and as an ensemble answers its members' mean; the hips stage
(ik/hips_reach.py) moves a free root only as far as the pinned limbs need; a free effector lands where the network
puts it (Solver.step's follow)."""

import json

import numpy as np
import pytest
from synthetic import synthetic_dataset

from neural_ik.neural_network.data import augment
from neural_ik.neural_network.data.files import FileRefused
from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix
from neural_ik.neural_network.ik.hips_reach import CROUCH, LEG_REACH, LIMBS, SLACK, HipsReach
from neural_ik.neural_network.model import checkpoint, prior, trainer
from neural_ik.neural_network.runtime.free_targets import FreeTargets, NoPrior
from neural_ik.neural_network.runtime.solver import Solver
from neural_ik.neural_network.runtime.status import MISSED


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    data = synthetic_dataset(frames_per_action=150, actions=6, seed=3)
    tr = trainer.Trainer(data, trainer.TrainConfig(epochs=40, batch_size=128, patience=0, limb_mix=0.0),
                         tmp_path_factory.mktemp("prior"))
    result = tr.run()
    return tr, result


def _yaw(angle, shift):
    T = np.eye(4)
    T[:3, :3] = axis_angle_to_matrix(np.array([0.0, 0.0, angle]))
    T[:3, 3] = shift
    return T


def test_free_mask_refuses_all_six_and_unknown_names():
    assert prior.free_mask(["root", "head"]).tolist() == [True, False, False, False, False, True]
    with pytest.raises(ValueError, match="pin at least one"):
        prior.free_mask(prior.TARGETS)
    with pytest.raises(ValueError, match="unknown target"):
        prior.free_mask(["tail"])


def test_the_placement_loss_is_the_mean_miss_of_the_free_targets_and_its_gradient_matches_finite_differences():
    rng = np.random.default_rng(5)
    want = rng.normal(size=(4, prior.NUM_PRIOR_OUTPUTS))
    free = np.zeros((4, prior.NUM_TARGETS), bool)
    free[:, 0] = free[1, 5] = free[3, 2] = True
    # a miss of the position alone, 0.3 long, on every free target: the loss is 0.3 (to the floor that keeps its
    # lengths smooth at 0); the pinned ones' misses count for nothing
    shift = np.zeros((4, prior.NUM_TARGETS, prior.PER_TARGET))
    shift[..., :3] = np.array([0.0, 0.18, 0.24])
    shift[~free] = rng.normal(size=(int((~free).sum()), prior.PER_TARGET))
    loss, _ = prior.placement_loss(want + shift.reshape(4, -1), want, free)
    assert loss == pytest.approx(0.3, abs=prior.LENGTH_FLOOR)
    out = want + rng.normal(scale=0.2, size=want.shape)
    loss, grad = prior.placement_loss(out, want, free)
    step = 1e-6
    numeric = np.zeros_like(out)
    for index in np.ndindex(out.shape):
        plus, minus = out.copy(), out.copy()
        plus[index] += step
        minus[index] -= step
        numeric[index] = (prior.placement_loss(plus, want, free)[0] - prior.placement_loss(minus, want, free)[0]) / (
            2 * step)
    assert np.abs(grad - numeric).max() < 1e-6
    assert np.abs(grad).max() > 1e-3 and not grad.reshape(4, prior.NUM_TARGETS, -1)[~free].any()


def test_the_prior_learns_where_the_hips_go_better_than_a_body_upright_over_the_feet(trained):
    tr, result = trained
    model = result.model
    assert model.prior is not None
    # the frames it trained on (six synthetic clips are too few to place the hips of an unseen one)
    targets = prior.targets_of_rows(tr.train.positions[:tr.recorded_rows], tr.train.global_rotations[:tr.recorded_rows])
    free = prior.free_mask(["root", "head"])
    placed = model.prior.complete(targets, free)
    np.testing.assert_array_equal(placed[:, ~free], targets[:, ~free])        # the pinned ones untouched
    learned = np.linalg.norm(placed[:, 0, :3, 3] - targets[:, 0, :3, 3], axis=-1).mean()
    # the baseline: the hips above the feet's midpoint at the training frames' mean height
    upright = targets[:, 3:5, :3, 3].mean(axis=1)
    upright[:, 2] = tr.train.positions[:, 0, 2].mean()
    baseline = np.linalg.norm(upright - targets[:, 0, :3, 3], axis=-1).mean()
    assert learned < 0.5 * baseline, (learned, baseline)
    R = placed[:, [0, 5], :3, :3]
    np.testing.assert_allclose(R @ np.swapaxes(R, -1, -2), np.broadcast_to(np.eye(3), R.shape), atol=1e-6)
    on_validation = model.prior.complete(tr.val_targets, free)
    miss = np.linalg.norm(on_validation[:, free, :3, 3] - tr.val_targets[:, free, :3, 3], axis=-1).mean()
    assert result.metrics["prior_root_head_cm"] == pytest.approx(100 * miss, rel=1e-3)    # reported per epoch


def test_a_train_run_trains_the_clip_prior_beside_the_plain_one(trained, tmp_path):
    tr, result = trained
    model = result.model
    assert model.clip_prior is not None and model.clip_prior.window == prior.WINDOW and not model.prior.window
    untrained = prior.PriorTraining(model.clip_prior.references, model.clip_prior.height, seed=9,
                                    window=prior.WINDOW).validate(tr.val_targets, rows=tr.val_clip_rows)
    for names in ("root_head", "root_left_foot_right_foot"):
        learned = result.metrics[f"clip_prior_{names}_cm"]
        assert learned < 0.5 * untrained[f"clip_prior_{names}_cm"], (names, learned, untrained)
    path = str(tmp_path / "m.npz")
    checkpoint.save_model(path, model)
    assert checkpoint.load_model(path).clip_prior.window == prior.WINDOW


def test_the_prior_moves_and_turns_with_the_pinned_targets(trained):
    model = trained[1].model
    targets = trained[0].val_targets[::40]
    free = prior.free_mask(["root", "head"])
    T = _yaw(1.1, [2.0, -3.0, 0.0])
    moved = model.prior.complete(T[None, None] @ targets, free)
    np.testing.assert_allclose(moved, T[None, None] @ model.prior.complete(targets, free), atol=1e-4)


def test_a_prior_trained_on_mirror_images_answers_the_mirror_image_with_the_mirror_image_of_its_answer(trained):
    """The prior's mirror of six targets is the dataset's mirror of the pose (augment.py), mirroring twice is the
    identity, and the prior (averaging its answer with the mirror image's) is exactly mirror-symmetric."""
    tr, result = trained
    model = result.model
    assert tr.mirror_note == "on" and model.prior.mirror_frames is not None
    frames = model.prior.mirror_frames

    def targets_of(dataset):
        rows = trainer.TrainingArrays(dataset)
        return prior.targets_of_rows(rows.positions, rows.global_rotations)[::5]

    targets = targets_of(tr.dataset)
    mirror = augment.mirror_check(tr.dataset)         # fitted on all the frames (the trainer's: the training split)
    image = prior.mirror_targets(targets, prior.mirror_frames_of(mirror))
    of_mirrored_pose = targets_of(augment.mirror_dataset(tr.dataset, mirror))
    np.testing.assert_allclose(image[..., :3, :3], of_mirrored_pose[..., :3, :3], atol=1e-5)
    np.testing.assert_allclose(image[..., :3, 3], of_mirrored_pose[..., :3, 3], atol=1e-4)
    image = prior.mirror_targets(targets, frames)
    np.testing.assert_allclose(prior.mirror_targets(image, frames), targets, atol=1e-12)

    plain = prior.TargetPrior(model.prior.weights, model.prior.height, model.prior.references)
    for names in (["root", "head"], ["root", "left_hand"], ["left_foot"]):
        free = prior.free_mask(names)
        placed = model.prior.complete(targets, free)
        np.testing.assert_allclose(model.prior.complete(image, free[prior.PARTNER]),
                                   prior.mirror_targets(placed, frames), atol=1e-5)
        assert not np.allclose(plain.complete(image, free[prior.PARTNER]), prior.mirror_targets(
            plain.complete(targets, free), frames), atol=1e-3)        # the network alone is not symmetric


def test_checkpoints_keep_the_prior_and_refuse_a_broken_one(trained, tmp_path):
    model = trained[1].model
    path = str(tmp_path / "m.npz")
    checkpoint.save_model(path, model)
    loaded = checkpoint.load_model(path)
    targets = trained[0].val_targets[:20]
    free = prior.free_mask(["root", "left_foot", "right_foot"])
    np.testing.assert_allclose(loaded.prior.complete(targets, free), model.prior.complete(targets, free), atol=1e-6)
    np.testing.assert_array_equal(loaded.prior.mirror_frames, model.prior.mirror_frames)
    arrays = dict(np.load(path, allow_pickle=False))
    arrays["prior_W1"] = arrays["prior_W1"] * np.nan
    np.savez(str(tmp_path / "bad.npz"), **arrays)
    with pytest.raises(FileRefused, match="target prior's layer 1 holds NaN"):
        checkpoint.load_model(str(tmp_path / "bad.npz"))
    arrays = dict(np.load(path, allow_pickle=False))
    meta = json.loads(arrays["meta"].tobytes())
    meta["prior"]["mirror_frames"][0] = 3.0
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(str(tmp_path / "skewed.npz"), **arrays)
    with pytest.raises(FileRefused, match="mirror frames are not orthogonal"):
        checkpoint.load_model(str(tmp_path / "skewed.npz"))
    old = trained[1].model
    old_style = type(old)(**{**old.__dict__, "prior": None})
    with pytest.raises(NoPrior, match="train it again"):
        FreeTargets(old_style, prior.free_mask(["root"]))


def _standing(stage, height):
    """(1, 6, 4, 4) targets of a body standing straight: the root at `height`, each foot and hand below its anchor
    at 0.9 of the limb's reach."""
    targets = np.broadcast_to(np.eye(4), (1, 6, 4, 4)).copy()
    targets[0, 0, :3, 3] = [0.0, 0.0, height]
    for row, (slot, _anchor, _chain) in enumerate(LIMBS[:4]):
        targets[0, slot, :3, 3] = targets[0, 0, :3, 3] + stage.anchors[row] - [0.0, 0.0, 0.9 * stage.reaches[row]]
    return targets


def _stage_cost(stage, targets, pinned, anchors, u):
    """The hips stage's cost as its docstring writes it (hips_reach.py), for a solution u (K, 5): the limbs' excess,
    the feet's crouch, the moves."""
    from neural_ik.neural_network.ik import hips_reach

    rows = [row for row, (slot, _a, _c) in enumerate(LIMBS) if pinned[slot]]
    feet = np.isin(rows, hips_reach.FEET)
    slack = hips_reach.POSED_SLACK if anchors is not None else np.full(len(LIMBS), SLACK)
    reach = stage.reaches[rows] + slack[rows] * stage.carried[rows]
    weight = np.where(feet | (np.array(rows) == 4), hips_reach.LEG, hips_reach.ARM) / stage.height
    root = targets[:, 0]
    side = root[:, :3, :3] @ stage.lateral
    side[:, 2] = 0.0
    side /= np.linalg.norm(side, axis=-1, keepdims=True)
    ahead = np.cross(side, [0.0, 0.0, 1.0])
    turned = axis_angle_to_matrix(side * u[:, 3:4]) @ axis_angle_to_matrix(ahead * u[:, 4:5]) @ root[:, :3, :3]
    local = np.broadcast_to(stage.anchors[rows] if anchors is None else anchors[:, rows], (len(u), len(rows), 3))
    offset = root[:, None, :3, 3] + u[:, None, :3] + np.einsum("kab,kmb->kma", turned, local) \
        - targets[:, [LIMBS[r][0] for r in rows]][..., :3, 3]
    over = np.maximum(np.linalg.norm(offset, axis=-1) - reach, 0.0)
    under = np.where(feet, np.maximum(CROUCH / LEG_REACH * reach - np.linalg.norm(offset, axis=-1), 0.0), 0.0)
    bend = hips_reach.HEAD_BEND if (reach <= 0).any() else hips_reach.BEND
    return (((over + under) * weight) ** 2).sum(1) + hips_reach.MOVE * (u[:, :3] ** 2).sum(1) / stage.height ** 2 \
        + bend * (u[:, 3:] ** 2).sum(1)


def _stage_slopes(stage, targets, pinned, anchors, u, step=1e-6):
    """(K, 5) central differences of _stage_cost at solutions u (K, 5): its slope along the move, the bend, the roll."""
    return np.stack([(_stage_cost(stage, targets, pinned, anchors, u + step * e)
                      - _stage_cost(stage, targets, pinned, anchors, u - step * e)) / (2 * step)
                     for e in np.eye(5)], axis=1)


def test_hips_stage_with_a_pinned_head_finds_the_least_cost(trained, monkeypatch):
    """The VR case (head and hands pinned, anchors where a network's pose holds them: the head has no reach): the
    stage's root is where its documented cost is least (central differences vanish there, but for a bend held at
    its bound, whose slope points past it; they do not at the prior's root), within 0.1 % of the cost ten times the
    iterations reach; the head's anchor comes to its target as far as the hands' reach lets it."""
    from neural_ik.neural_network.ik import hips_reach

    stage = HipsReach.for_model(trained[1].model)
    rng = np.random.default_rng(4)
    targets = np.repeat(_standing(stage, 1.0), 12, axis=0)
    targets[:, 5, :3, 3] = targets[:, 0, :3, 3] + stage.anchors[4]
    for slot in (1, 2, 5):                                                        # head and hands moved about
        targets[:, slot, :3, 3] += rng.normal(scale=0.12, size=(12, 3))
    anchors = np.broadcast_to(stage.anchors, (12, 5, 3)) + rng.normal(scale=0.02, size=(12, 5, 3))
    pinned = ~prior.free_mask(["root", "left_foot", "right_foot"])
    root, u = stage.place(targets, pinned, anchors=anchors)
    grads = [_stage_slopes(stage, targets, pinned, anchors, solution) for solution in (np.zeros_like(u), u)]
    assert (u[:, 4] == 0.0).all()                  # with the head pinned this way the root does not roll
    low, high = u[:, 3] <= -hips_reach.BACKWARD, u[:, 3] >= hips_reach.FORWARD
    assert (grads[1][low, 3] > 0.0).all() and (grads[1][high, 3] < 0.0).all()
    slope = np.where((low | high)[:, None] & (np.arange(5) == 3) | (np.arange(5) == 4), 0.0, grads[1])
    # a limb right at its reach is a kink the Gauss-Newton steps close in on slowly: within 1 % of the starting slope
    # (a stage that stops short leaves 30 % or more)
    assert (np.abs(slope).max(axis=1) < 1e-2 * np.abs(grads[0]).max(axis=1)).all()
    monkeypatch.setattr(hips_reach, "ITERATIONS", 10 * hips_reach.ITERATIONS)
    _root, longer = stage.place(targets, pinned, anchors=anchors)
    costs = [_stage_cost(stage, targets, pinned, anchors, solution) for solution in (u, longer)]
    assert (costs[0] <= 1.001 * costs[1]).all()
    misses = [np.linalg.norm(r[:, :3, 3] + np.einsum("kab,kb->ka", r[:, :3, :3], anchors[:, 4]) - targets[:, 5, :3, 3],
                             axis=-1) for r in (targets[:, 0], root)]
    assert (misses[1] < misses[0]).all() and misses[1].mean() < 0.2 * misses[0].mean()


def test_hips_stage_holds_the_bend_at_its_bound_and_moves_the_root_the_rest_of_the_way(trained):
    """A pinned head far behind the body (where a 1.6 rad backward bend would put it) with the hands pinned ahead:
    the bend stops at its bound (BACKWARD) and the root's move still goes where the cost is least, the gradient
    vanishing along the move and the cost falling only past the bound. (Before, the clipped Gauss-Newton step
    lowered no cost and the stage stopped halfway: the move's gradient still 30-45 % of its start.)"""
    from neural_ik.neural_network.ik import hips_reach

    stage = HipsReach.for_model(trained[1].model)
    targets = _standing(stage, 1.0)
    side = targets[0, 0, :3, :3] @ stage.lateral
    side[2] = 0.0
    side /= np.linalg.norm(side)
    forward = np.cross(stage.lateral, [0.0, 0.0, 1.0])
    targets[0, 5, :3, 3] = targets[0, 0, :3, 3] + axis_angle_to_matrix(-1.6 * side) @ stage.anchors[4]
    targets[0, 1:3, :3, 3] += 0.3 * forward / np.linalg.norm(forward)
    anchors = stage.anchors[None].copy()
    pinned = ~prior.free_mask(["root", "left_foot", "right_foot"])
    _root, u = stage.place(targets, pinned, anchors=anchors)
    assert u[0, 3] == -hips_reach.BACKWARD
    grads = [_stage_slopes(stage, targets, pinned, anchors, solution)[0] for solution in (np.zeros_like(u), u)]
    assert np.abs(grads[1][:3]).max() < 1e-3 * np.abs(grads[0][:3]).max(), grads
    assert grads[1][3] > 0.0                       # bending further back would lower the cost: the bound holds it


def test_hips_stage_leaves_a_reachable_root_and_brings_the_hips_down_to_a_hand_on_the_floor(trained):
    stage = HipsReach.for_model(trained[1].model)
    targets = _standing(stage, 1.0)
    pinned = ~prior.free_mask(["root", "head"])
    root, _u = stage.place(targets, pinned)
    np.testing.assert_allclose(root, targets[:, 0], atol=1e-12)     # every limb reaches: nothing moves
    # a right hand on the floor (where the feet stand) half a metre in front: the root comes down and bends forward
    # until the arm reaches
    floor = targets.copy()
    forward = np.cross(stage.lateral, [0.0, 0.0, 1.0])              # left x up
    floor[0, 2, :3, 3] = 0.5 * forward / np.linalg.norm(forward)
    floor[0, 2, 2, 3] = targets[0, 3, 2, 3]
    moved, u = stage.place(floor, pinned)
    assert moved[0, 2, 3] < floor[0, 0, 2, 3] - 0.05 and u[0, 3] > 0.3        # down, and bent forward
    shoulder = moved[0, :3, 3] + moved[0, :3, :3] @ stage.anchors[1]
    assert np.linalg.norm(shoulder - floor[0, 2, :3, 3]) <= stage.reaches[1] + SLACK * stage.carried[1] + 0.01
    for row in (2, 3):                        # the legs still reach their feet, and fold no further than allowed
        hip = moved[0, :3, 3] + moved[0, :3, :3] @ stage.anchors[row]
        foot = floor[0, LIMBS[row][0], :3, 3]
        assert np.linalg.norm(hip - foot) <= stage.reaches[row] + 0.01
        assert np.linalg.norm(hip - foot) >= CROUCH / LEG_REACH * stage.reaches[row] - 0.01
    # the goal moved a little moves the root a little (a dragged hand moves the body continuously)
    nudged = floor.copy()
    nudged[0, 2, :3, 3] += 0.005 * forward / np.linalg.norm(forward)
    again, _u = stage.place(nudged, pinned, u)
    assert np.abs(again[0, :3, 3] - moved[0, :3, 3]).max() < 0.02


def test_hips_stage_keeps_the_standing_foot_in_reach_under_a_raised_foot(trained):
    """A kick: the left foot pinned at the hip joint's height in front, the right foot on the ground. The stage must
    leave both legs within reach and fold neither knee past its crouch, with the hips no higher than they stand.
    (When the crouch bounded the hip's height above each foot instead of their distance, it lifted the hips a crouch
    above the raised foot, and the standing foot missed by a third of the leg.)"""
    stage = HipsReach.for_model(trained[1].model)
    targets = _standing(stage, 1.0)
    forward = np.cross(stage.lateral, [0.0, 0.0, 1.0])
    forward /= np.linalg.norm(forward)
    hip = targets[0, 0, :3, 3] + stage.anchors[2]
    targets[0, LIMBS[2][0], :3, 3] = hip + 0.8 * stage.reaches[2] * forward
    for free in (["root", "head"], ["root", "head", "left_hand", "right_hand"]):
        root, _u = stage.place(targets, ~prior.free_mask(free))
        for row in (2, 3):
            joint = root[0, :3, 3] + root[0, :3, :3] @ stage.anchors[row]
            distance = np.linalg.norm(joint - targets[0, LIMBS[row][0], :3, 3])
            assert CROUCH / LEG_REACH * stage.reaches[row] - 0.01 <= distance <= stage.reaches[row] + 0.01, (free, row)
        assert root[0, 2, 3] <= targets[0, 0, 2, 3] + 0.01


def test_hips_stage_rolls_the_pelvis_away_from_a_foot_kicked_high_to_the_side(trained):
    """A side kick with both hands up (an unseen Bandai dance): the left foot pinned high out to the left, the right
    on the ground, the hands overhead. Rolled away from the kick (the left hip up), the hips let every limb reach;
    with a bend alone (the stage before the roll) a limb stays out of reach (a hand 3-8 cm and the feet 2 cm on the
    dance); so does the stage with the roll off, even from the rolled solution."""
    stage = HipsReach.for_model(trained[1].model)
    targets = _standing(stage, 1.0)
    up = np.array([0.0, 0.0, 1.0])
    hip = targets[0, 0, :3, 3] + stage.anchors[2]
    targets[0, LIMBS[2][0], :3, 3] = hip + stage.reaches[2] * (stage.lateral + 0.9 * up)
    for row in (0, 1):                                  # the hands straight up over the shoulders
        targets[0, LIMBS[row][0], :3, 3] = targets[0, 0, :3, 3] + stage.anchors[row] + 1.1 * stage.reaches[row] * up
    pinned = ~prior.free_mask(["root", "head"])

    def worst_excess(root):
        return max(np.linalg.norm(root[0, :3, 3] + root[0, :3, :3] @ stage.anchors[row]
                                  - targets[0, LIMBS[row][0], :3, 3]) - stage.reaches[row] - SLACK * stage.carried[row]
                   for row in range(4))

    root, u = stage.place(targets, pinned)
    left_hip, right_hip = (root[0, :3, :3] @ stage.anchors[row] for row in (2, 3))
    assert worst_excess(root) < 0.005 and left_hip[2] > right_hip[2] + 0.05          # rolled: the left hip up
    # where the documented cost is least (its slopes, the roll's included, vanish there but not at the start)
    slopes = [np.abs(_stage_slopes(stage, targets, pinned, None, x)).max() for x in (np.zeros_like(u), u)]
    assert slopes[1] < 1e-2 * slopes[0], slopes
    bent, u_bent = stage.place(targets, pinned, start=u, roll=False)      # (FreeTargets' retry after a miss)
    assert u_bent[0, 4] == 0.0 and worst_excess(bent) > 0.02


def test_a_free_effector_lands_where_the_network_puts_it_and_the_pinned_ones_exactly(trained):
    model = trained[1].model
    targets = trained[0].val_targets[::10]
    free = FreeTargets(model, prior.free_mask(["root", "head"]))
    solver = Solver(model, None, characters=len(targets), engine="numpy")
    filled = free.step(solver, targets, 3)
    np.testing.assert_array_equal(filled[:, 1:5], targets[:, 1:5])          # the pinned ones as given
    landed = np.nanmax(solver.errors[:, :4], axis=1) < 1e-3                  # ... and they land
    assert landed.mean() > 0.8 and (solver.status[~landed] & MISSED).all()  # (a miss is said: a prior turned away)
    network = Solver(model, None, characters=len(targets), engine="numpy").solve(filled, refine_iterations=0)
    # the free head was not pulled anywhere: it is where the network's pose carries it (to the refinement's change)
    head_net = solver.refiner.chain_forward(network.quaternions, filled[:, 0])[:, solver.effector_slots[4], :3, 3]
    head = solver.refiner.chain_forward(solver.q, filled[:, 0])[:, solver.effector_slots[4], :3, 3]
    assert np.linalg.norm(head - head_net, axis=-1).mean() < 0.03
    assert solver.errors[:, 4].max() < 1e-4                                  # its target is where it went


def test_a_free_head_does_not_hold_the_spine_back_from_the_pinned_hands(trained):
    """With only the head free, least squares leaves the head out and it rides along: the pinned hands land where the
    spine can bring them (before, the free head was held where the network put it, and a fifth of these frames kept
    a hand 1-7 cm off)."""
    model = trained[1].model
    targets = trained[0].val_targets[::10]
    free = FreeTargets(model, prior.free_mask(["head"]))
    solver = Solver(model, None, characters=len(targets), engine="numpy")
    filled = free.step(solver, targets, 10)
    assert solver.refiner.last_least_squares > 0                            # the arms alone could not
    assert np.nanmax(solver.errors[:, :4]) < 1e-3, np.nanmax(solver.errors[:, :4], axis=1)
    assert solver.errors[:, 4].max() < 1e-4                                  # the head where the solve took it
    head = solver.refiner.chain_forward(solver.q, filled[:, 0])[:, solver.effector_slots[4], :3, 3]
    np.testing.assert_allclose(solver.normalised[:, 5, :3, 3], head, atol=1e-4)


@pytest.mark.parametrize("sequence", [False, True])
def test_a_pinned_head_left_off_its_target_brings_a_free_root_along(trained, sequence, monkeypatch):
    """The VR case (head and hands pinned, root and feet free) with the head's target raised past what the spine
    gives from where the hips stage puts the root (the hands pull it back): the root moves with the head, which then
    lands on some frames; a shift stays only where it lowers the worst pinned miss, elsewhere the solve is as it was."""
    from neural_ik.neural_network.runtime import free_targets

    # the plain prior places the feet in both cases: every fifth validation frame is no clip for the clip prior
    model = type(trained[1].model)(**{**trained[1].model.__dict__, "clip_prior": None})
    targets = trained[0].val_targets[::5].copy()
    targets[:, 5, 2, 3] += 0.25 * model.skeleton.height     # the hips stage puts the root under a head raised less
    mask = prior.free_mask(["root", "left_foot", "right_foot"])
    solved = {}
    for shifts in (0, free_targets.HEAD_SHIFTS):
        monkeypatch.setattr(free_targets, "HEAD_SHIFTS", shifts)
        stage = FreeTargets(model, mask)
        solver = Solver(model, None, characters=len(targets), engine="numpy", sequence=sequence)
        filled = stage.step(solver, targets, 3, sequence=sequence, dt=1 / 30)
        head = solver.refiner.chain_forward(solver.q, filled[:, 0])[:, solver.effector_slots[4], :3, 3]
        solved[shifts] = (np.linalg.norm(head - targets[:, 5, :3, 3], axis=-1), solver.errors.copy(), filled)
    (head_before, errors_before, unshifted), (head_after, errors_after, filled) = solved[0], solved[free_targets.HEAD_SHIFTS]
    off = head_before > 1e-3
    landed = head_after < 1e-3
    assert off.mean() > 0.3 and (landed & off).any()                    # off on many frames, now on some of them
    assert head_after[off].mean() < head_before[off].mean()
    pinned = [0, 1, 4]
    # the two runs agree to rounding only (NumPy's SIMD sums depend on memory alignment), so "as it was" is 1e-9
    shifted = np.linalg.norm(filled[:, 0, :3, 3] - unshifted[:, 0, :3, 3], axis=-1) > 1e-6
    assert shifted.any()
    np.testing.assert_allclose(errors_after[~shifted], errors_before[~shifted], rtol=0, atol=1e-9)
    worst_before, worst_after = errors_before[:, pinned].max(axis=1), errors_after[:, pinned].max(axis=1)
    assert (worst_after[shifted] < worst_before[shifted]).all()            # a shift stays only where it helps
    np.testing.assert_allclose(errors_after[:, 4], head_after, atol=1e-9)   # the solver's errors are the pose's
    np.testing.assert_array_equal(filled[:, 1:3], targets[:, 1:3])          # the pinned targets as given


def test_a_free_target_is_never_read(trained):
    model = trained[1].model
    targets = trained[0].val_targets[::25]
    for names in (["root", "head"], ["root", "left_foot", "right_foot"], ["right_hand"]):
        free = FreeTargets(model, prior.free_mask(names))
        poisoned = targets.copy()
        poisoned[:, free.free] = np.nan                    # whatever the clip or the empty held there
        np.testing.assert_array_equal(free.fill(poisoned), FreeTargets(model, free.free).fill(targets))
        assert np.isfinite(free.fill(poisoned)).all()


def test_bake_smoothing_averages_only_the_free_targets_over_the_clip():
    from neural_ik.neural_network.runtime.free_targets import smoothed

    rng = np.random.default_rng(4)
    frames = np.broadcast_to(np.eye(4), (60, 6, 4, 4)).copy()
    frames[:, :, :3, 3] = np.linspace(0.0, 1.0, 60)[:, None, None]            # every target moves steadily
    noisy = frames.copy()
    noisy[:, 0, :3, 3] += rng.normal(0.0, 0.02, (60, 3))
    noisy[:, 0, :3, :3] = axis_angle_to_matrix(rng.normal(0.0, 0.05, (60, 3)))
    free = prior.free_mask(["root"])
    out = smoothed(noisy, free, 9)
    np.testing.assert_array_equal(out[:, 1:], noisy[:, 1:])                     # the pinned as given
    inner = slice(5, -5)                                                         # a steady track stays where it is
    np.testing.assert_allclose(smoothed(frames, free, 9)[inner], frames[inner], atol=1e-12)
    jitter = lambda t: np.abs(np.diff(t[:, 0, :3, 3], 2, axis=0)).mean()       # noqa: E731
    assert jitter(out) < 0.3 * jitter(noisy)
    R = out[:, 0, :3, :3]
    np.testing.assert_allclose(R @ np.swapaxes(R, -1, -2), np.broadcast_to(np.eye(3), R.shape), atol=1e-9)
    assert np.all(np.linalg.det(R) > 0)


def test_an_ensemble_answers_its_members_mean_keeps_it_in_a_checkpoint_and_splits_back_into_them(trained, tmp_path):
    tr = trained[0]
    targets = prior.targets_of_rows(tr.train.positions[:512], tr.train.global_rotations[:512])
    ensemble = prior.EnsembleTraining(3, trained[1].model.prior.references, trained[1].model.prior.height, seed=2,
                                      hidden=(24, 16))
    for start in range(0, 512, 64):
        ensemble.step(np.arange(start, start + 64), 2e-3, lambda rows: (targets[rows], None), len(targets))
    members = [member.prior() for member in ensemble.members]
    merged = ensemble.prior({"note": "test"})
    assert merged.layer_sizes == [60, 72, 48, 54] and merged.meta["members"] == 3
    x, _frames = prior.prior_inputs(targets, prior.draw_free_sets(np.random.default_rng(1), len(targets)),
                                    merged.references, merged.height)
    answers = np.stack([member.predict(x) for member in members])
    assert np.abs(answers[0] - answers[1]).mean() > 1e-3                    # trained apart, they answer apart
    np.testing.assert_allclose(merged.predict(x), answers.mean(axis=0), atol=1e-5)
    model = trained[1].model
    model_path = str(tmp_path / "m.npz")
    checkpoint.save_model(model_path, type(model)(**{**model.__dict__, "prior": merged}))
    loaded = checkpoint.load_model(model_path).prior
    assert loaded.meta["members"] == 3
    np.testing.assert_array_equal(loaded.predict(x), merged.predict(x))
    # split: each member as it was, but for the last layer's bias (the members share the mean); so their mean is the
    # merged answer
    parts = prior.split(loaded)
    assert [p.layer_sizes for p in parts] == [[60, 24, 16, 54]] * 3 and "members" not in parts[0].meta
    shifts = np.stack([part.predict(x) for part in parts]) - answers
    np.testing.assert_allclose(shifts, np.broadcast_to(shifts[:, :1], shifts.shape), atol=1e-5)
    np.testing.assert_allclose(shifts.sum(axis=0), 0.0, atol=1e-5)
    assert prior.split(members[0]) == [members[0]] and prior.merge([members[0]]) is members[0]
