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
orientation is the closed form's (the head takes its target's rotation). Pure NumPy; no bpy. The live tick's
one-character refiner runs blender/live/head.py instead, which mirrors HeadReach.solve step by step in mathutils (a
change here goes there too; tests/test_live_head.py holds the two together).
"""

import numpy as np

from ..geometry.quaternion_math import SKEW, exp_quaternions, multiply_quaternions
from ..geometry.rotations import quaternion_to_axis_angle, right_jacobian
from ..skeleton.roles import ROLE_INDEX

HEAD_ITERATIONS = 12       # Gauss-Newton steps at most (a reachable target needs 3-6; one at a limit up to ~12)
FOLLOW_ITERATIONS = 6      # the same from last tick's solution (a memory): what is left goes on next tick
HEAD_TOLERANCE = 1e-6      # metres: a head this close to its target has landed
ACTIVE_SET_PASSES = 3      # per step: solves with the axes on a limit taken out, until none pushes outward
MAX_TURN = 0.2             # radians: the largest change of one joint in one step
SMALLEST_TURN = 1e-5       # radians: a character whose steps shrank below this (none brought the head closer) stops
STALLED = 0.98             # a step that leaves more than this of the squared miss: the character stops after it
NECK_AIM = 0.01            # with a two-bone neck: its base is aimed this fraction of the chain's reach inside it


class HeadReach:
    """The head stage for one rig: the mapped joints between the hips and the head, their weights and limits."""

    def __init__(self, joints, slots, point_slot, root_weights, mean, mean_conjugate, low, high, damping, neck_chain):
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
        return cls(np.array(chain), np.array([refiner.slot_of[j] for j in chain]), refiner.slot_of[point], weights,
                   refiner.mean_quaternions[index], refiner.mean_conjugates[index], refiner.joint_low[index],
                   refiner.joint_high[index], 1e-3 * skeleton.height, neck_chain)

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

    def solve(self, q, hips, targets, rows, chain_forward, links, start=None, rate=0.0):
        """Land the head of characters `rows` (indices into q) on targets (K, 3), in place on q (K, 23, 4); hips
        (K, 4, 4); chain_forward(q, hips, links) -> the chain layout's world transforms (the refiner's), links the
        refiner's ChainLinks of all K characters.

        The solve starts from q's pose (pulled inside the limits), or from `start` (len(rows), m, 3: deltas d, the
        previous tick's solution, see refine_memory.py; NaN rows: q's pose) where given: its first step then also
        moves the joints back toward q's pose, at most `rate` radians each, in the directions that leave the head where
        it is (the null space of J), so a character follows its network only as fast as that. Returns (the heads'
        misses (len(rows),), the joints' deltas d now, and q's own clipped to the limits (each (len(rows), m, 3)))."""
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
        final_off = off.copy()
        pulling = pull.any(axis=1)
        # a character with a memory (its start given) takes FOLLOW_ITERATIONS, one without (no start, or NaN) the
        # full HEAD_ITERATIONS: so a character's solve is the same whoever it is solved with (a Bake's frames, each
        # on its own, or a live tick's characters together)
        remembered = np.zeros(n, bool) if start is None else ~np.isnan(start).any(axis=(1, 2))
        steps = np.where(remembered, FOLLOW_ITERATIONS, HEAD_ITERATIONS)
        for iteration in range(int(steps.max())):
            missing = ((off > HEAD_TOLERANCE) & (radius[live] > SMALLEST_TURN)) | pulling[live]
            missing &= iteration < steps[live]
            if not missing.all():                        # (at K = 1 every subset is a copy: taken only when needed)
                if not missing.any():
                    break
                live, X, e, off = live[missing], X[missing], e[missing], off[missing]
            k, dl = len(live), d[live]
            frames = X[:, self.slots]
            point = X[:, self.point_slot, :3, 3]
            lever = point[:, None] - frames[..., :3, 3]                                        # (k, m, 3)
            J = -(lever @ SKEW).reshape(k, m, 3, 3) @ frames[..., :3, :3] @ right_jacobian(dl)
            J = J.transpose(0, 2, 1, 3).reshape(k, 3, 3 * m)
            now = dl.reshape(k, 3 * m)
            on_low, on_high = now <= low, now >= high
            back = pull[live] if pulling.any() else None
            free = np.ones((k, 3 * m), bool)
            rest = e
            for _ in range(ACTIVE_SET_PASSES):     # axes on a limit that the step pushes outward leave the step
                if back is not None:
                    moves = (J @ (free * back)[..., None])[..., 0]       # the pull's own move of the point
                    rest = e - moves
                    if self.neck_chain:
                        # pulled toward the network's pose, the neck's base need only stay within the chain's reach (not
                        # aimed inside it), so a network pose that reaches is reached, and the memory settles
                        within = self._misses_at(point + moves, t[live], reach[live], 0.0)
                        rest = np.where(pulling[live][:, None], within, rest)
                Jf = J * (free * self.root_weights)[:, None]
                y = np.linalg.solve(Jf @ Jf.swapaxes(-1, -2) + damping[live, None, None] * self.damping_matrix,
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
            better = (after < before) | pulling[live] | ((off_tried <= HEAD_TOLERANCE) & (off > HEAD_TOLERANCE))
            # a point that stopped coming closer (a target the limits keep out of reach) is as close as it gets
            stalled = better & ~pulling[live] & (after > STALLED * before)
            if back is not None:
                pulling[live] = False
            if better.all():                   # the usual step: no masks (at K = 1 each costs a few calls)
                radius[live] = np.minimum(2.0 * radius[live], MAX_TURN)
                damping[live] = np.maximum(0.1 * damping[live], 1.0)
                d[live], qq[live], final_off[live] = tried, moved, off_tried
                X, e, off = X_tried.copy(), e_tried, off_tried       # (the forward pass reuses its buffer)
            else:
                radius[live] = np.where(better, np.minimum(2.0 * radius[live], MAX_TURN), 0.25 * radius[live])
                damping[live] = np.where(better, np.maximum(0.1 * damping[live], 1.0), 100.0 * damping[live])
                taken = live[better]
                d[taken], qq[taken], final_off[taken] = tried[better], moved[better], off_tried[better]
                X[better], e[better], off[better] = X_tried[better], e_tried[better], off_tried[better]
            if stalled.any():
                radius[live[stalled]] = 0.0
        q[rows] = qq
        return final_off, d, own
