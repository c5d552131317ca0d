"""End twist: a hand, foot or head past the model's limits gives its roll to the bone above it; an arm also swings.

Why: with a hand pinned, its local rotation is whatever turns the forearm's frame into the target's. Where the
forearm's roll (the network's, kept by the refinement) differs from the clip's, the wrist takes the whole
difference: on 35 unseen Bandai clips with six targets pinned, 61 hand frames went past the model's limits by 23-43
degrees on average (up to 83) beyond what the clip's own wrist did (docs/results.md, "End twist"). Turning the
forearm about its own line (elbow to wrist) and the hand back by the same turn leaves every joint where it is and
the hand's world rotation as it is, and moves the roll from the wrist into the forearm, where a real arm's roll
happens. The feet (on the shins) and the head (on the upper neck, or the one neck bone a rig like Bandai's has) take
the same stage; their excess was smaller (1-2 degrees on the shins, 6-16 on the feet) and so is the roll a knee has
to give. A roll cannot undo a wrist bent past its limits (flexed, not rolled): after the roll, an arm swings as a
whole about its shoulder-hand line, the hand turned back, by the same kind of turn on the upper arm and the hand
(the elbow moves; the hand stays), for what lies more than SWING_MARGIN past the limits only (a clip's own wrist may
sit a little past them, and the least-excess elbow is not the clip's). A leg's swing was measured and left out: it
left more thigh and foot frames past, not fewer, and the inner joints further off.

For one limb with mid bone m and end bone e (local rotations L, mean-pose rotations M, the model's limits [low, high]
on each axis of d = log(M^-1 L)), a turn t about the line from the end's head to the mid's head:

    L_m(t) = L_m r(u_m, t)        L_e(t) = L_e r(u_e, -t)

with u_m the end's head offset in m's frame (unit) and u_e = L_e^-1 B_e^T u_m the same line in e's frame (B_e the
end's rest bridge). The turn minimises

    f(t) = sum over both joints and axes of (how far d lies past [low, high])^2 + STAY t^2

by Gauss-Newton from t = 0 (with a memory, from last tick's turn; d'(t) = s J_r^-1(d) u, s = +1 for the mid and -1
for the end), each step halved until f falls. It runs only for limbs with a joint past its limits at t = 0 (or a
turn still easing out); elsewhere f's only term is STAY t^2 and nothing turns. With the Solver's memory a limb's turn
moves at most SPEED radians a second from last tick's (a Bake: from the last frame's): where the least-cost turn
jumps (two rolls nearly as good, a forearm's limits meeting the hand's) the forearm rolls over instead of snapping,
and a turn no longer needed eases out. The swing is the same solve with the upper bone in the mid's place and the
line from its head to the end's (in the upper bone's frame: the mid's head offset plus B_m L_m times the end's).

An arm's or a leg's upper bone (the upper arm, the thigh) rolls as well, about its own line, the mid turned back by
as much: L_u(t1) = L_u r(a_u, t1), L_m = r(B_m^T a_u, -t1) L_m r(u_m, t2). Rolled together (t1 = t2) the thigh and
the foot turn the knee's bend axis about the shin, which takes back a knee bent sideways past a hinge's narrow limits
(neither roll alone does). The two turns minimise, before the arm's swing, how far the three joints lie past their
limits summed (not squared: as many joints as can come wholly within, rather than each a little past; on the
Bandai clips squared sums spread a thigh's excess over the knee and the foot) by a scan and a pattern search
(solve_two: f has several valleys and kinks), measured past a box INSIDE within the limits (the search stops within
its last step of a face, on either side).

One character (the live tick) is checked in Python floats (a NumPy call costs more than a joint's dozen float
operations), many characters or a Bake's frames in arrays; the turns themselves (a few limbs in a hundred) are solved
limb by limb in floats. Pure NumPy and Python; no bpy.
"""

import math

import numpy as np

