"""The live tick's one-character refinement in Blender's math library (live/refine.py) against the NumPy refiner it
stands in for: the same decisions (assist turns, least squares), the same effector positions and errors; single
precision, so the rotations agree to what float32 positions fix (an almost straight limb's bend is ill-conditioned:
~1e-3 in the quaternion moves its end by less than a micrometre)."""

import numpy as np
import pytest
from live_helpers import humanoid_skeleton, random_poses
from test_refine import (
    BEYOND_SPINE2S_TURN,
    EFF,
    SPINE,
    closed_form_case,
    head_beyond_spine2s_turn,
    hips_matrices,
    pushed_beyond_reach,
    refiner_for,
)

from neural_ik.blender.live.refine import MathutilsRefiner
from neural_ik.neural_network.geometry import kinematics
from neural_ik.neural_network.geometry.quaternion_math import (
    matrices_to_quaternions,
    multiply_quaternions,
    quaternions_to_matrices,
)
from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix, quaternion_to_axis_angle
from neural_ik.neural_network.ik.refine_layout import CHAINS
from neural_ik.neural_network.skeleton.roles import ROLE_INDEX


def effector_positions(skel, q, hips):
    rotations = quaternions_to_matrices(q)
    rotations[:, ~skel.role_mask] = np.eye(3)
    return kinematics.forward(skel, rotations, hips[:, :3, :3], hips[:, :3, 3]).positions[:, EFF]


def one_by_one(skel, ref, q, hips, tp, tr, iterations=2, staged=None):
    """Both refiners on each character alone: (reference q, errors, least-squares flags), the same from the
    mathutils refiner. staged: a list that gets, per character, whether the mathutils refiner's head stage ran."""
    fast = MathutilsRefiner(ref)
    ran = []
    land_head = fast._land_head
    fast._land_head = lambda *args: ran.append(True) or land_head(*args)
    out = {"numpy": ([], [], []), "mathutils": ([], [], [])}
    for i in range(len(q)):
        before = len(ran)
        for name, refiner in (("numpy", ref), ("mathutils", fast)):
            qi = q[i:i + 1].copy()
            errors = refiner.refine_quaternions(qi, hips[i:i + 1], tp[i:i + 1], tr[i:i + 1], iterations=iterations)
            out[name][0].append(qi[0])
            out[name][1].append(errors[0])
            out[name][2].append(refiner.last_least_squares)
        if staged is not None:
            staged.append(len(ran) > before)
    return [tuple(np.array(x) for x in out[name]) for name in ("numpy", "mathutils")]


# metres: where the head stage ran, what the effectors may differ by (its steps in float32: a target out of reach ends
# where the steps stop coming closer, which float32 moves by up to a few micrometres)
HEAD_STAGE_TOLERANCE = 1e-5


def aligned(a, b):
    """b with each quaternion's sign turned to a's (q and -q are one rotation)."""
    return b * np.where(np.sum(a * b, axis=-1, keepdims=True) < 0, -1.0, 1.0)


def assert_same_refinement(skel, q, hips, expected, got, position_tol=1e-6, quaternion_tol=2e-3):
    (q_ref, e_ref, ls_ref), (q_got, e_got, ls_got) = expected, got
    np.testing.assert_array_equal(ls_got, ls_ref)
    np.testing.assert_allclose(e_got, e_ref, atol=position_tol)
    np.testing.assert_allclose(effector_positions(skel, q_got, hips), effector_positions(skel, q_ref, hips),
                               atol=position_tol)
    if quaternion_tol is not None:
        np.testing.assert_allclose(aligned(q_ref, q_got), q_ref, atol=quaternion_tol)
    chain_bone = np.zeros(q.shape[1], bool)
    chain_bone[[ROLE_INDEX[n] for chain in CHAINS for n in chain[1:]]] = True
    untouched = np.all(q_ref == q, axis=-1) & ~chain_bone   # bones besides the chains' the reference leaves alone
    np.testing.assert_array_equal(q_got[untouched], q[untouched])


