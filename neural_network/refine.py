"""Refinement: the network supplies the pose, this makes the five effectors land on their targets.

Two stages, both batched over characters (K):

1. Damped least squares over the whole chain: the unknowns are small body-frame rotations w_j of every mapped joint
   between the hips and an effector (spine, neck, clavicles, upper limbs, lower limbs); the Jacobian is analytic,
   d x_e / d w_j = -[x_e - x_j]x R_j for each ancestor j of effector e. Joints are weighted (limbs move freely, the
   spine and clavicles less), so the smallest weighted change wins and the network's pose survives. After each step
   the local rotations are pulled back inside the model's joint limits (deltas from the mean pose, per axis). This
   stage is what brings a target into the reach of its limb when the network misplaced a shoulder or hip.
2. An exact finish: a closed-form two-bone solve per limb (bend the elbow/knee about the limb's own plane normal,
   then the smallest rotation of the upper bone that puts the wrist/ankle on the target - the swivel plane of the
   pose is kept), then each effector takes its target's orientation. After stage 1 these corrections are tiny, so
   they do not push joints past their limits in any way that matters.

The hips transform is given and never moves. Pure NumPy; no bpy.
"""

import numpy as np

from . import kinematics
from .roles import EFFECTOR_ROLES, NUM_ROLES, ROLE_INDEX
from .rotations import axis_angle_to_matrix, matrix_to_axis_angle

LIMBS = (("LeftArm", "LeftForeArm", "LeftHand"), ("RightArm", "RightForeArm", "RightHand"),
         ("LeftThigh", "LeftShin", "LeftFoot"), ("RightThigh", "RightShin", "RightFoot"))
# How freely each kind of joint may move in the least-squares stage (larger moves more).
JOINT_WEIGHTS = {"Spine": 0.15, "Spine1": 0.15, "Spine2": 0.15, "NeckLower": 0.4, "NeckUpper": 0.4,
                 "LeftShoulder": 0.4, "RightShoulder": 0.4}
MAX_STEP = 0.6   # radians: the largest joint change one least-squares step may make


def _axis_angle_matrix(axis, angle):
    return axis_angle_to_matrix(axis * angle[..., None])