from ..geometry.quaternion_math import (
    axis_angle_excess,
    axis_angle_quaternion,
    log_slope,
    matrix_times,
    matrix_transposed_times,
    multiply_quaternions,
    quaternion_axis_angle,
    quaternion_matrix,
    quaternion_product,
    turn_quaternion,
)
from ..geometry.rotations import quaternion_to_axis_angle
from ..skeleton.roles import ROLE_INDEX

STAY = 1e-8           # cost of a radian of twist (squared) against squared radians past the limits: a tie-break
MAX_TWIST = 1.6       # radians, the largest turn
SPEED = 2.0           # radians a second: how fast a limb's turn may change from tick to tick (or frame to frame)
STEPS = 6             # Gauss-Newton steps
HALVINGS = 6          # a step that does not lower f is halved this many times at most (then not taken)
SWING_MARGIN = 0.25   # radians: an arm swings only for what lies this far past the limits (the clip may go a little
                      # past them itself; the swing moves the elbow, the roll nothing)
LIMBS = tuple((ROLE_INDEX[mid], ROLE_INDEX[end]) for mid, end in (
    ("LeftForeArm", "LeftHand"), ("RightForeArm", "RightHand"), ("NeckUpper", "Head"), ("LeftShin", "LeftFoot"),
    ("RightShin", "RightFoot")))
UPPERS = {ROLE_INDEX[mid]: ROLE_INDEX[upper] for mid, upper in (     # an arm's upper bone: its swing
    ("LeftForeArm", "LeftArm"), ("RightForeArm", "RightArm"))}
ROLLED = {ROLE_INDEX[mid]: ROLE_INDEX[upper] for mid, upper in (     # a limb whose upper bone rolls too
    ("LeftForeArm", "LeftArm"), ("RightForeArm", "RightArm"), ("LeftShin", "LeftThigh"), ("RightShin", "RightThigh"))}
PATTERN = ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, -1), (1, -1), (-1, 1))   # the two-turn search's steps
PATTERN_STEP, PATTERN_END = 0.15, 1e-4     # radians: its first step, and the step it stops below
SCAN = (-1.2, -0.9, -0.6, -0.3, 0.3, 0.6, 0.9, 1.2)     # radians: the two-turn solve's other starts (clipped to its box)
INSIDE = 1e-3             # radians: the two-turn solve aims this far inside the limits (its search stops within
                          # PATTERN_END of a face, which left knees 0.001-0.05 degrees past on unseen Bandai clips)
LIVE_BOX, LIVE_STEP, LIVE_ROUNDS = 0.3, 0.01, 2   # a box narrower than LIVE_BOX (the memory's speed limit): no scan,
                                                  # a first step of LIVE_STEP and at most LIVE_ROUNDS rounds of the
                                                  # search, which goes on from there next tick


