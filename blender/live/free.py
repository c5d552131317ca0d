"""Free targets while live: the model places them (runtime/free_targets.py), and their empties show where.

A live group's characters each have six Free settings (layer_<target>.free), read when a setting is edited. With any
target free the group's tick goes through FreeTargets.step (the prior, the hips stage, the free effectors following
the network) instead of the plain solve, and no bone turns by more than MAX_TURN in a tick (a fast drag: the body
follows over a few ticks). After the solve, the empty of each free target is moved to where the model put it, so the
user sees it; grabbing that empty (moving it to anywhere else) pins the target again (its Free setting goes off).
Stop puts every empty that live mode moved back where it was, unless the user pinned it by moving it.
"""

import numpy as np
from mathutils import Matrix

from ...neural_network.ik.refine_memory import turned_toward
from ...neural_network.runtime.free_targets import FreeTargets, NoPrior
from ..errors import LiveStopped
from .motion import LAYER_SLOTS, TARGET_LABELS, free_flags

GRABBED = 1e-4      # an empty this far (any matrix entry) from where the tick put it was moved by the user
MAX_TURN = np.radians(14.0)   # the largest turn of a bone in one tick while targets are free (issue 33: 15)


def limit_turns(q, previous, limit):
    """Turn each (K, 23, 4) quaternion of q that is more than `limit` radians from `previous` back toward it, in
    place, to exactly `limit` (refine_memory.turned_toward, as the refinement's memory follows the network)."""
    turned, angle = turned_toward(previous, q, limit)
    over = angle > limit
    q[over] = turned[over]


class LiveFree:
    """The free targets of one live group."""

    def __init__(self, model, characters):
        self.model = model
        self.characters = characters
        self.flags = np.zeros((len(characters), 6), bool)
        self.stage = None                       # FreeTargets while any target is free
        self.shown = {}                         # (character, slot) -> the world matrix last written to its empty
        self.saved = {}                         # (character, slot) -> the empty's matrix_world before live mode
        self.previous = None                    # last tick's (K, 23, 4) pose

    @property
    def active(self):
        return self.stage is not None

    def refresh(self):
        """Read every character's Free settings; LiveStopped in words for a set that cannot be solved."""
        flags = np.stack([free_flags(c.obj) for c in self.characters])
        if np.array_equal(flags, self.flags):
            return
        for c, row in zip(self.characters, flags):
            if row.all():
                raise LiveStopped(f"all six targets of {c.obj.name} are free: pin at least one")
            for k in np.nonzero(~row)[0]:
                if c.targets[k] is None and c.motion is None:
                    raise LiveStopped(f"the {TARGET_LABELS[k]} of {c.obj.name} was pinned but has no target empty: "
                                      "create targets")
        for key in [key for key in self.shown if not flags[key[0], key[1]]]:
            del self.shown[key]                 # pinned again: its empty is the user's
        self.flags = flags
        self.previous = None
        try:
            self.stage = FreeTargets(self.model, flags) if flags.any() else None
        except NoPrior as exc:
            raise LiveStopped(f"{exc}: live IK stopped") from None

    def pin_grabbed(self, reader):
        """Pin each free target whose empty the user moved since the tick put it (reader: this tick's TargetReader)."""
        for (i, k), matrix in list(self.shown.items()):
            empty = self.characters[i].targets[k]
            if empty is None:
                continue
            now = np.asarray(reader.matrices[i, 1 + k], np.float64).T
            if np.abs(now - matrix).max() > GRABBED:
                del self.shown[(i, k)]
                getattr(self.characters[i].obj.neural_ik, LAYER_SLOTS[k]).free = False   # refreshed next tick
                self.flags[i, k] = False
        if self.stage is not None and not self.flags.any():
            self.stage = None

    def step(self, solver, targets, iterations, contact):
        """The group's solve with the free targets filled in; keeps the filled targets for show(). No bone turns by
        more than MAX_TURN from one tick to the next (the body follows a fast drag over a few ticks)."""
        if targets is None:
            targets = solver.world_targets()
        self.filled = self.stage.step(solver, targets, iterations, contact=contact, measure_errors=False,
                                      ground=None, desired_contact=None, phase=None)
        q = solver.q
        if self.previous is not None and self.previous.shape == q.shape:
            limit_turns(q, self.previous, MAX_TURN)
            np.copyto(solver.last_q, q)
        self.previous = q.copy()

    def show(self, reader):
        """Move each free target's empty to where the model put it (world space)."""
        for i, c in enumerate(self.characters):
            for k in np.nonzero(self.flags[i])[0]:
                empty = c.targets[k]
                if empty is None:
                    continue
                world = reader.character_to_world[i] @ self.filled[i, k]
                if (i, k) not in self.saved:
                    self.saved[(i, k)] = empty.matrix_world.copy()
                empty.matrix_world = Matrix(world.tolist())
                self.shown[(i, k)] = np.asarray(empty.matrix_world, np.float64)

    def stop(self):
        """Put the empties live mode moved back, except those the user pinned by moving them."""
        for (i, k), matrix in self.saved.items():
            empty = self.characters[i].targets[k]
            try:
                if empty is not None and (i, k) in self.shown:
                    empty.matrix_world = matrix
            except ReferenceError:
                pass
        self.saved.clear()
        self.shown.clear()
