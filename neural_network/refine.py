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

Run time (`refine_quaternions`, what the solver calls every tick) turns the order round, because the closed form is
exact whenever it can reach: one forward pass over a level-by-lane layout of the chain (8 batched 4x4 products for all
characters), then the two-bone solve of all five chains (both arms, both legs, and the neck - NeckLower, NeckUpper,
Head - for the head) and the effector orientations at once, vectorised over chains and characters. Only characters
whose targets that leaves out of reach (a clavicle or the spine must move, or the rig has a single neck bone) go
through the least-squares stage - `iterations` steps of it - and then the closed form again. So the iteration count
is the least-squares budget for unreachable targets; `last_least_squares` says how many characters needed it.

The hips transform is given and never moves. Pure NumPy; no bpy.
"""

from typing import NamedTuple

import numpy as np

from . import kinematics
from .quaternion_math import QUATERNION_TO_MATRIX, SKEW, matrices_to_quaternions, quaternions_to_matrices, rotations_about
from .roles import EFFECTOR_ROLES, NUM_ROLES, ROLE_INDEX
from .rotations import axis_angle_to_matrix, matrix_to_axis_angle

LIMBS = (("LeftArm", "LeftForeArm", "LeftHand"), ("RightArm", "RightForeArm", "RightHand"),
         ("LeftThigh", "LeftShin", "LeftFoot"), ("RightThigh", "RightShin", "RightFoot"))
# How freely each kind of joint may move in the least-squares stage (larger moves more).
JOINT_WEIGHTS = {"Spine": 0.15, "Spine1": 0.15, "Spine2": 0.15, "NeckLower": 0.4, "NeckUpper": 0.4,
                 "LeftShoulder": 0.4, "RightShoulder": 0.4}
MAX_STEP = 0.6   # radians: the largest joint change one least-squares step may make
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


class ChainLinks(NamedTuple):
    """What the run-time chain takes from the bridges and offsets: per-slot bridge-times-quadratic-form (S, 16, 9),
    slot offsets (S, 3), the chains' bridges (1, 5, 3, 3, 3), bone lengths (l1, l2, l1^2 + l2^2, 1 / (2 l1 l2)) and
    reach (max, min), each (5,). per_character: every array has a leading K axis (one set per character), and forms
    holds the slots' bridges (K, S, 3, 3) instead (a 16x9 form per slot and frame would cost 28 kB a frame)."""
    forms: np.ndarray
    offsets: np.ndarray
    chain_bridges: np.ndarray
    lengths: tuple
    reach: tuple
    per_character: bool

    def take(self, rows):
        """The links of characters `rows` (shared links are everyone's)."""
        if not self.per_character:
            return self
        return ChainLinks(self.forms[rows], self.offsets[rows], self.chain_bridges[rows],
                          tuple(a[rows] for a in self.lengths), tuple(a[rows] for a in self.reach), True)


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
        self.link_bridges = self.link_offsets = None      # per-character links (set_links); None: the skeleton's
        self._chain_layout(skeleton, mask, parents)
        self.last_least_squares = 0

    def _chain_layout(self, skeleton, mask, parents):
        """Constants of the run-time path: slot roles, chain slots, and the link constants (set_links)."""
        slot_of = {}
        roles = []
        for level, names in enumerate(LEVELS):
            for lane, name in enumerate(names):
                j = ROLE_INDEX[name] if name else -1
                roles.append(j)
                if j >= 0 and level > 0:
                    slot_of[j] = 3 * level + lane
        slot_of[0] = 0
        roles = np.array(roles)
        mapped = np.array([j > 0 and mask[j] for j in roles])
        self.slot_mapped = mapped
        self.slot_roles = np.where(mapped, roles, 0)          # quaternion read per slot (any unit one when passing)
        self.chain_slots = np.array([[slot_of[ROLE_INDEX[n]] if n != "Hips" else 0 for n in chain] for chain in CHAINS])
        self.chain_roles = np.array([[ROLE_INDEX[n] for n in chain[1:]] for chain in CHAINS])       # (5, 3)
        self.chain_valid = np.array([all(mask[j] for j in chain) and parents[chain[1]] == chain[0]
                                     and parents[chain[2]] == chain[1] for chain in self.chain_roles])
        self.all_chains_valid = bool(self.chain_valid.all())
        written = [(c, i) for c in range(5) for i in range(3) if mask[self.chain_roles[c, i]]]
        self.written_flat = np.array([3 * c + i for c, i in written])
        self.written_roles = np.array([self.chain_roles[c, i] for c, i in written])
        self.valid_weight = self.chain_valid.astype(np.float64)
        self.links = self._link_constants(np.asarray(skeleton.bridges, np.float64), np.asarray(skeleton.offsets, np.float64))
        self._buffers = {}

    def _link_constants(self, bridges, offsets):
        """ChainLinks from bridges (23, 3, 3) and offsets (23, 3) (the skeleton's: shared by every character) or
        (K, 23, 3, 3) and (K, 23, 3) (one set per character)."""
        lead = bridges.shape[:-3]
        slots = np.nonzero(self.slot_mapped)[0]
        roles = self.slot_roles[slots]
        slot_offsets = np.zeros(lead + (len(self.slot_roles), 3))
        slot_offsets[..., slots, :] = offsets[..., roles, :]
        if lead:                          # per character: the slots' bridges, identity where a slot passes through
            forms = np.broadcast_to(np.eye(3), lead + (len(self.slot_roles), 3, 3)).copy()
            forms[:, slots] = bridges[:, roles]
        else:
            # vec(bridge_j @ R(q_j)) = vec(q q^T) @ D_j; a pass-through slot (unmapped or padding) gets |q|^2 I = I
            through = np.zeros((16, 9))
            for a in range(4):
                through[5 * a] = np.eye(3).reshape(9)
            forms = np.broadcast_to(through, (len(self.slot_roles), 16, 9)).copy()
            form = QUATERNION_TO_MATRIX.reshape(16, 3, 3)
            forms[slots] = (bridges[roles][:, None] @ form).reshape(len(slots), 16, 9)
        chain_bridges = bridges[..., self.chain_roles, :, :]                                     # (..., 5, 3, 3, 3)
        if not lead:
            chain_bridges = chain_bridges[None]
        l1 = np.linalg.norm(offsets[..., self.chain_roles[:, 1], :], axis=-1)
        l2 = np.linalg.norm(offsets[..., self.chain_roles[:, 2], :], axis=-1)
        l1 = np.where(self.chain_valid, l1, 1.0)
        l2 = np.where(self.chain_valid, l2, 1.0)
        return ChainLinks(forms, slot_offsets, chain_bridges, (l1, l2, l1 * l1 + l2 * l2, 1.0 / (2 * l1 * l2)),
                          ((l1 + l2) * (1 - 1e-9), np.abs(l1 - l2) * (1 + 1e-9) + 1e-9), bool(lead))

    def set_links(self, bridges=None, offsets=None):
        """Per-character bridges (K, 23, 3, 3) and offsets (K, 23, 3), for rigs whose unmapped in-between bones
        move (a bake of a clip with a moving pelvis): from now on calls must pass K characters in this order. None
        goes back to the skeleton's own (shared by any number of characters)."""
        if bridges is None:
            self.link_bridges = self.link_offsets = None
            self.links = self._link_constants(np.asarray(self.skeleton.bridges, np.float64),
                                              np.asarray(self.skeleton.offsets, np.float64))
        else:
            self.link_bridges = np.asarray(bridges, np.float64)
            self.link_offsets = np.asarray(offsets, np.float64)
            self.links = self._link_constants(self.link_bridges, self.link_offsets)
        self._buffers = {}

    def _buffers_for(self, k):
        buf = self._buffers.get(k)
        if buf is None:
            G = np.zeros((k, 24, 4, 4))
            if not self.links.per_character:
                G[:, :, :3, 3] = self.links.offsets
            G[:, :, 3, 3] = 1.0
            T = np.zeros((k, 8, 3, 4, 4))
            frames = np.empty((k, 5, 4, 3, 3))                 # parent of upper, upper, mid (new), end target
            buf = self._buffers[k] = (G, T, frames)
        return buf

    # -- run time --------------------------------------------------------------------------------------------
    def chain_forward(self, q, hips, links=None):
        """q (K, 23, 4) local quaternions, hips (K, 4, 4) -> (K, 24, 4, 4) world transforms of the slots.

        links: the ChainLinks of these characters (default: the refiner's; `links.take(rows)` for a subset)."""
        links = self.links if links is None else links
        G, T, _frames = self._buffers_for(len(q))
        qs = q[:, self.slot_roles]
        if links.per_character:
            G[:, :, :3, 3] = links.offsets
            rot = links.forms @ quaternions_to_matrices(qs)
            rot[:, ~self.slot_mapped] = np.eye(3)
            G[:, :, :3, :3] = rot
        else:
            outer = qs[..., :, None] * qs[..., None, :]
            rot = outer.reshape(len(q), 24, 1, 16) @ links.forms
            G[:, :, :3, :3] = rot.reshape(len(q), 24, 3, 3)
        G = G.reshape(len(q), 8, 3, 4, 4)
        T[:, 0] = hips[:, None]
        for level in range(1, 8):
            parent = T[:, 3, :1] if level == 4 else T[:, level - 1]
            np.matmul(parent, G[:, level], out=T[:, level])
        return T.reshape(len(q), 24, 4, 4)

    def closed_form(self, q, world, target_positions, target_rotations, links=None):
        """Two-bone solve of the five chains and the effector orientations, in place on q (K, 23, 4).

        Returns the effector errors (K, 5) the solve leaves (exactly |d - clipped d| for a valid chain: the end lands
        on the line to its target at the reachable distance). links: as in chain_forward."""
        links = self.links if links is None else links
        k = len(q)
        _G, _T, frames = self._buffers_for(k)
        S = world[:, self.chain_slots]                                    # (K, 5, 4, 4, 4)
        a, b, c = S[:, :, 1, :3, 3], S[:, :, 2, :3, 3], S[:, :, 3, :3, 3]
        R_up, R_mid = S[:, :, 1, :3, :3], S[:, :, 2, :3, :3]
        l1, l2, sum_sq, inv_2l1l2 = links.lengths
        u, v, tv = b - a, c - b, target_positions - a
        d = np.sqrt(np.einsum("kci,kci->kc", tv, tv))
        dc = np.clip(d, links.reach[1], links.reach[0])
        normal = ((u @ SKEW).reshape(k, 5, 3, 3) @ v[..., None])[..., 0]
        n_len = np.sqrt(np.einsum("kci,kci->kc", normal, normal))
        if n_len.min() <= 1e-6 * (l1 * l2).min():                        # a straight limb: bend about the mid bone's x
            fallback = R_mid[..., :, 0] - np.einsum("kci,kci->kc", R_mid[..., :, 0], u)[..., None] * u / (l1 * l1)[..., None]
            fallback /= np.maximum(np.linalg.norm(fallback, axis=-1, keepdims=True), 1e-30)
            straight = (n_len <= 1e-6 * l1 * l2)[..., None]
            n = np.where(straight, fallback, normal / np.maximum(n_len, 1e-300)[..., None])
        else:
            n = normal / n_len[..., None]
        bend_now = np.arctan2(n_len, np.einsum("kci,kci->kc", u, v))
        cos_inner = (sum_sq - dc * dc) * inv_2l1l2
        phi = np.pi - np.arccos(np.clip(cos_inner, -1.0, 1.0, out=cos_inner)) - bend_now
        if not self.all_chains_valid:
            phi *= self.valid_weight
        Q1 = rotations_about(n, phi)
        p = b + (Q1 @ v[..., None])[..., 0] - a
        axis = ((p @ SKEW).reshape(k, 5, 3, 3) @ tv[..., None])[..., 0]
        s = np.sqrt(np.einsum("kci,kci->kc", axis, axis))
        angle = np.arctan2(s, np.einsum("kci,kci->kc", p, tv))
        if not self.all_chains_valid:
            angle *= self.valid_weight
        axis /= np.maximum(s, 1e-300)[..., None]
        Q2 = rotations_about(axis, angle)
        frames[:, :, 0] = S[:, :, 0, :3, :3]
        np.matmul(Q2, R_up, out=frames[:, :, 1])
        np.matmul(Q2, Q1 @ R_mid, out=frames[:, :, 2])
        frames[:, :, 3] = target_rotations
        # local = (world of the parent @ bridge)^T @ world, for upper, mid and end at once
        local = np.swapaxes(frames[:, :, :3] @ links.chain_bridges, -1, -2) @ frames[:, :, 1:]
        quats = matrices_to_quaternions(local.reshape(k, 15, 3, 3)[:, self.written_flat])
        q[:, self.written_roles] = quats
        errors = np.abs(d - dc)
        if not self.all_chains_valid:                                    # chains the closed form leaves alone
            miss = np.sqrt(np.einsum("kci,kci->kc", c - target_positions, c - target_positions))
            errors = np.where(self.chain_valid, errors, miss)
        return errors

    def refine_quaternions(self, q, hips, target_positions, target_rotations, iterations=2, tolerance=1e-4):
        """Run-time refinement on (K, 23, 4) local quaternions (modified in place); hips (K, 4, 4) transforms.

        Closed form for everyone; least squares (`iterations` steps) then the closed form again only for characters
        the closed form leaves more than `tolerance` metres away, when that brings them closer. Returns errors (K, 5).
        """
        errors = self.closed_form(q, self.chain_forward(q, hips), target_positions, target_rotations)
        self.last_least_squares = 0
        if iterations <= 0:
            return errors
        need = np.nonzero(errors.max(axis=1) > tolerance)[0]
        if len(need):
            self.last_least_squares = len(need)
            hips_R, hips_p = hips[need, :3, :3], hips[need, :3, 3]
            local = quaternions_to_matrices(q[need])
            local[:, ~self.skeleton.role_mask] = np.eye(3)
            tp = target_positions[need]
            links = self.links.take(need)
            bridges, offsets = self._fk_links(need)
            for _ in range(iterations):
                local, err = self.least_squares_step(local, hips_R, hips_p, tp, bridges, offsets)
                if np.max(np.abs(err)) < tolerance:
                    break
            q_more = matrices_to_quaternions(local)
            q_more[:, ~self.skeleton.role_mask] = (1.0, 0.0, 0.0, 0.0)
            more = self.closed_form(q_more, self.chain_forward(q_more, hips[need], links), tp, target_rotations[need],
                                    links)
            better = more.max(axis=1) < errors[need].max(axis=1)
            q[need[better]] = q_more[better]
            errors[need[better]] = more[better]
        return errors

    # -- helpers ---------------------------------------------------------------------------------------------
    def _fk_links(self, rows=None):
        """(bridges, offsets) for kinematics.forward: the per-character links of `rows` (all: None), or (None, None)
        when the skeleton's own hold."""
        if self.link_bridges is None:
            return None, None
        if rows is None:
            return self.link_bridges, self.link_offsets
        return self.link_bridges[rows], self.link_offsets[rows]

    def forward(self, local, hips_rotation, hips_position, bridges=None, offsets=None):
        return kinematics.forward(self.skeleton, local, hips_rotation, hips_position, bridges, offsets)

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

    def least_squares_step(self, local, hips_rotation, hips_position, target_positions, bridges=None, offsets=None):
        """One weighted damped least-squares step on every chain joint; returns (new local, errors before it).
        bridges/offsets: per-character links (see set_links), None for the skeleton's."""
        pose = self.forward(local, hips_rotation, hips_position, bridges, offsets)
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
        frame = pose.rotations[:, self.effector_parents] @ pose.bridges[:, eff]
        local[:, eff] = np.swapaxes(frame, -1, -2) @ target_rotations
        return local

    # -- all of it -------------------------------------------------------------------------------------------
    def refine(self, local, hips_rotation, hips_position, target_positions, target_rotations, iterations=2,
               tolerance=1e-4):
        """(K, 23, 3, 3) network pose -> (refined local, pose, effector errors (K, 5) in metres), through the run-time
        path (refine_quaternions); the errors are measured by an independent FK pass of the returned rotations."""
        local = np.array(local, np.float64, copy=True)
        if iterations > 0:
            k = len(local)
            q = matrices_to_quaternions(local)
            q[:, ~self.skeleton.role_mask] = (1.0, 0.0, 0.0, 0.0)
            hips = np.zeros((k, 4, 4))
            hips[:, :3, :3], hips[:, :3, 3], hips[:, 3, 3] = hips_rotation, hips_position, 1.0
            self.refine_quaternions(q, hips, np.asarray(target_positions, np.float64),
                                    np.asarray(target_rotations, np.float64), iterations, tolerance)
            local = quaternions_to_matrices(q)
            local[:, ~self.skeleton.role_mask] = np.eye(3)
        pose = self.forward(local, hips_rotation, hips_position, *self._fk_links())
        errors = np.linalg.norm(pose.positions[:, EFFECTOR_ROLES] - target_positions, axis=-1)
        return local, pose, errors
