"""Refinement: the analytic Jacobian against finite differences, exact landing, limits, and the kept swivel plane."""

import numpy as np
import pytest
from live_helpers import humanoid_skeleton, limits, mean_pose, mpjpe, random_poses

from neural_ik.neural_network import kinematics
from neural_ik.neural_network.refine import Refiner
from neural_ik.neural_network.roles import EFFECTOR_ROLES, ROLE_INDEX
from neural_ik.neural_network.rotations import axis_angle_to_matrix, matrix_to_axis_angle

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