@pytest.mark.parametrize("twist", [0.0, 0.3])
def test_closed_form_matches_the_numpy_refiner(twist):
    """Targets near the pose, far out of reach, at the hip, and limbs held exactly straight (closed form only, and the
    head stage where the reach assist leaves the head's target beyond reach: its float32 Gauss-Newton steps end where
    NumPy's do to HEAD_STAGE_TOLERANCE, and the arms hanging off the spine with them)."""
    skel = humanoid_skeleton(twist=twist)
    ref = refiner_for(skel)
    local, hips_R, hips_p, tp, tr = closed_form_case(skel, 24, seed=7)
    q, hips = matrices_to_quaternions(local), hips_matrices(hips_R, hips_p)
    staged = []
    expected, got = one_by_one(skel, ref, q, hips, tp, tr, iterations=0, staged=staged)
    staged = np.array(staged)
    # targets metres out of reach: the ends lie on the lines to them, which the float32 frames of the arms' reach
    # assist (turned toward such a target) move by a few micrometres
    staged |= expected[1].max(axis=1) > 0.5
    for rows, tolerance in ((~staged, 1e-6), (staged, HEAD_STAGE_TOLERANCE)):
        assert_same_refinement(skel, q[rows], hips[rows], tuple(a[rows] for a in expected),
                               tuple(a[rows] for a in got), position_tol=tolerance)
    assert expected[1].max() > 0.1 and (expected[1].max(axis=1) < 1e-9).any()      # unreachable and reachable
    assert 0 < staged.sum() < len(q)


@pytest.mark.parametrize("chains", [(4,), (0,), (1,), (4, 0)])
def test_reach_assist_matches_the_numpy_refiner(chains):
    """Head or hand targets beyond their chains' reach (the head's and the left hand's together: the spine turns,
    then the clavicle): the same parent turns, no least squares, the effectors on their targets."""
    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel, width=0.6)
    seed = 30 + chains[0] + 6 * (len(chains) - 1)
    local, hips_R, hips_p, tp, tr = pushed_beyond_reach(ref, skel, 12, chains[0], seed=seed)
    for chain in chains[1:]:
        tp[:, chain] = pushed_beyond_reach(ref, skel, 12, chain, seed=seed)[3][:, chain]
    q, hips = matrices_to_quaternions(local), hips_matrices(hips_R, hips_p)
    expected, got = one_by_one(skel, ref, q, hips, tp, tr)
    assert_same_refinement(skel, q, hips, expected, got)
    assert not got[2].any() and got[1].max() < 1e-4
    np.testing.assert_allclose(effector_positions(skel, got[0], hips), tp, atol=1e-5)
    turned = [ROLE_INDEX["Spine2"] if c == 4 else ROLE_INDEX[("LeftShoulder", "RightShoulder")[c]] for c in chains]
    assert (np.abs(got[0][:, turned] - q[:, turned]).max(axis=-1) > 1e-4).all()


def test_a_spine2_turn_that_may_meet_its_limits_takes_the_python_float_path(monkeypatch):
    """Narrow limits: a Spine2 turn that may leave them goes to reach_assist's own functions (which clamp it), the
    others stay in mathutils; either way the result is the NumPy refiner's. Seed 57: 7 of its 16 characters take
    the Python-float path, and none has a clamped Spine2 that the spine's straightening then finds exactly on its
    limit (the tie: see the two tests below)."""
    outcomes = []
    head_assist = MathutilsRefiner._assist_head

    def spy(self, *args):
        outcomes.append(head_assist(self, *args))
        return outcomes[-1]

    monkeypatch.setattr(MathutilsRefiner, "_assist_head", spy)
    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel, width=0.2)
    local, hips_R, hips_p, tp, tr = pushed_beyond_reach(ref, skel, 16, 4, seed=57)
    q, hips = matrices_to_quaternions(local), hips_matrices(hips_R, hips_p)
    expected, got = one_by_one(skel, ref, q, hips, tp, tr)
    assert_same_refinement(skel, q, hips, expected, got)
    python_float = sum(outcome is None for outcome in outcomes)
    assert 0 < python_float < len(outcomes)


