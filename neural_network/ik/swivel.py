"""Arm swivel: after the refinement, turn each arm about its shoulder-hand line to where its shoulder and wrist sit
nearest the model's mean pose.

Why: on motion of styles the network never saw, the largest inner-joint error is the elbow's swivel (the turn of a
bent arm about the line from the shoulder to the hand): on bent arms about 30 degrees off, the elbow 8-10 cm off, and
the exact refinement keeps whatever swivel the network gave. The hand's orientation says much about the swivel (a
forearm turned the wrong way leaves the wrist twisted), and that geometric reading holds for any style. Measured in
docs/results.md ("Arm swivel").

For one arm, with S the shoulder joint (the Arm role's head), H the hand (on its target after the refinement) and
a = (H - S) / |H - S|, a turn R(phi) of the upper arm and the forearm together about a leaves the hand where it is
and as it is turned. In local terms (G a role's world rotation, L its local one, r(axis, angle) a quaternion):

    L_arm(phi) = L_arm * r(G_arm^T a, phi)        L_hand(phi) = L_hand * r(G_hand^T a, -phi)

and the elbow's own rotation does not change. The turn minimises

    f(phi) = |d_arm(phi) / w_arm|^2 + WRIST |d_hand(phi) / w_hand|^2 + STAY phi^2

with d_j = log(M_j^T L_j) the role's delta from the model's mean pose and w_j half the role's range in the model's
limits. One Gauss-Newton step from phi = 0 (d'(phi) = s J_r^-1(d) a, s = +1 for the arm and -1 for the hand; more
steps gain nothing measurable, docs/results.md), so the turn is a smooth function of the pose. It fades out where the
shoulder or the wrist is FADE half ranges (or WRAP radians) from the mean, where the mean pose says little; it is cut
back (bisection) so neither joint goes further past the model's limits than the refinement left it; and with the
Solver's memory it moves at most SPEED radians a second from the last tick's (a Bake: the last frame's), so a
shoulder-hand line that swings fast never turns an arm in a jump (the speed limit comes first: the limits' cut goes
no further than it allows).

One character is Python floats (two arms, a few dozen float operations each: cheaper than NumPy calls), a Bake's
frames too (in order, for the speed limit); BATCH_FROM characters or more run the same steps as array operations.
Pure NumPy and Python; no bpy.
"""

import math

import numpy as np

from ..geometry.quaternion_math import (
    axis_angle_excess,
    multiply_quaternions,
    quaternion_axis_angle,
    quaternion_product,
    turn_quaternion,
)
from ..geometry.rotations import quaternion_to_axis_angle
from ..skeleton.roles import ROLE_INDEX

WRIST = 2.0           # the wrist's weight against the shoulder's
STAY = 1.0            # cost of a radian of turn away from the network's swivel (squared)
MAX_STEP = 0.35       # radians, the largest turn
SPEED = 1.0           # radians a second: how fast an arm's turn may change from tick to tick (or frame to frame)
FADE = (1.5, 2.5)     # the turn fades out as the shoulder or the wrist is this far from the mean (in half ranges)
WRAP = (2.4, 2.9)     # ... or this many radians (a delta wraps at pi)
LIMIT_BISECTIONS = 5  # a step that takes a joint further past its limits is cut to within 1/32 of where it would
BATCH_FROM = 8        # this many characters together (not a Bake's frames, which run in order): the NumPy path
ARMS = tuple(tuple(ROLE_INDEX[side + name] for name in ("Arm", "ForeArm", "Hand")) for side in ("Left", "Right"))


