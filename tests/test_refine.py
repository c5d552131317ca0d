"""Refinement: the analytic Jacobian against finite differences, exact landing, limits, the kept swivel plane, and the
fast run-time path (chain layout, quaternions) against plain statements of the same steps."""

import numpy as np
import pytest
from live_helpers import humanoid_skeleton, limits, mean_pose, mpjpe, random_poses

from neural_ik.neural_network.geometry import kinematics
from neural_ik.neural_network.geometry.quaternion_math import (
    matrices_to_quaternions,
    multiply_quaternions,
    quaternions_to_matrices,
)
from neural_ik.neural_network.geometry.rotations import (
    axis_angle_to_matrix,
    matrix_to_axis_angle,
    quaternion_to_axis_angle,
)
from neural_ik.neural_network.ik.refine import Refiner
from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES, ROLE_INDEX

EFF = list(EFFECTOR_ROLES)


def refiner_for(skeleton, width=1.6):
    low, high = limits(width)
    return Refiner(skeleton, mean_pose(), low, high)


@pytest.mark.parametrize("drop", [(), ("Spine2", "NeckUpper")])
def test_jacobian_matches_finite_differences(drop):
    skel = humanoid_skeleton(drop=drop, twist=0.3)
    ref = refiner_for(skel)
    local, hips_R, hips_p, pose = random_poses(skel, 2, seed=4)
    J = ref.jacobian(pose)
    eps = 1e-6
    numeric = np.zeros_like(J)
    for m, j in enumerate(ref.joints):
        for a in range(3):
            w = np.zeros(3)
            w[a] = eps
            bumped = local.copy()
            bumped[:, j] = local[:, j] @ axis_angle_to_matrix(w)
            plus = kinematics.forward(skel, bumped, hips_R, hips_p).positions[:, EFF]
            bumped[:, j] = local[:, j] @ axis_angle_to_matrix(-w)
            minus = kinematics.forward(skel, bumped, hips_R, hips_p).positions[:, EFF]
            numeric[:, :, 3 * m + a] = ((plus - minus) / (2 * eps)).reshape(2, 15)
    assert np.max(np.abs(J - numeric)) < 1e-7
    assert np.abs(J).max() > 0.1


@pytest.mark.parametrize("drop", [(), ("Spine2", "NeckUpper", "LeftShoulder")])
def test_lands_effectors_within_a_millimetre_and_keeps_the_pose(drop):
    """A network-like pose (the reference plus joint noise) refined onto the reference's effectors."""
    skel = humanoid_skeleton(drop=drop, twist=0.2)
    ref = refiner_for(skel)
    local, hips_R, hips_p, pose = random_poses(skel, 300, seed=7, spread=0.3)
    rng = np.random.default_rng(8)
    noisy = local @ axis_angle_to_matrix(rng.normal(0, 0.06, local.shape[:2] + (3,)))
    noisy[:, ~skel.role_mask] = np.eye(3)
    network = kinematics.forward(skel, noisy, hips_R, hips_p)
    out, _pose, errors = ref.refine(noisy, hips_R, hips_p, pose.positions[:, EFF], pose.rotations[:, EFF], iterations=8)
    check = kinematics.forward(skel, out, hips_R, hips_p)      # independent FK of the returned rotations
    miss = np.linalg.norm(check.positions[:, EFF] - pose.positions[:, EFF], axis=-1)
    np.testing.assert_allclose(miss, errors, atol=1e-9)
    assert np.mean(miss.max(axis=1) < 1e-3) >= 0.99
    mask = skel.role_mask
    assert mpjpe(check.positions, pose.positions, mask) <= mpjpe(network.positions, pose.positions, mask) + 0.005
    angle = np.linalg.norm(matrix_to_axis_angle(np.swapaxes(check.rotations[:, EFF], -1, -2) @ pose.rotations[:, EFF]),
                           axis=-1)
    assert angle.max() < 1e-6                                  # effectors take their targets' orientation


def test_least_squares_keeps_joint_limits():
    skel = humanoid_skeleton()
    ref = refiner_for(skel, width=0.4)
    local, hips_R, hips_p, pose = random_poses(skel, 50, seed=9, spread=0.2)
    far = pose.positions[:, EFF] + np.array([0.0, 0.0, 0.4])   # pulls joints toward their limits
    out = local
    for _ in range(4):
        out, _ = ref.least_squares_step(out, hips_R, hips_p, far)
    joints = ref.joints
    delta = matrix_to_axis_angle(np.swapaxes(ref.mean_pose[joints], -1, -2) @ out[:, joints])
    assert np.all(delta >= ref.limit_low[joints] - 1e-9) and np.all(delta <= ref.limit_high[joints] + 1e-9)
    assert np.mean(np.isclose(np.abs(delta), 0.4, atol=1e-9)) > 0.01    # some joints sit on a limit