TIE_SEEDS = range(30, 50)     # 320 characters; 24 of them meet the tie (measured on main at 36fde6c)
TIE_TOLERANCE = 1e-5         # metres: what the two refiners' effectors may differ by (float32 against float64)


def tie_cases():
    """Narrow limits (0.2 rad) and head targets 1-3 cm beyond reach: Spine2's turn is often clamped onto its limit,
    and the spine's straightening leaves it within 1e-15 rad of it, so rounding decides its limit check. Yields
    (skeleton, q, hips, (NumPy result, mathutils result), whether either result has Spine2 on a limit)."""
    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel, width=0.2)
    spine2 = ROLE_INDEX["Spine2"]
    mean_conjugate = matrices_to_quaternions(ref.mean_pose[spine2].T)

    def on_limit(q):
        delta = quaternion_to_axis_angle(multiply_quaternions(mean_conjugate, q[:, spine2]))
        return (np.minimum(np.abs(delta - ref.limit_low[spine2]), np.abs(delta - ref.limit_high[spine2])) < 1e-6).any(-1)

    for seed in TIE_SEEDS:
        local, hips_R, hips_p, tp, tr = pushed_beyond_reach(ref, skel, 16, 4, seed=seed)
        q, hips = matrices_to_quaternions(local), hips_matrices(hips_R, hips_p)
        expected, got = one_by_one(skel, ref, q, hips, tp, tr)
        yield skel, q, hips, (expected, got), on_limit(expected[0]) | on_limit(got[0])


def test_at_the_spine2_tie_the_refiners_agree_wherever_they_take_the_same_path():
    """Where both refiners' limit checks go the same way (the great majority), the results are the same: the closed
    form to a micrometre, least squares (which starts from the single-precision closed form) to TIE_TOLERANCE."""
    same = on_limit = 0
    for skel, q, hips, (expected, got), limit in tie_cases():
        closed = (expected[2] == got[2]) & (expected[2] == 0)
        both = (expected[2] == got[2]) & (expected[2] > 0)
        same, on_limit = same + int(closed.sum() + both.sum()), on_limit + int(limit.sum())
        # the head stage turns the spine and neck: one of many such poses lands the head, and the two precisions
        # may settle on different ones, so they are held to what they land (to a micrometre), not to their turns
        assert_same_refinement(skel, q[closed], hips[closed], tuple(a[closed] for a in expected),
                               tuple(a[closed] for a in got), quaternion_tol=None)
        np.testing.assert_allclose(effector_positions(skel, got[0][both], hips[both]),
                                   effector_positions(skel, expected[0][both], hips[both]), atol=TIE_TOLERANCE)
        np.testing.assert_allclose(got[1][both], expected[1][both], atol=TIE_TOLERANCE)
    print(f"\n{same} of {16 * len(TIE_SEEDS)} characters take the same path; Spine2 ends on its limit in {on_limit}")
    assert same > 250 and on_limit > 20        # the seeds do reach the tie


def test_at_the_spine2_tie_the_refiners_land_the_same_effectors():
    """The tie itself: however rounding decides the limit check of a Spine2 clamped onto its limit, the NumPy and the
    mathutils refiner give the same effector positions and errors, to TIE_TOLERANCE. (Before the head stage the
    refiner sent to least squares left the head up to 2.8 cm off where the other landed it.)"""
    for skel, _q, hips, (expected, got), _limit in tie_cases():
        np.testing.assert_allclose(effector_positions(skel, got[0], hips), effector_positions(skel, expected[0], hips),
                                   atol=TIE_TOLERANCE)
        np.testing.assert_allclose(got[1], expected[1], atol=TIE_TOLERANCE)


@pytest.mark.parametrize("case", BEYOND_SPINE2S_TURN)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_spine_straightening_matches_the_numpy_refiner(case, sign):
    """Also with every quaternion given as -q (the same rotation): the limits are checked the shortest way round."""
    skel = humanoid_skeleton()
    ref = refiner_for(skel, width=0.6)
    local, hips_R, hips_p, pose, tp = head_beyond_spine2s_turn(ref, skel, **BEYOND_SPINE2S_TURN[case])
    q, hips = sign * matrices_to_quaternions(local), hips_matrices(hips_R, hips_p)
    expected, got = one_by_one(skel, ref, q, hips, tp, pose.rotations[:, EFF])
    assert_same_refinement(skel, q, hips, expected, got)
    assert (np.abs(got[0][:, SPINE] - q[:, SPINE]).max(axis=(1, 2)) > 1e-4).all() and not got[2].any()


