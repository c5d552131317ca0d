"""Batched rotation conversions in NumPy: axis-angle <-> matrix (with the exact derivative), quaternions, Euler.

Conventions follow Blender: matrices act on column vectors, quaternions are (w, x, y, z), and an Euler order
"XYZ" means X is applied first (R = Rz @ Ry @ Rx).
"""

import numpy as np

from .quaternion_math import QUATERNION_TO_MATRIX, SKEW, quaternions_to_matrices

_SMALL = 1e-8


def skew(v):
    """(..., 3) -> (..., 3, 3) cross-product matrices."""
    x, y, z = v[..., 0], v[..., 1], v[..., 2]
    o = np.zeros_like(x)
    return np.stack([np.stack([o, -z, y], -1), np.stack([z, o, -x], -1), np.stack([-y, x, o], -1)], -2)


def axis_angle_to_matrix(v):
    """Rodrigues' formula, (..., 3) -> (..., 3, 3); exact near zero through Taylor terms."""
    v = np.asarray(v)
    theta2 = np.sum(v * v, axis=-1)[..., None, None]
    theta = np.sqrt(theta2)
    small = theta2 < 1e-12
    safe = np.where(small, 1.0, theta)
    a = np.where(small, 1.0 - theta2 / 6.0, np.sin(safe) / safe)
    b = np.where(small, 0.5 - theta2 / 24.0, (1.0 - np.cos(safe)) / (safe * safe))
    k = skew(v)
    eye = np.broadcast_to(np.eye(3, dtype=v.dtype), k.shape)
    return eye + a * k + b * (k @ k)


def right_jacobian(v):
    """(..., 3) axis-angle -> (..., 3, 3) J with exp(v + d) = exp(v) exp(J d) to first order in d: how a change of the
    axis-angle vector turns the rotation in its own frame. I - (1 - cos t) / t^2 [v]x + (t - sin t) / t^3 [v]x^2."""
    v = np.asarray(v, np.float64)
    theta2 = np.einsum("...i,...i->...", v, v)[..., None, None]
    small = theta2 < 1e-8
    safe2 = np.where(small, 1.0, theta2)
    safe = np.sqrt(safe2)
    a = np.where(small, 0.5 - theta2 / 24.0, (1.0 - np.cos(safe)) / safe2)
    b = np.where(small, 1.0 / 6.0 - theta2 / 120.0, (safe - np.sin(safe)) / (safe2 * safe))
    k = (v @ SKEW).reshape(v.shape + (3,))                     # [v]x (a few calls, where skew stacks nine)
    return np.eye(3) - a * k + b * (k @ k)


def axis_angle_vjp(v, grad_matrix):
    """Gradient with respect to v of sum(grad_matrix * axis_angle_to_matrix(v)).

    Uses dR/dv_i = (v_i [v]x + [v x (I - R) e_i]x) R / |v|^2 (Gallego and Yezzi 2015), and [e_i]x at zero.
    """
    v = np.asarray(v)
    R = axis_angle_to_matrix(v)
    theta2 = np.sum(v * v, axis=-1)
    small = theta2 < 1e-12
    safe2 = np.where(small, 1.0, theta2)
    eye = np.eye(3, dtype=v.dtype)
    kv = skew(v)
    out = np.empty(v.shape, dtype=np.result_type(v, grad_matrix))
    i_minus_r = eye - R
    for i in range(3):
        col = i_minus_r[..., :, i]                      # (I - R) e_i
        term = v[..., i, None, None] * kv + skew(np.cross(v, col))
        d_general = (term @ R) / safe2[..., None, None]
        d_small = np.broadcast_to(skew(eye[i]), R.shape)
        d = np.where(small[..., None, None], d_small, d_general)
        out[..., i] = np.sum(grad_matrix * d, axis=(-2, -1))
    return out


def matrix_to_axis_angle(R):
    """(..., 3, 3) -> (..., 3), the angle in [0, pi]; stable near 0 and near pi. Computed in float64."""
    R = np.asarray(R, dtype=np.float64)
    return quaternion_to_axis_angle(matrix_to_quaternion(R))


def matrix_to_quaternion(R):
    """(..., 3, 3) -> (..., 4) unit quaternions (w, x, y, z) with w >= 0 (Shepperd's method)."""
    R = np.asarray(R, dtype=np.float64)
    m00, m11, m22 = R[..., 0, 0], R[..., 1, 1], R[..., 2, 2]
    trace = m00 + m11 + m22
    cands = np.stack([
        np.stack([1 + trace, R[..., 2, 1] - R[..., 1, 2], R[..., 0, 2] - R[..., 2, 0], R[..., 1, 0] - R[..., 0, 1]], -1),
        np.stack([R[..., 2, 1] - R[..., 1, 2], 1 + m00 - m11 - m22, R[..., 0, 1] + R[..., 1, 0], R[..., 0, 2] + R[..., 2, 0]], -1),
        np.stack([R[..., 0, 2] - R[..., 2, 0], R[..., 0, 1] + R[..., 1, 0], 1 - m00 + m11 - m22, R[..., 1, 2] + R[..., 2, 1]], -1),
        np.stack([R[..., 1, 0] - R[..., 0, 1], R[..., 0, 2] + R[..., 2, 0], R[..., 1, 2] + R[..., 2, 1], 1 - m00 - m11 + m22], -1),
    ], -2)
    pick = np.argmax(np.stack([trace, m00, m11, m22], -1), axis=-1)
    q = np.take_along_axis(cands, pick[..., None, None], axis=-2)[..., 0, :]
    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
    return np.where(q[..., :1] < 0, -q, q)


