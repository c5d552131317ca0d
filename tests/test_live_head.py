"""The head stage for one character in Blender's math library (live/head.py) against the NumPy HeadReach.solve it
mirrors: on rigs with a two-bone neck chain and with one neck bone, head targets within reach and beyond it, narrow
limits the joints end on, with and without the memory's start and pull; then the live refiner's use of it tick by tick
with a memory. Single precision: the point lands where NumPy's does to a micrometre (also where a target out of reach
ends, where the steps stop coming closer), the joints' deltas agree to ~1e-5 rad."""

import numpy as np
import pytest
from mathutils import Matrix, Vector
from test_head_reach import SPINE_NECK, head_case, turned
from test_live_refine import aligned

from neural_ik.blender.live.refine import MathutilsRefiner
from neural_ik.neural_network.geometry import kinematics
from neural_ik.neural_network.geometry.quaternion_math import (
    matrices_to_quaternions,
    multiply_quaternions,
    quaternions_to_matrices,
)
from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix, quaternion_to_axis_angle
from neural_ik.neural_network.ik.refine_memory import RefineMemory
from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES, ROLE_INDEX

HEAD = ROLE_INDEX["Head"]
POSITION_TOLERANCE = 2e-5      # metres: the point and the head, float32 against float64
DELTA_TOLERANCE = 1e-3         # radians: the joints' deltas from the mean pose
RATE = 4.0 / 60.0              # the memory's rate at 60 ticks a second (refine_memory.FOLLOW_SPEED)