class Refiner:
    """Makes effectors land on targets for one rig; holds its chain structure, weights and limits."""

    def __init__(self, skeleton, mean_pose, limit_low, limit_high, damping=None):
        self.skeleton = skeleton
        self.mean_pose = np.asarray(mean_pose, np.float64)
        self.mean_pose_t = np.swapaxes(self.mean_pose, -1, -2)
        self.limit_low = np.asarray(limit_low, np.float64).reshape(NUM_ROLES, 3)
        self.limit_high = np.asarray(limit_high, np.float64).reshape(NUM_ROLES, 3)
        parents, mask = skeleton.parents, skeleton.role_mask
        effectors = set(EFFECTOR_ROLES)
        ancestors = []
        for e in EFFECTOR_ROLES:
            chain, p = [], parents[e]
            while p > 0:   # the hips (0) are given
                chain.append(int(p))
                p = parents[p]
            ancestors.append(chain)
        joints = sorted({j for chain in ancestors for j in chain if mask[j] and j not in effectors})
        self.joints = np.array(joints, dtype=np.int64)
        self.reach = np.array([[j in chain for j in joints] for chain in ancestors], dtype=np.float64)   # (5, M)
        from .roles import ROLES
        weights = np.array([JOINT_WEIGHTS.get(ROLES[j], 1.0) for j in joints])
        self.column_weights = np.repeat(weights, 3)                                                      # (3M,)
        self.damping = (0.005 * skeleton.height) if damping is None else damping
        self.limbs = np.array([[ROLE_INDEX[n] for n in limb] for limb in LIMBS], dtype=np.int64)
        self.limb_ok = all(mask[i] for limb in self.limbs for i in limb) and all(
            parents[limb[1]] == limb[0] and parents[limb[2]] == limb[1] for limb in self.limbs)
        self.effector_parents = parents[list(EFFECTOR_ROLES)]

    # -- helpers ---------------------------------------------------------------------------------------------
    def forward(self, local, hips_rotation, hips_position):
        return kinematics.forward(self.skeleton, local, hips_rotation, hips_position)

    def clamp_to_limits(self, local_joints, joints):
        """Pull (K, M, 3, 3) local rotations of `joints` inside the limits (deltas from the mean pose, per axis)."""
        delta = matrix_to_axis_angle(self.mean_pose_t[joints] @ local_joints)
        clipped = np.clip(delta, self.limit_low[joints], self.limit_high[joints])
        outside = np.any(clipped != delta, axis=-1)
        if not outside.any():
            return local_joints
        fixed = self.mean_pose[joints] @ axis_angle_to_matrix(clipped)
        return np.where(outside[..., None, None], fixed, local_joints)

    # -- stage 1 ---------------------------------------------------------------------------------------------
    def jacobian(self, pose):
        """(K, 15, 3M) d(effector positions) / d(body-frame rotation of each chain joint): -[x_e - x_j]x R_j."""
        J_idx = self.joints
        x_e = pose.positions[:, EFFECTOR_ROLES]                         # (K, 5, 3)
        diff = x_e[:, :, None, :] - pose.positions[:, None, J_idx]      # (K, 5, M, 3)
        # d x_e = (R_j w) x diff: column a of the block is (R_j e_a) x diff
        cols = np.cross(np.swapaxes(pose.rotations[:, J_idx], -1, -2)[:, None], diff[:, :, :, None, :])
        cols = cols * self.reach[None, :, :, None, None]
        k, m = pose.positions.shape[0], len(J_idx)
        return np.transpose(cols, (0, 1, 4, 2, 3)).reshape(k, 15, 3 * m)

    def least_squares_step(self, local, hips_rotation, hips_position, target_positions):
        """One weighted damped least-squares step on every chain joint; returns (new local, errors before it)."""
        pose = self.forward(local, hips_rotation, hips_position)
        err = target_positions - pose.positions[:, EFFECTOR_ROLES]
        J_idx = self.joints
        k, m = local.shape[0], len(J_idx)
        J = self.jacobian(pose)
        JW = J * self.column_weights
        H = JW @ np.swapaxes(J, -1, -2)
        H += (self.damping ** 2) * np.eye(15)
        y = np.linalg.solve(H, err.reshape(k, 15, 1))
        w = (np.swapaxes(JW, -1, -2) @ y).reshape(k, m, 3)
        biggest = np.linalg.norm(w, axis=-1).max(axis=-1)
        w *= np.minimum(1.0, MAX_STEP / np.maximum(biggest, 1e-12))[:, None, None]
        out = local.copy()
        out[:, J_idx] = self.clamp_to_limits(local[:, J_idx] @ axis_angle_to_matrix(w), J_idx)
        return out, err

    # -- stage 2 ---------------------------------------------------------------------------------------------
    def two_bone(self, local, pose, target_positions):
        """Closed-form limb solve that keeps the swivel plane; modifies and returns local."""
        limbs = self.limbs
        upper, mid, end = limbs[:, 0], limbs[:, 1], limbs[:, 2]
        t = target_positions[:, [EFFECTOR_ROLES.index(int(e)) for e in end]]    # (K, 4, 3)
        a, b, c = pose.positions[:, upper], pose.positions[:, mid], pose.positions[:, end]
        R_up, R_mid = pose.rotations[:, upper], pose.rotations[:, mid]
        u, v = b - a, c - b
        l1, l2 = np.linalg.norm(u, axis=-1), np.linalg.norm(v, axis=-1)
        reach_max, reach_min = (l1 + l2) * (1 - 1e-9), np.abs(l1 - l2) * (1 + 1e-9) + 1e-9
        d = np.clip(np.linalg.norm(t - a, axis=-1), reach_min, reach_max)
        normal = np.cross(u, v)
        n_len = np.linalg.norm(normal, axis=-1)
        fallback = R_mid[..., :, 0]                                     # the mid bone's x axis: a hinge on most rigs
        n = np.where((n_len > 1e-6 * l1 * l2)[..., None], normal / np.maximum(n_len, 1e-30)[..., None], fallback)
        bend_now = np.arctan2(n_len, np.sum(u * v, axis=-1))
        cos_inner = np.clip((l1 * l1 + l2 * l2 - d * d) / (2 * l1 * l2), -1.0, 1.0)
        phi = (np.pi - np.arccos(cos_inner)) - bend_now
        # mid bone turns about n (world) by phi: local increment about R_mid^T n
        axis_mid = np.einsum("klba,klb->kla", R_mid, n)
        local[:, mid] = local[:, mid] @ _axis_angle_matrix(axis_mid, phi)
        Q1 = _axis_angle_matrix(n, phi)
        c_new = b + np.einsum("klab,klb->kla", Q1, v)
        # upper bone: the smallest rotation taking (c_new - a) onto (t - a)
        p, q = c_new - a, t - a
        p_hat = p / np.maximum(np.linalg.norm(p, axis=-1, keepdims=True), 1e-12)
        q_hat = q / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-12)
        axis = np.cross(p_hat, q_hat)
        s = np.linalg.norm(axis, axis=-1)
        angle = np.arctan2(s, np.sum(p_hat * q_hat, axis=-1))
        axis = np.where((s > 1e-12)[..., None], axis / np.maximum(s, 1e-30)[..., None], 0.0)
        axis_up = np.einsum("klba,klb->kla", R_up, axis)
        local[:, upper] = local[:, upper] @ _axis_angle_matrix(axis_up, angle)
        return local

    def orient_effectors(self, local, pose, target_rotations):
        """Give each effector its target's orientation: L_e = (R_parent @ bridge_e)^T @ R_target."""
        eff = list(EFFECTOR_ROLES)
        frame = pose.rotations[:, self.effector_parents] @ self.skeleton.bridges[eff][None]
        local[:, eff] = np.swapaxes(frame, -1, -2) @ target_rotations
        return local

    # -- all of it -------------------------------------------------------------------------------------------
    def refine(self, local, hips_rotation, hips_position, target_positions, target_rotations, iterations=2,
               tolerance=1e-4):
        """(K, 23, 3, 3) network pose -> (refined local, pose, effector errors (K, 5) in metres).

        Stops the least-squares stage early once every effector is within `tolerance` metres.
        """
        local = np.array(local, np.float64, copy=True)
        for _ in range(iterations):
            local, err = self.least_squares_step(local, hips_rotation, hips_position, target_positions)
            if np.max(np.abs(err)) < tolerance:
                break
        if iterations > 0 and self.limb_ok:
            pose = self.forward(local, hips_rotation, hips_position)
            local = self.two_bone(local, pose, target_positions)
        pose = self.forward(local, hips_rotation, hips_position)
        if iterations > 0:
            local = self.orient_effectors(local, pose, target_rotations)
        errors = np.linalg.norm(pose.positions[:, EFFECTOR_ROLES] - target_positions, axis=-1)
        return local, pose, errors
