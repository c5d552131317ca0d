"""Layering: each target from its empty, from the playing action, or a blend of the two.

A rig with an action keeps playing it while a few targets are pinned: a hand on a door handle, a foot on a rock.
Per target and frame, a position influence and a rotation influence (0..1, keyable in Blender, so a pin fades in
and out) say how much comes from the empty; the rest comes from where the action puts that effector at that frame.
A target with no empty comes from the action alone. Rotations blend along the shortest arc (exact slerp through the
relative rotation), positions linearly.

Targets are (F, 6, 4, 4) matrices in character space: root (hips), left hand, right hand, left foot, right foot,
head (`runtime.inputs`). Pure NumPy.
"""

import numpy as np

from ..geometry.rotations import axis_angle_to_matrix, matrix_to_axis_angle


def blend_targets(action, empties, position, rotation, present=None):
    """(F, 6, 4, 4) targets: `action` where the influences are 0, `empties` where they are 1, a blend between.

    position, rotation: (F, 6) or (6,) influences in 0..1; present: (6,) bool, False where a target has no empty
    (its influences count as 0, and `empties` may hold anything there)."""
    action = np.asarray(action, np.float64)
    empties = np.asarray(empties, np.float64)
    shape = action.shape[:2]
    wp = np.broadcast_to(np.clip(np.asarray(position, np.float64), 0.0, 1.0), shape).copy()
    wr = np.broadcast_to(np.clip(np.asarray(rotation, np.float64), 0.0, 1.0), shape).copy()
    if present is not None:
        absent = ~np.asarray(present, bool)
        wp[:, absent] = 0.0
        wr[:, absent] = 0.0
    out = action.copy()
    out[..., :3, 3] += wp[..., None] * (empties[..., :3, 3] - action[..., :3, 3])
    turning = wr > 0.0
    if turning.any():
        a, b = action[turning][:, :3, :3], _rotation_part(empties[turning][:, :3, :3])
        relative = matrix_to_axis_angle(np.swapaxes(a, -1, -2) @ b)
        out[turning, :3, :3] = a @ axis_angle_to_matrix(relative * wr[turning][:, None])
    return out


def _rotation_part(m):
    """Rotation of (N, 3, 3) matrices that may carry scale (an empty scaled by the user): unit columns, re-orthogonal.
    A matrix with a non-finite entry stays non-finite (NaN), for the solver's own checks to refuse; it never raises."""
    finite = np.isfinite(m).all(axis=(1, 2))
    if not finite.all():
        out = np.full(m.shape, np.nan)
        out[finite] = _rotation_part(m[finite]) if finite.any() else out[finite]
        return out
    u, _, vt = np.linalg.svd(m)
    r = u @ vt
    flip = np.linalg.det(r) < 0
    if flip.any():
        u[flip, :, -1] *= -1
        r[flip] = u[flip] @ vt[flip]
    return r