def test_limits_hold_as_measured_around_a_single_precision_mean_pose():
    """A checkpoint stores the mean pose in single precision. The refiner's mean rotations must be that pose (to its
    precision), also where a rotation has a component of 0: from the matrices' diagonal alone (the copysign form)
    such a component came out ~1e-4 off, and joints pulled onto a limit sat a hair past it as the evaluation measures
    it (metrics.limit_excess; here up to 0.008 degrees, on an unseen Bandai dance 10 Spine1 frames)."""
    from neural_ik.neural_network.report.metrics import limit_excess

    skel = humanoid_skeleton()
    rng = np.random.default_rng(5)
    axes = rng.normal(size=(23, 3))
    axes[:, 0] = 0.0                                                   # every mean rotation has a component of 0
    mean = axis_angle_to_matrix(axes * (rng.uniform(0.2, 1.5, (23, 1)) / np.linalg.norm(axes, axis=-1, keepdims=True)))
    mean = mean.astype(np.float32)
    low, high = limits(0.3)
    ref = Refiner(skel, mean, low, high)
    joints = ref.joints
    assert np.abs(quaternions_to_matrices(ref.mean_quaternions) - mean[joints]).max() < 1e-6
    turns = np.zeros((3, len(joints), 4))                               # each joint 0.5 rad past, about each axis
    turns[..., 0] = np.cos(0.4)
    for axis in range(3):
        turns[axis, :, 1 + axis] = np.sin(0.4)
    clamped = ref._limit_quaternions(multiply_quaternions(ref.mean_quaternions, turns))
    rotations = np.tile(np.eye(3), (3, 23, 1, 1))
    rotations[:, joints] = quaternions_to_matrices(clamped)
    excess = limit_excess(rotations, mean, ref.limit_low, ref.limit_high)[:, joints]
    assert excess.max() < 1e-4                                          # degrees (the evaluation counts from 1e-3)


def test_two_bone_keeps_the_swivel_plane():
    skel = humanoid_skeleton()
    ref = refiner_for(skel)
    local, hips_R, hips_p, pose = random_poses(skel, 40, seed=10, spread=0.4)
    arm, fore, hand = ROLE_INDEX["LeftArm"], ROLE_INDEX["LeftForeArm"], ROLE_INDEX["LeftHand"]
    a, b, c = pose.positions[:, arm], pose.positions[:, fore], pose.positions[:, hand]
    normal = np.cross(b - a, c - b)
    normal /= np.linalg.norm(normal, axis=-1, keepdims=True)
    targets = pose.positions[:, EFF].copy()
    targets[:, 0] = a + 0.8 * (c - a)                          # pull the wrist in along the shoulder-wrist line
    out = ref.two_bone(local.copy(), pose, targets)
    after = kinematics.forward(skel, out, hips_R, hips_p).positions
    assert np.max(np.linalg.norm(after[:, hand] - targets[:, 0], axis=-1)) < 1e-9
    assert np.max(np.abs(np.sum((after[:, fore] - a) * normal, axis=-1))) < 1e-9   # the elbow stays in the plane


# ---- the run-time path against plain statements of the same steps ----------------------------------------------------

CHAIN_ROLES = [[ROLE_INDEX[n] for n in names] for names in (("LeftArm", "LeftForeArm", "LeftHand"),
               ("RightArm", "RightForeArm", "RightHand"), ("LeftThigh", "LeftShin", "LeftFoot"),
               ("RightThigh", "RightShin", "RightFoot"), ("NeckLower", "NeckUpper", "Head"))]