class EndTwist:
    """The twist stage of one rig and model: its limbs (each end and the mapped bone it hangs off; an arm's upper bone
    for its swing), their mean-pose rotations, limits and twist axes."""

    def __init__(self, skeleton, mean_quaternions, limit_low, limit_high):
        mask = skeleton.role_mask
        # each limb's end and the mapped bone it hangs off (a rig without an upper neck: the head on the lower one)
        self.limbs = [(m if mask[m] else int(skeleton.parents[e]), e) for m, e in LIMBS
                      if mask[e] and (mask[m] or (m == ROLE_INDEX["NeckUpper"] and mask[ROLE_INDEX["NeckLower"]]))]
        self.uppers = [UPPERS[m] if m in UPPERS and mask[UPPERS[m]] else None for m, _e in self.limbs]
        self.bridges, self.offsets = skeleton.bridges.tolist(), skeleton.offsets.tolist()
        mean_inverse = np.asarray(mean_quaternions, np.float64) * np.array([1.0, -1.0, -1.0, -1.0])
        low, high = (np.asarray(limit, np.float64).reshape(-1, 3) for limit in (limit_low, limit_high))
        joints = [j for limb in self.limbs for j in limb]                  # mid, end, mid, end, ...
        self.roles = np.array(joints, int)
        self.mean_inverse = mean_inverse[joints].reshape(-1, 2, 4)
        self.low, self.high = low[joints].reshape(-1, 2, 3), high[joints].reshape(-1, 2, 3)
        self.axes = self._axes(skeleton.bridges, skeleton.offsets)
        # a limb whose upper bone rolls as well (arms, legs; an arm's swing turns the same bone)
        self.rolled = [ROLLED[m] if m in ROLLED and mask[ROLLED[m]] else None for m, _e in self.limbs]
        self.rolled_limbs = np.array([i for i, u in enumerate(self.rolled) if u is not None], int)
        self.rolled_roles = np.array([u for u in self.rolled if u is not None], int)
        self.upper_mean_inverse = mean_inverse[self.rolled_roles]
        self.upper_low, self.upper_high = low[self.rolled_roles], high[self.rolled_roles]
        # the one-character check's constants as floats, per joint: M^-1, low, high, and cos^2 of half the angle a
        # turn from the mean stays within the limits below (the nearest face of the box, 2 where the mean is
        # outside); the mids and ends, then the rolled upper bones
        inside = np.minimum(-low, high).min(axis=-1)
        inside_cos2 = np.where(inside > 0.0, np.cos(0.5 * np.minimum(inside, np.pi)) ** 2, 2.0)

        def check(role):
            return (tuple(mean_inverse[role].tolist()), tuple(low[role].tolist()), tuple(high[role].tolist()),
                    float(inside_cos2[role]))

        self.upper_checks = [None if u is None else check(u) for u in self.rolled]
        self.checks = [check(j) for j in joints] + [self.upper_checks[i] for i in self.rolled_limbs.tolist()]
        # per checked joint and axis: half the nearer face's distance (negative where the mean lies outside)
        self.check_reach = [tuple(0.5 * min(-lo, hi) for lo, hi in zip(low, high)) for _m, low, high, _c in self.checks]
        self.check_limbs = [i for i in range(len(self.limbs)) for _s in (0, 1)] + self.rolled_limbs.tolist()
        self.check_roles = np.concatenate([self.roles, self.rolled_roles])
        self.upper_axes = self._upper_axes(skeleton.bridges, skeleton.offsets)

    @property
    def active(self):
        return bool(self.limbs)

    def _axes(self, bridges, offsets):
        """(..., limbs, 2, 3): u_m, the end's head offset in the mid's frame (unit), and B_e^T u_m (u_e before L_e^-1),
        from the rig's bridges and offsets ((23, 3, 3), (23, 3), or per character with a leading K axis)."""
        ends = [e for _m, e in self.limbs]
        line = np.asarray(offsets, np.float64)[..., ends, :]
        line = line / np.maximum(np.linalg.norm(line, axis=-1, keepdims=True), 1e-300)
        in_end = np.einsum("...ba,...b->...a", np.asarray(bridges, np.float64)[..., ends, :, :], line)
        return np.stack([line, in_end], axis=-2)

    def _upper_axes(self, bridges, offsets):
        """(..., limbs, 2, 3) for the rolled limbs (zeros elsewhere): a_u, the mid's head offset in the upper bone's
        frame (unit: the upper bone's own line), and B_m^T a_u, the same line in the frame the mid's local rotation
        turns from."""
        offsets, bridges = np.asarray(offsets, np.float64), np.asarray(bridges, np.float64)
        out = np.zeros(offsets.shape[:-2] + (len(self.limbs), 2, 3))
        for i, upper in enumerate(self.rolled):
            if upper is None:
                continue
            mid = self.limbs[i][0]
            line = offsets[..., mid, :]
            line = line / np.maximum(np.linalg.norm(line, axis=-1, keepdims=True), 1e-300)
            out[..., i, 0, :] = line
            out[..., i, 1, :] = np.einsum("...ba,...b->...a", bridges[..., mid, :, :], line)
        return out

    def _past_one(self, q):
        """Indices of the limbs of one character (q (23, 4)) with a joint past its limits, in Python floats (the
        product M^-1 L and its log map written out: a call costs as much as a joint's arithmetic). A joint turned
        from the mean by less than the nearest face of its limits' box is inside: |w| of M^-1 L says so. So is one
        whose every axis i has 2 |v_i| / |w| within the nearer face (v the vector part: the log map's angle over the
        half angle's sine is at most 1 / cos of the half angle)."""
        past = []
        for i, ((w, x, y, z), ((mw, mx, my, mz), low, high, inside_cos2), (r0, r1, r2)) in enumerate(
                zip(q.take(self.check_roles, axis=0).tolist(), self.checks, self.check_reach)):
            qw = mw * w - mx * x - my * y - mz * z
            if qw * qw >= inside_cos2:
                continue
            qx, qy, qz = mw * x + mx * w + my * z - mz * y, mw * y - mx * z + my * w + mz * x, mw * z + mx * y - my * x + mz * w
            aw = abs(qw)
            if abs(qx) <= aw * r0 and abs(qy) <= aw * r1 and abs(qz) <= aw * r2:
                continue
            s = math.sqrt(qx * qx + qy * qy + qz * qz)
            scale = math.copysign(2.0 * math.atan2(s, abs(qw)) / max(s, 1e-300), qw)
            if not (low[0] <= qx * scale <= high[0] and low[1] <= qy * scale <= high[1]
                    and low[2] <= qz * scale <= high[2]):
                past.append(self.check_limbs[i])
        return past

    def settle(self, q, bridges=None, offsets=None, memory=None):
        """Turn the limbs of q (K, 23, 4) local quaternions in place where a joint is past its limits. bridges,
        offsets: per-character links ((K, 23, 3, 3), (K, 23, 3)), or None for the rig's own. memory: the Solver's
        RefineMemory (refine_memory.py): a limb's turn moves at most SPEED * memory.dt from its last tick's (a Bake:
        its last frame's, the frames in order), so it never flips between ticks and eases out as gradually. Returns
        how many turns (rolls and swings) it made."""
        if memory is None or not memory.sequence:
            return self._settle(q, bridges, offsets, memory)
        turned = 0
        for i in range(len(q)):            # frames of one character in order: each turn held to the one before
            links = (None, None) if bridges is None else (bridges[i:i + 1], offsets[i:i + 1])
            turned += self._settle(q[i:i + 1], *links, memory)
        return turned

    def _settle(self, q, bridges, offsets, memory):
        """settle for characters q (memory rows 0 to K - 1). One character without a limb to turn, the usual live
        tick, costs the float check and no NumPy call."""
        k, n = len(q), len(self.limbs)
        if k == 1:
            past = self._past_one(q[0])
            if not past and memory is not None and memory.twist_still[0]:
                return 0                     # nothing past, nothing turned last tick: nothing to read or remember
            known = memory is not None and bool(memory.twist_known[0])
            last = (memory.twist[0, :n].tolist(), memory.swing[0, :n].tolist(), memory.upper_roll[0, :n].tolist()) \
                if known else ([0.0] * n, [0.0] * n, [0.0] * n)
            pairs = [(0, limb) for limb in range(n) if limb in past or any(moves[limb] != 0.0 for moves in last)]
            if not pairs and (known or memory is None):
                return 0
            known, last = [known], [last]
        else:
            known = np.zeros(k, bool) if memory is None else memory.twist_known[:k].copy()
            moves = [np.zeros((k, n))] * 3 if memory is None else [
                np.where(known[:, None], remembered[:k, :n], 0.0)
                for remembered in (memory.twist, memory.swing, memory.upper_roll)]
            d = quaternion_to_axis_angle(multiply_quaternions(self.mean_inverse, q[:, self.roles].reshape(k, n, 2, 4)))
            needed = ((d < self.low) | (d > self.high)).any(axis=(2, 3)) | (np.stack(moves) != 0.0).any(axis=0)
            if len(self.rolled_limbs):
                d = quaternion_to_axis_angle(multiply_quaternions(self.upper_mean_inverse, q[:, self.rolled_roles]))
                needed[:, self.rolled_limbs] |= ((d < self.upper_low) | (d > self.upper_high)).any(axis=2)
            pairs = list(zip(*(index.tolist() for index in np.nonzero(needed))))
            known, last = known.tolist(), list(zip(*(move.tolist() for move in moves)))
        turns = tuple([[0.0] * n for _ in range(k)] for _move in range(3))       # rolls, swings, upper rolls
        if pairs:
            axes = self.axes if bridges is None else self._axes(bridges, offsets)
            upper_axes = self.upper_axes if bridges is None else self._upper_axes(bridges, offsets)
            rate = SPEED * memory.dt if memory is not None else 0.0

            def bounds(row, start):
                """The turn's box and where it starts: within SPEED of last tick's with a memory."""
                lower, upper = (max(start - rate, -MAX_TWIST), min(start + rate, MAX_TWIST)) if known[row] \
                    else (-MAX_TWIST, MAX_TWIST)
                return min(max(start, lower), upper), lower, upper

            for row, limb in pairs:
                links = (self.bridges, self.offsets) if bridges is None else (bridges[row], offsets[row])
                line = (axes[limb] if bridges is None else axes[row, limb]).tolist()
                if self.rolled[limb] is not None:          # the upper bone's roll and the mid's, together
                    chain = self._chain_joints(q[row], limb, line, (upper_axes[limb] if bridges is None
                                                                    else upper_axes[row, limb]).tolist())
                    first, second = bounds(row, last[row][2][limb]), bounds(row, last[row][0][limb])
                    t1, t2 = solve_two(chain, (first[0], second[0]), (first[1], second[1]), (first[2], second[2]))
                    t1 = turns[2][row][limb] = t1 if abs(t1) > 1e-9 else 0.0
                    t2 = turns[0][row][limb] = t2 if abs(t2) > 1e-9 else 0.0
                    if t1 != 0.0 or t2 != 0.0:
                        for role, local in zip((self.rolled[limb], *self.limbs[limb]), chain_turned(chain, t1, t2)):
                            q[row, role] = local
                else:
                    joints = self._joints(q[row], limb, line)
                    start, lower, upper = bounds(row, last[row][0][limb])
                    t = solve(joints, start, lower, upper)
                    t = turns[0][row][limb] = t if abs(t) > 1e-9 else 0.0   # eased out: done (not 1e-18)
                    _turned(q[row], self.limbs[limb], joints, t)
                if self.uppers[limb] is not None:          # then an arm's swing
                    joints = self._swing_joints(q[row], limb, *links)
                    start, lower, upper = bounds(row, last[row][1][limb])
                    t = solve(joints, start, lower, upper)
                    t = turns[1][row][limb] = t if abs(t) > 1e-9 else 0.0
                    _turned(q[row], (self.uppers[limb], self.limbs[limb][1]), joints, t)
        if memory is not None:
            memory.twist[:k, :n], memory.swing[:k, :n], memory.upper_roll[:k, :n] = turns
            memory.twist_known[:k] = True
            memory.twist_still[:k] = [not any(move[row][limb] for move in turns for limb in range(n)) for row in range(k)]
        return sum(t != 0.0 for move in turns for row in move for t in row)

    def _chain_joints(self, q, limb, line, upper_line):
        """A rolled limb of one character (q (23, 4)) for solve_two: per joint (upper, mid, end) its local rotation,
        M^-1, limits; the upper's roll axis a_u (its own line), the mid's B_m^T a_u (turned by -t1 before its local
        rotation) and u_m (after it), the end's u_e = L_e^-1 B_e^T u_m."""
        upper, (mid, end) = self.rolled[limb], self.limbs[limb]
        u_check = self.upper_checks[limb]
        end_rows = quaternion_matrix(q[end].tolist())
        u_end = matrix_transposed_times(end_rows, line[1])
        (m_mean, m_low, m_high, _i), (e_mean, e_low, e_high, _j) = self.checks[2 * limb:2 * limb + 2]
        return ((tuple(q[upper].tolist()), u_check[0], u_check[1], u_check[2], tuple(upper_line[0])),
                (tuple(q[mid].tolist()), m_mean, m_low, m_high, tuple(upper_line[1]), tuple(line[0])),
                (tuple(q[end].tolist()), e_mean, e_low, e_high, tuple(u_end)))

    def _swing_joints(self, q, limb, bridges, offsets):
        """One limb of one character for `solve`, turned as a whole about the line from its upper bone's head to its
        end's (the end turned back): per joint (upper, end) its delta from the mean pose, the line in its own frame,
        its limits. The line in the upper bone's frame: the mid's head offset plus B_m L_m times the end's; in the
        end's frame: (B_m L_m B_e L_e)^T times that."""
        (mid, end), upper = self.limbs[limb], self.uppers[limb]
        mid_rows, end_rows = quaternion_matrix(q[mid].tolist()), quaternion_matrix(q[end].tolist())
        line = [a + b for a, b in zip(offsets[mid], matrix_times(bridges[mid], matrix_times(mid_rows, offsets[end])))]
        length = math.sqrt(line[0] * line[0] + line[1] * line[1] + line[2] * line[2])
        if length < 1e-12:
            line = (0.0, 0.0, 0.0)
        else:
            line = (line[0] / length, line[1] / length, line[2] / length)
        in_end = matrix_transposed_times(end_rows, matrix_transposed_times(bridges[end], matrix_transposed_times(
            mid_rows, matrix_transposed_times(bridges[mid], line))))
        (mean_upper, low_upper, high_upper, _u), (mean_end, low_end, high_end, _e) = \
            self.upper_checks[limb], self.checks[2 * limb + 1]
        wider = [tuple(v - SWING_MARGIN for v in low) for low in (low_upper, low_end)], \
            [tuple(v + SWING_MARGIN for v in high) for high in (high_upper, high_end)]
        return ((quaternion_product(mean_upper, q[upper].tolist()), line, wider[0][0], wider[1][0]),
                (quaternion_product(mean_end, q[end].tolist()), in_end, wider[0][1], wider[1][1]))

    def _joints(self, q, limb, axes):
        """One limb of one character (q (23, 4)) for `solve`: per joint (mid, end) its delta from the mean pose
        M^-1 L, its turn's axis in its own frame (u_m; u_e = L_e^-1 B_e^T u_m), its limits."""
        (mid, end), (line, in_end) = self.limbs[limb], axes
        end_rows = quaternion_matrix(q[end].tolist())               # L_e as rows: L_e^-1 w = L_e^T w
        u_end = matrix_transposed_times(end_rows, in_end)
        checks = self.checks[2 * limb:2 * limb + 2]
        return tuple((quaternion_product(mean_inverse, q[role].tolist()), u, low, high)
                     for role, u, (mean_inverse, low, high, _inside) in zip((mid, end), (tuple(line), u_end), checks))


