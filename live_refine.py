"""The live tick's refinement of one character in Blender's own math library (mathutils, C, single precision).

neural_network/refine.py is the refinement: vectorised NumPy over characters, used by bake, evaluation and every
batch, and the reference for this module. For one character a NumPy call costs ~0.5 us whatever its size, so its
closed form (a forward pass of 8 batched products, about 50 calls for the five two-bone solves) costs ~60 us, and
the reach assist's second forward pass ~14 more. A mathutils operation on a 3-vector, a quaternion or a 4x4 matrix
costs ~0.05-0.2 us, so the same steps written per bone take ~5 us (forward pass) and ~3 us a chain. This module is
those steps, one character at a time, in the order Refiner.refine_quaternions takes them:

1. forward pass over the refiner's chain layout (refine.LEVELS): world transform of every slot;
2. reach check, and where an assisted chain's target is beyond reach the reach assist (reach_assist.py's own
   per-character functions, in Python floats), then the upper body's forward pass again;
3. the closed form per chain: the elbow/knee bends about the limb plane's normal so the end reaches |t - a|
   clipped to the limb's reach, the upper bone turns the smallest way onto the target, the end takes the target's
   orientation; local quaternions from the new world rotations.

A character the closed form leaves more than `tolerance` from a target goes on to the NumPy refiner's last stage
(least squares, then the closed form again: a few percent of ticks on unseen motion). Several characters at once
(K > 1: the NumPy refiner is batched) and rigs with a chain that is not a clean two-bone chain go to the NumPy
refiner altogether. Single precision: the effectors land as exactly as the NumPy refiner's (to a micrometre), but
an almost straight limb's bend, which float32 positions fix only to ~1e-3 rad, may differ by that much. Tests hold
the two together (tests/test_live_refine.py). Needs Blender (mathutils); no bpy.
"""

import math
from typing import NamedTuple

import numpy as np
from mathutils import Matrix, Quaternion, Vector

from .neural_network import reach_assist
from .neural_network.refine import LEVELS


class _Chain(NamedTuple):
    """One two-bone chain's constants (refine.CHAINS order)."""
    slots: tuple               # slots of the upper bone's parent, the upper bone, the mid bone, the end (the effector)
    bridges: tuple             # upper, mid, end: the rest-pose rotation from the parent's frame (Matrix 3x3)
    sum_squares: float         # l1^2 + l2^2 (l1, l2: the upper and mid bones' lengths)
    inverse: float             # 1 / (2 l1 l2)
    reach_max: float
    reach_min: float
    straight: float            # |u x v| at or below which the limb counts as straight
    upper_length: float        # l1