def reference_closed_form(skel, local, hips_R, hips_p, tp, tr, bridges=None, offsets=None):
    """The closed form written plainly, one chain and one character at a time, on a full FK pass: returns the new
    local rotations and the errors (|d - clipped d| where the chain is solved, the end's miss where it is not)."""
    pose = kinematics.forward(skel, local, hips_R, hips_p, bridges, offsets)
    n = len(local)
    B = np.broadcast_to(skel.bridges if bridges is None else bridges, (n, 23, 3, 3))
    offs = np.broadcast_to(skel.offsets if offsets is None else offsets, (n, 23, 3))
    parents, mask = skel.parents, skel.role_mask
    out, errors = local.copy(), np.zeros((n, 5))
    for c, (upper, mid, end) in enumerate(CHAIN_ROLES):
        valid = mask[upper] and mask[mid] and mask[end] and parents[mid] == upper and parents[end] == mid
        for i in range(n):
            R, x, t = pose.rotations[i], pose.positions[i], tp[i, c]
            if not valid:
                out[i, end] = (R[parents[end]] @ B[i, end]).T @ tr[i, c]
                errors[i, c] = np.linalg.norm(x[end] - t)
                continue
            l1, l2 = np.linalg.norm(offs[i, mid]), np.linalg.norm(offs[i, end])
            u, v, tv = x[mid] - x[upper], x[end] - x[mid], t - x[upper]
            d = np.linalg.norm(tv)
            dc = min(max(d, abs(l1 - l2) * (1 + 1e-9) + 1e-9), (l1 + l2) * (1 - 1e-9))
            normal = np.cross(u, v)
            if np.linalg.norm(normal) <= 1e-6 * l1 * l2:          # straight: bend about the mid bone's x axis
                hinge = R[mid][:, 0] - (R[mid][:, 0] @ u) * u / (l1 * l1)
                axis_1 = hinge / np.linalg.norm(hinge)
            else:
                axis_1 = normal / np.linalg.norm(normal)
            inner = np.arccos(np.clip((l1 * l1 + l2 * l2 - dc * dc) / (2 * l1 * l2), -1, 1))
            Q1 = axis_angle_to_matrix(axis_1 * (np.pi - inner - np.arctan2(np.linalg.norm(normal), u @ v)))
            p = u + Q1 @ v
            axis_2 = np.cross(p, tv)
            s = np.linalg.norm(axis_2)
            Q2 = axis_angle_to_matrix(axis_2 / s * np.arctan2(s, p @ tv)) if s > 0 else np.eye(3)
            R_up, R_mid = Q2 @ R[upper], Q2 @ Q1 @ R[mid]
            out[i, upper] = (R[parents[upper]] @ B[i, upper]).T @ R_up
            out[i, mid] = (R_up @ B[i, mid]).T @ R_mid
            out[i, end] = (R_mid @ B[i, end]).T @ tr[i, c]
            errors[i, c] = abs(d - dc)
    return out, errors


def hips_matrices(hips_R, hips_p):
    hips = np.zeros((len(hips_R), 4, 4))
    hips[:, :3, :3], hips[:, :3, 3], hips[:, 3, 3] = hips_R, hips_p, 1.0
    return hips