@pytest.mark.parametrize("drop", [("LeftShoulder",), ("Spine2",)])
@pytest.mark.parametrize("chain", [4, 0])
def test_a_rig_without_a_clavicle_or_spine2_matches_the_numpy_refiner(drop, chain):
    """An unmapped left clavicle (its arm out of the assist's reach: read before the assist) or Spine2 (no head
    assist: the head stage): the same least-squares decisions, errors and landed effectors to 10 micrometres (least
    squares starts from the single-precision closed form; where its two steps leave an effector centimetres off, the
    misses agree to 2 %)."""
    skel = humanoid_skeleton(drop=drop, twist=0.2)
    ref = refiner_for(skel, width=0.6)
    assert MathutilsRefiner(ref).covers()
    local, hips_R, hips_p, tp, tr = pushed_beyond_reach(ref, skel, 8, chain, seed=60 + chain)
    q, hips = matrices_to_quaternions(local), hips_matrices(hips_R, hips_p)
    expected, got = one_by_one(skel, ref, q, hips, tp, tr)
    np.testing.assert_array_equal(got[2], expected[2])
    np.testing.assert_allclose(got[1], expected[1], atol=1e-5, rtol=0.02)
    landed = expected[1] < 1e-4
    assert landed.mean() > 0.5
    np.testing.assert_allclose(effector_positions(skel, got[0], hips)[landed],
                               effector_positions(skel, expected[0], hips)[landed], atol=1e-5)


def test_least_squares_goes_on_in_the_numpy_refiner():
    """Targets the closed form cannot reach from the network's pose: the NumPy refiner's least squares takes over
    (the same characters; it starts from the single-precision closed form, and its two steps leave these characters
    a leg's target out of reach, so what they do with the rest is sensitive to that start: errors to two millimetres
    (one hand: 1.15 mm against 0.02 mm), those of characters least squares did not touch to 10 micrometres)."""
    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel)
    local, hips_R, hips_p, pose = random_poses(skel, 16, seed=40, spread=0.3)
    q, hips = matrices_to_quaternions(local), hips_matrices(hips_R, hips_p)
    tp = pose.positions[:, EFF] + np.random.default_rng(41).normal(0, 0.03, (16, 5, 3))
    expected, got = one_by_one(skel, ref, q, hips, tp, pose.rotations[:, EFF])
    np.testing.assert_array_equal(got[2], expected[2])
    assert 0 < expected[2].sum() < len(q)
    np.testing.assert_allclose(got[1], expected[1], atol=2e-3)
    untouched = expected[2] == 0
    np.testing.assert_allclose(got[1][untouched], expected[1][untouched], atol=1e-5)


def assert_arm_lines_are_the_poses(refiner, q, hips):
    """The arms' shoulder-hand lines the mathutils refiner hands the swivel stage (no forward pass) are where the
    pose puts the shoulder (Arm) and hand slots, in the frames the pose gives them, to single precision."""
    world = refiner.chain_forward(q, hips)[0]
    lines = refiner.last_arm_lines
    assert set(lines) == {int(refiner.chain_slots[c, 1]) for c in (0, 1)}
    for c in (0, 1):
        shoulder, hand = world[refiner.chain_slots[c, [1, 3]]]
        line = hand[:3, 3] - shoulder[:3, 3]
        line /= np.linalg.norm(line)
        in_shoulder, in_hand = lines[int(refiner.chain_slots[c, 1])]
        np.testing.assert_allclose(in_shoulder, shoulder[:3, :3].T @ line, atol=1e-5)
        np.testing.assert_allclose(in_hand, hand[:3, :3].T @ line, atol=1e-5)


