"""The live tick's refinement of one character in Blender's own math library (mathutils, C, single precision).

neural_network/refine.py is the refinement: vectorised NumPy over characters, used by bake, evaluation and every
batch, and the reference for this module. For one character a NumPy call costs the same whatever its size, so its
closed form (a forward pass of 8 batched products, about 50 calls for the five two-bone solves) is paid in call
overhead, and the reach assist's second forward pass adds more. A mathutils operation on a 3-vector, a quaternion
or a 4x4 matrix costs a fraction of one NumPy call, so the same steps written per bone cost far less (figures in
docs/performance.md). This module is those steps, one character at a time, in the order Refiner.refine_quaternions
takes them:

1. forward pass over the refiner's chain layout (refine.LEVELS) for the legs and the spine up to the neck's base;
2. reach check, and where an assisted chain's target is beyond reach the reach assist: the head's group (a Spine2
   turn, or the spine unbending: almost every tick of unseen motion on the demo rig, whose straight neck leaves the
   head's target at the edge of its reach) in mathutils, its rare cases and the clavicles' group by reach_assist.py's
   own per-character functions in Python floats; the spine's slots again after a head turn;
3. the rest of the upper body's forward pass (again after a clavicle turn);
4. the closed form per chain: the elbow/knee bends about the limb plane's normal so the end reaches |t - a|
   clipped to the limb's reach, the upper bone turns the smallest way onto the target, the end takes the target's
   orientation; the local quaternions follow from the turns (see _solve_chain). Each arm's shoulder-hand line in
   its shoulder's and hand's frames follows from the same turns (_arm_lines): the arm swivel after the refinement
   (ik/swivel.py) reads it from `last_arm_lines` instead of a forward pass.

A character whose head the assist leaves off its target (or whose memory holds a spine of its own) goes through the
head stage after step 2 (live/head.py: HeadReach.solve for one character in mathutils, with the refiner's memory as
Refiner._land_heads), then the NumPy refiner's reach assist again (Refiner._assist_again: the clavicles hang off the
spine; in double precision, because the stage often leaves the spine nearly straight with the neck's base at the edge
of its reach, where float32 positions would decide the assist's law-of-cosines checks) and every slot again; one the
closed form leaves more than `tolerance` from a target goes on to the NumPy refiner's last stage (least squares, then
the closed form again: a few percent of ticks on unseen motion);
last, with a memory, the NumPy refiner's limb memory decides which limbs restart from last tick's correction, and
this module's closed form re-solves them. Several characters at once
(K > 1: the NumPy refiner is batched) and rigs with a chain that is not a clean two-bone chain go to the NumPy
refiner altogether. Single precision: the effectors land as exactly as the NumPy refiner's (to a micrometre; a few
where the head stage ends short of a target out of reach), but an almost straight limb's bend, which float32
positions fix only to ~1e-3 rad, may differ by that much, and a joint turned exactly onto its limit may pass the
limit check in one precision and not the other. Tests hold the two together (tests/test_live_refine.py,
tests/test_live_head.py). Needs Blender (mathutils); no bpy.
"""

import math
from typing import NamedTuple

import numpy as np
from mathutils import Matrix, Quaternion, Vector

from ...neural_network.ik import reach_assist
from ...neural_network.ik.refine_layout import LEVELS
from .head import LiveHeadReach


class _Chain(NamedTuple):
    """One two-bone chain's constants (refine.CHAINS order)."""
    slots: tuple               # slots of the upper bone, the mid bone and the end (the effector)
    roles: tuple               # the upper and mid bones' roles
    end_bridge: Quaternion     # the end's rest-pose rotation from the mid bone's frame
    sum_squares: float         # l1^2 + l2^2 (l1, l2: the upper and mid bones' lengths)
    inverse: float             # 1 / (2 l1 l2)
    reach_max: float
    reach_min: float
    straight: float            # |u x v| at or below which the limb counts as straight
    upper_length: float        # l1


