"""Layering (neural_network/ik/layering.py): each target from the clip, its empty, or a blend. Pure NumPy."""

import numpy as np

from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix
from neural_ik.neural_network.ik import layering


def test_influences_blend_positions_linearly_and_rotations_along_the_shortest_arc():
    action = np.broadcast_to(np.eye(4), (1, 6, 4, 4)).copy()
    empties = action.copy()
    empties[0, 1, :3, 3] = (0.4, 0.0, 0.2)
    empties[0, 1, :3, :3] = axis_angle_to_matrix(np.array([0.0, 0.0, 1.2])) * 2.0      # an empty scaled by 2
    out = layering.blend_targets(action, empties, [0, 0.25, 0, 0, 0, 0], [0, 0.5, 0, 0, 0, 0])
    np.testing.assert_allclose(out[0, 1, :3, 3], (0.1, 0.0, 0.05))
    np.testing.assert_allclose(out[0, 1, :3, :3], axis_angle_to_matrix(np.array([0.0, 0.0, 0.6])), atol=1e-12)
    np.testing.assert_array_equal(out[0, [0, 2, 3, 4, 5]], action[0, [0, 2, 3, 4, 5]])
    # a target without an empty follows the action whatever its influences say
    absent = layering.blend_targets(action, empties, np.ones(6), np.ones(6), present=[True, False] + [True] * 4)
    np.testing.assert_array_equal(absent[0, 1], action[0, 1])


def test_blending_a_non_finite_empty_gives_non_finite_targets_and_never_raises():
    """A target empty moved to NaN (a driver's bad value): the blend hands NaN to the solver, whose checks hold the
    last good pose, instead of raising inside the live tick (test_fuzz found the SVD raising)."""
    action = np.broadcast_to(np.eye(4), (3, 6, 4, 4)).copy()
    empties = action.copy()
    empties[1, 2, :3, :3] = np.nan
    empties[:, 2, :3, 3] = 0.5
    out = layering.blend_targets(action, empties, np.ones(6), np.ones(6))
    assert np.isnan(out[1, 2, :3, :3]).all()
    assert np.isfinite(np.delete(out.reshape(18, 4, 4), 1 * 6 + 2, axis=0)).all()
    np.testing.assert_allclose(out[0, 2, :3, 3], 0.5)