class MathutilsRefiner:
    """Wraps a NumPy Refiner (neural_network/refine.py): refine_quaternions for one character here, everything else
    (and other cases, see the module's docstring) by the wrapped refiner."""

    def __init__(self, refiner):
        self.numpy = refiner
        self.last_least_squares = 0
        self._links = None

    def __getattr__(self, name):                 # chain_forward, chain_slots, set_links, ... : the NumPy refiner's
        return getattr(self.numpy, name)

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
        self.reach = [float(x) for x in reach[0]]   # per chain: the upper + mid bones' reach (the assist's too)
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
        self.chains = [_Chain(tuple(r.chain_slots[c].tolist()), tuple(Matrix(chain_bridges[c, i].tolist()) for i in range(3)),
                              float(lengths[2][c]), float(lengths[3][c]), float(reach[0][c]), float(reach[1][c]),
                              float(straight[c]), float(lengths[0][c])) for c in range(5)]
        # what the assist turns (the spine, the clavicles) moves lane 0 and levels 4 on: the legs below stay
        self.upper_body = [s for s, slot in enumerate(self.slots)
                           if slot is not None and (s % 3 == 0 or s // 3 >= 4)]
        self.all_slots = [s for s, slot in enumerate(self.slots) if slot is not None]
        self.written = [role for c in range(5) for role in r.chain_roles[c].tolist()]
        self.places = {}                        # roles written -> their places in q[0] flattened
        assist = r.reach_assist
        self.assist = assist
        if assist is not None:
            self.reach_squares = assist.reach_squares[0].tolist() if assist.reach_squares.ndim > 1 \
                else assist.reach_squares.tolist()
            self.assisted, self.unassisted = assist.assisted_chains.tolist(), assist.unassisted_chains.tolist()

    def forward(self, quaternions, hips, world=None):
        """World 4x4 transforms (mathutils) of the chain layout's slots from local quaternions (23 lists) and the hips'
        transform (Matrix); None at padding. Given the world before the assist turned something, only the upper
        body's slots are computed again."""
        if world is None:
            world, slots = [hips] * 3 + [None] * (len(self.slots) - 3), self.all_slots
        else:
            world, slots = list(world), self.upper_body
        for s in slots:
            role, parent, constant = self.slots[s]
            if constant is None:
                world[s] = world[parent]
            else:
                world[s] = world[parent] @ constant @ Quaternion(quaternions[role]).to_matrix().to_4x4()
        return world

    def _beyond(self, world, target_vectors, chain):
        """Whether chain's target is beyond its reach."""
        upper = world[self.chains[chain].slots[1]].translation
        return (target_vectors[chain] - upper).length_squared > self.reach_squares[chain]

    def _assist(self, quaternions, world, targets, target_vectors, hips):
        """Reach assist for one character (ReachAssist.apply's steps): turns chains' parents (or unbends the spine)
        in `quaternions` (lists, changed in place). Returns (world after the turns or None when nothing turned, the
        roles turned). A group with no chain beyond reach is passed by (its turns would find nothing to do)."""
        assist, reach = self.assist, self.reach
        changed, roles = False, []
        for group in assist.groups:
            if not any(self._beyond(world, target_vectors, c) for c in group.chains.tolist()):
                continue
            frames = [[world[s][0][:], world[s][1][:], world[s][2][:]] for s in group.slots.tolist()]
            before = [quaternions[role] for role in group.roles]
            new, missed = reach_assist._turn_parents(group, frames, before, targets, reach)
            if group.chains[0] == 4 and assist.spine is not None:
                new, head_reached = reach_assist._straighten_spine(assist.spine, new, frames, before, targets[4],
                                                                   reach[4])
                missed = [c for c in missed if c != 4] if head_reached else [4]
            if missed:
                break
            turned = False
            for role, quaternion in new.items():
                if role != "turn":
                    quaternions[role] = list(quaternion)
                    roles.append(role)
                    turned = True
            if turned:
                world = self.forward(quaternions, hips, world)
                changed = True
        return (world if changed else None), roles

    def _solve_chain(self, chain, world, target, target_rotation):
        """The closed form of one chain: its three new local quaternions (upper, mid, end) and the error it leaves."""
        slots, bridges, sum_squares, inverse, reach_max, reach_min, straight, l1 = chain
        parent, upper, mid, end = (world[s] for s in slots)
        a, b = upper.translation, mid.translation
        u, v, t = b - a, end.translation - b, target - a
        d = t.length
        dc = min(max(d, reach_min), reach_max)
        cos_outer = min(max((dc * dc - sum_squares) * inverse, -1.0), 1.0)
        normal = u.cross(v)
        n_len = normal.length
        phi = math.acos(cos_outer) - math.atan2(n_len, u.dot(v))
        R_up, R_mid = upper.to_3x3(), mid.to_3x3()
        if n_len > straight:
            normal /= n_len
        else:          # a straight limb: bend about the mid bone's x axis made perpendicular to the upper bone
            x = R_mid.col[0]
            normal = x - (x.dot(u) / (l1 * l1)) * u
            normal /= max(normal.length, 1e-30)
        Q1 = Quaternion(normal, phi).to_matrix()
        p = u + Q1 @ v
        axis = p.cross(t)
        axis_len = axis.length
        Q2 = Quaternion(axis / axis_len, math.atan2(axis_len, p.dot(t))).to_matrix() if axis_len > 1e-300 \
            else Matrix.Identity(3)
        up_new = Q2 @ R_up
        mid_new = Q2 @ Q1 @ R_mid
        b_up, b_mid, b_end = bridges
        locals_ = ((parent.to_3x3() @ b_up).transposed() @ up_new, (up_new @ b_mid).transposed() @ mid_new,
                   (mid_new @ b_end).transposed() @ target_rotation)
        return [m.to_quaternion().normalized() for m in locals_], abs(d - dc)

    def refine_quaternions(self, q, hips, target_positions, target_rotations, iterations=2, tolerance=1e-4):
        """Refiner.refine_quaternions (same arguments, same result to single precision) for one character; any
        other K, and rigs it does not cover, by the NumPy refiner."""
        r = self.numpy
        if len(q) != 1 or not self.covers() or (r.links.per_character and len(r.link_bridges) != 1):
            result = r.refine_quaternions(q, hips, target_positions, target_rotations, iterations, tolerance)
            self.last_least_squares = r.last_least_squares
            return result
        if self._links is not r.links:
            self._constants()
        quaternions = q[0].tolist()
        H = Matrix(hips[0].tolist())
        world = self.forward(quaternions, H)
        targets = target_positions[0].tolist()
        target_vectors = [Vector(t) for t in targets]
        assisted = []
        if self.assist is not None:
            beyond = [self._beyond(world, target_vectors, c) for c in range(5)]
            if any(beyond[c] for c in self.assisted) and not any(beyond[c] for c in self.unassisted):
                turned, assisted = self._assist(quaternions, world, targets, target_vectors, H)
                world = turned if turned is not None else world
        rotations = target_rotations[0].tolist()
        solved = [x for role in assisted for x in quaternions[role]]           # flat: one np.put writes them all
        errors = []
        for c, chain in enumerate(self.chains):
            local, error = self._solve_chain(chain, world, target_vectors[c], Matrix(rotations[c]))
            for quaternion in local:
                solved.extend(quaternion)
            errors.append(error)
        roles = tuple(assisted)
        places = self.places.get(roles)
        if places is None:
            places = self.places[roles] = np.array([4 * role + i for role in roles + tuple(self.written) for i in range(4)])
        np.put(q, places, solved)
        errors = np.array([errors])
        self.last_least_squares = 0
        if iterations > 0 and errors.max() > tolerance:        # least squares: the NumPy refiner's last stage
            errors = r.least_squares_after_closed_form(q, hips, target_positions, target_rotations, errors,
                                                       iterations, tolerance)
            self.last_least_squares = r.last_least_squares
        return errors