SIGNS = (1.0, -1.0)      # the mid (or upper) bone turns by t, the end by -t


def _turned(q, roles, joints, t):
    """One character's q (23, 4) in place: the two joints `roles` of a `solve` turned by t and -t about their axes."""
    if t != 0.0:
        for role, sign, (_delta0, u, _low, _high) in zip(roles, SIGNS, joints):
            q[role] = quaternion_product(q[role].tolist(), axis_angle_quaternion(
                (u[0] * sign * t, u[1] * sign * t, u[2] * sign * t)))


def _inside(low, high):
    """The limits' box with each face moved INSIDE in (where the box is wider than twice that): what the turns aim at."""
    return (tuple(lo + INSIDE if hi - lo > 2 * INSIDE else lo for lo, hi in zip(low, high)),
            tuple(hi - INSIDE if hi - lo > 2 * INSIDE else hi for lo, hi in zip(low, high)))


def limb_cost(joints, t):
    """f(t) for one limb (`joints` as EndTwist._joints gives), and per joint its delta d(t) and residuals (how far
    each axis of d lies past its limits, signed)."""
    cost, parts = STAY * t * t, []
    for (delta0, u, low, high), sign in zip(joints, SIGNS):
        a = sign * t
        d = quaternion_axis_angle(quaternion_product(delta0, axis_angle_quaternion((u[0] * a, u[1] * a, u[2] * a))))
        residual = tuple(max(d[i] - high[i], 0.0) + min(d[i] - low[i], 0.0) for i in range(3))
        cost += residual[0] * residual[0] + residual[1] * residual[1] + residual[2] * residual[2]
        parts.append((d, residual))
    return cost, parts