def closed_form_case(skel, n, seed):
    """Poses with some limbs held exactly straight, and targets near, far out of reach and too close."""
    local, hips_R, hips_p, pose = random_poses(skel, n, seed=seed, spread=0.3)
    rng = np.random.default_rng(seed)
    for mid in (ROLE_INDEX["LeftShin"], ROLE_INDEX["RightShin"]):   # (on this rig an arm's x axis runs along it)
        local[: n // 3, mid] = skel.bridges[mid].T              # the mid bone continues the upper one: a straight leg
    upper = pose.positions[:, [c[0] for c in CHAIN_ROLES]]
    tp = pose.positions[:, EFF] + rng.normal(0, 0.05, (n, 5, 3))
    tp[n // 2:, 1] = upper[n // 2:, 1] + 3.0 * (tp[n // 2:, 1] - upper[n // 2:, 1])     # right hand: out of reach
    tp[n // 2:, 2] = upper[n // 2:, 2] + 0.001 * rng.normal(size=(n - n // 2, 3))       # left foot: at the hip
    tr = axis_angle_to_matrix(rng.normal(0, 1.0, (n, 5, 3)))
    return local, hips_R, hips_p, tp, tr


@pytest.mark.parametrize("drop", [(), ("Spine2", "NeckUpper", "LeftShoulder"), ("LeftForeArm",)])
def test_closed_form_equals_the_plain_statement(drop):
    skel = humanoid_skeleton(drop=drop, twist=0.3)
    ref = refiner_for(skel)
    local, hips_R, hips_p, tp, tr = closed_form_case(skel, 24, seed=11)
    expected, expected_errors = reference_closed_form(skel, local, hips_R, hips_p, tp, tr)
    q = matrices_to_quaternions(local)
    errors = ref.closed_form(q, ref.chain_forward(q, hips_matrices(hips_R, hips_p)), tp, tr)
    got = quaternions_to_matrices(q)
    got[:, ~skel.role_mask] = np.eye(3)
    np.testing.assert_allclose(got, expected, atol=1e-9)
    np.testing.assert_allclose(errors, expected_errors, atol=1e-9)
    assert expected_errors.max() > 0.1 and np.mean(expected_errors < 1e-9) > 0.3   # unreachable and reachable


def test_closed_form_with_per_character_links():
    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel)
    local, hips_R, hips_p, tp, tr = closed_form_case(skel, 12, seed=12)
    rng = np.random.default_rng(13)
    bridges = skel.bridges[None] @ axis_angle_to_matrix(rng.normal(0, 0.2, (12, 23, 3)))
    offsets = skel.offsets[None] * rng.uniform(0.8, 1.2, (12, 23, 1))
    expected, expected_errors = reference_closed_form(skel, local, hips_R, hips_p, tp, tr, bridges, offsets)
    ref.set_links(bridges, offsets)
    q = matrices_to_quaternions(local)
    errors = ref.closed_form(q, ref.chain_forward(q, hips_matrices(hips_R, hips_p)), tp, tr)
    np.testing.assert_allclose(quaternions_to_matrices(q), expected, atol=1e-9)
    np.testing.assert_allclose(errors, expected_errors, atol=1e-9)


@pytest.mark.parametrize("drop", [(), ("Spine2", "NeckUpper")])
def test_chain_forward_equals_full_forward_kinematics(drop):
    skel = humanoid_skeleton(drop=drop, twist=0.3)
    ref = refiner_for(skel)
    local, hips_R, hips_p, pose = random_poses(skel, 7, seed=14)
    world = ref.chain_forward(matrices_to_quaternions(local), hips_matrices(hips_R, hips_p))
    for role, slot in ref.slot_of.items():
        if skel.role_mask[role]:
            np.testing.assert_allclose(world[:, slot, :3, 3], pose.positions[:, role], atol=1e-12)
            np.testing.assert_allclose(world[:, slot, :3, :3], pose.rotations[:, role], atol=1e-12)


@pytest.mark.parametrize("drop", [(), ("Spine2", "NeckUpper", "LeftShoulder")])
def test_least_squares_on_the_chain_equals_the_matrix_step(drop):
    """The run-time step (chain layout, quaternions) against least_squares_step (full FK, rotation matrices), with
    limits narrow enough that many joints are clamped."""
    skel = humanoid_skeleton(drop=drop, twist=0.2)
    ref = refiner_for(skel, width=0.4)
    local, hips_R, hips_p, pose = random_poses(skel, 30, seed=15, spread=0.2)
    far = pose.positions[:, EFF] + np.array([0.0, 0.1, 0.3])
    q = matrices_to_quaternions(local)
    q[:, ~skel.role_mask] = (1.0, 0.0, 0.0, 0.0)
    hips = hips_matrices(hips_R, hips_p)
    expected = local
    for _ in range(3):
        expected, err = ref.least_squares_step(expected, hips_R, hips_p, far)
        largest = ref.least_squares_quaternions(q, hips, far)
        assert largest == pytest.approx(np.abs(err).max(), abs=1e-9)
    got = quaternions_to_matrices(q)
    got[:, ~skel.role_mask] = np.eye(3)
    np.testing.assert_allclose(got, expected, atol=1e-9)
    delta = matrix_to_axis_angle(np.swapaxes(ref.mean_pose[ref.joints], -1, -2) @ got[:, ref.joints])
    assert np.mean(np.isclose(np.abs(delta), 0.4, atol=1e-9)) > 0.01    # the limits were in play


def test_quaternion_helpers_match_rotation_matrices():
    rng = np.random.default_rng(16)
    a, b = (v / np.linalg.norm(v, axis=-1, keepdims=True) for v in rng.normal(size=(2, 200, 4)))
    np.testing.assert_allclose(quaternions_to_matrices(multiply_quaternions(a, b)),
                               quaternions_to_matrices(a) @ quaternions_to_matrices(b), atol=1e-12)
    np.testing.assert_allclose(axis_angle_to_matrix(quaternion_to_axis_angle(a)), quaternions_to_matrices(a), atol=1e-12)
    small = np.concatenate([np.ones((5, 1)), 1e-12 * rng.normal(size=(5, 3))], axis=1)
    np.testing.assert_allclose(quaternion_to_axis_angle(small), 2e0 * small[:, 1:], rtol=1e-9)


def test_the_memorys_corrections_turn_the_network_onto_the_solved_pose():
    """refine_memory.corrections(n, s) is c with n * c = s (its conjugate-product table against the plain product),
    for a limb's bones of many characters and for one quaternion."""
    from neural_ik.neural_network.ik.refine_memory import corrections
    rng = np.random.default_rng(17)
    n, s = (v / np.linalg.norm(v, axis=-1, keepdims=True) for v in rng.normal(size=(2, 6, 4, 3, 4)))
    c = corrections(n, s)
    np.testing.assert_allclose(multiply_quaternions(n, c), s, atol=1e-12)
    np.testing.assert_allclose(corrections(n[0, 0, 0], s[0, 0, 0]), c[0, 0, 0], atol=1e-15)


# ---- the reach assist: a chain's parent turns so the closed form reaches, without least squares ---------------------

def pushed_beyond_reach(ref, skel, n, chain, seed):
    """Poses near the mean with every effector's target on the effector except chain `chain`'s, which sits 1-3 cm
    beyond its upper + mid bones' reach, off to the side of the parent's bone (along that bone no turn of the parent
    helps)."""
    local, hips_R, hips_p, pose = random_poses(skel, n, seed=seed, spread=0.08)
    for elbow in ("LeftForeArm", "RightForeArm"):        # bent elbows: an arm keeps slack when the spine turns
        local[:, ROLE_INDEX[elbow]] = local[:, ROLE_INDEX[elbow]] @ axis_angle_to_matrix(np.array([0.0, 0.0, 0.8]))
    pose = kinematics.forward(skel, local, hips_R, hips_p)
    rng = np.random.default_rng(seed)
    upper, parent = CHAIN_ROLES[chain][0], skel.parents[CHAIN_ROLES[chain][0]]
    a, p = pose.positions[:, upper], pose.positions[:, parent]
    along = (a - p) / np.linalg.norm(a - p, axis=-1, keepdims=True)
    side = np.cross(along, rng.normal(size=(n, 3)))
    side /= np.linalg.norm(side, axis=-1, keepdims=True)
    tp = pose.positions[:, EFF].copy()
    tp[:, chain] = a + (ref.links.reach[0][chain] + rng.uniform(0.01, 0.03, n))[:, None] * side
    return local, hips_R, hips_p, tp, pose.rotations[:, EFF]


@pytest.mark.parametrize("chain,parent", [(4, "Spine2"), (0, "LeftShoulder"), (1, "RightShoulder")])
def test_reach_assist_lands_without_least_squares(chain, parent):
    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel, width=0.6)
    local, hips_R, hips_p, tp, tr = pushed_beyond_reach(ref, skel, 20, chain, seed=20 + chain)
    q = matrices_to_quaternions(local)
    before = q.copy()
    errors = ref.refine_quaternions(q, hips_matrices(hips_R, hips_p), tp, tr, iterations=2)
    assert ref.last_least_squares == 0
    assert errors.max() < 1e-4
    out = quaternions_to_matrices(q)
    out[:, ~skel.role_mask] = np.eye(3)
    check = kinematics.forward(skel, out, hips_R, hips_p)                 # independent FK of the written rotations
    assert np.linalg.norm(check.positions[:, EFF] - tp, axis=-1).max() < 1e-4
    turned = ROLE_INDEX[parent]
    assert np.abs(multiply_quaternions(before[:, turned] * [1, -1, -1, -1], q[:, turned])[:, 1:]).max() > 1e-3
    delta = quaternion_to_axis_angle(multiply_quaternions(matrices_to_quaternions(ref.mean_pose[turned].T), q[:, turned]))
    assert np.all(delta >= ref.limit_low[turned] - 1e-9) and np.all(delta <= ref.limit_high[turned] + 1e-9)
    untouched = [ROLE_INDEX[n] for n in ("Spine", "Spine1")]          # only the parent turns
    if chain != 4:
        untouched.append(ROLE_INDEX["Spine2"])
    np.testing.assert_array_equal(q[:, untouched], before[:, untouched])


SPINE = [ROLE_INDEX[s] for s in ("Spine", "Spine1", "Spine2")]


# Head targets beyond the neck's reach that no turn of Spine2 brings within it: the spine must unbend. The nearest point
# within the neck's reach of the target is either within the straight spine's reach too ("inside"), or beyond it, so
# the neck's base goes to the rim where the two spheres meet ("rim": the shipped model's usual case on unseen motion,
# whose demo rig has a straight spine and neck).
BEYOND_SPINE2S_TURN = {"inside": {"off_line": (0.0, 0.002), "inside": (2e-5, 1e-4)},
                       "rim": {"off_line": (0.02, 0.05), "inside": (2e-4, 1e-3)}}


def head_beyond_spine2s_turn(ref, skel, off_line, inside, n=12):
    """Poses with Spine1 and Spine2 bent by 0.05 rad (elbows bent too), the head's target `inside` (m, a range) inside
    what the straight spine and neck reach from Spine's head, `off_line` (rad, a range) off the line from there to
    the neck's base: (local, hips_R, hips_p, pose, targets)."""
    local, hips_R, hips_p, pose = random_poses(skel, n, seed=31, spread=0.0)
    rng = np.random.default_rng(32)
    local[:, SPINE[1:]] = local[:, SPINE[1:]] @ axis_angle_to_matrix(np.array([0.05, 0.0, 0.0]) + rng.normal(0, 0.02, (n, 2, 3)))
    for elbow in ("LeftForeArm", "RightForeArm"):
        local[:, ROLE_INDEX[elbow]] = local[:, ROLE_INDEX[elbow]] @ axis_angle_to_matrix(np.array([0.0, 0.0, 0.8]))
    pose = kinematics.forward(skel, local, hips_R, hips_p)
    lengths = np.linalg.norm(skel.offsets, axis=-1)
    straight = lengths[SPINE[1]] + lengths[SPINE[2]] + lengths[ROLE_INDEX["NeckLower"]] + ref.links.reach[0][4]
    p0 = pose.positions[:, SPINE[0]]
    line = pose.positions[:, ROLE_INDEX["NeckLower"]] - p0
    line /= np.linalg.norm(line, axis=-1, keepdims=True)
    turn = np.cross(line, rng.normal(size=(n, 3)))
    turn *= rng.uniform(*off_line, (n, 1)) / np.linalg.norm(turn, axis=-1, keepdims=True)
    direction = (axis_angle_to_matrix(turn) @ line[..., None])[..., 0]
    tp = pose.positions[:, EFF].copy()
    tp[:, 4] = p0 + (straight - rng.uniform(*inside, n))[:, None] * direction
    return local, hips_R, hips_p, pose, tp


@pytest.mark.parametrize("case", BEYOND_SPINE2S_TURN)
def test_spine_straightens_for_a_head_target_beyond_spine2s_turn(case):
    """A head target beyond its reach where no turn of Spine2 helps: the bent spine unbends in closed form (Spine,
    Spine1 and Spine2 all turn), landing without least squares inside the limits."""
    skel = humanoid_skeleton()
    ref = refiner_for(skel, width=0.6)
    local, hips_R, hips_p, pose, tp = head_beyond_spine2s_turn(ref, skel, **BEYOND_SPINE2S_TURN[case])
    spine = SPINE
    q = matrices_to_quaternions(local)
    before = q.copy()
    errors = ref.refine_quaternions(q, hips_matrices(hips_R, hips_p), tp, pose.rotations[:, EFF], iterations=2)
    assert ref.last_least_squares == 0 and errors.max() < 1e-4
    out = quaternions_to_matrices(q)
    check = kinematics.forward(skel, out, hips_R, hips_p)
    assert np.linalg.norm(check.positions[:, EFF] - tp, axis=-1).max() < 1e-4
    assert (np.abs(q[:, spine] - before[:, spine]).max(axis=(0, 2)) > 1e-4).all()
    delta = matrix_to_axis_angle(np.swapaxes(ref.mean_pose[spine], -1, -2) @ out[:, spine])
    assert np.all(delta >= ref.limit_low[spine] - 1e-9) and np.all(delta <= ref.limit_high[spine] + 1e-9)


def test_reach_assist_leaves_targets_within_reach_alone():
    """No chain beyond reach: refine_quaternions equals the closed form alone, bit for bit."""
    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel)
    local, hips_R, hips_p, pose = random_poses(skel, 16, seed=40, spread=0.3)
    tp = pose.positions[:, EFF]
    q, plain = matrices_to_quaternions(local), matrices_to_quaternions(local)
    hips = hips_matrices(hips_R, hips_p)
    ref.refine_quaternions(q, hips, tp, pose.rotations[:, EFF], iterations=2)
    ref.closed_form(plain, ref.chain_forward(plain, hips), tp, pose.rotations[:, EFF])
    np.testing.assert_array_equal(q, plain)


