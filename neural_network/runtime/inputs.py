"""The 50 inputs at run time: `InputBuilder` computes features.build_inputs from the six target matrices with a few
constant matrix products (tests/test_solver.py checks it against build_inputs), plus the layout constants the solver
and the run-time graph share (how many targets, where the per-character settings enter, what counts as absurd)."""

import numpy as np

from ..data.features import INPUT_NAMES, NUM_INPUTS
from ..geometry.rotations import matrix_to_axis_angle
from ..skeleton.roles import ROLE_INDEX

NUM_TARGETS = 6               # root, then the five effectors
ABSURD_DISTANCE = 100.0       # rig heights from the origin of character space
NUM_FEATURES = NUM_INPUTS + 5                     # the inputs, then trace - 1 of each effector's relative rotation
SETTING_INPUTS = ("LeftFoot.height", "RightFoot.height", "LeftFoot.contact", "RightFoot.contact",
                  "LeftFoot.desired_contact", "RightFoot.desired_contact", "phase", "task")
SETTING_COLUMNS = tuple(INPUT_NAMES.index(name) for name in SETTING_INPUTS)   # where each setting enters the 50 inputs
NUM_SETTINGS = len(SETTING_COLUMNS)


def _linear_features(G, reference, hips_reference):
    """The part of the 50 inputs (plus the five traces minus one) that is linear in G (6, 4, 4), the targets turned
    into the root frame. Used only to build InputBuilder's constant matrix, by probing with unit inputs."""
    f = np.zeros(NUM_FEATURES)
    for e in range(5):
        t = e + 1
        f[6 * e:6 * e + 3] = G[t, :3, 3] - G[0, :3, 3]
        A = reference[e].T @ G[t, :3, :3]
        f[6 * e + 3:6 * e + 6] = (A[2, 1] - A[1, 2], A[0, 2] - A[2, 0], A[1, 0] - A[0, 1])
        f[NUM_INPUTS + e] = np.trace(A) - G[0, 3, 3]
    H = G[0, :3, :3] @ hips_reference.T
    f[30:33], f[33:36] = H[:, 1], H[:, 2]
    f[36], f[42] = G[3, 2, 3], G[4, 2, 3]
    f[39] = f[45] = G[0, 3, 3]          # ground normal +Z (G[0, 3, 3] is the constant 1)
    return f


