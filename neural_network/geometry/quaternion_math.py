"""Rotation conversions for the run-time tick, each a handful of whole-array NumPy calls (no per-element loops).

On arrays of a few dozen rotations a NumPy call costs about the same whatever the size, so the tick's
budget is counted in calls: these helpers write quaternion <-> matrix maps as small constant matrices applied with
one matmul (a rotation matrix is a quadratic form of its unit quaternion, a cross-product matrix is linear in its
vector). Quaternions are (w, x, y, z) like Blender's; matrices act on column vectors.
"""

import math

import numpy as np


def _homogeneous_matrix(q):
    """R(q) without normalisation: exact for unit q, scaled by |q|^2 otherwise (a quadratic form of q)."""
    w, x, y, z = q
    return np.array([
        [w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z]])


def _quadratic_form():
    """(16, 9): vec(R(q)) = vec(q q^T) @ this, by polarisation of the quadratic form."""
    eye = np.eye(4)
    out = np.zeros((4, 4, 9))
    for a in range(4):
        for b in range(4):
            out[a, b] = ((_homogeneous_matrix(eye[a] + eye[b]) - _homogeneous_matrix(eye[a] - eye[b])) / 4).reshape(9)
    return out.reshape(16, 9)


QUATERNION_TO_MATRIX = _quadratic_form()
SKEW = np.zeros((3, 9))               # vec([v]x) = v @ SKEW
SKEW[0, [7, 5]] = 1.0, -1.0
SKEW[1, [2, 6]] = 1.0, -1.0
SKEW[2, [3, 1]] = 1.0, -1.0

# vec(R) (9) -> (1 + m00 + m11 + m22, 1 + m00 - m11 - m22, 1 - m00 + m11 - m22, 1 - m00 - m11 + m22,
#                m21 - m12, m02 - m20, m10 - m01) after adding _SQUARES_BIAS: 4 * |q_i|^2 and the signs of x, y, z.
MATRIX_TO_SQUARES = np.zeros((9, 7))
MATRIX_TO_SQUARES[[0, 4, 8], 0] = 1, 1, 1
MATRIX_TO_SQUARES[[0, 4, 8], 1] = 1, -1, -1
MATRIX_TO_SQUARES[[0, 4, 8], 2] = -1, 1, -1
MATRIX_TO_SQUARES[[0, 4, 8], 3] = -1, -1, 1
MATRIX_TO_SQUARES[[7, 5], 4] = 1, -1
MATRIX_TO_SQUARES[[2, 6], 5] = 1, -1
MATRIX_TO_SQUARES[[3, 1], 6] = 1, -1
SQUARES_BIAS = np.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0])


def quaternions_to_matrices(q):
    """(..., 4) unit quaternions -> (..., 3, 3): one outer product and one matmul."""
    outer = q[..., :, None] * q[..., None, :]
    return (outer.reshape(q.shape[:-1] + (16,)) @ QUATERNION_TO_MATRIX).reshape(q.shape[:-1] + (3, 3))


def squares_to_quaternions(s, out=None):
    """(..., 7) from MATRIX_TO_SQUARES (bias included) -> (..., 4) unit quaternions, w >= 0 (the copysign form)."""
    q = np.maximum(s[..., :4], 0.0, out=out)
    np.sqrt(q, out=q)
    np.copysign(q[..., 1:], s[..., 4:], out=q[..., 1:])
    q /= np.sqrt(np.einsum("...i,...i->...", q, q))[..., None]
    return q


def matrices_to_quaternions(R, out=None):
    """(..., 3, 3) rotations -> (..., 4) unit quaternions with w >= 0."""
    s = R.reshape(R.shape[:-2] + (9,)) @ MATRIX_TO_SQUARES
    s += SQUARES_BIAS
    return squares_to_quaternions(s, out)


def exp_quaternions(v, out=None):
    """(..., 3) axis-angle -> unit quaternions written into out (..., 4; a new array when None); v is the half angle
    times the axis."""
    if out is None:
        out = np.empty(v.shape[:-1] + (4,))
    half = np.sqrt(np.einsum("...i,...i->...", v, v))
    np.cos(half, out=out[..., 0])
    scale = np.sin(half)
    scale /= np.maximum(half, 1e-300)        # sin(h)/h: exact for tiny h, and v = 0 gives 0 * 0
    np.multiply(v, scale[..., None], out=out[..., 1:])
    return out


def rotations_about(axis, angle):
    """(..., 3) unit axes and (...,) angles -> (..., 3, 3) rotation matrices (through the half-angle quaternion)."""
    half = 0.5 * angle
    q = np.empty(axis.shape[:-1] + (4,))
    np.cos(half, out=q[..., 0])
    np.multiply(axis, np.sin(half)[..., None], out=q[..., 1:])
    return quaternions_to_matrices(q)


def left_matrices(q):
    """(..., 4) -> (..., 4, 4) L(q) with q * p = L(q) @ p (Hamilton product, (w, x, y, z))."""
    w, x, y, z = (q[..., i] for i in range(4))
    return np.stack([np.stack([w, -x, -y, -z], -1), np.stack([x, w, -z, y], -1),
                     np.stack([y, z, w, -x], -1), np.stack([z, -y, x, w], -1)], -2)


