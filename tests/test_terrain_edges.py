"""A contact that meets a step's edge (ik/terrain.py: support, hold_across_edges, fit_to_ground) without Blender: the
stance stays on the tread most of its frames stand on; only its landing or lift-off frames over another step leave
the contact, and a crossing in the middle of a stance still holds it on the higher surface."""

import numpy as np

from neural_ik.neural_network.ik import terrain

UP = np.array([0.0, 0.0, 1.0])


def _contact(surfaces):
    """One foot (the right; the left never planted) standing for len(surfaces) frames from frame 5, then a swing of
    5 frames and the next landing (3 frames a step up, at 0.30 m): planted (F, 2), the support heights (F, 2) and
    normals (F, 2, 3), and where it stands across an edge (F, 2)."""
    n = len(surfaces)
    f = n + 13
    planted = np.zeros((f, 2), bool)
    planted[5:5 + n, 1] = planted[-3:, 1] = True
    heights = np.zeros((f, 2))
    heights[:, 1] = surfaces[0]
    heights[5:5 + n, 1] = surfaces
    heights[5 + n:, 1] = 0.30
    edges = np.zeros((f, 2), bool)
    edges[5:5 + n, 1] = np.asarray(surfaces) != surfaces[0]
    return planted, heights, np.broadcast_to(UP, (f, 2, 3)).copy(), edges


def test_a_toe_off_over_the_next_steps_nose_leaves_the_stance_on_its_tread():
    """21 frames on the tread at 0.15 m, the last frame of the contact with its ball over the next step (0.30): the
    stance is fitted at 0.15 (before, at 0.30 for all 22 frames: the foot stood a step high over its tread), the last
    frame goes to the swing, and the fitted foot rises from the tread to the next landing without a jump."""
    planted, heights, normals, edges = _contact([0.15] * 21 + [0.30])
    held, _normals, standing = terrain.hold_across_edges(planted, heights, normals, edges)
    np.testing.assert_array_equal(held[5:26, 1], 0.15)
    assert standing[5:26, 1].all() and not standing[26, 1]
    np.testing.assert_array_equal(standing[:, 0], planted[:, 0])
    targets = np.broadcast_to(np.eye(4), (len(planted), 6, 4, 4)).copy()
    fitted, _lift = terrain.fit_to_ground(targets, standing, held, normals)
    z = fitted[:, 4, 2, 3]
    np.testing.assert_allclose(z[5:26], 0.15)
    steps = np.diff(z[25:])
    assert (steps >= 0).all() and steps.max() < 0.06 and z[-1] == 0.30      # a smooth rise (the smoothstep's)


def test_landing_frames_over_another_step_leave_the_contact_too():
    planted, heights, normals, edges = _contact([0.30, 0.30] + [0.15] * 18)
    held, _normals, standing = terrain.hold_across_edges(planted, heights, normals, edges)
    assert not standing[5:7, 1].any() and standing[7:25, 1].all()
    np.testing.assert_array_equal(held[7:25, 1], 0.15)


def test_a_crossing_in_the_middle_of_a_stance_holds_it_on_the_higher_surface():
    """A foot that rolls over a nose halfway through its stance must not drop onto the lower tread: the whole
    contact stands on the higher surface, and every frame of it stays planted for the fit."""
    planted, heights, normals, edges = _contact([0.15] * 8 + [0.30] * 3 + [0.15] * 9)
    held, _normals, standing = terrain.hold_across_edges(planted, heights, normals, edges)
    np.testing.assert_array_equal(held[5:25, 1], 0.30)
    np.testing.assert_array_equal(standing, planted)


def test_more_than_a_quarter_of_the_contact_on_another_step_is_not_cut():
    """Half the contact over each surface: no end is a landing or a lift-off of a few frames; it stands on the
    higher one, as before."""
    planted, heights, normals, edges = _contact([0.15] * 10 + [0.30] * 10)
    held, _normals, standing = terrain.hold_across_edges(planted, heights, normals, edges)
    np.testing.assert_array_equal(standing, planted)
    np.testing.assert_array_equal(held[5:25, 1], 0.30)
