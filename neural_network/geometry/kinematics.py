"""Forward kinematics over the mapped chain, and its exact reverse pass (vector-Jacobian product).

    R_j = R_p @ A_j,   A_j = bridge_j @ L_j
    x_j = x_p + R_p @ offset_j

The hips transform is given (from the data or the root target), so L_0 does not enter FK. Roles the rig lacks
copy their ideal parent's transform so every output is finite; losses mask them out. One batched step per depth
level of the chain keeps the Python loop short (about 7 steps for a full humanoid).
"""

from dataclasses import dataclass

import numpy as np

from ..skeleton.roles import NUM_ROLES, ROLE_PARENTS
from .rotations import axis_angle_to_matrix, axis_angle_vjp


@dataclass
class Pose:
    rotations: np.ndarray   # (N, 23, 3, 3) character-space orientation of each role's bone
    positions: np.ndarray   # (N, 23, 3) head positions
    blocks: np.ndarray      # (N, 23, 3, 3) A_j = bridge_j @ L_j, kept for the reverse pass
    bridges: np.ndarray     # (N or 1, 23, 3, 3) what forward used
    offsets: np.ndarray     # (N or 1, 23, 3)
    soa: dict = None        # large batches: the same arrays with the batch axis last, kept for backward


# From this batch size on, FK and its reverse pass run with the batch axis last ("structure of arrays"): a 3x3
# product becomes 9 multiply-adds over contiguous length-N vectors, several times faster than np.matmul on stacks
# of 3x3 matrices (measured at N = 256 x 23). Small batches (the live solver's single pose) keep np.matmul, which has
# less per-call overhead. Both paths compute the same numbers (tests/test_losses.py checks them against each other).
BATCH_LAST_FROM = 64


def _last(a):
    """(N, ...) -> (..., N), contiguous."""
    return np.ascontiguousarray(np.moveaxis(a, 0, -1))


def _first(a):
    """(..., N) -> (N, ...), contiguous."""
    return np.ascontiguousarray(np.moveaxis(a, -1, 0))


def _mm(a, b):
    """Matrix product of (..., 3, 3, N) stacks (either may have N = 1)."""
    out = a[..., :, 0, None, :] * b[..., None, 0, :, :]
    out += a[..., :, 1, None, :] * b[..., None, 1, :, :]
    out += a[..., :, 2, None, :] * b[..., None, 2, :, :]
    return out


def _mv(a, x):
    """(..., 3, 3, N) @ (..., 3, N)."""
    return a[..., :, 0, :] * x[..., None, 0, :] + a[..., :, 1, :] * x[..., None, 1, :] + a[..., :, 2, :] * x[..., None, 2, :]


def _tr(a):
    return np.swapaxes(a, -3, -2)


def _forward_batch_last(skeleton, local_rotations, hips_rotation, hips_position, bridges, offsets):
    dtype = local_rotations.dtype
    n = local_rotations.shape[0]
    B = skeleton.bridges.astype(dtype)[..., None] if bridges is None else _last(bridges)
    offs = skeleton.offsets.astype(dtype)[..., None] if offsets is None else _last(offsets)
    blocks = _mm(B, _last(local_rotations))
    rot = np.empty((NUM_ROLES, 3, 3, n), dtype=dtype)
    pos = np.empty((NUM_ROLES, 3, n), dtype=dtype)
    rot[0] = _last(np.asarray(hips_rotation, dtype))
    pos[0] = _last(np.asarray(hips_position, dtype))
    for idx, par in skeleton.levels():
        r_p = rot[par]
        rot[idx] = _mm(r_p, blocks[idx])
        pos[idx] = pos[par] + _mv(r_p, offs[idx])
    mask = skeleton.role_mask
    for j in range(1, NUM_ROLES):
        if not mask[j]:
            rot[j] = rot[ROLE_PARENTS[j]]
            pos[j] = pos[ROLE_PARENTS[j]]
    aos_bridges = skeleton.bridges.astype(dtype)[None] if bridges is None else bridges
    aos_offsets = skeleton.offsets.astype(dtype)[None] if offsets is None else offsets
    return Pose(_first(rot), _first(pos), _first(blocks), aos_bridges, aos_offsets,
                soa={"rot": rot, "blocks": blocks, "bridges": B, "offsets": offs})


def _backward_batch_last(skeleton, pose, grad_rotations, grad_positions):
    n = pose.positions.shape[0]
    dtype = pose.positions.dtype
    cache = pose.soa
    g_rot = np.zeros((NUM_ROLES, 3, 3, n), dtype) if grad_rotations is None else _last(grad_rotations)
    g_pos = np.zeros((NUM_ROLES, 3, n), dtype) if grad_positions is None else _last(grad_positions)
    mask = skeleton.role_mask
    for j in range(NUM_ROLES - 1, 0, -1):   # undo the copies made for unmapped roles
        if not mask[j]:
            g_rot[ROLE_PARENTS[j]] += g_rot[j]
            g_pos[ROLE_PARENTS[j]] += g_pos[j]
            g_rot[j] = 0
            g_pos[j] = 0
    rot, blocks, offs = cache["rot"], cache["blocks"], cache["offsets"]
    g_blocks = np.zeros_like(blocks)
    for idx, par in reversed(skeleton.levels()):
        g_r = g_rot[idx]
        g_x = g_pos[idx]
        g_blocks[idx] = _mm(_tr(rot[par]), g_r)
        to_parent_rot = _mm(g_r, _tr(blocks[idx])) + g_x[:, :, None, :] * offs[idx][:, None, :, :]
        for k, p in enumerate(par):   # a parent may have several children on one level (thighs, shoulders)
            g_rot[p] += to_parent_rot[k]
            g_pos[p] += g_x[k]
    g_local = _mm(_tr(cache["bridges"]), g_blocks)
    g_local[0] = 0
    return _first(g_local)