def _hamilton_product():
    """(16, 4): a * b = vec(a b^T) @ this (Hamilton product, (w, x, y, z)), from the columns of left_matrices."""
    eye = np.eye(4)
    out = np.zeros((4, 4, 4))
    for a in range(4):
        out[a] = left_matrices(eye[a]).T        # (a_i e_i) * b = a_i L(e_i) @ b
    return out.reshape(16, 4)


HAMILTON_PRODUCT = _hamilton_product()


def multiply_quaternions(a, b):
    """(..., 4) a * b (Hamilton product, broadcast) in two calls: one outer product and one matmul."""
    outer = a[..., :, None] * b[..., None, :]
    return outer.reshape(outer.shape[:-2] + (16,)) @ HAMILTON_PRODUCT


# -- one rotation at a time, in plain Python floats -----------------------------------------------------------------
# For a handful of rotations of one character, Python float operations beat NumPy calls (a NumPy call costs more
# than a dozen float operations): the reach assist and the end twist work per character with these (tuples of
# floats; matrices as rows).

def quaternion_product(a, b):
    """a * b for (w, x, y, z) tuples (Hamilton product)."""
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return (aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw)


def quaternion_axis_angle(q):
    """(w, x, y, z) unit quaternion -> axis-angle (x, y, z) with angle in [0, pi], as rotations.quaternion_to_axis_angle
    does for arrays."""
    w, x, y, z = q
    s = math.sqrt(x * x + y * y + z * z)
    scale = math.copysign(2.0 * math.atan2(s, abs(w)) / max(s, 1e-300), w)
    return (x * scale, y * scale, z * scale)


def axis_angle_quaternion(v):
    """Axis-angle (x, y, z) -> (w, x, y, z) unit quaternion."""
    angle = math.sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2])
    scale = math.sin(0.5 * angle) / max(angle, 1e-300)
    return (math.cos(0.5 * angle), v[0] * scale, v[1] * scale, v[2] * scale)


def turn_quaternion(axis, angle):
    """The turn by `angle` about a unit axis (x, y, z) as a (w, x, y, z) quaternion."""
    s = math.sin(0.5 * angle)
    return (math.cos(0.5 * angle), axis[0] * s, axis[1] * s, axis[2] * s)


def axis_angle_excess(d, low, high):
    """How far an axis-angle d lies past the box [low, high], summed over its axes."""
    out = 0.0
    for v, lo, hi in ((d[0], low[0], high[0]), (d[1], low[1], high[1]), (d[2], low[2], high[2])):
        if v > hi:
            out += v - hi
        elif v < lo:
            out += lo - v
    return out


def quaternion_matrix(q):
    """(w, x, y, z) unit quaternion -> rotation matrix as three row tuples."""
    w, x, y, z = q
    return ((1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)),
            (2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)),
            (2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)))


def rotation_about(n, angle):
    """Unit axis n (x, y, z) and angle -> rotation matrix as three row tuples (Rodrigues)."""
    x, y, z = n
    c, s = math.cos(angle), math.sin(angle)
    k = 1.0 - c
    return ((c + x * x * k, x * y * k - z * s, x * z * k + y * s),
            (y * x * k + z * s, c + y * y * k, y * z * k - x * s),
            (z * x * k - y * s, z * y * k + x * s, c + z * z * k))


def matrix_times(M, v):
    """A 3x3 matrix (rows) times a vector."""
    return (M[0][0] * v[0] + M[0][1] * v[1] + M[0][2] * v[2], M[1][0] * v[0] + M[1][1] * v[1] + M[1][2] * v[2],
            M[2][0] * v[0] + M[2][1] * v[1] + M[2][2] * v[2])


def matrix_transposed_times(M, v):
    """The transpose of a 3x3 matrix (rows) times a vector."""
    return (M[0][0] * v[0] + M[1][0] * v[1] + M[2][0] * v[2], M[0][1] * v[0] + M[1][1] * v[1] + M[2][1] * v[2],
            M[0][2] * v[0] + M[1][2] * v[1] + M[2][2] * v[2])


def log_slope(d, a):
    """J_r^-1(d) a, the derivative of log(exp(d) exp(s a)) in s at 0, for an axis-angle d and an axis a:
    a + d x a / 2 + c d x (d x a), c = 1/t^2 - (1 + cos t) / (2 t sin t) (swivel.py writes it inline, and for
    arrays)."""
    d0, d1, d2 = d
    t2 = d0 * d0 + d1 * d1 + d2 * d2
    if t2 < 1e-8:
        c = 1.0 / 12.0
    else:
        t = math.sqrt(t2)
        c = 1.0 / t2 - (1.0 + math.cos(t)) / (2.0 * t * math.sin(t)) if t < 3.14 else 1.0 / t2
    x0, x1, x2 = d1 * a[2] - d2 * a[1], d2 * a[0] - d0 * a[2], d0 * a[1] - d1 * a[0]
    return (a[0] + 0.5 * x0 + c * (d1 * x2 - d2 * x1), a[1] + 0.5 * x1 + c * (d2 * x0 - d0 * x2),
            a[2] + 0.5 * x2 + c * (d0 * x1 - d1 * x0))