def solve(joints, start=0.0, lower=-MAX_TWIST, upper=MAX_TWIST):
    """One limb's turn: Gauss-Newton on f from `start`, every trial clipped to [lower, upper], each step halved until
    f falls (the turn stays where it is when no halving lowers f)."""
    t = start
    cost, parts = limb_cost(joints, t)
    for _ in range(STEPS):
        slope, curve = STAY * t, STAY
        for (d, residual), (_delta0, u, _low, _high), sign in zip(parts, joints, SIGNS):
            if residual == (0.0, 0.0, 0.0):
                continue
            j = log_slope(d, u)
            for i in range(3):
                if residual[i] != 0.0:
                    slope += sign * residual[i] * j[i]
                    curve += j[i] * j[i]
        step = -slope / curve
        if abs(step) <= 1e-7:
            break
        for _ in range(HALVINGS):
            trial = min(max(t + step, lower), upper)
            trial_cost, trial_parts = limb_cost(joints, trial)
            if trial_cost < cost:
                t, cost, parts = trial, trial_cost, trial_parts
                break
            step *= 0.5
        else:
            break
    return t


def chain_turned(chain, t1, t2):
    """The three local rotations of a rolled limb (`chain` as EndTwist._chain_joints gives) after the upper bone's
    roll t1 (the mid turned back by as much) and the mid's roll t2 (the end turned back): L_u r(a_u, t1),
    r(B_m^T a_u, -t1) L_m r(u_m, t2), L_e r(u_e, -t2). No joint moves; the mid and the end keep their world rotations
    but for the mid's own roll."""
    (upper, _um, _ul, _uh, a_u), (mid, _mm, _ml, _mh, back, a_m), (end, _em, _el, _eh, u_e) = chain
    return (quaternion_product(upper, turn_quaternion(a_u, t1)),
            quaternion_product(quaternion_product(turn_quaternion(back, -t1), mid), turn_quaternion(a_m, t2)),
            quaternion_product(end, turn_quaternion(u_e, -t2)))