def test_reach_assist_helps_the_arms_of_a_character_whose_leg_is_beyond_reach():
    """A character whose leg target is beyond reach (no assist turn helps a leg; least squares runs anyway) still has
    its arms assisted: its clavicle turns and the hand lands in the closed form alone, as the others' do. Skipped
    before, such a hand went to least squares, which left it a few millimetres short for a tick while a foot was
    dragged beyond reach (and the limbs' memory restarted the arm: 104 of 1,368 ticks with a pinned hand more than
    1 mm off in a foot drag with the shipped model, docs/results.md)."""
    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel, width=0.6)
    local, hips_R, hips_p, tp, tr = pushed_beyond_reach(ref, skel, 6, 0, seed=50)
    q = matrices_to_quaternions(local)
    hips = hips_matrices(hips_R, hips_p)
    np.testing.assert_array_equal(ref._beyond_reach(ref.chain_forward(q, hips), tp), np.arange(6))
    far = tp.copy()
    far[::2, 2] += np.array([0.0, 0.0, -0.5])            # left foot targets half a metre below the reach
    np.testing.assert_array_equal(ref._beyond_reach(ref.chain_forward(q, hips), far), np.arange(6))   # all six
    before = q.copy()
    errors = ref.refine_quaternions(q, hips, far, tr, iterations=0)      # no least squares: the assist alone
    shoulder = ROLE_INDEX["LeftShoulder"]
    assert (np.abs(q[:, shoulder] - before[:, shoulder]).max(axis=-1) > 1e-3).all()
    assert errors[:, 0].max() < 1e-6                                     # every left hand lands
    assert errors[::2, 2].min() > 0.2                                    # the feet half a metre below stay short