class ArmSwivel:
    """The swivel stage of one rig and model: which arms it turns, their mean-pose rotations, ranges and limits."""

    def __init__(self, skeleton, mean_quaternions, limit_low, limit_high, slot_of):
        mask = skeleton.role_mask
        self.arms = []
        for arm in ARMS:
            if not all(mask[j] for j in arm):
                continue
            joints = []
            for role, sign in ((arm[0], 1.0), (arm[2], -1.0)):
                w, x, y, z = (float(c) for c in mean_quaternions[role])
                low = tuple(float(v) for v in limit_low[role])
                high = tuple(float(v) for v in limit_high[role])
                scale = tuple(1.0 / max(0.5 * (h - lo), 0.05) for lo, h in zip(low, high))
                squares = tuple(s * s for s in scale)
                weight = 1.0 if sign > 0 else WRIST
                joints.append((role, sign, (w, -x, -y, -z), squares, low, high, tuple(weight * c for c in squares)))
            self.arms.append((slot_of[arm[0]], slot_of[arm[2]], joints))

    @property
    def active(self):
        return bool(self.arms)

    def settle(self, q, world, memory=None, lines=None):
        """Turn the arms of q (K, 23, 4) local quaternions in place; world (K, 24, 4, 4) the refiner's slot transforms
        of q (Refiner.chain_forward). memory: the Solver's RefineMemory (refine_memory.py): an arm's turn moves at
        most SPEED * memory.dt from its last tick's (Bake: its last frame's), so it never flips between ticks (and
        fades out as gradually). lines: for one character, each arm's shoulder-hand line as the refinement already
        knows it (MathutilsRefiner.last_arm_lines: shoulder slot -> (the line in the shoulder's frame, in the hand's
        frame), or None where the hand sits on the shoulder); world is then not read. Returns how many arms turned."""
        if lines is None and len(q) >= BATCH_FROM and (memory is None or not memory.sequence):
            return self._settle_batch(q, world, memory)
        turned = 0
        rate = None if memory is None else SPEED * memory.dt
        for k in range(len(q)):
            row = 0 if memory is not None and memory.sequence else k
            last = memory.swivel[row].tolist() if memory is not None and memory.swivel_known[row] else None
            turns = []
            for a, (shoulder_slot, hand_slot, joints) in enumerate(self.arms):
                axes = lines[shoulder_slot] if lines is not None else _arm_lines(world[k], shoulder_slot, hand_slot)
                phi = 0.0 if axes is None else self._settle_arm(q[k], axes, joints, None if last is None else last[a],
                                                                rate)
                turned += phi != 0.0
                turns.append(phi)
            if memory is not None:
                memory.swivel[row, :len(turns)] = turns
                memory.swivel_known[row] = True
        return turned

    @staticmethod
    def _settle_arm(q, axes, joints, last=None, rate=None):
        """One arm of one character: q (23, 4) in place; axes: the shoulder-hand line (unit) in the shoulder's and in
        the hand's frame (G^T a); last: the arm's turn last tick (None: unknown), rate: the most it moves from there.
        Returns the turn. Written out in floats (the quaternion product, the log map and J_r^-1 inline, as
        _settle_batch's array functions): the live tick runs it every tick for both arms, and the calls were half
        its cost."""
        parts = []       # per joint: (role, sign, local axis, the delta quaternion at phi = 0, low, high, local, delta)
        far = wrap = 0.0   # how far from the mean pose the shoulder and the wrist are (half ranges, radians; squared)
        slope, curve, margin = 0.0, STAY, math.inf
        for (role, sign, (mw, mx, my, mz), (s0, s1, s2), low, high, (w0, w1, w2)), axis in zip(joints, axes):
            a0, a1, a2 = axis
            local = q[role].tolist()
            w, x, y, z = local
            delta0 = (mw * w - mx * x - my * y - mz * z, mw * x + mx * w + my * z - mz * y,    # M^-1 L
                      mw * y - mx * z + my * w + mz * x, mw * z + mx * y - my * x + mz * w)
            qw, qx, qy, qz = delta0
            s = math.sqrt(qx * qx + qy * qy + qz * qz)                  # d = log(M^-1 L), angle in [0, pi]
            scale = math.copysign(2.0 * math.atan2(s, abs(qw)) / max(s, 1e-300), qw)
            d0, d1, d2 = qx * scale, qy * scale, qz * scale
            t2 = d0 * d0 + d1 * d1 + d2 * d2
            far = max(far, d0 * d0 * s0 + d1 * d1 * s1 + d2 * d2 * s2)
            wrap = max(wrap, t2)
            # j = J_r^-1(d) a = a + d x a / 2 + c d x (d x a), c = 1/t^2 - (1 + cos t) / (2 t sin t)
            if t2 < 1e-8:
                c = 1.0 / 12.0
            else:
                t = math.sqrt(t2)
                c = 1.0 / t2 - (1.0 + math.cos(t)) / (2.0 * t * math.sin(t)) if t < 3.14 else 1.0 / t2
            x0, x1, x2 = d1 * a2 - d2 * a1, d2 * a0 - d0 * a2, d0 * a1 - d1 * a0
            j0 = a0 + 0.5 * x0 + c * (d1 * x2 - d2 * x1)
            j1 = a1 + 0.5 * x1 + c * (d2 * x0 - d0 * x2)
            j2 = a2 + 0.5 * x2 + c * (d0 * x1 - d1 * x0)
            slope += sign * (w0 * d0 * j0 + w1 * d1 * j1 + w2 * d2 * j2)    # the Gauss-Newton step's terms
            curve += w0 * j0 * j0 + w1 * j1 * j1 + w2 * j2 * j2
            margin = min(margin, d0 - low[0], d1 - low[1], d2 - low[2], high[0] - d0, high[1] - d1, high[2] - d2)
            parts.append((role, sign, axis, delta0, low, high, local, (d0, d1, d2)))
        # the turn fades out from FADE[0] to FADE[1] of that, where the mean pose says little (a hand held at an
        # angle no clip made, or near the half turn where the deltas wrap) and the turn could flip from tick to tick
        fade = min(1.0, (FADE[1] - math.sqrt(far)) / (FADE[1] - FADE[0]),
                   (WRAP[1] - math.sqrt(wrap)) / (WRAP[1] - WRAP[0]))
        phi = max(fade, 0.0) * max(-MAX_STEP, min(MAX_STEP, -slope / curve))
        least = 0.0         # the smallest turn the speed limit allows (the limits' cut goes no further)
        if last is not None:
            phi = max(last - rate, min(last + rate, phi))
            least = max(last - rate, min(last + rate, 0.0))
        # a turn by phi moves a delta by at most pi/2 |phi| (|J_r^-1| <= (t/2) / sin(t/2) <= pi/2): within the
        # margin no joint can cross a limit
        if 1.6 * abs(phi) >= margin:
            phi = _within_limits(parts, phi, least)
        if abs(phi) < 1e-7:
            return 0.0
        for role, sign, axis, _delta0, _low, _high, local, _d in parts:
            q[role] = quaternion_product(local, turn_quaternion(axis, sign * phi))
        return phi

    def _settle_batch(self, q, world, memory):
        """settle for many characters at once: _settle_arm's steps as array operations over the characters (the
        same numbers to rounding; tests/test_swivel.py holds the two together)."""
        k, turned = len(q), 0
        rate = None if memory is None else SPEED * memory.dt
        known = np.zeros(k, bool) if memory is None else memory.swivel_known[:k].copy()
        for a, (shoulder_slot, hand_slot, joints) in enumerate(self.arms):
            roles = [joint[0] for joint in joints]
            signs = np.array([joint[1] for joint in joints])
            mean_inverse = np.array([joint[2] for joint in joints])
            squares, low, high, weights = (np.array([joint[i] for joint in joints]) for i in (3, 4, 5, 6))
            line = world[:, hand_slot, :3, 3] - world[:, shoulder_slot, :3, 3]
            length = np.sqrt(np.einsum("ki,ki->k", line, line))
            line = line / np.maximum(length, 1e-300)[:, None]
            frames = np.stack([world[:, shoulder_slot, :3, :3], world[:, hand_slot, :3, :3]], axis=1)
            axes = np.einsum("kjab,ka->kjb", frames, line)                           # (K, 2, 3)
            local = q[:, roles]
            delta0 = multiply_quaternions(mean_inverse, local)
            d = quaternion_to_axis_angle(delta0)
            far = np.sqrt((d * d * squares).sum(-1).max(axis=1))
            wrap = np.sqrt((d * d).sum(-1)).max(axis=1)
            j = _inverse_jacobian_times_array(d, axes)
            slope = (weights * d * j * signs[:, None]).sum(axis=(1, 2))
            curve = STAY + (weights * j * j).sum(axis=(1, 2))
            margin = np.minimum(d - low, high - d).min(axis=(1, 2))
            past0 = (np.maximum(d - high, 0.0) + np.maximum(low - d, 0.0)).sum(axis=(1, 2))
            fade = np.maximum(np.minimum.reduce([np.ones(k), (FADE[1] - far) / (FADE[1] - FADE[0]),
                                                 (WRAP[1] - wrap) / (WRAP[1] - WRAP[0])]), 0.0)
            phi = fade * np.clip(-slope / curve, -MAX_STEP, MAX_STEP)
            least = np.zeros(k)
            if memory is not None:
                last = memory.swivel[:k, a]
                phi = np.where(known, np.clip(phi, last - rate, last + rate), phi)
                least = np.where(known, np.clip(0.0, last - rate, last + rate), 0.0)
            check = np.nonzero((1.6 * np.abs(phi) >= margin) & (length >= 1e-9))[0]
            if len(check):
                limits = (signs, low, high)
                crossing = check[_past_array(axes[check], delta0[check], phi[check], *limits) > past0[check] + 1e-9]
                if len(crossing):
                    lo, hi = np.zeros(len(crossing)), np.ones(len(crossing))
                    start, span = least[crossing], phi[crossing] - least[crossing]
                    for _ in range(LIMIT_BISECTIONS):
                        middle = 0.5 * (lo + hi)
                        past = _past_array(axes[crossing], delta0[crossing], start + middle * span, *limits)
                        fine = past <= past0[crossing] + 1e-9
                        lo, hi = np.where(fine, middle, lo), np.where(fine, hi, middle)
                    phi[crossing] = start + lo * span
            phi = np.where((np.abs(phi) < 1e-7) | (length < 1e-9), 0.0, phi)
            moving = np.nonzero(phi)[0]
            if len(moving):
                q[moving[:, None], roles] = multiply_quaternions(
                    local[moving], _turn_array(axes[moving], signs * phi[moving, None]))
            turned += len(moving)
            if memory is not None:
                memory.swivel[:k, a] = phi
        if memory is not None:
            memory.swivel_known[:k] = True
        return turned