def _cost_parts(chain):
    """_parts_cost's constants for a rolled limb (`chain` as EndTwist._chain_joints gives). A turn r(a, t) =
    cos(t/2) + sin(t/2) (0, a), so each joint's delta from the mean pose is a sum of a few fixed quaternions weighted
    by the turns' cosines and sines: the upper's M_u^-1 L_u r(a_u, t1) = c1 P + s1 P a_u; the mid's
    r(M_m^-1 b, -t1) M_m^-1 L_m r(a_m, t2) = c1 c2 P + c1 s2 P a - s1 c2 b P - s1 s2 b P a; the end's c2 P - s2 P u_e
    (products with pure quaternions (0, v) written v). Returns those with the limits, each face moved INSIDE in (_inside)."""
    (upper, u_mean, u_low, u_high, a_u), (mid, m_mean, m_low, m_high, back, a_m), (end, e_mean, e_low, e_high, u_e) \
        = chain
    def pure(v):
        return 0.0, v[0], v[1], v[2]

    u_low, u_high = _inside(u_low, u_high)
    m_low, m_high = _inside(m_low, m_high)
    e_low, e_high = _inside(e_low, e_high)

    p_u, p_m, p_e = quaternion_product(u_mean, upper), quaternion_product(m_mean, mid), quaternion_product(e_mean, end)
    b = pure(matrix_times(quaternion_matrix(m_mean), back))
    b_p = quaternion_product(b, p_m)
    return ((p_u, quaternion_product(p_u, pure(a_u)), u_low, u_high),
            (p_m, quaternion_product(p_m, pure(a_m)), b_p, quaternion_product(b_p, pure(a_m)), m_low, m_high),
            (p_e, quaternion_product(p_e, pure(u_e)), e_low, e_high))


