"""Knees as hinges at the refinement's start (ik/hinges.py): a knee whose limits show one wide axis loses its turn
about the other two before the closed form, keeps its bend, and the refiners (NumPy and the live mathutils one) land
the effectors from there; knees whose limits show no hinge, and every other bone, are left as they are."""

import numpy as np
from live_helpers import humanoid_skeleton, limits, mean_pose, random_poses
from test_live_refine import HEAD_STAGE_TOLERANCE, assert_same_refinement, one_by_one
from test_refine import EFF, hips_matrices

from neural_ik.neural_network.geometry.quaternion_math import matrices_to_quaternions, multiply_quaternions
from neural_ik.neural_network.geometry.rotations import quaternion_to_axis_angle
from neural_ik.neural_network.ik.hinges import Hinges
from neural_ik.neural_network.ik.refine import Refiner
from neural_ik.neural_network.skeleton.roles import ROLE_INDEX

KNEES = [ROLE_INDEX["LeftShin"], ROLE_INDEX["RightShin"]]


def hinge_limits(axis=0):
    """The test limits with both knees wide on `axis` (2.5 rad) and narrow (0.2) on the other two."""
    low, high = limits()
    for j in KNEES:
        low[j], high[j] = -0.1, 0.1
        low[j, axis], high[j, axis] = -0.5, 2.0
    return low, high


def deltas(mean_q, q, roles):
    conjugate = mean_q[roles] * np.array([1.0, -1.0, -1.0, -1.0])
    return quaternion_to_axis_angle(multiply_quaternions(conjugate, q[:, roles]))


def test_a_knee_keeps_only_its_bend_and_nothing_else_moves():
    skel = humanoid_skeleton(twist=0.2)
    mean_q = matrices_to_quaternions(mean_pose())
    local, *_ = random_poses(skel, 20, seed=3, spread=0.4)
    q = matrices_to_quaternions(local)
    for axis in (0, 2):
        low, high = hinge_limits(axis)
        hinges = Hinges(skel.role_mask, mean_q, low, high)
        assert hinges.roles.tolist() == KNEES
        closed = q.copy()
        hinges.close(closed)
        before, after = deltas(mean_q, q, KNEES), deltas(mean_q, closed, KNEES)
        np.testing.assert_allclose(after[..., axis], before[..., axis], atol=1e-12)       # the bend as it was
        np.testing.assert_allclose(np.delete(after, axis, axis=-1), 0.0, atol=1e-12)      # no sideways turn or twist
        assert np.abs(np.delete(before, axis, axis=-1)).min() < 0.4 < np.abs(np.delete(before, axis, axis=-1)).max()
        others = np.setdiff1d(np.arange(q.shape[1]), KNEES)
        np.testing.assert_array_equal(closed[:, others], q[:, others])
        for k in range(3):                              # one character: the same in Python floats
            one = q[k:k + 1].copy()
            hinges.close(one)
            np.testing.assert_allclose(one, closed[k:k + 1], atol=1e-12)


def test_knees_without_a_hinge_in_their_limits_are_left_alone():
    skel = humanoid_skeleton()
    mean_q = matrices_to_quaternions(mean_pose())
    assert not Hinges(skel.role_mask, mean_q, *limits()).active              # every axis as wide
    low, high = hinge_limits()
    low[KNEES[0], 1], high[KNEES[0], 1] = -1.0, 1.0                          # the left knee: two wide axes
    assert Hinges(skel.role_mask, mean_q, low, high).roles.tolist() == KNEES[1:]
    dropped = humanoid_skeleton(drop=("RightShin",))
    assert Hinges(dropped.role_mask, mean_q, *hinge_limits()).roles.tolist() == KNEES[:1]
    assert Refiner(skel, mean_pose(), *limits()).hinges is None


def test_the_refiners_close_the_knees_first_and_land_the_effectors():
    """The feet's targets where random poses have them, the rest near: both refiners land the feet; the knees'
    sideways turn, which the closed form bends about as the network left it, is gone before it (the refined knee's
    off-axis turn is what the closed form's bend adds, smaller than without the hinges); the mathutils refiner gives
    the NumPy one's result (where the head stage ran, its effectors)."""
    skel = humanoid_skeleton()
    low, high = hinge_limits()
    hinged, plain = Refiner(skel, mean_pose(), low, high), Refiner(skel, mean_pose(), *limits())
    assert hinged.hinges is not None and plain.hinges is None
    local, hips_R, hips_p, pose = random_poses(skel, 24, seed=5, spread=0.3)
    q, hips = matrices_to_quaternions(local), hips_matrices(hips_R, hips_p)
    tp = pose.positions[:, EFF] + np.random.default_rng(6).normal(0, 0.02, (24, 5, 3))
    tp[:, 2:4] = pose.positions[:, EFF[2:4]]           # the feet where the pose has them: within reach either way
    tr = pose.rotations[:, EFF]
    mean_q = matrices_to_quaternions(mean_pose())
    off = {}
    for name, refiner in (("hinged", hinged), ("plain", plain)):
        out = q.copy()
        errors = refiner.refine_quaternions(out, hips, tp, tr, iterations=0)
        assert errors[:, 2:4].max() < 1e-6                                  # the feet land
        off[name] = np.abs(deltas(mean_q, out, KNEES)[..., 1:]).mean()
    assert off["hinged"] < 0.5 * off["plain"], off
    staged = []
    expected, got = one_by_one(skel, hinged, q, hips, tp, tr, iterations=0, staged=staged)
    staged = np.array(staged)           # where the head stage ran its float32 steps end elsewhere on the spine
    for rows, tolerance, turns in ((~staged, 1e-6, 2e-3), (staged, HEAD_STAGE_TOLERANCE, None)):
        assert_same_refinement(skel, q[rows], hips[rows], tuple(a[rows] for a in expected),
                               tuple(a[rows] for a in got), position_tol=tolerance, quaternion_tol=turns)
    assert (~staged).sum() >= 20