def test_the_arm_lines_are_the_refined_poses_and_unknown_after_least_squares():
    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel)
    fast = MathutilsRefiner(ref)
    local, hips_R, hips_p, tp, tr = closed_form_case(skel, 12, seed=9)
    q, hips = matrices_to_quaternions(local), hips_matrices(hips_R, hips_p)
    for i in range(len(q)):                         # the closed form (some heads through the head stage)
        qi = q[i:i + 1].copy()
        fast.refine_quaternions(qi, hips[i:i + 1], tp[i:i + 1], tr[i:i + 1], iterations=0)
        assert_arm_lines_are_the_poses(fast, qi, hips[i:i + 1])
    local, hips_R, hips_p, pose = random_poses(skel, 16, seed=40, spread=0.3)
    q, hips = matrices_to_quaternions(local), hips_matrices(hips_R, hips_p)
    tp = pose.positions[:, EFF] + np.random.default_rng(41).normal(0, 0.03, (16, 5, 3))
    ran = 0
    for i in range(len(q)):
        fast.refine_quaternions(q[i:i + 1].copy(), hips[i:i + 1], tp[i:i + 1], pose.rotations[i:i + 1, EFF])
        assert (fast.last_arm_lines is None) == (fast.last_least_squares > 0)
        ran += fast.last_least_squares > 0
    assert ran > 0
    fast.refine_quaternions(q[:2].copy(), hips[:2], tp[:2], pose.rotations[:2, EFF])     # two: the NumPy refiner
    assert fast.last_arm_lines is None


def test_other_cases_are_the_numpy_refiners_own():
    """Several characters at once, and a rig whose chains are not all clean two-bone chains: the NumPy refiner's
    result, bit for bit; links replaced by set_links are followed."""
    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel)
    local, hips_R, hips_p, tp, tr = closed_form_case(skel, 6, seed=50)
    q, hips = matrices_to_quaternions(local), hips_matrices(hips_R, hips_p)
    fast = MathutilsRefiner(ref)
    a, b = q.copy(), q.copy()
    np.testing.assert_array_equal(fast.refine_quaternions(a, hips, tp, tr), ref.refine_quaternions(b, hips, tp, tr))
    np.testing.assert_array_equal(a, b)

    dropped = humanoid_skeleton(drop=("LeftForeArm",))
    ref_dropped = refiner_for(dropped)
    fast_dropped = MathutilsRefiner(ref_dropped)
    assert not fast_dropped.covers()
    a, b = q[:1].copy(), q[:1].copy()
    np.testing.assert_array_equal(fast_dropped.refine_quaternions(a, hips[:1], tp[:1], tr[:1]),
                                  ref_dropped.refine_quaternions(b, hips[:1], tp[:1], tr[:1]))
    np.testing.assert_array_equal(a, b)

    rng = np.random.default_rng(51)
    bridges = skel.bridges[None] @ axis_angle_to_matrix(rng.normal(0, 0.2, (1, 23, 3)))
    offsets = skel.offsets[None] * rng.uniform(0.8, 1.2, (1, 23, 1))
    fast.refine_quaternions(q[:1].copy(), hips[:1], tp[:1], tr[:1], iterations=0)      # constants for the old links
    fast.set_links(bridges, offsets)
    a, b = q[:1].copy(), q[:1].copy()
    got = fast.refine_quaternions(a, hips[:1], tp[:1], tr[:1], iterations=0)
    expected = ref.refine_quaternions(b, hips[:1], tp[:1], tr[:1], iterations=0)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(aligned(b, a), b, atol=2e-3)