def _parts_cost(parts, t1, t2):
    """f(t1, t2) for a rolled limb, from _cost_parts' constants (a search evaluates it a hundred times or more): the
    radians its three joints lie past their limits, summed over the axes (not squared: the turns then leave as many
    joints as they can wholly within their limits, rather than each a little past), plus STAY per radian of each turn
    (squared)."""
    (p_u, pa_u, u_low, u_high), (p_m, pa_m, bp_m, bpa_m, m_low, m_high), (p_e, pu_e, e_low, e_high) = parts
    c1, s1, c2, s2 = math.cos(0.5 * t1), math.sin(0.5 * t1), math.cos(0.5 * t2), math.sin(0.5 * t2)
    cc, cs, sc, ss = c1 * c2, c1 * s2, s1 * c2, s1 * s2
    upper = tuple(c1 * a + s1 * b for a, b in zip(p_u, pa_u))
    mid = tuple(cc * a + cs * b - sc * c - ss * d for a, b, c, d in zip(p_m, pa_m, bp_m, bpa_m))
    end = tuple(c2 * a - s2 * b for a, b in zip(p_e, pu_e))
    return (STAY * (t1 * t1 + t2 * t2) + axis_angle_excess(quaternion_axis_angle(upper), u_low, u_high)
            + axis_angle_excess(quaternion_axis_angle(mid), m_low, m_high)
            + axis_angle_excess(quaternion_axis_angle(end), e_low, e_high))