def test_least_squares_never_takes_a_landed_hand_off_its_target():
    """The right hand's target 10-25 % beyond the arm's reach (least squares bends the spine for it), the left hand's
    on a nearly straight arm (a hanging arm: a spine move that takes its shoulder away leaves it short): the left hand
    stays on its target and the right one still comes closer than the closed form alone brings it. Before least
    squares' move was cut to what keeps landed effectors landed, it left the left hand 25-30 mm short (and the tick
    the right target came back within reach the spine snapped back, bending that straight elbow in one tick)."""
    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel, width=0.6)
    n = 12
    local, hips_R, hips_p, _pose = random_poses(skel, n, seed=60, spread=0.08)
    for elbow, bend in (("LeftForeArm", 0.15), ("RightForeArm", 0.8)):
        local[:, ROLE_INDEX[elbow]] = local[:, ROLE_INDEX[elbow]] @ axis_angle_to_matrix(np.array([0.0, 0.0, bend]))
    pose = kinematics.forward(skel, local, hips_R, hips_p)
    hips = hips_matrices(hips_R, hips_p)
    rng = np.random.default_rng(61)
    away = rng.normal(size=(n, 3))
    away /= np.linalg.norm(away, axis=-1, keepdims=True)
    shoulder = pose.positions[:, ROLE_INDEX["RightArm"]]
    for beyond in (1.1, 1.15, 1.2, 1.25):
        tp = pose.positions[:, EFF].copy()
        tp[:, 1] = shoulder + beyond * ref.links.reach[0][1] * away
        tr = pose.rotations[:, EFF]
        alone = matrices_to_quaternions(local)
        closed = ref.closed_form(alone, ref.chain_forward(alone, hips), tp, tr)
        q = matrices_to_quaternions(local)
        errors = ref.refine_quaternions(q, hips, tp, tr, iterations=2)
        assert ref.last_least_squares == n
        assert closed[:, [0, 2, 3, 4]].max() < 1e-6                   # the others are within reach: they land
        assert errors[:, [0, 2, 3, 4]].max() < 1e-4                   # and stay there
        assert (errors[:, 1] < closed[:, 1] - 1e-3).all()             # the spine still brings the right hand closer
        out = quaternions_to_matrices(q)
        out[:, ~skel.role_mask] = np.eye(3)
        check = kinematics.forward(skel, out, hips_R, hips_p)         # independent FK of the written rotations
        np.testing.assert_allclose(np.linalg.norm(check.positions[:, EFF] - tp, axis=-1), errors, atol=1e-9)


