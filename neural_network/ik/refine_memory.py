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

from ..geometry.quaternion_math import exp_quaternions, multiply_quaternions
from ..geometry.rotations import quaternion_to_axis_angle

FOLLOW_SPEED = 4.0       # radians a second: how fast the refinement moves back toward the network's own pose
SETTLED = 1e-9           # radians: a spine this close to the network's own pose has nothing left to remember


CONJUGATE = np.array([1.0, -1.0, -1.0, -1.0])


def corrections(network, solved):
    """(..., 4) c with solved = network * c: what the refinement turned each bone by, in the bone's own frame."""
    return multiply_quaternions(network * CONJUGATE, solved)


def turned_toward(a, b, most):
    """(..., 4) a turned toward b the shortest way, by at most `most` radians ((...,) or a scalar), and the whole
    angle between them (...,)."""
    v = quaternion_to_axis_angle(multiply_quaternions(a * CONJUGATE, b))
    angle = np.sqrt(np.einsum("...i,...i->...", v, v))
    share = np.minimum(1.0, most / np.maximum(angle, 1e-300))
    return multiply_quaternions(a, exp_quaternions((0.5 * share)[..., None] * v)), angle


class RefineMemory:
    """Per character: the spine and neck's deltas from the mean pose (the head stage's joints) that landed the head
    last tick, while they differ from the network's own (`head_active`); each limb's correction of the network's
    clavicle (the hips for a leg), upper and mid bones last tick (`limbs`, (K, 4, 3, 4): arms then legs, refine.CHAINS
    order; `limbs_known`)."""

    def __init__(self, characters, head_joints, sequence=False):
        k = 1 if sequence else characters
        self.sequence = sequence          # rows of a solve are frames of one character, in order (Bake)
        self.head = np.zeros((k, max(head_joints, 1), 3))
        self.head_active = np.zeros(k, bool)
        self.limbs = np.zeros((k, 4, 3, 4))
        self.limbs_known = np.zeros(k, bool)
        self.dt = 1.0 / 60.0

    @property
    def rate(self):
        """The most a joint moves back toward the network's own pose in one tick (radians)."""
        return FOLLOW_SPEED * self.dt

    def reset(self, rows=None):
        """Forget characters `rows` (all when None): their next tick starts from the network's pose."""
        rows = slice(None) if rows is None else rows
        self.head_active[rows] = False
        self.limbs_known[rows] = False

    def remember_head(self, rows, solved, own):
        """After the head stage: characters `rows` settled on deltas `solved` (len(rows), m, 3) where the network's own
        were `own`; they stay remembered while the two differ (non-finite ones are forgotten)."""
        gap = np.abs(solved - own).max(axis=(1, 2)) if len(rows) else np.zeros(0)
        self.head[rows] = np.where(np.isfinite(solved), solved, 0.0)
        self.head_active[rows] = gap > SETTLED

    def follow_limbs(self, rows, new):
        """Limbs' corrections `new` (len(rows), 4, 3, 4) this tick's closed form made for characters `rows`, against
        what they made last tick: (where a limb's correction moved more than `rate`: (len(rows), 4) bool, the
        corrections to start that limb from instead - last tick's turned toward this tick's by `rate`), or None when
        none did. Characters the memory knows nothing of take theirs as they are."""
        known = self.limbs_known[rows]
        if not known.any():
            return None
        before = self.limbs[rows]
        # a turn by less than the rate: |<a, b>| = cos(angle / 2) above cos(rate / 2) (one call: the usual tick's)
        if np.abs(np.einsum("...i,...i->...", before, new)).min() > math.cos(0.5 * self.rate):
            return None
        start, angle = turned_toward(before, new, self.rate)
        jumped = known[:, None] & (angle.max(axis=-1) > self.rate)
        return (jumped, start) if jumped.any() else None

    def remember_limbs(self, rows, corrections_now):
        """The limbs' corrections the tick settled on for characters `rows` (non-finite ones: forgotten)."""
        self.limbs[rows] = corrections_now
        self.limbs_known[rows] = True
        if not np.isfinite(corrections_now).all():
            finite = np.isfinite(corrections_now).all(axis=(1, 2, 3))
            self.limbs[rows] = np.where(finite[:, None, None, None], corrections_now, (1.0, 0.0, 0.0, 0.0))
            self.limbs_known[rows] = finite