def quaternion_to_matrix(q):
    """(..., 4) (w, x, y, z), normalised first -> (..., 3, 3)."""
    q = np.asarray(q)
    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
    ], -2)


def quaternion_to_axis_angle(q):
    """(..., 4) -> (..., 3) with the angle in [0, pi] (q and -q give the same): v * sign(w) 2 atan2(|v|, |w|) / |v|,
    which tends to v * 2 / |w| as |v| -> 0, so small angles keep full precision."""
    q = np.asarray(q, dtype=np.float64)
    v, w = q[..., 1:], q[..., 0]
    s = np.sqrt(np.einsum("...i,...i->...", v, v))
    scale = np.copysign(2.0 * np.arctan2(s, np.abs(w)) / np.maximum(s, 1e-300), w)
    return v * scale[..., None]


def axis_angle_to_quaternion(v):
    v = np.asarray(v, dtype=np.float64)
    angle = np.linalg.norm(v, axis=-1, keepdims=True)
    half = 0.5 * angle
    scale = np.where(angle < _SMALL, 0.5 - angle * angle / 48.0, np.sin(half) / np.maximum(angle, _SMALL))
    return np.concatenate([np.cos(half), v * scale], axis=-1)


def blender_axis_angle(aa):
    """(..., 3) axis-angle -> (..., 4) as Blender's rotation_axis_angle stores it: (angle, x, y, z) with a unit axis;
    a zero turn keeps Blender's default axis (0, 1, 0)."""
    aa = np.asarray(aa, np.float64)
    angle = np.linalg.norm(aa, axis=-1, keepdims=True)
    axis = np.where(angle > 1e-12, aa / np.maximum(angle, 1e-12), (0.0, 1.0, 0.0))
    return np.concatenate([angle, axis], axis=-1)


def euler_to_matrix(angles, order="XYZ"):
    """(..., 3) Euler angles in radians, as Blender stores them (x, y, z), -> (..., 3, 3)."""
    angles = np.asarray(angles)
    c, s = np.cos(angles), np.sin(angles)
    one, zero = np.ones_like(c[..., 0]), np.zeros_like(c[..., 0])
    basic = {
        "X": np.stack([np.stack([one, zero, zero], -1), np.stack([zero, c[..., 0], -s[..., 0]], -1),
                       np.stack([zero, s[..., 0], c[..., 0]], -1)], -2),
        "Y": np.stack([np.stack([c[..., 1], zero, s[..., 1]], -1), np.stack([zero, one, zero], -1),
                       np.stack([-s[..., 1], zero, c[..., 1]], -1)], -2),
        "Z": np.stack([np.stack([c[..., 2], -s[..., 2], zero], -1), np.stack([s[..., 2], c[..., 2], zero], -1),
                       np.stack([zero, zero, one], -1)], -2),
    }
    first, second, third = order
    return basic[third] @ basic[second] @ basic[first]


# Blender's Euler orders as (i, j, k, parity): the axes in the order applied, and whether they are an odd permutation
EULER_AXES = {"XYZ": (0, 1, 2, False), "XZY": (0, 2, 1, True), "YXZ": (1, 0, 2, True), "YZX": (1, 2, 0, False),
              "ZXY": (2, 0, 1, False), "ZYX": (2, 1, 0, True)}
_TWO_PI = 2.0 * np.pi


def matrix_to_euler(M, order="XYZ", compat=None):
    """(..., 3, 3) rotations -> (..., 3) Euler angles (x, y, z) in `order`, batched: what mathutils'
    Matrix.to_euler(order, compat) gives, one rotation at a time.

    Every rotation has two Euler solutions (Blender's mat3_normalized_to_eulo2). Without compat the one with the
    smaller sum of |angles| is taken; with compat (..., 3) (the angles a bone holds now) each solution's angles are
    first moved by whole turns to within half a turn of compat's, then the nearer solution (L1) is taken - so a live
    pose or a key never jumps by a turn or flips to the other solution (Blender's compatible_eul)."""
    M = np.asarray(M, np.float64)
    i, j, k, parity = EULER_AXES[order]
    cy = np.hypot(M[..., i, i], M[..., j, i])
    first, second = np.empty(M.shape[:-2] + (3,)), np.empty(M.shape[:-2] + (3,))
    first[..., i] = np.arctan2(M[..., k, j], M[..., k, k])
    first[..., j] = np.arctan2(-M[..., k, i], cy)
    first[..., k] = np.arctan2(M[..., j, i], M[..., i, i])
    second[..., i] = np.arctan2(-M[..., k, j], -M[..., k, k])
    second[..., j] = np.arctan2(-M[..., k, i], -cy)
    second[..., k] = np.arctan2(-M[..., j, i], -M[..., i, i])
    locked = cy <= 16.0 * np.finfo(np.float32).eps          # gimbal lock: one solution, the last angle zero
    if locked.any():
        first[..., i] = np.where(locked, np.arctan2(-M[..., j, k], M[..., j, j]), first[..., i])
        first[..., k] = np.where(locked, 0.0, first[..., k])
        second = np.where(locked[..., None], first, second)
    if parity:
        first, second = -first, -second
    if compat is None:
        take_second = np.abs(first).sum(axis=-1) > np.abs(second).sum(axis=-1)
    else:
        compat = np.asarray(compat, np.float64)
        first -= np.floor((first - compat) / _TWO_PI + 0.5) * _TWO_PI
        second -= np.floor((second - compat) / _TWO_PI + 0.5) * _TWO_PI
        take_second = np.abs(first - compat).sum(axis=-1) > np.abs(second - compat).sum(axis=-1)
    return np.where(take_second[..., None], second, first)


