"""Reach assist: the closed-form step before the refiner's two-bone solve that moves what that solve cannot.

For a chain whose target is beyond its reach, the chain's parent - Spine2 for the head, the clavicle for an arm - turns
about its head by the smallest rotation that brings the target within reach (law of cosines; at most ASSIST_MAX_TURN,
inside the limits). When no Spine2 turn can (the network bent the spine more than the pose: a near-straight neck's
target is then out of every Spine2 turn's reach), the spine unbends instead: Spine2 and Spine1 bend in their planes
just enough, then Spine swings the neck's base onto the nearest point within reach. The head goes first because the
clavicles hang off the spine. Only characters with a chain beyond reach pay for it (a within-reach tick pays one check
of a few calls); on the shipped model's held-out clips it takes the share of ticks needing least squares from 100% to
a few percent. It works one character at a time in Python floats (a turn is a few dozen float operations, far cheaper
at K = 1 than NumPy calls on whole subtrees), then one forward pass; a character with a chain it cannot bring within
reach is left to least squares untouched (but for the clavicles' turns toward an arm's target). A leg beyond reach
(the hips are given: no turn helps it) does not stop the assist of the arms and the head: least squares runs anyway,
and a hand the assist lands stays landed through it (a hand left to least squares instead came a few millimetres
short while a foot was dragged beyond reach).

The Refiner (refine.py) owns the chain layout, the forward pass and the workspace; ReachAssist holds the assist's own
constants (which parents turn, the spine's, the chains' reaches) and is called by Refiner.refine_quaternions: first
rows_beyond_reach on the |t|^2 the closed form's first step left, then apply for those characters. Pure NumPy and
Python floats; no bpy.
"""

import math
from typing import NamedTuple

import numpy as np

from ..geometry.quaternion_math import (
    axis_angle_quaternion,
    matrix_times,
    matrix_transposed_times,
    quaternion_axis_angle,
    quaternion_matrix,
    quaternion_product,
    rotation_about,
)
from ..skeleton.roles import ROLE_INDEX

# The largest turn (radians) of a chain's parent joint that brings its target into reach; a target that needs more is
# left to least squares. The turn aims this fraction inside the reach so the limb keeps a hint of bend.
ASSIST_MAX_TURN = 0.35
ASSIST_SLACK = 1e-6
SPINE_SLACK = 1e-6     # the spine's closed form aims this fraction inside the reaches it bends to
# The chains whose parents turn together, in the order they must turn: the head's (Spine2) first, since the clavicles
# hang off it, then both arms'. Legs hang off the given hips: none.
GROUP_CHAINS = ((4,), (0, 1))


# -- vector helpers: one character at a time in Python floats (3-tuples; matrices as row tuples) ----------------------