class _HeadAssist(NamedTuple):
    """The head group's assist constants (reach_assist's _AssistGroup and _SpineBend) as mathutils values."""
    parent_slot: int           # Spine2's slot: the head chain's upper bone's parent, which turns first
    upper_slot: int            # NeckLower's: its head is the neck's base a
    spine_slots: tuple         # Spine, Spine1, Spine2
    turn_role: int
    spine_roles: tuple
    turn_limit: tuple          # the turning parent's (mean conjugate (Quaternion), surely_inside)
    spine_limits: tuple        # per spine joint: (mean conjugate (Quaternion), low, high)
    upper_length: float        # Spine1's and Spine2's bone lengths


def _bend(r, e, a, reach):
    """reach_assist._bend_angle in mathutils: (world unit axis, angle) of the turn of the joint at e (bone from r) that
    puts a at `reach` from r, or None."""
    u, v = e - r, a - e
    l1, l2 = u.length, v.length
    normal = u.cross(v)
    n_len = normal.length
    if not (l1 * l2 > 0.0 and n_len > 1e-9 * l1 * l2):
        return None
    cos_inner = (l1 * l1 + l2 * l2 - reach * reach) / (2.0 * l1 * l2)
    if abs(cos_inner) > 1.0 + 1e-6:
        return None
    phi = math.acos(min(max(-cos_inner, -1.0), 1.0)) - math.atan2(n_len, u.dot(v))
    if abs(phi) > reach_assist.ASSIST_MAX_TURN:
        return None
    return normal / n_len, phi


def _nearest_in_both(a, t, reach, spine_length):
    """reach_assist._nearest_in_both in mathutils: the point nearest a within `reach` of t and within `spine_length` of
    the spine's root (the origin). On the held-out clips it is almost always on the rim where the two spheres meet:
    the demo's spine and neck are straight, so the head's target is at the edge of what they reach."""
    miss = a - t
    inside = t + miss * min(1.0, reach / max(miss.length, 1e-300))
    if inside.length_squared <= spine_length * spine_length:
        return inside
    distance = max(t.length, 1e-300)
    e = t / distance
    if distance > reach + spine_length:
        return e * spine_length
    along = (distance * distance + spine_length * spine_length - reach * reach) / (2.0 * distance)
    radius = math.sqrt(max(spine_length * spine_length - along * along, 0.0))
    side = a - e * a.dot(e)
    return e * along + side * (radius / max(side.length, 1e-300))


def _within_limits(q, mean_conjugate, low, high):
    """reach_assist._within_limits for a mathutils quaternion (the shortest way from the mean pose)."""
    delta = mean_conjugate @ q
    if delta.w < 0.0:
        delta.negate()
    x, y, z = delta.to_exponential_map()
    return low[0] <= x <= high[0] and low[1] <= y <= high[1] and low[2] <= z <= high[2]