def _arm_lines(world, shoulder_slot, hand_slot):
    """One character's shoulder-hand line (unit) in the shoulder's and the hand's frames (G^T a), from its slot
    transforms world (24, 4, 4); None where the hand sits on the shoulder."""
    shoulder, hand = world[shoulder_slot].tolist(), world[hand_slot].tolist()
    line = [hand[i][3] - shoulder[i][3] for i in range(3)]
    length = math.sqrt(line[0] * line[0] + line[1] * line[1] + line[2] * line[2])
    if length < 1e-9:
        return None
    lx, ly, lz = line[0] / length, line[1] / length, line[2] / length
    return tuple((r0[0] * lx + r1[0] * ly + r2[0] * lz, r0[1] * lx + r1[1] * ly + r2[1] * lz,
                  r0[2] * lx + r1[2] * ly + r2[2] * lz) for r0, r1, r2 in (shoulder[:3], hand[:3]))


def _within_limits(parts, phi, least=0.0):
    """_settle_arm's turn phi, or the turn nearest it between `least` and phi (bisection) that takes neither joint
    further past the limits (summed over their axes) than the refinement left them; `least` (0, or with a memory the
    smallest turn its speed limit allows) where none does: the speed limit comes first."""
    def past(turn):
        return sum(axis_angle_excess(quaternion_axis_angle(quaternion_product(delta0, turn_quaternion(axis, sign * turn))),
                                     low, high)
                   for _role, sign, axis, delta0, low, high, _local, _d in parts)

    past0 = sum(axis_angle_excess(d, low, high) for *_, low, high, _local, d in parts) + 1e-9
    if past(phi) <= past0:
        return phi
    low, high = 0.0, 1.0
    for _ in range(LIMIT_BISECTIONS):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if past(least + middle * (phi - least)) <= past0 else (low, middle)
    return least + low * (phi - least)