def beyond_reach(tp, n, seed):
    """Head targets: the first half as given (within reach), the second pushed 5-25 cm away in a random direction."""
    rng = np.random.default_rng(seed)
    push = rng.normal(size=(n, 3))
    push *= rng.uniform(0.05, 0.25, (n, 1)) / np.linalg.norm(push, axis=-1, keepdims=True)
    targets = tp[:, 4].copy()
    targets[n // 2:] += push[n // 2:]
    return targets


def both_solves(ref, q, hips, targets, start=None, rate=0.0, links=None):
    """HeadReach.solve (NumPy) and LiveHeadReach.solve (mathutils) of each character alone: per name, (q after,
    misses, deltas d, own). links: per character (bridges (23, 3, 3), offsets (23, 3)) set on the refiner for its
    solves (see Refiner.set_links), or None for the skeleton's."""
    fast = MathutilsRefiner(ref)
    out = {"numpy": [[], [], [], []], "mathutils": [[], [], [], []]}
    for i in range(len(q)):
        if links is not None:
            ref.set_links(links[0][i:i + 1], links[1][i:i + 1])
        fast._constants()
        head, stage, reach = ref.head_reach, fast.head_stage, fast.chains[4].reach_max
        qa = q[i:i + 1].copy()
        result = head.solve(qa, hips[i:i + 1], targets[i:i + 1], [0], ref.chain_forward, ref.links,
                            None if start is None else start[i:i + 1], rate)
        for part, value in zip(out["numpy"], (qa[0], result[0][0], result[1][0], result[2][0])):
            part.append(value)
        quaternions = q[i].tolist()
        result = stage.solve(quaternions, Matrix(hips[i].tolist()), Vector(targets[i].tolist()), reach,
                             None if start is None else start[i], rate)
        for part, value in zip(out["mathutils"], (np.array(quaternions), *result)):
            part.append(value)
    return {name: [np.array(part) for part in parts] for name, parts in out.items()}


def positions(skel, q, hips, bridges=None, offsets=None):
    rotations = quaternions_to_matrices(q)
    rotations[:, ~skel.role_mask] = np.eye(3)
    return kinematics.forward(skel, rotations, hips[:, :3, :3], hips[:, :3, 3], bridges, offsets).positions


def assert_same_head_stage(ref, skel, q, hips, got, expected, links=(None, None)):
    """The same point and head positions (an independent FK pass of the quaternions each wrote, with the characters'
    links when given), misses, deltas and own deltas; every delta inside the limits, exactly, and the quaternions
    written with them."""
    head = ref.head_reach
    point = int(ref.slot_roles[head.point_slot])
    for name in ("numpy", "mathutils"):
        # the quaternions written are the mean pose turned by the deltas, in double precision (the reach assist reads
        # them next, often at the edge of what the spine reaches)
        q_out, _, d, _ = {"numpy": expected, "mathutils": got}[name]
        delta = quaternion_to_axis_angle(multiply_quaternions(head.mean_conjugate, q_out[:, head.joints]))
        np.testing.assert_allclose(delta, d, atol=1e-12)
        assert np.all(d >= head.low) and np.all(d <= head.high)
        untouched = np.ones(q.shape[1], bool)
        untouched[head.joints] = False
        np.testing.assert_array_equal(q_out[:, untouched], q[:, untouched])
    p_got, p_expected = positions(skel, got[0], hips, *links), positions(skel, expected[0], hips, *links)
    np.testing.assert_allclose(p_got[:, [point, HEAD]], p_expected[:, [point, HEAD]], atol=POSITION_TOLERANCE)
    np.testing.assert_allclose(got[1], expected[1], atol=POSITION_TOLERANCE)
    np.testing.assert_allclose(got[2], expected[2], atol=DELTA_TOLERANCE)
    np.testing.assert_allclose(got[3], expected[3], atol=1e-5)


@pytest.mark.parametrize("drop", [(), ("NeckUpper",)])
@pytest.mark.parametrize("width", [0.45, 0.25])
def test_head_stage_matches_the_numpy_head_stage(drop, width):
    """Two-bone neck chain (the point: the neck's base) and one neck bone (the point: the head); targets within reach
    land to a micrometre in both, those beyond reach end the same; limits narrow enough that joints end on them."""
    n = 24
    ref, skel, q, hips, tp, _ = head_case(n, seed=90, drop=drop, width=width)
    assert ref.head_reach.neck_chain == (drop == ())
    targets = beyond_reach(tp, n, seed=91)
    result = both_solves(ref, q, hips, targets)
    expected, got = result["numpy"], result["mathutils"]
    assert_same_head_stage(ref, skel, q, hips, got, expected)
    head = ref.head_reach
    on_limit = (expected[2] == head.low) | (expected[2] == head.high)
    print(f"\n{int(on_limit.any(axis=(1, 2)).sum())} of {n} characters end with a joint on a limit; largest differences: "
          f"point {np.abs(got[1] - expected[1]).max():.1e} m, deltas {np.abs(got[2] - expected[2]).max():.1e} rad")
    assert on_limit.any(axis=(1, 2)).sum() >= 3
    assert (expected[1][: n // 2] < 1e-5).mean() > 0.8 and (expected[1][n // 2:] > 1e-3).mean() > 0.5


@pytest.mark.parametrize("drop", [(), ("NeckUpper",)])
def test_head_stage_from_the_memorys_start_matches_the_numpy_head_stage(drop):
    """The memory's start (last tick's deltas, some on the limits; one character's NaN: q's own) and its pull back
    toward q's pose at the memory's rate: the same first step (the pull) and the same steps after it."""
    n = 24
    ref, skel, q, hips, tp, _ = head_case(n, seed=92, drop=drop, width=0.45)
    targets = beyond_reach(tp, n, seed=93)
    head = ref.head_reach
    rng = np.random.default_rng(94)
    start = rng.uniform(-1.2, 1.2, (n, len(head.joints), 3)) * head.high          # a sixth beyond a limit: clamped
    start[0] = np.nan
    start[1, 0] = np.nan
    result = both_solves(ref, q, hips, targets, start, RATE)
    assert_same_head_stage(ref, skel, q, hips, result["mathutils"], result["numpy"])
    plain = both_solves(ref, q, hips, targets)["numpy"]          # the start matters
    assert np.abs(plain[2] - result["numpy"][2]).max() > 0.1


def test_head_stage_with_per_character_links_matches_the_numpy_head_stage():
    """A rig whose unmapped in-between bones move (Refiner.set_links: bridges and offsets of its own per character):
    the mathutils stage takes its constants from the refiner's links, as the NumPy stage does."""
    n = 12
    ref, skel, q, hips, tp, _ = head_case(n, seed=97, drop=(), width=0.45)
    rng = np.random.default_rng(98)
    links = (skel.bridges[None] @ axis_angle_to_matrix(rng.normal(0, 0.2, (n, 23, 3))),
             skel.offsets[None] * rng.uniform(0.8, 1.2, (n, 23, 1)))
    targets = beyond_reach(tp, n, seed=99)
    result = both_solves(ref, q, hips, targets, links=links)
    assert_same_head_stage(ref, skel, q, hips, result["mathutils"], result["numpy"], links)
    plain = both_solves(ref, q, hips, targets, links=(skel.bridges[None].repeat(n, 0), skel.offsets[None].repeat(n, 0)))
    assert np.abs(plain["numpy"][2] - result["numpy"][2]).max() > 0.01          # the links matter


def test_live_refiner_runs_the_head_stage_with_its_memory_as_the_numpy_refiner():
    """Tick by tick with a memory of one character: the head's target moving from within reach to beyond it and back,
    the network's spine jittering (0.06 rad a tick) about a pose 0.3 rad off the target's. The mathutils refiner gives
    the NumPy refiner's poses (the effectors where NumPy's land, or miss by as much; the spine and head turned alike), the
    same memory (the same ticks holding one, its spine to a tenth of DELTA_TOLERANCE on nine ticks in ten; see below);
    last, the head's target where the network's own pose puts the head, and both memories settle on the same tick."""
    n = 60
    ref, skel, q, hips, tp, tr = head_case(1, seed=95, drop=(), width=0.45)
    q, hips, tp, tr = (np.repeat(a, n, axis=0) for a in (q, hips, tp, tr))
    away = np.concatenate([np.linspace(0.0, 1.0, n // 2), np.linspace(1.0, 0.0, n - n // 2)])
    tp[:, 4] += away[:, None] * np.array([0.5, 0.35, -0.4])
    q[:, SPINE_NECK] = matrices_to_quaternions(quaternions_to_matrices(q[:, SPINE_NECK])
                                               @ turned(np.random.default_rng(96), (n, len(SPINE_NECK)), 0.06))
    q[-20:] = q[-20]                 # last, a still network pose, and the head's target where it puts the head
    tp[-20:, 4] = positions(skel, q[-20:], hips[-20:])[:, HEAD]
    fast = MathutilsRefiner(ref)
    memories = {name: RefineMemory.for_refiner(ref, 1) for name in ("numpy", "mathutils")}
    out = {name: q.copy() for name in memories}
    heads, active, errors = ({name: [] for name in memories} for _ in range(3))
    staged, land_head = [], fast._land_head
    fast._land_head = lambda *args: staged.append(True) or land_head(*args)
    for i in range(n):
        for name, refiner in (("numpy", ref), ("mathutils", fast)):
            errors[name].append(refiner.refine_quaternions(out[name][i:i + 1], hips[i:i + 1], tp[i:i + 1], tr[i:i + 1],
                                                           iterations=0, memory=memories[name])[0])
            heads[name].append(memories[name].head[0].copy())
            active[name].append(bool(memories[name].head_active[0]))
    print(f"\nthe head stage ran on {len(staged)} of {n} ticks; the memory held a spine after {sum(active['numpy'])}: "
          f"{''.join('x' if a else '.' for a in active['numpy'])}")
    assert len(staged) > 0                       # the mathutils head stage ran (not the NumPy refiner's)
    np.testing.assert_array_equal(active["mathutils"], active["numpy"])
    assert sum(active["numpy"]) > n // 2 and not any(active["numpy"][-5:])     # the memory holds a spine, then settles
    # tick to tick the memory carries each tick's float32 differences on; where the head's target crosses the edge of
    # what the spine reaches (ticks 13-16 here) the solve amplifies them ~50x in three ticks (NumPy's own ticks, their
    # network pose nudged by 1e-7, grow apart as fast), then they die away
    gap = np.abs(np.array(heads["mathutils"]) - np.array(heads["numpy"])).max(axis=(1, 2))
    print(f"memory's spine, mathutils against NumPy: largest {gap.max():.1e} rad, median {np.median(gap):.1e}")
    assert gap.max() < 5 * DELTA_TOLERANCE and (gap < 0.1 * DELTA_TOLERANCE).mean() > 0.9
    # the effectors land where NumPy's do (the elbows, knees and NeckUpper may not: a chain the spine's turn leaves
    # straight toward a target out of reach may bend about another axis in float32, its end in the same place); those
    # the spine leaves out of reach (no least squares here) miss by what NumPy's miss by, to the spine's difference
    landed = np.array(errors["numpy"]) < 1e-4
    np.testing.assert_allclose(positions(skel, out["mathutils"], hips)[:, EFFECTOR_ROLES][landed],
                               positions(skel, out["numpy"], hips)[:, EFFECTOR_ROLES][landed], atol=POSITION_TOLERANCE)
    print(f"effectors' misses: {int((~landed).sum())} of {landed.size} beyond 0.1 mm, differing by at most "
          f"{np.abs(np.array(errors['mathutils']) - np.array(errors['numpy'])).max():.1e} m")
    np.testing.assert_allclose(np.array(errors["mathutils"]), np.array(errors["numpy"]), atol=5e-4)
    turned_roles = SPINE_NECK[:3] + [HEAD]              # the head stage's joints (the neck is the chain's) and the head
    np.testing.assert_allclose(aligned(out["numpy"][:, turned_roles], out["mathutils"][:, turned_roles]),
                               out["numpy"][:, turned_roles], atol=2e-3)
    missed = np.linalg.norm(positions(skel, out["numpy"], hips)[:, HEAD] - tp[:, 4], axis=-1) > 1e-4
    assert 0 < missed.sum() < n                  # some ticks' targets beyond reach
