"""Head reach: the head lands on its target by turning the spine and the neck, inside their joint limits.

The head hangs at the end of the spine and neck chain (Spine, Spine1, Spine2, NeckLower, NeckUpper: whichever the rig
maps). Where the network's spine is off (a weak prior, a pose unlike its training clips), neither the two-bone solve of
the neck nor the reach assist's closed-form turns (reach_assist.py: at most ASSIST_MAX_TURN, one joint at a time)
bring the head's target within reach, and a rig with one neck bone has no two-bone neck chain at all. This stage
solves the joints below a point for that point's position alone - three equations, three unknowns per joint - by
projected Gauss-Newton in the space the limits are stated in: each joint's rotation is mean pose * exp(d), d its
axis-angle delta (the limits are a box on d, per axis, see Refiner.clamp_to_limits), so a step is
    d <- clip(d + W J^T (J W J^T + damping I)^-1 e, low, high)
with J = d point / d d (the body-frame Jacobian -[x - x_j]x R_j times the right Jacobian of exp at d), W the refiner's
joint weights (the spine moves less than the neck). The point and e: with one neck bone, the head and its miss (it
lands on the target); with a two-bone neck chain, the neck's base and the part of its distance to the target beyond
the chain's reach (aimed NECK_AIM inside it), after which the chain's closed form lands the head. Axes sitting on a
limit and pushed outward leave the step (active set), a step that does not bring the point closer is not taken (and
the next is smaller and more damped), a character whose miss stops shrinking stops. A reachable target lands in a
few steps (to a micrometre; 3-6 on held-out Bandai clips with a dozen-clip model); an unreachable one ends near the
nearest point the limits allow, and its miss is what the refiner reports (the solver's MISSED status).

The stage runs only for characters whose head the cheaper stages leave more than the tolerance off its target, or
whose memory (refine_memory.py) holds a spine of its own from last tick: it then starts from that spine and moves back
toward the network's at most the memory's rate, in the null space of J (and, with a neck chain, as far as keeps the
base within reach), so the spine follows the network without jumping between the many spines that reach. The head's
orientation is the closed form's (the head takes its target's rotation).

The head's own turn. Where the point is the head itself (no two-bone neck chain: a rig with one neck bone, as
Bandai's or Mixamo's), the head's local rotation once it takes its target's rotation is fixed by the spine and neck
below it: L_h = (P_h)^T R_T, P_h the head's parent frame (times its rest bridge), R_T the target's rotation. A
spine held more upright than the pose the targets come from leaves the head nodding past its limits (on unseen
Bandai clips with the head and hands pinned: up to 20 degrees past, docs/results.md). With the targets' rotations
given, the stage then also solves for d_h = log(M_h^-1 L_h) inside the head's limits (aimed TURN_AIM inside them):
a turn a of joint j's frame (world axis: a = R_j Jr(d_j) delta d_j) turns P_h by a, so L_h by -R_T^T a in its own
frame, and

    d d_h / d d_j = -Jr^-1(d_h) R_T^T R_j Jr(d_j)

rows for the axes past the limits only, weighted TURN_LENGTH rig heights per radian against the point's miss (the
position comes first where both cannot hold), stacked under the point's three. Characters whose head lands inside
its limits anyway see no such row. Pure NumPy; no bpy. The live tick's
one-character refiner runs blender/live/head.py instead, which mirrors HeadReach.solve step by step in mathutils (a
change here goes there too; tests/test_live_head.py holds the two together); it covers only rigs with a two-bone neck
chain, so it has no rows for the head's own turn.
"""

import numpy as np

from ..geometry.quaternion_math import SKEW, exp_quaternions, multiply_quaternions, quaternions_to_matrices
from ..geometry.rotations import matrix_to_axis_angle, quaternion_to_axis_angle, right_jacobian
from ..skeleton.roles import ROLE_INDEX