def test_least_squares_leaves_the_spine_and_clavicles_inside_the_limits():
    """Narrow limits (0.2 rad), poses inside them, a right hand 25 % beyond the arm's reach beside a left hand on a
    nearly straight arm: least squares turns the spine and the clavicles onto their limits, and the share of its move
    that keeps the left hand landed is a blend of two poses inside the limits. Such a blend can lie outside them (58 of
    these 200 characters, by up to 5e-4 rad, before the blend was pulled back inside; 3e-5 rad on unseen Bandai
    clips): none does."""
    from neural_ik.neural_network.geometry.rotations import matrix_to_axis_angle

    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel, width=0.2)
    roles = [ROLE_INDEX[name] for name in ("Spine", "Spine1", "Spine2", "LeftShoulder", "RightShoulder")]
    n = 200
    local, hips_R, hips_p, _pose = random_poses(skel, n, seed=60, spread=0.05)
    for elbow, bend in (("LeftForeArm", 0.15), ("RightForeArm", 0.8)):
        local[:, ROLE_INDEX[elbow]] = local[:, ROLE_INDEX[elbow]] @ axis_angle_to_matrix(np.array([0.0, 0.0, bend]))
    pose = kinematics.forward(skel, local, hips_R, hips_p)
    away = np.random.default_rng(61).normal(size=(n, 3))
    away /= np.linalg.norm(away, axis=-1, keepdims=True)
    tp = pose.positions[:, EFF].copy()
    tp[:, 1] = pose.positions[:, ROLE_INDEX["RightArm"]] + 1.25 * ref.links.reach[0][1] * away
    q = matrices_to_quaternions(local)
    errors = ref.refine_quaternions(q, hips_matrices(hips_R, hips_p), tp, pose.rotations[:, EFF], iterations=2)
    assert ref.last_least_squares == n
    assert errors[:, 0].max() < 1e-4                                       # the left hand stays landed
    d = matrix_to_axis_angle(np.swapaxes(ref.mean_pose[roles], -1, -2) @ quaternions_to_matrices(q[:, roles]))
    at_limit = np.isclose(d, ref.limit_low[roles], atol=1e-9) | np.isclose(d, ref.limit_high[roles], atol=1e-9)
    assert at_limit.any(axis=(1, 2)).sum() > n // 4                        # least squares went to the limits
    assert (d >= ref.limit_low[roles] - 1e-12).all() and (d <= ref.limit_high[roles] + 1e-12).all()