def _sub(a, b):
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def _dot(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def _cross3(a, b):
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


def _length(a):
    return math.sqrt(a[0] * a[0] + a[1] * a[1] + a[2] * a[2])


def _scaled(a, s):
    return (a[0] * s, a[1] * s, a[2] * s)


def _matrix_product(A, B):
    columns = tuple(zip(*B))
    return tuple(tuple(_dot(row, column) for column in columns) for row in A)


def _turn_point(M, pivot, x):
    """x turned by M about pivot."""
    d = matrix_times(M, _sub(x, pivot))
    return (pivot[0] + d[0], pivot[1] + d[1], pivot[2] + d[2])


def _frame(matrix):
    """A 4x4 transform (nested lists) -> (rotation rows, position)."""
    return matrix[:3], (matrix[0][3], matrix[1][3], matrix[2][3])


def _turned_quaternion(q, R, n, angle):
    """The local quaternion q of a joint with world rotation R after it turns by `angle` about the world unit axis n:
    q * (the same turn about R^T n, n in the joint's own frame)."""
    b = matrix_transposed_times(R, n)
    s = math.sin(0.5 * angle)
    return quaternion_product(q, (math.cos(0.5 * angle), b[0] * s, b[1] * s, b[2] * s))


def _within_limits(q, mean_conjugate, low, high):
    x, y, z = quaternion_axis_angle(quaternion_product(mean_conjugate, q))
    return low[0] <= x <= high[0] and low[1] <= y <= high[1] and low[2] <= z <= high[2]


def _turn_point_about(n, angle, pivot, x):
    """x turned by `angle` about the unit axis n through pivot (Rodrigues, without building the matrix)."""
    vx, vy, vz = x[0] - pivot[0], x[1] - pivot[1], x[2] - pivot[2]
    nx, ny, nz = n
    c, s = math.cos(angle), math.sin(angle)
    k = (nx * vx + ny * vy + nz * vz) * (1.0 - c)
    return (pivot[0] + vx * c + (ny * vz - nz * vy) * s + nx * k, pivot[1] + vy * c + (nz * vx - nx * vz) * s + ny * k,
            pivot[2] + vz * c + (nx * vy - ny * vx) * s + nz * k)


def _bend_angle(r, e, a, reach):
    """The two-bone elbow's law of cosines for a spine joint with head e, bone from r, and the neck's base a: the turn
    (unit axis = the normal of the plane (e - r, a - e), angle) that makes |a - r| = reach, or None when that turn is
    not possible (out of reach, no plane) or larger than ASSIST_MAX_TURN."""
    u, v = _sub(e, r), _sub(a, e)
    l1, l2 = _length(u), _length(v)
    normal = _cross3(u, v)
    n_len = _length(normal)
    if not (l1 * l2 > 0.0 and n_len > 1e-9 * l1 * l2):
        return None
    cos_inner = (l1 * l1 + l2 * l2 - reach * reach) / (2.0 * l1 * l2)
    if abs(cos_inner) > 1.0 + 1e-6:
        return None
    phi = math.acos(min(max(-cos_inner, -1.0), 1.0)) - math.atan2(n_len, _dot(u, v))
    if abs(phi) > ASSIST_MAX_TURN:
        return None
    return _scaled(normal, 1.0 / n_len), phi


def _nearest_in_both(a, t, reach, spine_length):
    """The point nearest a within `reach` of t and within `spine_length` of the origin (the spine's root): a projected
    onto the ball about t, and when that is too far from the root, onto the circle where the two spheres meet (a
    target at the edge of what the straight spine and neck reach leaves only a thin lens). Where the balls do not
    meet, the root's straight line toward t at spine_length."""
    miss = _sub(a, t)
    d = _length(miss)
    s = min(1.0, reach / max(d, 1e-300))
    inside = (t[0] + miss[0] * s, t[1] + miss[1] * s, t[2] + miss[2] * s)
    if _dot(inside, inside) <= spine_length * spine_length:
        return inside
    distance = max(_length(t), 1e-300)
    e = _scaled(t, 1.0 / distance)
    if distance > reach + spine_length:
        return _scaled(e, spine_length)
    along = (distance * distance + spine_length * spine_length - reach * reach) / (2.0 * distance)
    radius = math.sqrt(max(spine_length * spine_length - along * along, 0.0))
    side = _sub(a, _scaled(e, _dot(a, e)))
    side = _scaled(side, radius / max(_length(side), 1e-300))
    return (along * e[0] + side[0], along * e[1] + side[1], along * e[2] + side[2])


def _swing_beyond_limit(bone, lower, goal, length, upper):
    """Whether Spine's swing in _straighten_spine surely exceeds ASSIST_MAX_TURN, from distances alone (before the
    bends are worked out). After the bends the neck's base sits at `length` from Spine's head and `upper` from Spine1's
    (both bends keep the distance they do not set), so its angle to Spine's bone (`bone`, of length `lower`) is fixed
    by the law of cosines; the swing onto `goal` (also at `length`) is at least the difference of the two angles to
    that axis. A margin keeps rounding from ever skipping a swing the full computation would allow."""
    if not lower * length > 0.0:
        return False
    cos_now = (lower * lower + length * length - upper * upper) / (2.0 * lower * length)
    cos_goal = _dot(bone, goal) / (lower * length)
    gap = abs(math.acos(min(max(cos_now, -1.0), 1.0)) - math.acos(min(max(cos_goal, -1.0), 1.0)))
    return gap > ASSIST_MAX_TURN + 1e-6


class _AssistGroup(NamedTuple):
    """Chains whose parents the reach assist turns together (see ReachAssist.for_refiner)."""
    chains: np.ndarray          # (c,) chain indices
    enabled: np.ndarray         # (c,) bool
    roles: tuple                # (c,) the parents' roles, then (head group) the spine's: the quaternions read
    role_index: np.ndarray      # the same as an index array
    slots: np.ndarray           # each chain's parent slot and upper slot, then (head group) the spine's: transforms read
    limits: tuple               # per chain: the parent's (mean quaternion, its conjugate, low, high, surely_inside)


class _SpineBend(NamedTuple):
    """Spine, Spine1 and Spine2 below the neck (see _straighten_spine)."""
    roles: tuple                # Spine, Spine1, Spine2
    slots: np.ndarray           # (3,)
    upper_length: float         # |p1 - a| with the upper spine straight: Spine1's and Spine2's bone lengths
    limits: tuple               # per joint: (mean conjugate, low, high)


def _turn_parents(group, frames, quaternions, targets, reach):
    """One character: for each chain of `group` whose target t is beyond the reach R of its upper + mid bones
    (|t - a| > R, a the upper bone's head), the smallest turn of its parent about the parent's head p that brings t
    within reach: in the plane of a - p and t - p, turn a - p toward t - p until |t - a'| = R (law of cosines).
    A turn that takes the parent outside its limits is clamped to them (the clamped turn is the one applied). For
    the head's chain, turns larger than ASSIST_MAX_TURN, and targets no turn brings within reach, are left alone (the
    spine's straightening and the head stage's job). A clavicle turns as far as it can toward that instead:
    ASSIST_MAX_TURN, or toward the target itself where no turn brings it within reach, or to its limits; its arm
    stays beyond reach and least squares moves the spine for the rest. So what least squares starts from goes
    continuously into what the assist lands once the target is back within a turn's reach (from the network's
    clavicle, least squares had moved the spine, which snapped back the tick after: a straight elbow of the other
    arm turned 18-23 degrees in one tick, docs/results.md). Returns {role: new local quaternion} - for the head's
    chain also the turn's rotation and pivot under key "turn" (the spine's straightening goes on from the turned
    pose) - and the chains left beyond reach."""
    new, missed = {}, []
    for i, chain in enumerate(group.chains.tolist()):
        R_p, p = _frame(frames[2 * i])
        a = _frame(frames[2 * i + 1])[1]
        t, r = targets[chain], reach[chain]
        miss = _sub(t, a)
        if not _dot(miss, miss) > r * r:
            continue
        missed.append(chain)
        if not group.enabled[i]:
            continue
        P, D = _sub(a, p), _sub(t, p)
        cross = _cross3(P, D)
        sine = _length(cross)
        if not sine > 0.0:                   # no plane to turn in (and no division by a zero length below)
            continue
        A2, T2 = _dot(P, P), _dot(D, D)
        goal = r * (1.0 - ASSIST_SLACK)
        cos_goal = (T2 + A2 - goal * goal) / (2.0 * math.sqrt(A2 * T2))
        head, toward = chain == 4, not cos_goal <= 1.0
        if toward:                          # no turn brings t within reach: a clavicle turns toward it
            if head or cos_goal != cos_goal:
                continue
            cos_goal = 1.0
        turn = math.atan2(sine, _dot(P, D)) - math.acos(max(cos_goal, -1.0))
        lands = turn <= ASSIST_MAX_TURN and not toward
        if not turn <= ASSIST_MAX_TURN:
            if head:
                continue
            turn = ASSIST_MAX_TURN
        n = _scaled(cross, 1.0 / sine)
        q_old = tuple(quaternions[i])
        q_new = _turned_quaternion(q_old, R_p, n, turn)
        M = None
        mean, mean_conjugate, low, high, surely_inside = group.limits[i]
        delta = quaternion_product(mean_conjugate, q_new)
        if abs(delta[0]) < surely_inside:
            delta = quaternion_axis_angle(delta)
            clipped = tuple(min(max(d, lo), hi) for d, lo, hi in zip(delta, low, high))
            if clipped != delta:
                q_new = quaternion_product(mean, axis_angle_quaternion(clipped))
                change = quaternion_matrix(quaternion_product((q_old[0], -q_old[1], -q_old[2], -q_old[3]), q_new))
                M = _matrix_product(_matrix_product(R_p, change), tuple(zip(*R_p)))
                miss = _sub(t, _turn_point(M, p, a))
                lands = not _dot(miss, miss) > r * r
        if lands:
            missed.pop()
        new[group.roles[i]] = q_new
        if head:
            new["turn"] = (rotation_about(n, turn) if M is None else M, p)
    return new, missed


def _straighten_spine(spine, new, frames, quaternions, t, reach):
    """One character, after the head's Spine2 turn (`new` from _turn_parents; returned with the spine's turns added;
    spine: the rig's _SpineBend): when no turn of Spine2 alone brought the head's target t within the neck's reach R
    (the network's spine is bent more than the pose's: the neck's base a sits too far from t), the spine (Spine, Spine1,
    Spine2; heads p0, p1, p2) moves a to a* = the nearest point within reach of t, in closed form: Spine1's joint bends
    in the plane of (p1 - p0, a - p1) so that |a - p0| = |a* - p0| (the two-bone elbow), then Spine swings a onto a*.
    When Spine1's bend cannot reach (|a* - p0| > |p1 - p0| + |a - p1|: the upper spine is bent too), Spine2's joint
    first unbends in its own plane just enough. A character whose turns would exceed ASSIST_MAX_TURN or leave a joint's
    limits keeps its pose (least squares' job). Returns (new, whether the head's target is within reach now)."""
    R2, a = _frame(frames[0])[0], _frame(frames[1])[1]
    turn = new.pop("turn", None)
    if turn is not None:
        a = _turn_point(turn[0], turn[1], a)
        R2 = _matrix_product(turn[0], R2)
    (R0, p0), (R1, p1), (_, p2) = (_frame(frames[2 + j]) for j in range(3))
    miss = _sub(a, t)
    lower = _length(_sub(p1, p0))
    if not _dot(miss, miss) > reach * reach:
        return new, True
    if not _length(_sub(t, p0)) < lower + spine.upper_length + reach:    # beyond what the straight spine reaches
        return new, False
    goal = _nearest_in_both(_sub(a, p0), _sub(t, p0), reach * (1.0 - SPINE_SLACK),
                            (lower + spine.upper_length) * (1.0 - SPINE_SLACK))
    length = _length(goal)
    upper_needed = max(_length(_sub(a, p1)), min(length - lower, spine.upper_length))     # |a - p1| to have
    if _swing_beyond_limit(_sub(p1, p0), lower, goal, length, upper_needed):
        return new, False
    roles = spine.roles
    q0, q1, q2 = new.get(roles[0], quaternions[-3]), new.get(roles[1], quaternions[-2]), new.get(roles[2], quaternions[-1])
    bend = _bend_angle(p1, p2, a, upper_needed)                                    # Spine2 unbends, if it must
    if bend is None:
        return new, False
    q2 = _turned_quaternion(q2, R2, *bend)
    a = _turn_point_about(*bend, p2, a)
    bend = _bend_angle(p0, p1, a, length)                                          # Spine1 bends to |a* - p0|
    if bend is None:
        return new, False
    q1 = _turned_quaternion(q1, R1, *bend)
    now = _sub(_turn_point_about(*bend, p1, a), p0)                                # Spine swings a onto a*
    axis = _cross3(now, goal)
    sine = _length(axis)
    angle = math.atan2(sine, _dot(now, goal))
    if not angle <= ASSIST_MAX_TURN:
        return new, False
    if sine > 0.0:
        q0 = _turned_quaternion(q0, R0, _scaled(axis, 1.0 / sine), angle)
    limits = spine.limits
    if not (_within_limits(q0, *limits[0]) and _within_limits(q1, *limits[1]) and _within_limits(q2, *limits[2])):
        return new, False
    new[roles[0]], new[roles[1]], new[roles[2]] = q0, q1, q2
    return new, True


class ReachAssist:
    """The reach assist for one rig: its chain groups and spine (fixed by the rig) and the chains' reaches (which
    follow the refiner's links, see update_reach)."""

    def __init__(self, groups, spine, links, chain_valid):
        self.groups = groups
        self.spine = spine
        self.update_reach(links, chain_valid)

    @classmethod
    def for_refiner(cls, refiner, chains, mask, parents):
        """The assist for a Refiner's rig, or None when no chain may be assisted. Reads the refiner's chain layout
        (chains: its CHAINS, valid chains, chain roles and slots) and least-squares constants (joints, mean
        quaternions, limits). Per group (GROUP_CHAINS): its chains, which may turn at all (the chain is solved by the
        closed form and its parent is mapped and is the upper bone's parent), the parents' roles, the slots read
        (parent, upper per chain) and the parents' limit constants as floats."""
        joint_index = {int(j): i for i, j in enumerate(refiner.joints)}

        def limits(role):
            i = joint_index.get(int(role), 0)
            return (tuple(refiner.mean_quaternions[i].tolist()), tuple(refiner.mean_conjugates[i].tolist()),
                    tuple(refiner.joint_low[i].tolist()), tuple(refiner.joint_high[i].tolist()),
                    float(refiner.surely_inside[i]))

        groups = []
        for group_chains in GROUP_CHAINS:
            group_chains = np.array(group_chains)
            roles = [ROLE_INDEX[chains[c][0]] for c in group_chains]
            enabled = np.array([bool(refiner.chain_valid[c] and mask[r] and parents[refiner.chain_roles[c, 0]] == r
                                     and int(r) in joint_index) for c, r in zip(group_chains, roles)])
            if not enabled.any():
                continue
            slots = refiner.chain_slots[group_chains, :2].reshape(-1)
            groups.append(_AssistGroup(group_chains, enabled, tuple(roles), np.array(roles), slots,
                                       tuple(limits(r) for r in roles)))
        if not groups:
            return None
        spine_bend = None
        neck = ROLE_INDEX["NeckLower"]
        spine, j = [], parents[neck]
        while j > 0 and mask[j] and int(j) in joint_index:
            spine.insert(0, int(j))
            j = parents[j]
        if groups[0].chains[0] == 4 and mask[neck] and len(spine) == 3:
            offsets = np.asarray(refiner.skeleton.offsets, np.float64)
            upper_length = float(np.linalg.norm(offsets[spine[2]]) + np.linalg.norm(offsets[neck]))   # Spine1 + Spine2 bones
            spine_bend = _SpineBend(tuple(spine), np.array([refiner.slot_of[r] for r in spine]), upper_length,
                                    tuple(limits(r)[1:4] for r in spine))
            head = groups[0]
            roles = head.roles + spine_bend.roles
            groups[0] = head._replace(roles=roles, role_index=np.array(roles),
                                      slots=np.concatenate([head.slots, spine_bend.slots]))
        return cls(groups, spine_bend, refiner.links, refiner.chain_valid)

    def update_reach(self, links, chain_valid):
        """Per chain, the squared reach beyond which its target is out of reach (infinite for chains the closed form
        leaves alone), and which chains the assist may help (the legs hang off the given hips: never). links: the
        refiner's ChainLinks (shared, or one set per character)."""
        assisted = np.zeros(5, bool)
        for group in self.groups:
            assisted[group.chains[group.enabled]] = True
        reach_max = links.reach[0]
        self.reach_squares = np.where(chain_valid, reach_max * reach_max, np.inf)
        self.assisted_chains = np.nonzero(assisted)[0]
        self.reach_per_character = reach_max if links.per_character else None
        self.reach_list = None if links.per_character else reach_max.tolist()

    def rows_beyond_reach(self, t_square, distances):
        """Characters (indices) with an assisted chain whose target is beyond its reach, or None, from the closed
        form's first step (t_square: |t|^2 per chain, (K, 5)); distances is a (K, 5) buffer. The check costs a
        within-reach tick three calls."""
        np.subtract(t_square, self.reach_squares, out=distances)
        if not distances.max() > 0.0:
            return None
        rows = np.nonzero((distances[:, self.assisted_chains] > 0.0).any(axis=1))[0]
        return rows if len(rows) else None

    def apply(self, q, hips, world, target_positions, rows, chain_forward):
        """Turn the parents of chains whose targets are beyond reach (characters `rows`), in place on q (K, 23, 4); the
        chain layout's world transforms (`world`, the buffer chain_forward fills) are recomputed after each group
        that turned something (chain_forward(q, hips): the refiner's), so the next group and the closed form see the
        turns. Returns them, or None when nothing turned (the caller's geometry still holds).

        One character at a time in Python floats: a turn takes a few dozen float operations where the same on
        arrays costs a NumPy call per step (a call costs about a dozen float operations); only the few points a
        turn moves are followed, and the chain's transforms come from one forward pass at the end instead.

        The assist is there to spare a character least squares, so a character with a chain it cannot bring within
        reach (the turn needed beyond ASSIST_MAX_TURN or the limits, a target beyond the straight spine) keeps its pose
        from then on: least squares moves it anyway, and the turns would be paid for nothing. Except the clavicles'
        turns toward an arm's target beyond reach (_turn_parents): least squares goes on from them."""
        targets = target_positions[rows].tolist()
        reach = [self.reach_list] * len(rows) if self.reach_per_character is None else self.reach_per_character[rows].tolist()
        live = list(range(len(rows)))               # characters (indices into rows) every group so far could help
        changed = False
        for group in self.groups:
            if not live:
                break
            rows_column = rows[live, None] if len(live) < len(rows) else rows[:, None]
            frames = world[rows_column, group.slots].tolist()
            quaternions = q[rows_column, group.role_index].tolist()
            straighten = group.chains[0] == 4 and self.spine is not None
            turned, still = False, []
            for j, i in enumerate(live):
                new, missed = _turn_parents(group, frames[j], quaternions[j], targets[i], reach[i])
                if straighten:
                    new, head_reached = _straighten_spine(self.spine, new, frames[j], quaternions[j], targets[i][4], reach[i][4])
                    missed = [c for c in missed if c != 4] if head_reached else [4]
                if 4 in missed:
                    continue
                if not missed:
                    still.append(i)
                row = int(rows[i])
                for role, quaternion in new.items():
                    if role != "turn":
                        q[row, role] = quaternion
                        turned = True
            live = still
            if turned:
                world = chain_forward(q, hips)
                changed = True
        return world if changed else None
