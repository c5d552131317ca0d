"""What the refinement of each character carries from one tick to the next, so that it never pops (issues 23, 27).

Refinement is a function of the network's pose and the targets; where the network's pose is poor (a weak model, a
pose unlike its clips) that function is not continuous: the head's solve through the spine and neck (head_reach.py)
can land on another of the many spine poses that reach, and the two-bone solve of a limb keeps a swivel plane the
network may flip. RefineMemory holds, per character, what the previous tick settled on, and the refiner starts from
it: the spine and neck that landed the head, and each limb's correction of the network's pose. The refinement then
moves back toward the network's own pose only as fast as FOLLOW_SPEED (radians a second: a limb's speed, at most
FOLLOW_SPEED * dt a tick), in the directions that keep the effectors on their targets, so the effectors still land
exactly every tick.

The memory is explicit: a Solver owns one (live: one row per character; Bake: `sequence`, one row that runs through
the frames in order, so Bake gives what a live tick per frame gives); `reset` forgets some or all characters (their
next tick is refined from the network's pose alone, as without a memory). Pure NumPy; no bpy.
"""

import math

import numpy as np

from ..geometry.quaternion_math import HAMILTON_PRODUCT, exp_quaternions, multiply_quaternions
from ..geometry.rotations import quaternion_to_axis_angle

FOLLOW_SPEED = 4.0       # radians a second: how fast the refinement moves back toward the network's own pose
SETTLED = 1e-9           # radians: a spine this close to the network's own pose has nothing left to remember
POP_TURN = math.radians(8.0)    # a limb's clavicle, upper and mid bones turning this much (in all) more than the
#                                 network's own in one tick: a pop
POP_COSINE = math.cos(POP_TURN / 6.0)   # |<c, c'>| above it: that turned by less than a third of POP_TURN


CONJUGATE = np.array([1.0, -1.0, -1.0, -1.0])
# n -> L(conj n) flattened, L(q) p = q * p: conj(n)_i s_j H[i, j, k] summed over i and j, so L(conj n)[k, j] =
# sum_i n_i (+-H[i, j, k]) (the Hamilton product's table, the vector part of n negated)
CONJUGATE_LEFT = np.transpose(CONJUGATE[:, None, None] * HAMILTON_PRODUCT.reshape(4, 4, 4), (0, 2, 1)).reshape(4, 16)


def corrections(network, solved):
    """(..., 4) c with solved = network * c: what the refinement turned each bone by, in the bone's own frame
    (conj(network) * solved as L(conj network) @ solved: two products, no broadcast outer product)."""
    left = (network @ CONJUGATE_LEFT).reshape(network.shape[:-1] + (4, 4))
    return (left @ solved[..., None])[..., 0]


def turned_toward(a, b, most):
    """(..., 4) a turned toward b the shortest way, by at most `most` radians ((...,) or a scalar), and the whole
    angle between them (...,)."""
    v = quaternion_to_axis_angle(multiply_quaternions(a * CONJUGATE, b))
    angle = np.sqrt(np.einsum("...i,...i->...", v, v))
    share = np.minimum(1.0, most / np.maximum(angle, 1e-300))
    return multiply_quaternions(a, exp_quaternions((0.5 * share)[..., None] * v)), angle


