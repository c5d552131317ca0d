"""The refinement's run-time chain layout (refine.py): the chain laid out level by level in three lanes, the five
chains of the closed form, what each character's links give the chain (ChainLinks), and the Workspace of buffers and
views the run-time steps write into, made once per character count. Pure NumPy.
"""

from typing import NamedTuple

import numpy as np

from ..geometry.quaternion_math import MATRIX_TO_SQUARES, SQUARES_BIAS

# The chain laid out level by level in three lanes (torso/neck, left, right), so one batched 4x4 product per level
# is the whole forward pass; every slot's parent is the slot above it in its lane, except level 4 whose three
# slots (NeckLower, both clavicles) hang off Spine2. "" pads. Toes are left out: no effector lies below them.
LEVELS = (("Hips", "Hips", "Hips"), ("Spine", "LeftThigh", "RightThigh"), ("Spine1", "LeftShin", "RightShin"),
          ("Spine2", "LeftFoot", "RightFoot"), ("NeckLower", "LeftShoulder", "RightShoulder"),
          ("NeckUpper", "LeftArm", "RightArm"), ("Head", "LeftForeArm", "RightForeArm"), ("", "LeftHand", "RightHand"))
# The five chains in effector order: (parent of the upper bone, upper, mid, end = the effector).
CHAINS = (("LeftShoulder", "LeftArm", "LeftForeArm", "LeftHand"), ("RightShoulder", "RightArm", "RightForeArm", "RightHand"),
          ("Hips", "LeftThigh", "LeftShin", "LeftFoot"), ("Hips", "RightThigh", "RightShin", "RightFoot"),
          ("Spine2", "NeckLower", "NeckUpper", "Head"))
SLOTS = 3 * len(LEVELS)
MATRIX_TO_SQUARES_WITH_BIAS = np.vstack([MATRIX_TO_SQUARES, SQUARES_BIAS])     # (10, 7): rows (vec(R), 1)
FOUR_ONES = np.ones(4)


class ChainLinks(NamedTuple):
    """What the run-time chain takes from the bridges and offsets: per-slot bridge-times-quadratic-form (S, 16, 9),
    slot offsets (S, 3), the chains' bridges (1, 5, 3, 3, 3), bone lengths (l1, l2, l1^2 + l2^2, 1 / (2 l1 l2)),
    reach (max, min), each (5,), and the |u x v| (5,) below which a limb counts as straight (-1 for chains the closed
    form leaves alone) with its largest value. per_character: every array has a leading K axis (one set per
    character), and forms holds the slots' bridges (K, S, 3, 3) instead (a 16x9 form per slot and frame would cost
    28 kB a frame)."""
    forms: np.ndarray
    offsets: np.ndarray
    chain_bridges: np.ndarray
    lengths: tuple
    reach: tuple
    per_character: bool
    straight: np.ndarray
    straight_max: float

    def take(self, rows):
        """The links of characters `rows` (shared links are everyone's)."""
        if not self.per_character:
            return self
        straight = self.straight[rows]
        return ChainLinks(self.forms[rows], self.offsets[rows], self.chain_bridges[rows],
                          tuple(a[rows] for a in self.lengths), tuple(a[rows] for a in self.reach), True,
                          straight, float(straight.max(initial=-1.0)))


def _unblocked(shape):
    """An empty array whose last axis has stride 2. NumPy's matmul hands each matrix of a stack to BLAS on its own
    (a BLAS call per matrix) unless an operand's rows are not contiguous; then its own loop runs, several times
    faster for stacks of 3x3 and 4x4 (measured on (50, 5, 3, 3, 3) and (50, 3, 4, 4) products; at K = 1 a little)."""
    return np.zeros(tuple(shape[:-1]) + (2 * shape[-1],))[..., ::2]


def _view(array, shape):
    """array reshaped without a copy (an error rather than a silent copy that writes nowhere)."""
    out = array.reshape(shape)
    if not np.shares_memory(out, array):
        raise ValueError("reshape would copy")
    return out