def _euler_forms():
    """Per order, (16, 6): vec(q q^T) -> (y, x) in axis order (x, y, z) such that matrix_to_euler's first solution is
    arctan2(y, x) - the matrix entries it reads, as quadratic forms of q, with the parity's sign on y - except the
    middle axis' x (cy, not a quadratic form: left 0)."""
    entry = lambda r, c: QUATERNION_TO_MATRIX[:, 3 * r + c]          # noqa: E731
    forms = {}
    for order, (i, j, k, parity) in EULER_AXES.items():
        sign = -1.0 if parity else 1.0
        form = np.zeros((16, 6))
        form[:, i], form[:, 3 + i] = sign * entry(k, j), entry(k, k)
        form[:, j] = -sign * entry(k, i)
        form[:, k], form[:, 3 + k] = sign * entry(j, i), entry(i, i)
        forms[order] = form
    return forms


_EULER_FORMS = _euler_forms()


def quaternions_to_compatible_euler(q, order, compat):
    """(n, 4) unit quaternions -> (n, 3) Euler angles in `order`, each the solution nearest compat (n, 3): what
    matrix_to_euler(quaternion matrices, order, compat) gives, in about twenty NumPy calls (the live tick writes a
    rig's Euler bones with it every tick). The second solution is the first's (a + pi, pi - b, c + pi) in axis order
    i, j, k, up to whole turns, which the wrap toward compat takes out anyway."""
    i, j, k, _parity = EULER_AXES[order]
    q = np.asarray(q, np.float64)
    yx = np.einsum("ni,nj->nij", q, q).reshape(len(q), 16) @ _EULER_FORMS[order]
    y, x = yx[:, :3], yx[:, 3:]
    cy = np.hypot(x[:, k], y[:, k], out=x[:, j])                      # hypot(M_ii, M_ji)
    if not cy.min(initial=np.inf) > 16.0 * np.finfo(np.float32).eps:  # gimbal lock somewhere: the full statement
        return matrix_to_euler(quaternions_to_matrices(q), order, compat)
    both = np.empty((2, len(q), 3))
    first = np.arctan2(y, x, out=both[0])
    flip = np.ones(3)
    flip[j] = -1.0
    np.multiply(first, flip, out=both[1])
    both[1] += np.pi
    compat = np.asarray(compat, np.float64)
    both -= np.rint((both - compat) * (1.0 / _TWO_PI)) * _TWO_PI
    distance = np.abs(both - compat).sum(axis=-1)
    return np.where((distance[0] > distance[1])[:, None], both[1], both[0])


def angle_between(Ra, Rb):
    """Geodesic angle in radians between rotation matrices, float64 and atan2-based (no arccos floor)."""
    rel = np.swapaxes(np.asarray(Ra, np.float64), -1, -2) @ np.asarray(Rb, np.float64)
    return np.linalg.norm(matrix_to_axis_angle(rel), axis=-1)


def orthonormalize(R):
    """Nearest rotation matrix (SVD), for averaged or float32-drifted matrices."""
    u, _, vt = np.linalg.svd(R)
    d = np.sign(np.linalg.det(u @ vt))
    u = u.copy()
    u[..., :, -1] *= d[..., None]
    return u @ vt


def blend_transforms(a, b, share):
    """(..., 4, 4) rigid transforms between a and b: `share` ((...,) or a number) of the way from a to b, positions
    on the line and rotations the nearest to the same weighted mean of the two matrices (chordal)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    t = np.asarray(share, np.float64)[..., None]
    out = np.array(a)
    out[..., :3, 3] = (1.0 - t) * a[..., :3, 3] + t * b[..., :3, 3]
    out[..., :3, :3] = orthonormalize((1.0 - t[..., None]) * a[..., :3, :3] + t[..., None] * b[..., :3, :3])
    return out


def chordal_mean(R, axis=0):
    """Rotation closest to the arithmetic mean of rotation matrices (the chordal L2 mean)."""
    return orthonormalize(np.mean(np.asarray(R, np.float64), axis=axis))