def test_the_memory_runs_the_same_in_both_refiners_and_in_bake():
    """A network whose right arm is held straight with a tiny bend about a random axis each tick (its elbow's
    direction degenerate, as a narrow model's is far from its clips), the right hand's target going round the
    shoulder (report/reach_sweep): tick by tick with a memory, the mathutils refiner gives the NumPy refiner's poses
    and memory (single precision); a memory reset gives the tick on its own again; Bake's way (every frame in one
    call, a memory in sequence) gives the NumPy refiner's ticks exactly; and no bone turns more than 15 degrees a
    tick, where without the memory the arm does."""
    from neural_ik.neural_network.geometry.rotations import angle_between
    from neural_ik.neural_network.ik.refine_memory import RefineMemory
    from neural_ik.neural_network.report.reach_sweep import sweep_path

    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel)
    local, hips_R, hips_p, pose = random_poses(skel, 1, seed=80, spread=0.2)
    upper, fore, hand = (ROLE_INDEX[n] for n in ("RightArm", "RightForeArm", "RightHand"))
    local[:, fore] = skel.bridges[fore].T                       # a straight right arm
    n = 300
    rng = np.random.default_rng(81)
    axes = rng.normal(size=(n, 3))
    bends = axis_angle_to_matrix(0.02 * axes / np.linalg.norm(axes, axis=-1, keepdims=True))
    q = np.repeat(matrices_to_quaternions(local), n, axis=0)
    q[:, fore] = matrices_to_quaternions(local[:, fore] @ bends)
    hips = np.repeat(hips_matrices(hips_R, hips_p), n, axis=0)
    tp = np.repeat(pose.positions[:, EFF], n, axis=0)
    tr = np.repeat(pose.rotations[:, EFF], n, axis=0)
    arm = float(np.linalg.norm(skel.offsets[fore]) + np.linalg.norm(skel.offsets[hand]))
    tp[:, 1] = sweep_path(pose.positions[0, upper], arm, n, 0.012, forward=(0.0, -1.0, 0.0), outward=(-1.0, 0.0, 0.0),
                          reach=(0.6, 0.95))
    fast, memories = MathutilsRefiner(ref), {name: RefineMemory.for_refiner(ref, 1) for name in ("numpy", "mathutils")}
    out = {name: q.copy() for name in memories}
    limbs = {name: [] for name in memories}
    for i in range(n):
        for name, refiner in (("numpy", ref), ("mathutils", fast)):
            refiner.refine_quaternions(out[name][i:i + 1], hips[i:i + 1], tp[i:i + 1], tr[i:i + 1], iterations=2,
                                       memory=memories[name])
            limbs[name].append(memories[name].bones[0].copy())
        if fast.last_arm_lines is not None:         # the arm's memory re-solves it: the lines follow
            assert_arm_lines_are_the_poses(fast, out["mathutils"][i:i + 1], hips[i:i + 1])
    np.testing.assert_allclose(effector_positions(skel, out["mathutils"], hips), effector_positions(skel, out["numpy"], hips),
                               atol=1e-5)
    np.testing.assert_allclose(aligned(out["numpy"], out["mathutils"]), out["numpy"], atol=2e-3)
    np.testing.assert_allclose(aligned(np.array(limbs["numpy"]), np.array(limbs["mathutils"])), np.array(limbs["numpy"]),
                               atol=2e-3)
    memory = memories["numpy"]                      # forgotten: the next tick is the tick on its own
    assert memory.limbs_known.all() and np.abs(memory.bones[..., 1:]).max() > 0.1
    memory.reset()
    again, plain = q[-1:].copy(), q[-1:].copy()
    ref.refine_quaternions(again, hips[-1:], tp[-1:], tr[-1:], iterations=2, memory=memory)
    ref.refine_quaternions(plain, hips[-1:], tp[-1:], tr[-1:], iterations=2)
    np.testing.assert_array_equal(again, plain)
    baked = q.copy()
    ref.refine_quaternions(baked, hips, tp, tr, iterations=2, memory=RefineMemory.for_refiner(ref, n, sequence=True))
    np.testing.assert_allclose(aligned(out["numpy"], baked), out["numpy"], atol=1e-12)
    alone = q.copy()
    ref.refine_quaternions(alone, hips, tp, tr, iterations=2)

    def turns(x):
        rotations = quaternions_to_matrices(x)
        rotations[:, ~skel.role_mask] = np.eye(3)
        world = kinematics.forward(skel, rotations, hips[:, :3, :3], hips[:, :3, 3]).rotations[:, skel.role_mask]
        return np.degrees(angle_between(world[1:], world[:-1])).max()
    print(f"\nlargest turn a tick: with the memory {turns(out['numpy']):.1f} deg, each tick alone {turns(alone):.1f}")
    assert turns(out["numpy"]) <= 15.0 < turns(alone)