def solve_two(chain, start=(0.0, 0.0), lower=(-MAX_TWIST, -MAX_TWIST), upper=(MAX_TWIST, MAX_TWIST)):
    """A rolled limb's two turns: the least f (_parts_cost) in the box [lower, upper], from the best of `start` and a
    scan over the box's diagonal and axes (f has several valleys), by a pattern search (steps along the axes and the
    diagonals, halved when none lowers f: f has kinks where a joint meets its limits, which stall slopes). In a box
    narrower than LIVE_BOX (a live tick's or a Bake frame's, held to SPEED) no scan and at most LIVE_ROUNDS rounds
    from a LIVE_STEP step: the next tick goes on from where this one stopped."""
    parts = _cost_parts(chain)

    def clip(t):
        return min(max(t[0], lower[0]), upper[0]), min(max(t[1], lower[1]), upper[1])

    # the box's point nearest no turn: where all three joints are within their limits there, it is the least f
    # (the common case: a turn easing out, or no turn at all)
    t = clip((0.0, 0.0))
    cost = _parts_cost(parts, *t)
    if cost <= STAY * (t[0] * t[0] + t[1] * t[1]):
        return t
    narrow = max(upper[0] - lower[0], upper[1] - lower[1]) < LIVE_BOX      # a live tick's (or a Bake frame's) box
    tried = {t}
    for trial in [clip(start)] + ([] if narrow else [clip(point) for c in SCAN for point in ((c, c), (c, 0.0),
                                                                                              (0.0, c))]):
        if trial in tried:                          # starts the box clips to one point: tried once
            continue
        tried.add(trial)
        trial_cost = _parts_cost(parts, *trial)
        if trial_cost < cost:
            t, cost = trial, trial_cost
    step = min(LIVE_STEP if narrow else PATTERN_STEP, 0.5 * max(upper[0] - lower[0], upper[1] - lower[1]))
    rounds = 0
    while step > PATTERN_END and not (narrow and rounds >= LIVE_ROUNDS):
        moved, rounds = False, rounds + 1
        for dx, dy in PATTERN:
            trial = clip((t[0] + dx * step, t[1] + dy * step))
            trial_cost = _parts_cost(parts, *trial)
            if trial_cost < cost:
                t, cost, moved = trial, trial_cost, True
        if not moved:
            step *= 0.5
    return t