class RefineMemory:
    """Per character: the spine and neck's deltas from the mean pose (the head stage's joints) that landed the head
    last tick, while they differ from the network's own (`head_active`); each limb's clavicle (the hips for a leg),
    upper and mid bones' local rotations last tick, the network's own and the refinement's correction between them
    (network * c = solved) (`last`, (K, 3, 4, 3, 4); arms then legs, refine.CHAINS order; `limbs_known`); the arms'
    swivel turns (`swivel`, `swivel_known`: a turn moves at most swivel.SPEED * dt a tick); the ends' rolls
    and the arms' swings, the upper arms' and thighs' rolls (`twist`, `swing`, `upper_roll`, `twist_known`:
    twist.SPEED * dt a tick; `twist_still`: all of them 0)."""

    @property
    def bones(self):
        """(K, 4, 3, 4) the limbs' local rotations last tick."""
        return self.last[:, 0]

    def __init__(self, characters, head_joints, sequence=False):
        k = 1 if sequence else characters
        self.sequence = sequence          # rows of a solve are frames of one character, in order (Bake)
        self.head = np.zeros((k, max(head_joints, 1), 3))
        self.head_active = np.zeros(k, bool)
        # the limbs' local rotations last tick, the network's own and the corrections between them
        self.last = np.zeros((k, 3, 4, 3, 4))
        self.anything_known = False
        self.limbs_known = np.zeros(k, bool)
        self.swivel = np.zeros((k, 2))          # the arms' swivel turns last tick (ik/swivel.py), radians
        self.swivel_known = np.zeros(k, bool)
        self.twist = np.zeros((k, 5))           # the ends' twist turns last tick (ik/twist.py), radians: rolls
        self.swing = np.zeros((k, 5))           # ... and swings
        self.upper_roll = np.zeros((k, 5))      # ... and the upper bones' rolls (arms, legs)
        self.twist_known = np.zeros(k, bool)
        self.twist_still = np.zeros(k, bool)    # known, and every one of those turns 0: a tick with no limb past its
        #                                         limits has nothing to turn, read or write (twist.py)
        self.dt = 1.0 / 60.0

    @classmethod
    def for_refiner(cls, refiner, characters, sequence=False):
        """A memory of `characters` (or, with sequence, of one character's frames) for a Refiner's rig."""
        head = refiner.head_reach
        return cls(characters, 0 if head is None else len(head.joints), sequence)

    @property
    def rate(self):
        """The most a joint moves back toward the network's own pose in one tick (radians)."""
        return FOLLOW_SPEED * self.dt

    def reset(self, rows=None):
        """Forget characters `rows` (all when None): their next tick starts from the network's pose."""
        rows = slice(None) if rows is None else rows
        self.head_active[rows] = False
        self.limbs_known[rows] = False
        self.swivel_known[rows] = False
        self.twist_known[rows] = False
        self.twist_still[rows] = False
        self.anything_known = bool(self.limbs_known.any())

    def remember_head(self, rows, solved, own):
        """After the head stage: characters `rows` settled on deltas `solved` (len(rows), m, 3) where the network's own
        were `own`; they stay remembered while the two differ (non-finite ones are forgotten)."""
        gap = np.abs(solved - own).max(axis=(1, 2)) if len(rows) else np.zeros(0)
        self.head[rows] = np.where(np.isfinite(solved), solved, 0.0)
        self.head_active[rows] = gap > SETTLED

    def follow_limbs(self, rows, solved, network):
        """The local rotations this tick's refinement gave the limbs' bones of characters `rows` (`solved`,
        (len(rows), 4, 3, 4)) and the network's own (`network`), against last tick's: where a limb's bones turned more
        than POP_TURN (in all) beyond what the network's own turned, and its correction of the network's (solved =
        network * c) moved more than `rate` (the refinement, not the network, turned them: a flip), (those limbs,
        (len(rows), 4) bool; the corrections to start them from instead: last tick's turned toward this tick's by
        `rate`), or None when no limb did; and this tick's corrections. Characters the memory knows nothing of take
        theirs as they are. The usual tick costs a few calls: a bone can turn beyond the network's own turn by no more
        than its correction turned, so corrections that turned less than a third of POP_TURN each settle it."""
        new = corrections(network, solved)
        if not self.anything_known:
            return None, new
        last = self.last[rows]                       # (k, 3, 4, 3, 4): bones, network, corrections
        dots = last[:, 2, ..., None, :] @ new[..., :, None]       # (k, 4, 3, 1, 1)
        if dots.min() > POP_COSINE:     # (a correction whose sign flipped, a rare one near a half turn: checked below)
            return None, new
        # |cos| of half of how far each bone turned since last tick, and the network's own
        halves = np.einsum("kpabi,kpabi->kpab", last[:, :2], np.stack((solved, network), axis=1))
        turns = np.arccos(np.minimum(np.abs(halves), 1.0)).sum(axis=-1)          # (k, 2, 4): halves
        popping = self.limbs_known[rows][:, None] & (turns[:, 0] - turns[:, 1] > 0.5 * POP_TURN)
        if not popping.any():
            return None, new
        start, angle = turned_toward(last[:, 2], new, self.rate)
        jumped = popping & (angle.max(axis=-1) > self.rate)
        return ((jumped, start) if jumped.any() else None), new

    def remember_limbs(self, rows, solved, network, corrections_now):
        """The local rotations the tick settled on for the limbs' bones of characters `rows`, the network's own and
        the corrections between them."""
        last = self.last[rows] if isinstance(rows, slice) else None
        if last is not None:                         # a view: written in place
            last[:, 0], last[:, 1], last[:, 2] = solved, network, corrections_now
        else:
            self.last[rows, 0], self.last[rows, 1], self.last[rows, 2] = solved, network, corrections_now
        self.limbs_known[rows] = True
        self.anything_known = True