class InputBuilder:
    """features.build_inputs specialised for run time: the same numbers (tests/test_solver.py checks them against
    build_inputs) from very few array operations.

    Everything but the root heading and the axis-angle conversion is linear in the normalised target matrices, and the
    heading enters as a rotation about +Z, R_root^T = cos * Cx + sin * Sx + Ez. So one constant matrix maps
    [vec(targets) (96), settings (8)] to three blocks of features (one per heading basis) plus the thigh-to-thigh
    axis; the heading's cosine and sine then mix the blocks in a second small product, and only the five rotations
    need a few element-wise calls (axis-angle from the antisymmetric part and the trace).
    """

    def __init__(self, skeleton, spec):
        lateral = thigh_axis(skeleton.offsets)
        reference = np.asarray(spec.effector_reference, np.float64)
        hips_reference = np.asarray(spec.hips_reference, np.float64)
        cx, sx, ez = np.zeros((4, 4)), np.zeros((4, 4)), np.zeros((4, 4))
        cx[0, 0] = cx[1, 1] = 1.0
        sx[0, 1], sx[1, 0] = 1.0, -1.0
        ez[2, 2] = ez[3, 3] = 1.0
        width = 96 + NUM_SETTINGS
        M = np.zeros((width, 3 * NUM_FEATURES + 2))
        for u in range(96):
            probe = np.zeros(96)
            probe[u] = 1.0
            probe = probe.reshape(6, 4, 4)
            for b, basis in enumerate((cx, sx, ez)):
                M[u, b * NUM_FEATURES:(b + 1) * NUM_FEATURES] = _linear_features(basis @ probe, reference, hips_reference)
            M[u, 3 * NUM_FEATURES:] = (probe[0, :3, :3] @ lateral)[:2]
        for i, column in enumerate(SETTING_COLUMNS):   # settings pass straight through the constant block
            M[96 + i, 2 * NUM_FEATURES + column] = 1.0
        self.matrix = M
        self.reference = reference
        self.laterals = None

    def set_laterals(self, offsets):
        """Per-character thigh-to-thigh axes in the hips' frame from offsets (K, 23, 3) (in-between bones that move
        per character, see Solver's links); None: the skeleton's, folded into the constant matrix."""
        self.laterals = None if offsets is None else thigh_axis(np.asarray(offsets, np.float64))

    def buffers(self, k):
        """x (K, 104): vec(normalised targets) then settings; y; mixing weights (K, 1, 3) = (cos, sin, 1); features."""
        x = np.zeros((k, 96 + NUM_SETTINGS))
        y = np.empty((k, 3 * NUM_FEATURES + 2))
        weights = np.ones((k, 1, 3))
        features = np.empty((k, 1, NUM_FEATURES))
        return x, y, weights, features

    def __call__(self, buffers, out):
        """Fill out (K, 50) float32 from buffers[0] (targets normalised in place, settings set); returns features."""
        x, y, weights, features = buffers
        k = len(x)
        np.matmul(x, self.matrix, out=y)
        lateral = y[:, 3 * NUM_FEATURES:]
        if self.laterals is not None:                    # (hips rotation @ axis)[:2] per character
            hips = x[:, :16].reshape(k, 4, 4)
            np.einsum("kab,kb->ka", hips[:, :2, :3], self.laterals, out=lateral)
        length = np.hypot(lateral[:, 0], lateral[:, 1])
        if length.min() > 1e-6:
            np.divide(lateral, length[:, None], out=weights[:, 0, :2])
        else:                                            # thighs vertically aligned: the hips' own x axis
            self._fallback_heading(x, lateral, length, weights)
        np.matmul(weights, y[:, :3 * NUM_FEATURES].reshape(k, 3, NUM_FEATURES), out=features)
        f = features[:, 0]
        v = f[:, :30].reshape(k, 5, 6)[:, :, 3:]         # 2 sin(angle) axis, in place of the axis-angle columns
        trace_m1 = f[:, NUM_INPUTS:]                       # 2 cos(angle)
        if trace_m1.min() < -1.998:                        # near a half turn: the careful conversion
            self._careful_rotations(x, weights, v)
        else:
            two_sin = np.sqrt(np.einsum("kei,kei->ke", v, v))
            factor = np.arctan2(two_sin, trace_m1)
            factor /= np.maximum(two_sin, 1e-300)
            v *= factor[..., None]
        np.copyto(out, f[:, :NUM_INPUTS])
        return f

    def _fallback_heading(self, x, lateral, length, weights):
        hips_x = x[:, :96].reshape(-1, 6, 4, 4)[:, 0, :2, 0]
        fb = hips_x / np.maximum(np.hypot(hips_x[:, 0], hips_x[:, 1]), 1e-9)[:, None]
        use = (length > 1e-6)[:, None]
        weights[:, 0, :2] = np.where(use, lateral / np.maximum(length, 1e-12)[:, None], fb)

    def _careful_rotations(self, x, weights, v):
        """Near a half turn the antisymmetric part loses the axis: convert the whole relative matrices instead."""
        k = len(x)
        targets = x[:, :96].reshape(k, 6, 4, 4)
        c, s = weights[:, 0, 0], weights[:, 0, 1]
        root_t = np.zeros((k, 3, 3))
        root_t[:, 0, 0], root_t[:, 0, 1], root_t[:, 1, 0], root_t[:, 1, 1], root_t[:, 2, 2] = c, s, -s, c, 1.0
        A = np.swapaxes(self.reference, -1, -2)[None] @ (root_t[:, None] @ targets[:, 1:, :3, :3])
        v[...] = matrix_to_axis_angle(A)


def thigh_axis(offsets):
    """(..., 3) left thigh head minus right thigh head in the hips' frame, from offsets (..., 23, 3): what the root
    frame's heading is made from."""
    return offsets[..., ROLE_INDEX["LeftThigh"], :] - offsets[..., ROLE_INDEX["RightThigh"], :]
