"""What the refinement of each character carries from one tick to the next, so that it never pops.

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

import numpy as np

FOLLOW_SPEED = 4.0       # radians a second: how fast the refinement moves back toward the network's own pose
SETTLED = 1e-9           # radians: a spine this close to the network's own pose has nothing left to remember


class RefineMemory:
    """Per character: the spine and neck's deltas from the mean pose (the head stage's joints) that landed the head
    last tick, while they differ from the network's own (`head_active`)."""

    def __init__(self, characters, head_joints, sequence=False):
        k = 1 if sequence else characters
        self.sequence = sequence          # rows of a solve are frames of one character, in order (Bake)
        self.head = np.zeros((k, max(head_joints, 1), 3))
        self.head_active = np.zeros(k, bool)
        self.dt = 1.0 / 60.0

    @property
    def rate(self):
        """The most a joint moves back toward the network's own pose in one tick (radians)."""
        return FOLLOW_SPEED * self.dt

    def reset(self, rows=None):
        """Forget characters `rows` (all when None): their next tick starts from the network's pose."""
        rows = slice(None) if rows is None else rows
        self.head_active[rows] = False

    def remember_head(self, rows, solved, own):
        """After the head stage: characters `rows` settled on deltas `solved` (len(rows), m, 3) where the network's own
        were `own`; they stay remembered while the two differ (non-finite ones are forgotten)."""
        gap = np.abs(solved - own).max(axis=(1, 2)) if len(rows) else np.zeros(0)
        self.head[rows] = np.where(np.isfinite(solved), solved, 0.0)
        self.head_active[rows] = gap > SETTLED