class Workspace:
    """The run-time path's buffers for K characters, and every view its steps use, made once: at K = 1 a NumPy call
    costs the same whatever the size, and making a view costs nearly as much, so the steps are ufuncs and matmuls
    writing into these with out=."""

    def __init__(self, k, links):
        # forward pass: each slot's local transform [bridge R(q) | offset], then the world transforms level by level
        self.slot_q = np.empty((k, SLOTS, 4))
        by_slot = self.slot_q.swapaxes(0, 1)
        self.slot_q_columns, self.slot_q_rows = by_slot[..., :, None], by_slot[..., None, :]
        self.slot_outer = np.empty((SLOTS, k, 4, 4))
        self.slot_outer_flat = _view(self.slot_outer, (SLOTS, k, 16))
        self.slot_rotations = np.empty((SLOTS, k, 9))
        self.slot_rotations_by_character = _view(self.slot_rotations, (SLOTS, k, 3, 3)).swapaxes(0, 1)
        self.G = _unblocked((k, SLOTS, 4, 4))
        if not links.per_character:
            self.G[:, :, :3, 3] = links.offsets
        self.G[:, :, 3, 3] = 1.0
        self.rotations = self.G[:, :, :3, :3]
        T = np.zeros((k, len(LEVELS), 3, 4, 4))
        self.world = _view(T, (k, SLOTS, 4, 4))
        self.hips = T[:, 0]
        G = _view(self.G, (k, len(LEVELS), 3, 4, 4))
        self.levels = [(T[:, 3, :1] if level == 4 else T[:, level - 1], G[:, level], T[:, level])
                       for level in range(1, len(LEVELS))]
        # closed form: the chains' transforms (parent of upper, upper, mid, end)
        S = self.chains = np.empty((k, 5, 4, 4, 4))
        self.mid_end, self.upper_mid = S[:, :, 2:, :3, 3], S[:, :, 1:3, :3, 3]
        self.upper, self.end = S[:, :, 1, :3, 3], S[:, :, 3, :3, 3]
        self.parent_rotation, self.upper_rotation, self.mid_rotation = S[:, :, 0, :3, :3], S[:, :, 1, :3, :3], S[:, :, 2, :3, :3]
        # per chain: u = mid - upper, v = end - mid, t = target - upper, normal of the limb plane (u x v, the elbow's
        # axis), p = new end - upper, axis of the upper bone's turn (p x t)
        V = self.vectors = np.zeros((k, 5, 6, 3))
        self.first_four, self.first_four_t = V[:, :, :4], V[:, :, :4].swapaxes(-1, -2)
        self.vectors_t = V.swapaxes(-1, -2)
        self.uv, self.p_row, self.axes = V[:, :, :2], V[:, :, 4:5], V[:, :, 3::2]
        self.u, self.v, self.t, self.normal, self.p, self.axis = (V[:, :, i] for i in range(6))
        self.v_column, self.t_column = self.v[..., None], self.t[..., None]
        self.axis_column, self.normal_column = self.axis[..., None], self.normal[..., None]
        self.skew = _unblocked((k, 5, 9))                      # [u]x, then [p]x
        self.skew_matrices = _view(self.skew, (k, 5, 3, 3))
        self.first_dots = _unblocked((k, 5, 4, 4))             # dot products of u, v, t, normal
        self.t_normal_squares = np.diagonal(self.first_dots, 0, -2, -1)[..., 2:]
        self.dot_uv, self.dots_vv_uv = self.first_dots[..., 0, 1], self.first_dots[..., 1, 1::-1]
        self.dots = _unblocked((k, 5, 6, 6))                   # then of all six
        self.dot_pt, self.axis_square = self.dots[..., 4, 2], self.dots[..., 5, 5]
        self.lengths = np.empty((k, 5, 3))                     # |t|, |normal|, |axis|
        self.d, self.normal_length, self.axis_length = (self.lengths[..., i] for i in range(3))
        self.t_normal_lengths, self.turn_lengths = self.lengths[..., :2], self.lengths[..., 1:]
        self.dc, self.cos_outer, self.bend, self.ratio, self.cos_phi = (np.empty((k, 5)) for _ in range(5))
        self.ratio_column = self.ratio[..., None]
        self.angles = np.empty((k, 5, 2))                      # the elbow's turn and the upper bone's, then halved
        self.phi, self.angle_upper = self.angles[..., 0], self.angles[..., 1]
        self.coefficients = np.empty((k, 5, 1, 2))             # p = (1 - c0) u + (cos phi + c1) v
        self.c, self.c_u, self.c_v = self.coefficients[..., 0, :], self.coefficients[..., 0, 0], self.coefficients[..., 0, 1]
        self.turns = np.empty((k, 5, 2, 4))                    # quaternions of Q1 (elbow) and Q2 (upper bone)
        self.turn_w, self.turn_xyz = self.turns[..., 0], self.turns[..., 1:]
        self.turn_columns, self.turn_rows = self.turns[..., :, None], self.turns[..., None, :]
        self.turn_outer = np.empty((k, 5, 2, 4, 4))
        self.turn_outer_flat = _view(self.turn_outer, (k * 10, 16))
        self.turn_matrices = np.empty((k * 10, 9))
        Q = _view(self.turn_matrices, (k, 5, 2, 3, 3))
        self.Q1, self.Q2_column = Q[:, :, 0], Q[:, :, 1:]
        self.scale, self.safe_lengths = np.empty((k, 5, 2)), np.empty((k, 5, 2))
        self.scale_column = self.scale[..., None]
        self.halves, self.tiny = np.full((k, 5, 2), 0.5), np.full((k, 5, 2), 1e-300)
        self.minus_ones, self.ones = np.full((k, 5), -1.0), np.full((k, 5), 1.0)
        # the shared links' reaches and lengths as contiguous (K, 5) arrays: a ufunc on contiguous operands of one
        # shape costs less than half of one that broadcasts or strides (None when every character has its own)
        self.shared_reach = self.shared_lengths = None
        if not links.per_character:
            self.shared_reach = tuple(np.broadcast_to(a, (k, 5)).copy() for a in links.reach)
            self.shared_lengths = tuple(np.broadcast_to(a, (k, 5)).copy() for a in links.lengths)
        self.turned = _unblocked((k, 5, 2, 3, 3))              # R_up, Q1 R_mid
        self.frames = _unblocked((k, 5, 4, 3, 3))              # parent of upper, upper (new), mid (new), end = target
        F = self.frames
        self.frame_parent, self.frames_new, self.frame_end, self.frames_parents, self.frames_children = (
            F[:, :, 0], F[:, :, 1:3], F[:, :, 3], F[:, :, :3], F[:, :, 1:])
        self.bridged = np.empty((k, 5, 3, 3, 3))               # world of each parent @ its child's bridge
        self.bridged_t = self.bridged.swapaxes(-1, -2)
        # local rotations as rows of 10 (9 entries and a 1), so one product gives the quaternion squares with bias
        self.local_rows = np.ones((k * 15, 10))
        self.local = _view(self.local_rows[:, :9], (k, 5, 3, 3, 3))
        self.squares = np.empty((k * 15, 7))
        self.square_q, self.square_signs = self.squares[:, :4], self.squares[:, 4:]
        self.quaternions = np.empty((k * 15, 4))
        self.quaternion_xyz = self.quaternions[:, 1:]
        self.quaternions_by_chain = _view(self.quaternions, (k, 15, 4))
        self.norms = np.empty(k * 15)
        self.norm_column = self.norms[:, None]
        self.zeros = np.zeros((k * 15, 4))
        # reach assist's check: |t|^2, then |t|^2 - reach^2 per chain
        self.t_row = self.t[..., None, :]
        self.t_square = np.empty((k, 5))
        self.t_square_column = self.t_square[..., None, None]
        self.assist_distances = np.empty((k, 5))
