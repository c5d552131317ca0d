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
whose targets that leaves out of reach (a clavicle or the spine must move) go through the least-squares stage -
`iterations` steps of it - and then the closed form again. So the iteration count is the least-squares budget for
unreachable targets; `last_least_squares` says how many characters needed it. Least squares never takes an effector
the closed form landed off its target: where its move would, only the share of it that keeps it landed is taken.

Before the closed form, a reach assist (reach_assist.py, closed form too) moves what the two-bone solve cannot: for a
chain whose target is beyond its reach it turns the chain's parent (Spine2 for the head, a clavicle for an arm), or
unbends the spine, just enough; only characters with a chain beyond reach pay for it, and on the shipped model's
held-out clips it takes the share of ticks needing least squares from 100% to a few percent. Where the head is still
off (the assist's turns too small, or a rig with one neck bone, which has no two-bone neck chain), the head stage
(head_reach.py) solves the spine and neck inside their limits for it.

With a RefineMemory (refine_memory.py; a Solver passes its own) the refinement also carries what it settled on from
one tick to the next: the head stage starts from last tick's spine, and a limb whose bones the refinement turned much
more than the network's own turned (a degenerate or flipping elbow or knee) restarts from last tick's correction,
moving toward this tick's only as fast as FOLLOW_SPEED; the effectors land as before, what the network leaves free
never pops.

At K = 1 a NumPy call costs about the same whatever the array size, so the run-time path is written to
make few calls: every buffer and view is made once per K (refine_layout.Workspace), the vectors of a chain sit side by side so one
matmul gives all their dot products, the elbow's new position comes from the limb plane without building its
rotation, and the least-squares stage works on the same chain layout (joint positions and rotations straight from the
forward pass, quaternion updates and limits) instead of a full forward pass over 23 roles with rotation matrices. The
matrix-form methods further down (jacobian, least_squares_step, two_bone, ...) are the plain statements of the same
steps; tests hold the run-time path to them.

The hips transform is given and never moves. Pure NumPy; no bpy.
"""


import numpy as np

try:                                    # the clip ufunc itself: one call where np.clip's wrapper costs two ufuncs' time
    from numpy._core.umath import clip as _clip
except ImportError:                     # NumPy < 2
    from numpy.core.umath import clip as _clip

from ..geometry import kinematics
from ..geometry.quaternion_math import (
    QUATERNION_TO_MATRIX,
    SKEW,
    exp_quaternions,
    matrices_to_quaternions,
    multiply_quaternions,
    quaternions_to_matrices,
    rotations_about,
)
from ..geometry.rotations import axis_angle_to_matrix, matrix_to_axis_angle, matrix_to_quaternion, quaternion_to_axis_angle
from ..skeleton.roles import EFFECTOR_ROLES, NUM_ROLES, ROLE_INDEX, ROLES
from .head_reach import HeadReach
from .reach_assist import ReachAssist
from .refine_layout import CHAINS, FOUR_ONES, LEVELS, MATRIX_TO_SQUARES_WITH_BIAS, ChainLinks, Workspace
from .refine_memory import corrections

LIMBS = (("LeftArm", "LeftForeArm", "LeftHand"), ("RightArm", "RightForeArm", "RightHand"),
         ("LeftThigh", "LeftShin", "LeftFoot"), ("RightThigh", "RightShin", "RightFoot"))
# How freely each kind of joint may move in the least-squares stage (larger moves more).
JOINT_WEIGHTS = {"Spine": 0.15, "Spine1": 0.15, "Spine2": 0.15, "NeckLower": 0.4, "NeckUpper": 0.4,
                 "LeftShoulder": 0.4, "RightShoulder": 0.4}
MAX_STEP = 0.6   # radians: the largest joint change one least-squares step may make
LANDED_BISECTIONS = 6   # halvings of a least-squares move that took a landed effector off (1/64 of the move)


def _axis_angle_matrix(axis, angle):
    return axis_angle_to_matrix(axis * angle[..., None])


def _norms(v):
    """(..., 3) -> (...) lengths, without np.linalg.norm's overhead."""
    return np.sqrt(np.einsum("...i,...i->...", v, v))


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
        weights = np.array([JOINT_WEIGHTS.get(ROLES[j], 1.0) for j in joints])
        self.column_weights = np.repeat(weights, 3)                                                      # (3M,)
        self.damping = (0.005 * skeleton.height) if damping is None else damping
        self.limbs = np.array([[ROLE_INDEX[n] for n in limb] for limb in LIMBS], dtype=np.int64)
        self.effector_parents = parents[list(EFFECTOR_ROLES)]
        self.unmapped = np.nonzero(~mask)[0]
        self.link_bridges = self.link_offsets = None      # per-character links (set_links); None: the skeleton's
        self._chain_layout(skeleton, mask, parents)
        self._least_squares_constants()
        self.reach_assist = ReachAssist.for_refiner(self, CHAINS, mask, parents)     # None: no chain may be assisted
        self.head_reach = HeadReach.for_refiner(self)                                  # None: no joint below the head
        # the memory's bones of each arm and leg: the upper bone's parent (a clavicle; the hips, which never turn, for a
        # leg), the upper and the mid bone
        self.limb_roles = np.array([[ROLE_INDEX[chain[0]] for chain in CHAINS[:4]], *self.chain_roles[:4, :2].T]).T
        self.limb_flat = self.limb_roles.reshape(-1)
        self.last_least_squares = 0
        self.last_arm_lines = None      # the arms' swivel lines after a call, where known without a forward pass (NumPy: never)

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
        self.slot_of = slot_of
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
        self.all_written = len(written) == 15
        self.written_roles = np.array([self.chain_roles[c, i] for c, i in written])
        self.valid_weight = self.chain_valid.astype(np.float64)
        self.links = self._link_constants(np.asarray(skeleton.bridges, np.float64), np.asarray(skeleton.offsets, np.float64))
        self._workspaces = {}

    def _least_squares_constants(self):
        """The least-squares stage on the chain layout: which slots hold the joints and effectors, each Jacobian
        entry's factor (the minus sign, whether the joint moves the effector, the square root of its weight), and the
        joints' mean-pose quaternions for the limits."""
        m = len(self.joints)
        self.least_squares_slots = np.array([self.slot_of[int(j)] for j in self.joints] + list(self.chain_slots[:, 3]))
        self.root_weights = np.sqrt(self.column_weights)                                                 # (3M,)
        self.jacobian_factors = (self.reach[:, None, :, None] * self.root_weights.reshape(1, 1, m, 3)).reshape(5, 1, 3 * m)
        self.damping_matrix = (self.damping ** 2) * np.eye(15)
        # Shepperd's method, not the copysign form: a model's mean pose is stored in single precision, and the
        # copysign form's square roots turn its 1e-7 into 1e-4 in a small component, a hair past every limit
        mean_q = matrix_to_quaternion(self.mean_pose[self.joints])
        self.mean_quaternions, self.mean_conjugates = mean_q, mean_q * np.array([1.0, -1.0, -1.0, -1.0])  # (M, 4)
        self.joint_root_weights = self.root_weights.reshape(m, 3)
        self.joint_low, self.joint_high = self.limit_low[self.joints], self.limit_high[self.joints]
        # a delta from the mean pose turning by less than the nearest limit r is inside the box: |w| >= cos(r / 2)
        nearest = np.minimum(-self.joint_low, self.joint_high).min(axis=-1) - 1e-6
        self.surely_inside = np.where(nearest > 0, np.cos(0.5 * np.clip(nearest, 0.0, np.pi)), 2.0)

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
        straight = np.where(self.chain_valid, 1e-6 * l1 * l2, -1.0)
        return ChainLinks(forms, slot_offsets, chain_bridges, (l1, l2, l1 * l1 + l2 * l2, 1.0 / (2 * l1 * l2)),
                          ((l1 + l2) * (1 - 1e-9), np.abs(l1 - l2) * (1 + 1e-9) + 1e-9), bool(lead),
                          straight, float(straight.max(initial=-1.0)))

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
        self._workspaces = {}
        if self.reach_assist is not None:
            self.reach_assist.update_reach(self.links, self.chain_valid)

    def _workspace(self, k):
        ws = self._workspaces.get(k)
        if ws is None:
            ws = self._workspaces[k] = Workspace(k, self.links)
        return ws

    # -- run time --------------------------------------------------------------------------------------------
    def chain_forward(self, q, hips, links=None):
        """q (K, 23, 4) local quaternions, hips (K, 4, 4) -> (K, 24, 4, 4) world transforms of the slots (a buffer
        the next call for K characters overwrites).

        links: the ChainLinks of these characters (default: the refiner's; `links.take(rows)` for a subset)."""
        links = self.links if links is None else links
        ws = self._workspace(len(q))
        np.take(q, self.slot_roles, axis=1, out=ws.slot_q, mode="clip")
        if links.per_character:
            ws.G[:, :, :3, 3] = links.offsets
            rot = links.forms @ quaternions_to_matrices(ws.slot_q)
            rot[:, ~self.slot_mapped] = np.eye(3)
            ws.rotations[...] = rot
        else:   # slot-major: one (K, 16) @ (16, 9) product per slot, not K * 24 tiny ones
            np.multiply(ws.slot_q_columns, ws.slot_q_rows, out=ws.slot_outer)
            np.matmul(ws.slot_outer_flat, links.forms, out=ws.slot_rotations)
            ws.rotations[...] = ws.slot_rotations_by_character
        ws.hips[...] = hips[:, None]
        for parent, local, out in ws.levels:
            np.matmul(parent, local, out=out)
        return ws.world

    def closed_form(self, q, world, target_positions, target_rotations, links=None):
        """Two-bone solve of the five chains and the effector orientations, in place on q (K, 23, 4).

        Per chain (upper a, mid b, end c, target t; u = b - a, v = c - b): the elbow turns by phi about the limb plane's
        normal u x v so that |a - end| becomes |t - a| clipped to the limb's reach, then the upper bone turns the
        smallest way that points a -> end at t; the end takes the target's orientation.

        Returns the effector errors (K, 5) the solve leaves (exactly |d - clipped d| for a valid chain: the end lands
        on the line to its target at the reachable distance). links: as in chain_forward."""
        ws = self._workspace(len(q))
        self._chain_targets(ws, world, target_positions)
        self._chain_shape(ws)
        return self._solve_chains(q, ws, target_positions, target_rotations, links)

    def _chain_targets(self, ws, world, target_positions):
        """The closed form's first step, and all the reach check needs: per chain the transforms, t = target - upper
        and |t|^2."""
        np.take(world, self.chain_slots, axis=1, out=ws.chains, mode="clip")
        np.subtract(target_positions, ws.upper, out=ws.t)
        np.matmul(ws.t_row, ws.t_column, out=ws.t_square_column)

    def _chain_shape(self, ws):
        """The closed form's second step: u = mid - upper, v = end - mid, the limb plane's normal u x v, the dot
        products of u, v, t and the normal, |t| and |u x v|."""
        np.subtract(ws.mid_end, ws.upper_mid, out=ws.uv)
        np.matmul(ws.u, SKEW, out=ws.skew)
        np.matmul(ws.skew_matrices, ws.v_column, out=ws.normal_column)
        np.matmul(ws.first_four, ws.first_four_t, out=ws.first_dots)
        np.sqrt(ws.t_normal_squares, out=ws.t_normal_lengths)                # |t|, |u x v|

    def _solve_chains(self, q, ws, target_positions, target_rotations, links=None):
        """The rest of closed_form, from what _chain_targets and _chain_shape left in ws."""
        links = self.links if links is None else links
        shared = not links.per_character            # then links are the refiner's, those the workspace was made with
        reach_max, reach_min = ws.shared_reach if shared else links.reach
        dc, cos_outer, phi, n_len = ws.dc, ws.cos_outer, ws.phi, ws.normal_length
        _clip(ws.d, reach_min, reach_max, out=dc)
        _l1, _l2, sum_sq, inv_2l1l2 = ws.shared_lengths if shared else links.lengths
        np.multiply(dc, dc, out=cos_outer)                                   # cosine of the elbow's outer angle
        np.subtract(cos_outer, sum_sq, out=cos_outer)
        np.multiply(cos_outer, inv_2l1l2, out=cos_outer)
        _clip(cos_outer, ws.minus_ones, ws.ones, out=cos_outer)
        np.arccos(cos_outer, out=cos_outer)
        np.arctan2(n_len, ws.dot_uv, out=ws.bend)
        np.subtract(cos_outer, ws.bend, out=phi)
        if not self.all_chains_valid:
            np.multiply(phi, self.valid_weight, out=phi)
        if n_len.min() <= links.straight_max and (n_len <= links.straight).any():
            self._straight_limbs(ws, links)
        else:
            # p = u + Q1 v = u + v cos phi + (n x v) sin phi, n x v = (v (u.v) - u |v|^2) / |u x v|: no Q1 needed
            np.sin(phi, out=ws.ratio)
            if self.all_chains_valid:
                np.divide(ws.ratio, n_len, out=ws.ratio)
            else:
                ws.ratio /= np.maximum(n_len, 1e-300)
            np.multiply(ws.ratio_column, ws.dots_vv_uv, out=ws.c)
            np.subtract(ws.ones, ws.c_u, out=ws.c_u)
            np.cos(phi, out=ws.cos_phi)
            np.add(ws.c_v, ws.cos_phi, out=ws.c_v)
            np.matmul(ws.coefficients, ws.uv, out=ws.p_row)
        np.matmul(ws.p, SKEW, out=ws.skew)
        np.matmul(ws.skew_matrices, ws.t_column, out=ws.axis_column)         # p x t
        np.matmul(ws.vectors, ws.vectors_t, out=ws.dots)
        np.sqrt(ws.axis_square, out=ws.axis_length)
        np.arctan2(ws.axis_length, ws.dot_pt, out=ws.angle_upper)
        if not self.all_chains_valid:
            np.multiply(ws.angle_upper, self.valid_weight, out=ws.angle_upper)
        # Q1 (elbow) and Q2 (upper bone) from their half angles and unnormalised axes
        angles = ws.angles
        np.multiply(angles, ws.halves, out=angles)
        np.cos(angles, out=ws.turn_w)
        np.sin(angles, out=ws.scale)
        np.maximum(ws.turn_lengths, ws.tiny, out=ws.safe_lengths)
        np.divide(ws.scale, ws.safe_lengths, out=ws.scale)
        np.multiply(ws.axes, ws.scale_column, out=ws.turn_xyz)
        np.multiply(ws.turn_columns, ws.turn_rows, out=ws.turn_outer)
        np.matmul(ws.turn_outer_flat, QUATERNION_TO_MATRIX, out=ws.turn_matrices)
        # new world rotations: upper Q2 R_up, mid Q2 Q1 R_mid; the end takes the target's
        ws.frame_parent[...] = ws.parent_rotation
        ws.turned[:, :, 0] = ws.upper_rotation
        np.matmul(ws.Q1, ws.mid_rotation, out=ws.turned[:, :, 1])
        np.matmul(ws.Q2_column, ws.turned, out=ws.frames_new)
        ws.frame_end[...] = target_rotations
        # local = (world of the parent @ bridge)^T @ world, for upper, mid and end at once; then their quaternions
        np.matmul(ws.frames_parents, links.chain_bridges, out=ws.bridged)
        np.matmul(ws.bridged_t, ws.frames_children, out=ws.local)
        np.matmul(ws.local_rows, MATRIX_TO_SQUARES_WITH_BIAS, out=ws.squares)
        quats = ws.quaternions
        np.maximum(ws.square_q, ws.zeros, out=quats)
        np.matmul(quats, FOUR_ONES, out=ws.norms)          # the rig's bridges are orthonormal to ~1e-8 only: normalise
        np.sqrt(quats, out=quats)
        np.copysign(ws.quaternion_xyz, ws.square_signs, out=ws.quaternion_xyz)
        np.sqrt(ws.norms, out=ws.norms)
        np.divide(quats, ws.norm_column, out=quats)
        q[:, self.written_roles] = ws.quaternions_by_chain if self.all_written else ws.quaternions_by_chain[:, self.written_flat]
        errors = np.abs(ws.d - dc)
        if not self.all_chains_valid:                                    # chains the closed form leaves alone
            miss = ws.end - target_positions
            miss = np.sqrt(np.einsum("kci,kci->kc", miss, miss))
            errors = np.where(self.chain_valid, errors, miss)
        return errors

    def _straight_limbs(self, ws, links):
        """A limb held straight has no plane to bend in: it bends about the mid bone's x axis (a hinge on most rigs)
        made perpendicular to the upper bone. Sets the elbow's unit axis (length 1) and p = u + Q1 v for every chain."""
        u, v, n_len, R_mid = ws.u, ws.v, ws.normal_length, ws.mid_rotation
        straight = (n_len <= links.straight)[..., None]
        l1 = links.lengths[0]
        fallback = R_mid[..., :, 0] - np.einsum("kci,kci->kc", R_mid[..., :, 0], u)[..., None] * u / (l1 * l1)[..., None]
        fallback /= np.maximum(np.linalg.norm(fallback, axis=-1, keepdims=True), 1e-30)
        n = np.where(straight, fallback, ws.normal / np.maximum(n_len, 1e-300)[..., None])
        ws.normal[...] = n
        n_len[...] = 1.0
        ws.p[...] = u + (rotations_about(n, ws.phi) @ v[..., None])[..., 0]

    def _beyond_reach(self, world, target_positions):
        """Characters (indices) with an assisted chain whose target is beyond its reach, or None (see
        ReachAssist.rows_beyond_reach)."""
        ws = self._workspace(len(world))
        self._chain_targets(ws, world, target_positions)
        return self.reach_assist.rows_beyond_reach(ws.t_square, ws.assist_distances)

    def refine_quaternions(self, q, hips, target_positions, target_rotations, iterations=2, tolerance=1e-4,
                           memory=None, follow=None):
        """Run-time refinement on (K, 23, 4) local quaternions (modified in place); hips (K, 4, 4) transforms.

        Closed form for everyone (after the reach assist, and the head stage for characters whose head it leaves off);
        least squares (`iterations` steps) then the closed form again only for characters the closed form leaves more
        than `tolerance` metres away, when that brings them closer. memory: the characters' RefineMemory (what the
        previous tick settled on; updated), or None (each tick on its own). follow: (K, 5) bool, free effectors
        (their targets are where the network put them): least squares leaves them out and they ride along with what
        it moves (their targets in target_positions follow). Returns errors (K, 5).
        """
        network_limbs = None if memory is None else self.limb_bones(q)
        world = self.chain_forward(q, hips)
        ws = self._workspace(len(q))
        self._chain_targets(ws, world, target_positions)
        assist = self.reach_assist
        if assist is not None:
            rows = assist.rows_beyond_reach(ws.t_square, ws.assist_distances)
            if rows is not None:
                turned = assist.apply(q, hips, world, target_positions, rows, self.chain_forward)
                if turned is not None:          # nothing turned: what _chain_targets read stands
                    self._chain_targets(ws, turned, target_positions)
                    world = turned
        if self.head_reach is not None:
            rows = self._heads_off(ws.upper[:, 4], ws.end[:, 4], target_positions[:, 4], self.links, tolerance,
                                   self.head_reach.past_turns(world, q, target_rotations[:, 4]))
            if rows is not None or (memory is not None and memory.head_active.any()):
                if self._land_heads(q, hips, target_positions, rows, memory, target_rotations[:, 4]):
                    self._chain_targets(ws, self.chain_forward(q, hips), target_positions)
        self._chain_shape(ws)
        errors = self._solve_chains(q, ws, target_positions, target_rotations)
        errors = self.least_squares_after_closed_form(q, hips, target_positions, target_rotations, errors, iterations,
                                                      tolerance, follow)
        if memory is not None:
            self._follow_limbs(q, network_limbs, hips, target_positions, target_rotations, errors, memory)
        return errors

    def _follow_limbs(self, q, network, hips, target_positions, target_rotations, errors, memory, limbs_from=None):
        """The limbs' memory (refine_memory.py), last: where a limb's clavicle, upper and mid bones turned by more than
        POP_TURN beyond the network's own turn since last tick, and their correction of the network's (network: their
        quaternions before refinement, (K, 4, 3, 4)) moved more than the memory's rate (the network's elbow or knee
        flipped or its limb was degenerate; the clavicle's turn went from the reach assist's to least squares'), the
        limb starts again from last tick's correction turned toward this one's by that rate, and the closed form lands
        it from there (in place on q and errors; limbs_from: how, _limbs_from by default). What the tick settled on is
        remembered."""
        roles, limbs_from = self.limb_roles, limbs_from or self._limbs_from
        solved = self.limb_bones(q)
        if not memory.sequence:
            rows = slice(None)
            follow, new = memory.follow_limbs(rows, solved, network)
            if follow is not None:
                jumped, start = follow
                again = np.nonzero(jumped.any(axis=1))[0]
                limbs_from(q, network, hips, target_positions, target_rotations, errors, again, jumped[again],
                           start[again])
                solved[again] = q[again][:, roles]
                new[again] = corrections(network[again], solved[again])
            memory.remember_limbs(rows, solved, network, new)
            return
        one = slice(0, 1)
        for i in range(len(q)):            # frames of one character in order: each against the one before
            follow, new = memory.follow_limbs(one, solved[i:i + 1], network[i:i + 1])
            if follow is not None:
                limbs_from(q, network, hips, target_positions, target_rotations, errors, [i], *follow)
                solved[i] = q[i, roles]
                new = corrections(network[i:i + 1], solved[i:i + 1])
            memory.remember_limbs(one, solved[i:i + 1], network[i:i + 1], new)

    def limb_bones(self, q):
        """(K, 4, 3, 4) the limbs' memory's bones of q (K, 23, 4), limb_roles' order: one take (a copy, as indexing
        q[:, limb_roles] gives, for a third of its cost: the live tick takes them twice)."""
        return q.take(self.limb_flat, axis=1).reshape(len(q), 4, 3, 4)

    def _limbs_from(self, q, network, hips, target_positions, target_rotations, errors, rows, jumped, start):
        """Characters `rows`: the limbs `jumped` (len(rows), 4) take the network's clavicle, upper and mid bones times
        the corrections `start` (len(rows), 4, 3, 4), and the closed form lands every chain from there (in place on q
        and errors)."""
        rows = np.asarray(rows)
        roles, part = self.limb_roles, q[rows]
        part[:, roles] = np.where(jumped[..., None, None], multiply_quaternions(network[rows], start), part[:, roles])
        links = self.links.take(rows)
        errors[rows] = self.closed_form(part, self.chain_forward(part, hips[rows], links), target_positions[rows],
                                        target_rotations[rows], links)
        q[rows] = part

    def _heads_off(self, upper, end, targets, links, tolerance, turned_past=None):
        """Characters (indices) whose head the closed form would leave more than `tolerance` off its target, or None:
        the head's target that far beyond the neck chain's reach from its upper bone's head `upper` (K, 3), or, where
        the rig has no two-bone neck chain, the head (`end`, (K, 3)) that far from it. links: these characters'
        ChainLinks. turned_past: (K,) bool, the heads that would turn past their limits (HeadReach.past_turns), or
        None."""
        if self.chain_valid[4]:
            reach = links.reach[0][..., 4] + tolerance
            miss = targets - upper
            off = np.einsum("ki,ki->k", miss, miss) > reach * reach
        else:
            miss = targets - end
            off = np.einsum("ki,ki->k", miss, miss) > tolerance * tolerance
        if turned_past is not None:
            off |= turned_past
        return np.nonzero(off)[0] if off.any() else None

    def _land_heads(self, q, hips, target_positions, rows, memory=None, head_rotations=None):
        """The head stage (head_reach.py), in place on q (K, 23, 4), for characters `rows` (indices, or None) and those
        whose memory holds a spine of their own (from there, moving back toward the network's; memory updated); then
        the reach assist again for those whose arms the spine's turn left beyond reach (the clavicles hang off the
        spine). head_rotations: (K, 3, 3) the head targets' (the stage keeps the head's turn inside its limits), or
        None. Returns whether any character went through it."""
        head, k, rate = self.head_reach, len(q), 0.0 if memory is None else memory.rate
        need = np.zeros(k, bool)
        if rows is not None:
            need[rows] = True
        if memory is None:
            rows = np.nonzero(need)[0]
            head.solve(q, hips, target_positions[:, 4], rows, self.chain_forward, self.links, None, 0.0, head_rotations)
        elif memory.sequence:               # frames of one character in order: each starts from the one before
            for i in range(k):
                if need[i] or memory.head_active[0]:
                    start = memory.head[:1] if memory.head_active[0] else None
                    _, solved, own = head.solve(q, hips, target_positions[:, 4], [i], self.chain_forward, self.links,
                                                start, rate, head_rotations)
                    memory.remember_head([0], solved, own)
                    need[i] = True
            rows = np.nonzero(need)[0]
        else:
            need |= memory.head_active
            rows = np.nonzero(need)[0]
            start = np.where(memory.head_active[rows, None, None], memory.head[rows], np.nan)
            _, solved, own = head.solve(q, hips, target_positions[:, 4], rows, self.chain_forward, self.links, start,
                                        rate, head_rotations)
            memory.remember_head(rows, solved, own)
        if not len(rows):
            return False
        self._assist_again(q, hips, target_positions, rows)
        return True

    def _assist_again(self, q, hips, target_positions, rows):
        """After the head stage of characters `rows` (indices): the reach assist again, in place on q (K, 23, 4), for
        those of them with a chain beyond reach now (the spine's turn moved the clavicles, which hang off it; the
        head's target may be beyond the neck's reach still). The live tick's one-character refiner calls it too."""
        assist = self.reach_assist
        if assist is None:
            return
        ws = self._workspace(len(q))
        world = self.chain_forward(q, hips)
        self._chain_targets(ws, world, target_positions)
        again = assist.rows_beyond_reach(ws.t_square, ws.assist_distances)
        if again is not None:
            if len(rows) < len(q):                    # (rows: distinct characters; all of them at K = 1)
                again = np.intersect1d(again, rows)
            if len(again):
                assist.apply(q, hips, world, target_positions, again, self.chain_forward)

    def least_squares_after_closed_form(self, q, hips, target_positions, target_rotations, errors, iterations=2,
                                        tolerance=1e-4, follow=None):
        """refine_quaternions' last stage, on the closed form's result q (K, 23, 4) and its errors (K, 5): least
        squares (`iterations` steps) then the closed form again for the characters left more than `tolerance` away,
        kept where that brings them closer (the sum of the squared misses: the largest miss alone, often a foot beyond
        reach that least squares barely moves, dropped its help to a hand one tick and took it the next). follow: as
        in refine_quaternions (a free head does not hold the spine back from a pinned hand). Returns the errors; sets
        last_least_squares.

        What the closed form landed stays landed: where least squares' move (of the spine, for a hand beyond reach)
        takes a landed effector off its target (a straight arm whose shoulder moved away), only the largest share of
        the move that keeps it landed is taken (bisection on a blend of each joint's rotation before and after). So
        the target beyond reach comes as close as the rest allows, and as it comes back within reach the move fades
        out continuously: a move taken in full, then dropped the tick the target came within reach, snapped the
        spine back and bent the other arm's straight elbow 14-23 degrees in one tick (docs/results.md)."""
        self.last_least_squares = 0
        if iterations <= 0 or not errors.max() > tolerance:
            return errors
        need = np.nonzero(errors.max(axis=1) > tolerance)[0]
        self.last_least_squares = len(need)
        links = self.links.take(need)
        q_more, hips_more, tp = q[need], hips[need], target_positions[need]
        if len(self.unmapped):
            q_more[:, self.unmapped] = (1.0, 0.0, 0.0, 0.0)
        start = q_more.copy()
        riding = None if follow is None or not follow[need].any() else follow[need]
        for _ in range(iterations):
            if self.least_squares_quaternions(q_more, hips_more, tp, links, riding) < tolerance:
                break
        moved = q_more.copy()
        more = self._after_least_squares(q_more, hips_more, tp, target_rotations[need], links, riding, tolerance)
        landed = errors[need] <= tolerance
        if riding is not None:
            landed &= ~riding
        lost = np.nonzero(((more > tolerance) & landed).any(axis=1))[0]
        if len(lost):
            self._keep_landed(lost, start, moved, q_more, more, tp, hips_more, target_rotations[need], links, riding,
                              landed, tolerance)
        better = (more * more).sum(axis=1) < (errors[need] * errors[need]).sum(axis=1)
        q[need[better]] = q_more[better]
        errors[need[better]] = more[better]
        if riding is not None:
            target_positions[need[better]] = tp[better]
        return errors

    def _after_least_squares(self, q, hips, tp, target_rotations, links, riding, tolerance):
        """After least squares' steps on q (in place): the free effectors' targets go where it took them (tp, in
        place), the head stage where it moved the spine for the arms, then the closed form. Returns the errors."""
        world = self.chain_forward(q, hips, links)
        if riding is not None:                 # the free effectors go where least squares took them
            tp[riding] = world[:, self.chain_slots[:, 3]][:, :, :3, 3][riding]
        if self.head_reach is not None:        # least squares moved the spine for the arms: the head again
            upper, end = self.chain_slots[4, 1], self.chain_slots[4, 3]
            rows = self._heads_off(world[:, upper, :3, 3], world[:, end, :3, 3], tp[:, 4], links, tolerance,
                                   self.head_reach.past_turns(world, q, target_rotations[:, 4]))
            if rows is not None:
                self.head_reach.solve(q, hips, tp[:, 4], rows, self.chain_forward, links, None, 0.0,
                                      target_rotations[:, 4])
                world = self.chain_forward(q, hips, links)
        return self.closed_form(q, world, tp, target_rotations, links)

    def _keep_landed(self, rows, start, moved, q, errors, tp, hips, target_rotations, links, riding, landed,
                     tolerance):
        """least_squares_after_closed_form's characters `rows`, whose least squares took a landed effector off: the
        largest share s of the move (LANDED_BISECTIONS halvings; joint rotations start -> moved, blended) that keeps
        every `landed` one within tolerance, finished as _after_least_squares does; in place on q, errors and tp
        (no share: infinite errors, so the closed form's start stays)."""
        low, high = np.zeros(len(rows)), np.ones(len(rows))
        first, last = start[rows], moved[rows]
        last = np.where((np.einsum("kjc,kjc->kj", first, last) < 0.0)[..., None], -last, last)   # the short way
        best_q, best_errors, best_tp = first.copy(), np.zeros((len(rows), 5)), tp[rows].copy()
        sub_hips, sub_rotations, sub_links = hips[rows], target_rotations[rows], links.take(rows)
        sub_riding, keep = None if riding is None else riding[rows], landed[rows]
        for _ in range(LANDED_BISECTIONS):
            share = 0.5 * (low + high)
            blend = first + share[:, None, None] * (last - first)
            blend /= np.sqrt(np.einsum("kjc,kjc->kj", blend, blend))[..., None]
            # (a blend of two poses inside the limits can lie a little outside them: on unseen Bandai clips up to
            # 3e-5 rad on a clavicle)
            blend[:, self.joints] = self._limit_quaternions(blend[:, self.joints])
            targets = tp[rows]
            found = self._after_least_squares(blend, sub_hips, targets, sub_rotations, sub_links, sub_riding,
                                              tolerance)
            fine = ~((found > tolerance) & keep).any(axis=1)
            low, high = np.where(fine, share, low), np.where(fine, high, share)
            best_q[fine], best_errors[fine], best_tp[fine] = blend[fine], found[fine], targets[fine]
        best_errors[low == 0.0] = np.inf           # no share kept them: the closed form's start stays
        q[rows], errors[rows], tp[rows] = best_q, best_errors, best_tp

    def least_squares_quaternions(self, q, hips, target_positions, links=None, riding=None):
        """One least-squares step (what least_squares_step does with rotation matrices) in place on the joints of
        q (K, 23, 4), on the chain layout. Returns the largest effector error (per axis) before the step, like
        least_squares_step. links: as in chain_forward; riding: (K, 5) bool, effectors left out (free ones)."""
        links = self.links if links is None else links
        k, m = len(q), len(self.joints)
        X = self.chain_forward(q, hips, links)[:, self.least_squares_slots]       # (K, M + 5, 4, 4)
        x_e = X[:, m:, :3, 3]
        err = target_positions - x_e
        # d x_e / d w_j = -[x_e - x_j]x R_j = [x_j]x R_j - [x_e]x R_j, every joint side by side: rows (effector, axis),
        # columns (joint, axis); then each column scaled by the root of its weight and zero where j does not move e
        R_j = X[:, :m, :3, :3]
        rotations, crossed = np.empty((k, 3, m, 3)), np.empty((k, 3, m, 3))
        rotations[...] = R_j.transpose(0, 2, 1, 3)
        np.matmul((X[:, :m, :3, 3] @ SKEW).reshape(k, m, 3, 3), R_j, out=crossed.transpose(0, 2, 1, 3))
        J = crossed.reshape(k, 1, 3, 3 * m) - (x_e @ SKEW).reshape(k, 5, 3, 3) @ rotations.reshape(k, 1, 3, 3 * m)
        J *= self.jacobian_factors
        if riding is not None:
            J[riding] = 0.0
            err[riding] = 0.0
        scaled = J.reshape(k, 15, 3 * m)
        H = scaled @ np.swapaxes(scaled, -1, -2)
        H += self.damping_matrix
        y = np.linalg.solve(H, err.reshape(k, 15, 1))
        w = (np.swapaxes(scaled, -1, -2) @ y).reshape(k, m, 3)
        w *= self.joint_root_weights
        norms = _norms(w)
        if norms.max() > MAX_STEP:      # scale each character's step down so that no joint turns more than MAX_STEP
            w *= np.minimum(1.0, MAX_STEP / np.maximum(norms.max(axis=1), 1e-12))[:, None, None]
        moved = multiply_quaternions(q[:, self.joints], exp_quaternions(0.5 * w))
        q[:, self.joints] = self._limit_quaternions(moved)
        return np.abs(err).max()

    def _limit_quaternions(self, qj):
        """(K, M, 4) joint quaternions pulled inside the limits: clamp_to_limits with quaternions (the delta from the
        mean pose is conj(mean) * q, its axis-angle clipped per axis)."""
        delta = multiply_quaternions(self.mean_conjugates, qj)
        if (np.abs(delta[..., 0]) >= self.surely_inside).all():   # every turn smaller than its joint's nearest limit
            return qj
        delta = quaternion_to_axis_angle(delta)
        clipped = np.minimum(np.maximum(delta, self.joint_low), self.joint_high)
        outside = (clipped != delta).any(axis=-1)
        if not outside.any():
            return qj
        fixed = multiply_quaternions(self.mean_quaternions, exp_quaternions(0.5 * clipped))
        qj[outside] = fixed[outside]
        return qj

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