def forward(skeleton, local_rotations, hips_rotation, hips_position, bridges=None, offsets=None):
    """local_rotations (N, 23, 3, 3); hips_rotation (N, 3, 3); hips_position (N, 3) -> Pose.

    bridges (N, 23, 3, 3) and offsets (N, 23, 3) override the skeleton's defaults per sample.
    """
    if local_rotations.shape[0] >= BATCH_LAST_FROM:
        return _forward_batch_last(skeleton, local_rotations, hips_rotation, hips_position, bridges, offsets)
    dtype = local_rotations.dtype
    bridges = skeleton.bridges.astype(dtype)[None] if bridges is None else bridges
    offsets = skeleton.offsets.astype(dtype)[None] if offsets is None else offsets
    blocks = bridges @ local_rotations
    n = local_rotations.shape[0]
    rot = np.empty((n, NUM_ROLES, 3, 3), dtype=dtype)
    pos = np.empty((n, NUM_ROLES, 3), dtype=dtype)
    rot[:, 0] = hips_rotation
    pos[:, 0] = hips_position
    for idx, par in skeleton.levels():
        r_p = rot[:, par]
        rot[:, idx] = r_p @ blocks[:, idx]
        pos[:, idx] = pos[:, par] + np.einsum("nkab,nkb->nka", r_p, np.broadcast_to(offsets[:, idx], (n, len(idx), 3)))
    mask = skeleton.role_mask
    for j in range(1, NUM_ROLES):
        if not mask[j]:
            rot[:, j] = rot[:, ROLE_PARENTS[j]]
            pos[:, j] = pos[:, ROLE_PARENTS[j]]
    return Pose(rot, pos, blocks, bridges, offsets)


def backward(skeleton, pose, grad_rotations, grad_positions):
    """Gradient of a scalar loss with respect to the local rotation matrices L (N, 23, 3, 3).

    grad_rotations (N, 23, 3, 3) and grad_positions (N, 23, 3) are dLoss/dR and dLoss/dx (either may be None).
    The hips' own entry is zero: the hips transform is an input, not a prediction.
    """
    if pose.soa is not None:
        return _backward_batch_last(skeleton, pose, grad_rotations, grad_positions)
    n = pose.positions.shape[0]
    g_rot = np.zeros_like(pose.rotations) if grad_rotations is None else np.array(grad_rotations, copy=True)
    g_pos = np.zeros_like(pose.positions) if grad_positions is None else np.array(grad_positions, copy=True)
    mask = skeleton.role_mask
    for j in range(NUM_ROLES - 1, 0, -1):   # undo the copies made for unmapped roles
        if not mask[j]:
            g_rot[:, ROLE_PARENTS[j]] += g_rot[:, j]
            g_pos[:, ROLE_PARENTS[j]] += g_pos[:, j]
            g_rot[:, j] = 0
            g_pos[:, j] = 0
    g_blocks = np.zeros_like(pose.blocks)
    offsets = pose.offsets
    for idx, par in reversed(skeleton.levels()):
        r_p = pose.rotations[:, par]
        g_r = g_rot[:, idx]
        g_x = g_pos[:, idx]
        g_blocks[:, idx] = np.swapaxes(r_p, -1, -2) @ g_r
        off = np.broadcast_to(offsets[:, idx], (n, len(idx), 3))
        to_parent_rot = g_r @ np.swapaxes(pose.blocks[:, idx], -1, -2) + g_x[..., :, None] * off[..., None, :]
        for k, p in enumerate(par):   # a parent may have several children on one level (thighs, shoulders)
            g_rot[:, p] += to_parent_rot[:, k]
            g_pos[:, p] += g_x[:, k]
    g_local = np.swapaxes(pose.bridges, -1, -2) @ g_blocks
    g_local[:, 0] = 0
    return g_local


def forward_axis_angle(skeleton, axis_angles, hips_rotation, hips_position, bridges=None, offsets=None):
    """FK from (N, 23, 3) local axis-angle rotations."""
    return forward(skeleton, axis_angle_to_matrix(axis_angles), hips_rotation, hips_position, bridges, offsets)


def backward_axis_angle(skeleton, pose, axis_angles, grad_rotations, grad_positions):
    """Gradient with respect to the (N, 23, 3) axis-angles that forward_axis_angle was given."""
    return axis_angle_vjp(axis_angles, backward(skeleton, pose, grad_rotations, grad_positions))