HEAD_ITERATIONS = 12       # Gauss-Newton steps at most (a reachable target needs 3-6; one at a limit up to ~12)
FOLLOW_ITERATIONS = 6      # the same from last tick's solution (a memory): what is left goes on next tick
HEAD_TOLERANCE = 1e-6      # metres: a head this close to its target has landed
ACTIVE_SET_PASSES = 3      # per step: solves with the axes on a limit taken out, until none pushes outward
MAX_TURN = 0.2             # radians: the largest change of one joint in one step
SMALLEST_TURN = 1e-5       # radians: a character whose steps shrank below this (none brought the head closer) stops
STALLED = 0.98             # a step that leaves more than this of the squared miss: the character stops after it
NECK_AIM = 0.01            # with a two-bone neck: its base is aimed this fraction of the chain's reach inside it
TURN_AIM = 1e-4            # radians: a head turned past its limits is aimed this far inside them
TURN_LENGTH = 0.03         # rig heights: what a radian of the head's turn past its limits weighs against its miss


class HeadReach:
    """The head stage for one rig: the mapped joints between the hips and the head, their weights and limits."""

    def __init__(self, joints, slots, point_slot, root_weights, mean, mean_conjugate, low, high, damping, neck_chain,
                 head_turn=None):
        self.joints = joints                  # (m,) roles, hips side first
        self.slots = slots                    # (m,) their slots in the refiner's chain layout
        self.point_slot = point_slot          # the slot whose position the stage moves (see neck_chain)
        self.root_weights = root_weights      # (3m,) square roots of the joint weights, per axis
        self.mean, self.mean_conjugate = mean, mean_conjugate        # (m, 4) mean-pose quaternions
        self.low, self.high = low, high       # (m, 3) the box on d
        self.damping_matrix = damping * damping * np.eye(3)
        # a two-bone neck chain (NeckLower, NeckUpper, Head): the stage brings its base (NeckLower's head, the point)
        # within the chain's reach of the head's target with the joints below it, and the chain's closed form lands
        # the head; otherwise the point is the head itself, and it lands on the target
        self.neck_chain = neck_chain
        # without a neck chain, the head's own turn (see the module's docstring): (its mean pose's transpose (3, 3),
        # its limits' low and high (3,) each, TURN_LENGTH rig heights), or None
        self.head_turn = head_turn

    @classmethod
    def for_refiner(cls, refiner):
        """The stage for a Refiner's rig, or None when the head or every joint below it is unmapped. Reads the
        refiner's least-squares constants (joints, weights, mean quaternions, limits) and chain layout (slots, the
        neck chain's validity)."""
        skeleton = refiner.skeleton
        parents, mask = skeleton.parents, skeleton.role_mask
        head = ROLE_INDEX["Head"]
        if not mask[head]:
            return None
        neck_chain = bool(refiner.chain_valid[4])
        point = int(refiner.chain_roles[4, 0]) if neck_chain else head
        joint_index = {int(j): i for i, j in enumerate(refiner.joints)}
        chain, j = [], parents[point]
        while j > 0:
            if mask[j] and int(j) in joint_index:
                chain.insert(0, int(j))
            j = parents[j]
        if not chain:
            return None
        index = np.array([joint_index[j] for j in chain])
        weights = refiner.root_weights.reshape(-1, 3)[index].reshape(-1)
        head_turn = None if neck_chain else (refiner.mean_pose_t[head], refiner.limit_low[head],
                                             refiner.limit_high[head], TURN_LENGTH * skeleton.height)
        return cls(np.array(chain), np.array([refiner.slot_of[j] for j in chain]), refiner.slot_of[point], weights,
                   refiner.mean_quaternions[index], refiner.mean_conjugates[index], refiner.joint_low[index],
                   refiner.joint_high[index], 1e-3 * skeleton.height, neck_chain, head_turn)

    def head_turns(self, X, head_local, rotations):
        """(k, 3) d_h, the head's delta from its mean pose once it takes its target's rotation (rotations (k, 3, 3)):
        X the chain layout's world transforms (the head's slot as head_local (k, 3, 3), its local rotation, made it)."""
        mean_t = self.head_turn[0]
        return matrix_to_axis_angle(mean_t @ head_local @ X[:, self.point_slot, :3, :3].swapaxes(-1, -2) @ rotations)

    def past_turns(self, X, q, rotations):
        """(K,) bool: the characters whose head would turn past its limits taking its target's rotation (rotations
        (K, 3, 3)); X: chain_forward of q (K, 23, 4). None where the stage keeps no such limit (a neck chain)."""
        if self.head_turn is None:
            return None
        d = self.head_turns(X, quaternions_to_matrices(q[:, ROLE_INDEX["Head"]]), rotations)
        return self._turn_rows(d)[1] > 0.0

    def turn_jacobian(self, X, head_local, rotations, turns):
        """(k, 3, 3m) d d_h / d d: the head's turn (head_turns) against the joints' deltas,
        -Jr^-1(d_h) R_T^T R_j Jr(d_j) per joint j; turns (k, m, 3, 3) the joints' R_j Jr(d_j) (their world rotations
        times their right Jacobians)."""
        k, m = len(X), len(self.joints)
        inverse = np.linalg.inv(right_jacobian(self.head_turns(X, head_local, rotations)))
        J = -inverse[:, None] @ rotations.swapaxes(-1, -2)[:, None] @ turns
        return J.transpose(0, 2, 1, 3).reshape(k, 3, 3 * m)

    def _turn_rows(self, d):
        """(the rows' targets (k, 3): how far each axis of the head's d_h must move to lie TURN_AIM inside its
        limits, 0 where it lies inside them; how far past them the head is, summed over the axes (k,))."""
        _, low, high, _ = self.head_turn
        aimed = np.minimum(np.maximum(d, low + TURN_AIM), high - TURN_AIM) - d
        past = np.maximum(d - high, 0.0) + np.maximum(low - d, 0.0)
        return np.where(past > 0.0, aimed, 0.0), past.sum(axis=1)

    def _misses(self, X, targets, reach):
        """((k, 3) the point's move to aim at, (k,) how far it is off): the target minus the point, or, with a neck
        chain (reach: (k,) the chain's reach), the part of that beyond a point NECK_AIM inside the reach (so a few
        steps take it inside: the chain turns nearly straight toward the target only at second order) and how far
        beyond the reach itself the target is."""
        e = targets - X[:, self.point_slot, :3, 3]
        distance = np.sqrt(np.einsum("ki,ki->k", e, e))
        if not self.neck_chain:
            return e, distance
        return self._misses_at(X[:, self.point_slot, :3, 3], targets, reach, NECK_AIM), np.maximum(distance - reach, 0.0)

    @staticmethod
    def _misses_at(point, targets, reach, aim):
        """(k, 3) the move that takes `point` to within (1 - aim) * reach of targets (zero where it is)."""
        e = targets - point
        distance = np.sqrt(np.einsum("ki,ki->k", e, e))
        return e * np.maximum(0.0, 1.0 - (1.0 - aim) * reach / np.maximum(distance, 1e-300))[:, None]

    def solve(self, q, hips, targets, rows, chain_forward, links, start=None, rate=0.0, rotations=None):
        """Land the head of characters `rows` (indices into q) on targets (K, 3), in place on q (K, 23, 4); hips
        (K, 4, 4); chain_forward(q, hips, links) -> the chain layout's world transforms (the refiner's), links the
        refiner's ChainLinks of all K characters.

        The solve starts from q's pose (pulled inside the limits), or from `start` (len(rows), m, 3: deltas d, the
        previous tick's solution, see refine_memory.py; NaN rows: q's pose) where given: its first step then also
        moves the joints back toward q's pose, at most `rate` radians each, in the directions that leave the head where
        it is (the null space of J), so a character follows its network only as fast as that. Returns (the heads'
        misses (len(rows),), the joints' deltas d now, and q's own clipped to the limits (each (len(rows), m, 3))).
        rotations: (K, 3, 3) the head targets' rotations, or None; with them, a rig without a neck chain also keeps
        the head's own turn inside its limits (see the module's docstring)."""
        rows = np.asarray(rows)
        joints, m = self.joints, len(self.joints)
        qq, hh, t = q[rows], hips[rows], targets[rows]
        own = quaternion_to_axis_angle(multiply_quaternions(self.mean_conjugate, qq[:, joints]))
        own = np.minimum(np.maximum(own, self.low), self.high)
        d = own.copy() if start is None else np.where(np.isnan(start), own, np.minimum(np.maximum(start, self.low),
                                                                                       self.high))
        pull = np.zeros((len(rows), 3 * m))          # the first step's move back toward q's pose
        if start is not None and rate > 0.0:
            back = own - d
            size = np.sqrt(np.einsum("kmi,kmi->km", back, back))
            pull = (back * np.minimum(1.0, rate / np.maximum(size, 1e-300))[..., None]).reshape(len(rows), 3 * m)
        qq[:, joints] = multiply_quaternions(self.mean, exp_quaternions(0.5 * d))
        low, high = self.low.reshape(-1), self.high.reshape(-1)
        n = len(rows)
        live = np.arange(n)                              # characters still moving
        radius = np.full(n, MAX_TURN)                    # each one's largest joint turn in a step
        damping = np.ones(n)                             # each one's damping, times the base (Levenberg-Marquardt)
        reach = np.broadcast_to(links.take(rows).reach[0][..., 4], n) if self.neck_chain else None
        X = chain_forward(qq, hh, links.take(rows)).copy()
        e, off = self._misses(X, t, reach)
        turning = rotations is not None and self.head_turn is not None
        if turning:             # the head's own turn: its local rotation, its target's, its rows and how far past
            head_local = quaternions_to_matrices(qq[:, ROLE_INDEX["Head"]])
            turn_to, scale = rotations[rows], self.head_turn[3]
            e_turn, past = self._turn_rows(self.head_turns(X, head_local, turn_to))
            damping_matrix = self.damping_matrix[0, 0] * np.eye(6)      # the point's three rows and the turn's
        else:
            damping_matrix = self.damping_matrix
            past = np.zeros(n)
        final_off = off.copy()
        pulling = pull.any(axis=1)
        # a character with a memory (its start given) takes FOLLOW_ITERATIONS, one without (no start, or NaN) the
        # full HEAD_ITERATIONS: so a character's solve is the same whoever it is solved with (a Bake's frames, each
        # on its own, or a live tick's characters together)
        remembered = np.zeros(n, bool) if start is None else ~np.isnan(start).any(axis=(1, 2))
        steps = np.where(remembered, FOLLOW_ITERATIONS, HEAD_ITERATIONS)
        for iteration in range(int(steps.max())):
            missing = (((off > HEAD_TOLERANCE) | (past > 0.0)) & (radius[live] > SMALLEST_TURN)) | pulling[live]
            missing &= iteration < steps[live]
            if not missing.all():                        # (at K = 1 every subset is a copy: taken only when needed)
                if not missing.any():
                    break
                live, X, e, off, past = live[missing], X[missing], e[missing], off[missing], past[missing]
                if turning:
                    e_turn = e_turn[missing]
            k, dl = len(live), d[live]
            frames = X[:, self.slots]
            point = X[:, self.point_slot, :3, 3]
            lever = point[:, None] - frames[..., :3, 3]                                        # (k, m, 3)
            turns = frames[..., :3, :3] @ right_jacobian(dl)                                  # (k, m, 3, 3)
            J = -(lever @ SKEW).reshape(k, m, 3, 3) @ turns
            J = J.transpose(0, 2, 1, 3).reshape(k, 3, 3 * m)
            aim = e
            if turning:         # the head's turn's rows where it is past, stacked under the point's
                J_turn = self.turn_jacobian(X, head_local[live], turn_to[live], turns)
                J_turn *= (scale * (e_turn != 0.0))[..., None]
                J, aim = np.concatenate([J, J_turn], axis=1), np.concatenate([e, scale * e_turn], axis=1)
            now = dl.reshape(k, 3 * m)
            on_low, on_high = now <= low, now >= high
            back = pull[live] if pulling.any() else None
            free = np.ones((k, 3 * m), bool)
            rest = aim
            for _ in range(ACTIVE_SET_PASSES):     # axes on a limit that the step pushes outward leave the step
                if back is not None:
                    moves = (J @ (free * back)[..., None])[..., 0]       # the pull's own move of the point
                    rest = aim - moves
                    if self.neck_chain:
                        # pulled toward the network's pose, the neck's base need only stay within the chain's reach (not
                        # aimed inside it), so a network pose that reaches is reached, and the memory settles
                        within = self._misses_at(point + moves, t[live], reach[live], 0.0)
                        rest = np.where(pulling[live][:, None], within, rest)
                Jf = J * (free * self.root_weights)[:, None]
                y = np.linalg.solve(Jf @ Jf.swapaxes(-1, -2) + damping[live, None, None] * damping_matrix,
                                    rest[..., None])
                step = (Jf.swapaxes(-1, -2) @ y)[..., 0] * self.root_weights
                if back is not None:
                    step = free * (back + step)
                outward = free & ((on_low & (step < 0)) | (on_high & (step > 0)))
                if not outward.any():
                    break
                free &= ~outward
            step = step.reshape(k, m, 3)
            largest = np.sqrt(np.einsum("kmi,kmi->km", step, step)).max(axis=1)
            step *= np.minimum(1.0, radius[live] / np.maximum(largest, 1e-12))[:, None, None]
            tried = np.minimum(np.maximum(dl + step, self.low), self.high)
            moved = qq[live]
            moved[:, joints] = multiply_quaternions(self.mean, exp_quaternions(0.5 * tried))
            X_tried = chain_forward(moved, hh[live], links.take(rows[live]))
            e_tried, off_tried = self._misses(X_tried, t[live], None if reach is None else reach[live])
            # a step that does not bring the point closer is not taken, the next tries a smaller one (the pull's step
            # is: it is small, and the next steps land the head again)
            before, after = np.einsum("ki,ki->k", e, e), np.einsum("ki,ki->k", e_tried, e_tried)
            past_tried = np.zeros(k)
            if turning:         # (the head's turn past its limits counts in both)
                e_turn_tried, past_tried = self._turn_rows(self.head_turns(X_tried, head_local[live], turn_to[live]))
                before = before + scale * scale * np.einsum("ki,ki->k", e_turn, e_turn)
                after = after + scale * scale * np.einsum("ki,ki->k", e_turn_tried, e_turn_tried)
            landed = (off_tried <= HEAD_TOLERANCE) & (past_tried <= 0.0)
            better = (after < before) | pulling[live] | (landed & ((off > HEAD_TOLERANCE) | (past > 0.0)))
            # a point that stopped coming closer (a target the limits keep out of reach) is as close as it gets
            stalled = better & ~pulling[live] & (after > STALLED * before)
            if back is not None:
                pulling[live] = False
            if better.all():                   # the usual step: no masks (at K = 1 each costs a few calls)
                radius[live] = np.minimum(2.0 * radius[live], MAX_TURN)
                damping[live] = np.maximum(0.1 * damping[live], 1.0)
                d[live], qq[live], final_off[live] = tried, moved, off_tried
                X, e, off, past = X_tried.copy(), e_tried, off_tried, past_tried  # (the forward pass reuses its buffer)
                if turning:
                    e_turn = e_turn_tried
            else:
                radius[live] = np.where(better, np.minimum(2.0 * radius[live], MAX_TURN), 0.25 * radius[live])
                damping[live] = np.where(better, np.maximum(0.1 * damping[live], 1.0), 100.0 * damping[live])
                taken = live[better]
                d[taken], qq[taken], final_off[taken] = tried[better], moved[better], off_tried[better]
                X[better], e[better], off[better] = X_tried[better], e_tried[better], off_tried[better]
                past[better] = past_tried[better]
                if turning:
                    e_turn[better] = e_turn_tried[better]
            if stalled.any():
                radius[live[stalled]] = 0.0
        q[rows] = qq
        return final_off, d, own