def test_least_squares_help_for_a_hand_is_kept_beside_a_foot_beyond_reach():
    """A left foot's target half a metre below its reach (the hips are given: no move of the body brings it closer;
    the leg ends straight toward it either way) and the right hand's 5-8 cm beyond the arm's: least squares' spine
    and clavicle bring the hand closer, and that is kept for every character. Kept only where the largest miss fell,
    it was decided by the foot's, which least squares leaves as it was: all 16 lost the hand's help."""
    skel = humanoid_skeleton(twist=0.2)
    ref = refiner_for(skel, width=0.6)
    n = 16
    local, hips_R, hips_p, tp, tr = pushed_beyond_reach(ref, skel, n, 1, seed=70)
    shoulder = kinematics.forward(skel, local, hips_R, hips_p).positions[:, ROLE_INDEX["RightArm"]]
    out = tp[:, 1] - shoulder
    tp[:, 1] = shoulder + out * ((ref.links.reach[0][1] + 0.05 + 0.03 * np.linspace(0, 1, n)) /
                                 np.linalg.norm(out, axis=-1))[:, None]
    tp[:, 2, 2] -= 0.5
    hips = hips_matrices(hips_R, hips_p)
    alone = matrices_to_quaternions(local)
    closed = ref.closed_form(alone, ref.chain_forward(alone, hips), tp, tr)
    q = matrices_to_quaternions(local)
    errors = ref.refine_quaternions(q, hips, tp, tr, iterations=2)
    assert ref.last_least_squares == n
    assert (errors[:, 1] < closed[:, 1] - 0.005).all(), np.round((closed[:, 1] - errors[:, 1]) * 1000, 1).tolist()
    np.testing.assert_allclose(errors[:, 2], closed[:, 2], atol=1e-3)        # the foot: as far as ever


def test_spine_swing_bound_skips_only_what_the_full_straightening_would_refuse(monkeypatch):
    """The early bound on Spine's swing (from distances, before the bends) turns characters away only when the full
    closed-form straightening would refuse them too: the result equals the one without the bound, bit for bit, over
    head targets from just beyond reach to far beyond it, some of which the straightening lands and some it refuses."""
    from neural_ik.neural_network.ik import reach_assist

    skel = humanoid_skeleton()
    ref = refiner_for(skel, width=0.6)
    ref.head_reach = None              # the assist alone: the head stage would move the characters it refuses
    n = 60
    local, hips_R, hips_p, pose = random_poses(skel, n, seed=61, spread=0.0)
    rng = np.random.default_rng(62)
    spine = [ROLE_INDEX[s] for s in ("Spine", "Spine1", "Spine2")]
    local[:, spine[1:]] = local[:, spine[1:]] @ axis_angle_to_matrix(rng.normal(0, 0.2, (n, 2, 3)))
    pose = kinematics.forward(skel, local, hips_R, hips_p)
    neck = ROLE_INDEX["NeckLower"]
    direction = rng.normal(size=(n, 3)) + 2.0 * (pose.positions[:, EFF[4]] - pose.positions[:, neck])   # mostly up the neck
    direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
    tp = pose.positions[:, EFF].copy()
    tp[:, 4] = pose.positions[:, neck] + (ref.links.reach[0][4] + rng.uniform(0.001, 0.15, n))[:, None] * direction
    hips = hips_matrices(hips_R, hips_p)
    fired = []
    bound = reach_assist._swing_beyond_limit
    monkeypatch.setattr(reach_assist, "_swing_beyond_limit", lambda *args: fired.append(bound(*args)) or fired[-1])
    q = matrices_to_quaternions(local)
    ref.refine_quaternions(q, hips, tp, pose.rotations[:, EFF], iterations=0)
    monkeypatch.setattr(reach_assist, "_swing_beyond_limit", lambda *args: False)
    plain = matrices_to_quaternions(local)
    ref.refine_quaternions(plain, hips, tp, pose.rotations[:, EFF], iterations=0)
    np.testing.assert_array_equal(q, plain)
    assert any(fired) and not all(fired)
    moved = np.abs(q[:, spine] - matrices_to_quaternions(local)[:, spine]).max(axis=(1, 2)) > 1e-6
    assert moved.any() and not moved.all()