def _turn_array(axes, angles):
    """(..., 3) unit axes, (...) angles -> (..., 4) quaternions: turn_quaternion for arrays."""
    return np.concatenate([np.cos(0.5 * angles)[..., None], axes * np.sin(0.5 * angles)[..., None]], axis=-1)


def _past_array(axes, delta0, turn, signs, low, high):
    """(n,) how far the two joints of n arms are past their limits after turns `turn` (n,) (_settle_arm's past)."""
    d = quaternion_to_axis_angle(multiply_quaternions(delta0, _turn_array(axes, signs * turn[:, None])))
    return (np.maximum(d - high, 0.0) + np.maximum(low - d, 0.0)).sum(axis=(1, 2))


def _inverse_jacobian_times_array(v, a):
    """J_r^-1(v) a for (..., 3) axis-angles v: a + v x a / 2 + c v x (v x a), c = 1/t^2 - (1 + cos t) / (2 t sin t)."""
    t2 = (v * v).sum(-1)
    t = np.sqrt(t2)
    safe_t = np.where(t2 < 1e-8, 1.0, t)
    c = np.where(t2 < 1e-8, 1.0 / 12.0, np.where(t < 3.14, 1.0 / np.maximum(t2, 1e-300) - (1.0 + np.cos(safe_t)) / (
        2.0 * safe_t * np.sin(safe_t)), 1.0 / np.maximum(t2, 1e-300)))
    x = np.cross(v, a)
    return a + 0.5 * x + c[..., None] * np.cross(v, x)