class MathutilsRefiner:
    """Wraps a NumPy Refiner (neural_network/refine.py): refine_quaternions for one character here, everything else
    (and other cases, see the module's docstring) by the wrapped refiner."""

    def __init__(self, refiner):
        self.numpy = refiner
        self.last_least_squares = 0
        self.last_arm_lines = None     # the arms' swivel lines after the last call (one character, no least squares)
        self._links = None

    def __getattr__(self, name):                 # chain_forward, chain_slots, set_links, ... : the NumPy refiner's
        return getattr(self.numpy, name)

    # read on every tick (the end twist's links): a property costs a tenth of the lookup that falls to __getattr__
    link_bridges = property(lambda self: self.numpy.link_bridges)
    link_offsets = property(lambda self: self.numpy.link_offsets)

    def covers(self):
        """Whether refine_quaternions of one character runs here (every chain a clean two-bone chain and written)."""
        r = self.numpy
        return r.all_chains_valid and r.all_written

    def _constants(self):
        """Per-slot local constants [bridge | offset] and per-chain bridges and lengths as mathutils values, taken from
        the refiner's links (rebuilt when set_links replaces them)."""
        r = self.numpy
        self._links = links = r.links
        if links.per_character:                     # one set per character: the first (and only) one's
            bridges, offsets = r.link_bridges[0], r.link_offsets[0]
            lengths, reach, straight = [a[0] for a in links.lengths], [a[0] for a in links.reach], links.straight[0]
        else:
            bridges, offsets = np.asarray(r.skeleton.bridges, np.float64), np.asarray(r.skeleton.offsets, np.float64)
            lengths, reach, straight = links.lengths, links.reach, links.straight
        chain_bridges = links.chain_bridges[0]
        # slot s: (its role, the slot its parent transform comes from, its constant 4x4), None for padding; an
        # unmapped slot passes its parent's transform through
        self.slots = []
        for s, role in enumerate(r.slot_roles.tolist()):
            level, lane = divmod(s, 3)
            if level == 0:
                self.slots.append(None)
            elif level == len(LEVELS) - 1 and lane == 0:
                self.slots.append(None)                         # padding
            else:
                parent = 9 if level == 4 else s - 3             # level 4 hangs off Spine2 (slot 9)
                if r.slot_mapped[s]:
                    constant = Matrix(bridges[role].tolist()).to_4x4()
                    constant.translation = Vector(offsets[role].tolist())
                else:
                    constant = None
                self.slots.append((role, parent, constant))
        self.chains = [_Chain(tuple(r.chain_slots[c, 1:].tolist()), tuple(r.chain_roles[c, :2].tolist()),
                              Matrix(chain_bridges[c, 2].tolist()).to_quaternion(), float(lengths[2][c]),
                              float(lengths[3][c]), float(reach[0][c]), float(reach[1][c]), float(straight[c]),
                              float(lengths[0][c])) for c in range(5)]
        self.reach = [chain.reach_max for chain in self.chains]     # the list reach_assist's functions take
        # the forward pass in three parts, so that the head's assist (which turns the spine on almost every tick of
        # unseen motion) comes before the arms and the head are placed, not after: the legs (levels 1-3), the spine up
        # to the neck's base (lane 0, levels 1-4: what the legs' and the head's reach checks and the head's assist
        # read), the rest of the upper body (what the clavicles' assist reads and turns). Each part is a list of steps
        # (slot, parent slot, constant, role); an effector's role is None: only its position is read (by its chain's
        # solve), which its own rotation does not change, so that is left out.
        slots = [s for s, slot in enumerate(self.slots) if slot is not None]
        spine = [s for s in slots if s % 3 == 0 and s // 3 <= 4]
        lower = [s for s in slots if s // 3 <= 3 or s in spine]
        ends = set(r.chain_slots[:, 3].tolist())

        def steps(part):
            return [(s, self.slots[s][1], self.slots[s][2], None if s in ends else self.slots[s][0]) for s in part]
        self.spine_steps, self.lower_steps = steps(spine), steps(lower)
        self.rest_steps = steps([s for s in slots if s not in lower])
        self.written = [role for c in range(5) for role in r.chain_roles[c].tolist()]
        self.limb_roles = r.limb_roles.tolist()
        # each limb's slots from its clavicle down (the hips, given, are not placed again)
        self.limb_steps = [steps([int(x) for x in r.chain_slots[c] if x > 0]) for c in range(4)]
        self.places = {}                        # roles written -> their places in q[0] flattened
        assist = r.reach_assist
        self.assist = assist
        # each assist group with its chains as a tuple and whether it is the head's (the spine's) group
        self.assist_groups = [] if assist is None else [(group, tuple(group.chains.tolist()), int(group.chains[0]) == 4)
                                                        for group in assist.groups]
        if assist is not None:
            self.reach_squares = assist.reach_squares[0].tolist() if assist.reach_squares.ndim > 1 \
                else assist.reach_squares.tolist()
        # the head stage for one character (None when the rig has none)
        self.head_stage = None if r.head_reach is None else LiveHeadReach(r.head_reach, self.slots)
        self.head = None
        head = assist.groups[0] if assist is not None else None
        if head is not None and head.chains[0] == 4 and head.enabled[0] and assist.spine is not None:
            slots, spine = head.slots.tolist(), assist.spine
            _, mean_conjugate, _, _, surely_inside = head.limits[0]
            self.head = _HeadAssist(slots[0], slots[1], tuple(slots[2:5]), head.roles[0], spine.roles,
                                    (Quaternion(mean_conjugate), surely_inside),
                                    tuple((Quaternion(c), low, high) for c, low, high in spine.limits),
                                    spine.upper_length)

    def forward(self, quaternions, world, steps):
        """The forward pass over `steps` (one part of it, parents first; see _constants): world 4x4 transforms
        (mathutils) of the chain layout's slots into `world` (a list by slot, its first three the hips' transform)
        from local quaternions (23 lists)."""
        for s, parent, constant, role in steps:
            if constant is None:                       # an unmapped slot passes its parent's transform through
                world[s] = world[parent]
            elif role is None:                         # an effector: its position
                world[s] = world[parent] @ constant
            else:
                world[s] = world[parent] @ constant @ Quaternion(quaternions[role]).to_matrix().to_4x4()

    def _beyond(self, world, target_vectors, chain):
        """Whether chain's target is beyond its reach."""
        upper = world[self.chains[chain].slots[0]].translation
        return (target_vectors[chain] - upper).length_squared > self.reach_squares[chain]

    def _assist_group(self, group, spine, quaternions, world, targets, target_vectors):
        """The reach assist of one group (ReachAssist.apply's steps for one character; spine: the head's group): turns
        its chains' parents (or, for the head, unbends the spine) in `quaternions` (lists, changed in place). Returns
        the roles turned, or None when the head's chain stays beyond reach (least squares' job: the assist stops
        there, as ReachAssist.apply does; an arm's clavicle turned toward its target beyond reach is kept, as
        there)."""
        new = self._assist_head(quaternions, world, target_vectors[4], self.reach[4]) \
            if spine and self.head is not None else None
        if new is not None:
            new, reached = new
            missed = [] if reached else [4]
        else:                                          # the Python-float functions, on frames as row lists
            frames = [[world[s][0][:], world[s][1][:], world[s][2][:]] for s in group.slots.tolist()]
            before = [quaternions[role] for role in group.roles]
            new, missed = reach_assist._turn_parents(group, frames, before, targets, self.reach)
            if spine and self.assist.spine is not None:
                new, reached = reach_assist._straighten_spine(self.assist.spine, new, frames, before, targets[4],
                                                              self.reach[4])
                missed = [c for c in missed if c != 4] if reached else [4]
        if 4 in missed:
            return None
        roles = [role for role in new if role != "turn"]
        for role in roles:
            quaternions[role] = list(new[role])
        return roles

    def _assist_head(self, quaternions, world, t, reach):
        """The head group's reach assist (reach_assist._turn_parents for the head's chain, then _straighten_spine) in
        mathutils, on its usual paths: Spine2 turns the neck's base within reach of the head's target t, or, when no
        Spine2 turn can (almost every held-out tick: the demo's neck is straight, so its base must sit within a hair
        of one sphere), the spine unbends onto the nearest point within reach. Returns (new local quaternions by
        role, whether the target is within reach now) as _straighten_spine does, or None for the rare cases the
        Python-float functions take: no plane to turn in, a Spine2 turn that may meet its limits."""
        h, max_turn = self.head, reach_assist.ASSIST_MAX_TURN
        W2 = world[h.parent_slot]
        p, a = W2.translation, world[h.upper_slot].translation
        P, D = a - p, t - p
        cross = P.cross(D)
        sine = cross.length
        if not sine > 0.0:
            return None
        A2, T2 = P.length_squared, D.length_squared
        goal_reach = reach * (1.0 - reach_assist.ASSIST_SLACK)
        cos_goal = (T2 + A2 - goal_reach * goal_reach) / (2.0 * math.sqrt(A2 * T2))
        if cos_goal <= 1.0:
            turn = math.atan2(sine, P.dot(D)) - math.acos(max(cos_goal, -1.0))
            if turn <= max_turn:                             # Spine2 turns: the neck's base lands within reach
                q = Quaternion(quaternions[h.turn_role]) @ Quaternion((cross / sine) @ W2.to_3x3(), turn)
                mean_conjugate, surely_inside = h.turn_limit
                if abs((mean_conjugate @ q).w) < surely_inside:
                    return None
                return {h.turn_role: q}, True
        # the spine straightens (_straighten_spine's steps; Spine2's world rotation is W2's)
        S0, S1, S2 = (world[s] for s in h.spine_slots)
        p0, p1, p2 = S0.translation, S1.translation, S2.translation
        if not (a - t).length_squared > reach * reach:
            return {}, True
        lower = (p1 - p0).length
        T = t - p0
        if not T.length < lower + h.upper_length + reach:          # beyond what the straight spine reaches
            return {}, False
        goal = _nearest_in_both(a - p0, T, reach * (1.0 - reach_assist.SPINE_SLACK),
                                (lower + h.upper_length) * (1.0 - reach_assist.SPINE_SLACK))
        length = goal.length
        upper_needed = max((a - p1).length, min(length - lower, h.upper_length))
        if reach_assist._swing_beyond_limit(p1 - p0, lower, goal, length, upper_needed):
            return {}, False
        r0, r1, r2 = h.spine_roles
        bend = _bend(p1, p2, a, upper_needed)                       # Spine2 unbends, if it must
        if bend is None:
            return {}, False
        n, phi = bend
        q2 = Quaternion(quaternions[r2]) @ Quaternion(n @ W2.to_3x3(), phi)
        a = Quaternion(n, phi) @ (a - p2) + p2
        bend = _bend(p0, p1, a, length)                             # Spine1 bends to |a* - p0|
        if bend is None:
            return {}, False
        n, phi = bend
        q1 = Quaternion(quaternions[r1]) @ Quaternion(n @ S1.to_3x3(), phi)
        now = Quaternion(n, phi) @ (a - p1) + p1 - p0               # Spine swings a onto a*
        axis = now.cross(goal)
        sine = axis.length
        angle = math.atan2(sine, now.dot(goal))
        if not angle <= max_turn:
            return {}, False
        q0 = Quaternion(quaternions[r0])
        if sine > 0.0:
            q0 = q0 @ Quaternion((axis / sine) @ S0.to_3x3(), angle)
        (c0, low0, high0), (c1, low1, high1), (c2, low2, high2) = h.spine_limits
        if not (_within_limits(q0, c0, low0, high0) and _within_limits(q1, c1, low1, high1)
                and _within_limits(q2, c2, low2, high2)):
            return {}, False
        return {r0: q0, r1: q1, r2: q2}, True

    def _land_head(self, quaternions, hips, target, memory):
        """Refiner._land_heads' head stage for this one character, in mathutils (live/head.py), on `quaternions` (lists,
        the spine's changed in place); hips: its world 4x4; target: the head's (Vector). With a memory, as there: it
        starts from the memory's spine (the network's pose when it holds none) and is remembered."""
        stage, reach = self.head_stage, self.chains[4].reach_max
        if memory is None:
            stage.solve(quaternions, hips, target, reach)
            return
        if memory.head_active[0]:
            start = memory.head[0]
        else:       # q's pose: as _land_heads (a memory of frames in order passes no start, one of characters NaN)
            start = None if memory.sequence else np.full(memory.head[0].shape, np.nan)
        _, solved, own = stage.solve(quaternions, hips, target, reach, start, memory.rate)
        memory.remember_head([0], solved[None], own[None])

    def _solve_chain(self, chain, world, quaternions, target, target_rotation):
        """The closed form of one chain: its three new local quaternions (upper, mid, end) and the error it leaves.
        The bend (about the limb plane's unit normal, by phi) and the upper bone's turn (about the unit axis, by
        psi) are world rotations; a joint whose world rotation R = (its parent's world and rest-pose bridge) @ q
        turns by (n, phi) gets the local q @ (the same turn about R^T n), as in reach_assist, so the upper and mid
        bones' locals need neither their parents' frames nor their bridges; the end's is conj(its new world) times
        the target's rotation. Also returns the upper bone's world turn and the end's new place from the upper
        bone's head (turn @ p) for _arm_lines."""
        slots, roles, end_bridge, sum_squares, inverse, reach_max, reach_min, straight, l1 = chain
        upper, mid = world[slots[0]], world[slots[1]]
        a, b = upper.translation, mid.translation
        u, v, t = b - a, world[slots[2]].translation - b, target - a
        d = t.length
        dc = reach_min if d < reach_min else (reach_max if d > reach_max else d)
        cos_outer = (dc * dc - sum_squares) * inverse
        cos_outer = -1.0 if cos_outer < -1.0 else (1.0 if cos_outer > 1.0 else cos_outer)
        normal = u.cross(v)
        n_len = normal.length
        phi = math.acos(cos_outer) - math.atan2(n_len, u.dot(v))
        R_mid = mid.to_3x3()
        if n_len > straight:
            normal /= n_len
        else:          # a straight limb: bend about the mid bone's x axis made perpendicular to the upper bone
            x = R_mid.col[0]
            normal = x - (x.dot(u) / (l1 * l1)) * u
            normal /= max(normal.length, 1e-30)
        bend = Quaternion(normal, phi)
        p = u + bend @ v
        axis = p.cross(t)
        axis_len = axis.length
        if axis_len > 1e-300:
            axis /= axis_len
            psi = math.atan2(axis_len, p.dot(t))
        else:
            psi = 0.0
        turn = Quaternion(axis, psi)
        upper_local = Quaternion(quaternions[roles[0]]) @ Quaternion(axis @ upper.to_3x3(), psi)
        mid_local = Quaternion(quaternions[roles[1]]) @ Quaternion(normal @ R_mid, phi)
        end_local = (turn @ bend @ R_mid.to_quaternion() @ end_bridge).conjugated() @ target_rotation
        return upper_local, mid_local, end_local, abs(d - dc), turn, turn @ p

    def _arm_lines(self, lines, c, world, turn, reach, target_rotation):
        """The arm swivel's shoulder-hand line (ik/swivel.py) of chain c after its closed form, with no forward pass:
        the line is `reach` (the hand's place from the upper bone's head, which stays), in the upper bone's frame (the
        Arm slot's, turned by `turn`) and in the hand's (its target's rotation: the closed form gave it). lines:
        shoulder slot -> (the two as tuples), or None where the hand sits on the shoulder."""
        slots = self.chains[c].slots
        length = reach.length
        if length < 1e-9:
            lines[slots[0]] = None
            return
        line = reach / length
        lines[slots[0]] = ((line @ turn.to_matrix() @ world[slots[0]].to_3x3())[:], (line @ target_rotation)[:])

    def refine_quaternions(self, q, hips, target_positions, target_rotations, iterations=2, tolerance=1e-4,
                           memory=None, follow=None):
        """Refiner.refine_quaternions (same arguments, same result to single precision) for one character; any
        other K, and rigs it does not cover, by the NumPy refiner."""
        r = self.numpy
        if len(q) != 1 or not self.covers() or (r.links.per_character and len(r.link_bridges) != 1):
            result = r.refine_quaternions(q, hips, target_positions, target_rotations, iterations, tolerance, memory,
                                          follow)
            self.last_least_squares, self.last_arm_lines = r.last_least_squares, None
            return result
        if self._links is not r.links:
            self._constants()
        network = None if memory is None else r.limb_bones(q)          # for the limbs' memory
        quaternions = q[0].tolist()
        world = [Matrix(hips[0].tolist())] * 3 + [None] * (len(self.slots) - 3)
        targets = target_positions[0].tolist()
        target_vectors = [Vector(t) for t in targets]
        assisted = []                                  # the roles the reach assist turned
        self.forward(quaternions, world, self.lower_steps)
        rest_placed = False
        for group, chains, spine in self.assist_groups:
            if not spine and not rest_placed:
                self.forward(quaternions, world, self.rest_steps)
                rest_placed = True
            for c in chains:
                if self._beyond(world, target_vectors, c):
                    break
            else:
                continue                               # every chain of the group within reach
            roles = self._assist_group(group, spine, quaternions, world, targets, target_vectors)
            if roles is None:
                break
            if not roles:
                continue
            assisted += roles
            if spine:                          # the spine turned: its slots now, the rest before it is next read
                self.forward(quaternions, world, self.spine_steps)
                rest_placed = False
            else:
                self.forward(quaternions, world, self.rest_steps)
        if not rest_placed:
            self.forward(quaternions, world, self.rest_steps)
        if r.head_reach is not None:
            off = (target_vectors[4] - world[self.chains[4].slots[0]].translation).length
            beyond = off > self.chains[4].reach_max + tolerance                 # as Refiner._heads_off
            if beyond or (memory is not None and memory.head_active[0]):
                # the head stage (Refiner._land_heads for this character) in mathutils; then the reach assist again
                # (the clavicles hang off the spine) by the NumPy refiner, as there, and every slot from what it wrote
                self._land_head(quaternions, world[0], target_vectors[4], memory)
                np.put(q, [4 * role + i for role in range(len(quaternions)) for i in range(4)],
                       [x for quaternion in quaternions for x in quaternion])
                r._assist_again(q, hips, target_positions, [0])
                quaternions, assisted = q[0].tolist(), []
                self.forward(quaternions, world, self.spine_steps)        # (the legs hang off the hips: as they were)
                self.forward(quaternions, world, self.rest_steps)
        rotations = target_rotations[0].tolist()
        solved = [x for role in assisted for x in quaternions[role]]           # flat: one np.put writes them all
        errors = []
        lines = {}
        for c, chain in enumerate(self.chains):
            rotation = Matrix(rotations[c])
            upper, mid, end, error, turn, reach = self._solve_chain(chain, world, quaternions, target_vectors[c],
                                                                    rotation.to_quaternion())
            if c < 2:
                self._arm_lines(lines, c, world, turn, reach, rotation)
            solved.extend(upper)
            solved.extend(mid)
            solved.extend(end)
            errors.append(error)
        roles = tuple(assisted)
        places = self.places.get(roles)
        if places is None:
            places = self.places[roles] = np.array([4 * role + i for role in roles + tuple(self.written) for i in range(4)])
        q.put(places, solved)
        total = sum(errors)                 # NaN where any error is: then no least squares, as np.max would give
        worst = max(errors) if total == total else total
        errors = np.array([errors])
        self.last_least_squares = 0
        if iterations > 0 and worst > tolerance:                # least squares: the NumPy refiner's last stage
            errors = r.least_squares_after_closed_form(q, hips, target_positions, target_rotations, errors,
                                                       iterations, tolerance, follow)
            self.last_least_squares = r.last_least_squares
        self.last_arm_lines = None if self.last_least_squares else lines     # least squares moved what they show
        if memory is not None:                  # the limbs' memory: the NumPy refiner's, re-solving limbs here
            stale = self.last_least_squares > 0    # least squares moved bones its lines do not show

            def limbs_from(q, network, hips, target_positions, target_rotations, errors, rows, jumped, start):
                """Refiner._limbs_from for this character, in mathutils: each limb that jumped starts from the
                network's bones times `start`, and its closed form lands it."""
                for c in np.nonzero(jumped[0])[0].tolist():
                    roles = self.limb_roles[c]
                    for role, net, turn in zip(roles, network[0, c].tolist(), start[0, c].tolist()):
                        quaternions[role] = list(Quaternion(net) @ Quaternion(turn))
                    self.forward(quaternions, world, self.limb_steps[c])
                    rotation = Matrix(rotations[c])
                    upper, mid, end, errors[0, c], turn, reach = self._solve_chain(
                        self.chains[c], world, quaternions, target_vectors[c], rotation.to_quaternion())
                    if c < 2:
                        self._arm_lines(lines, c, world, turn, reach, rotation)
                    np.put(q, [4 * role + i for role in roles[:1] + self.written[3 * c:3 * c + 3] for i in range(4)],
                           [*quaternions[roles[0]], *upper, *mid, *end])
            r._follow_limbs(q, network, hips, target_positions, target_rotations, errors, memory,
                            None if stale else limbs_from)
        return errors
