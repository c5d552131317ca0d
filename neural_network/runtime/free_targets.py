"""Free targets: the ones a user leaves to the model, filled in before the solve.

    targets (K, 6, 4, 4), the free ones whatever they were
    -> the model's target prior (model/prior.py) places every free target from the pinned ones; in a Bake (the
       frames of one clip) its clip prior, where it has one, places the free feet from how the pinned targets move
       over the clip, and the free root and head go between the two priors' placements (clip_shares)
    -> with the root free, the hips stage (ik/hips_reach.py) moves the root so every pinned limb reaches, and the
       free effectors ride along with it
    -> the solver as always; a free effector then lands where the network puts it (Solver.step's `follow`): only
       the pinned ones are made exact, so a hand pinned to the floor bends the spine without a free head pulling it
       back up
    -> where a pinned target missed, the hips stage again with no slack, then also with no roll, and the solve
       (each kept where the worst pinned miss gets smaller)
    -> with the root free and the head pinned, a head the spine could not bring onto its target moves the root by
       its miss, and the pose is refined again (Solver.refine_again; kept where the worst pinned miss gets smaller).

`FreeTargets` holds the free set and, for a sequence of ticks or frames, the hips stage's last solution (it starts
from there, so a dragged target moves the body continuously and cheaply). Pure NumPy; no bpy.
"""

import numpy as np

from ..geometry import kinematics
from ..geometry.quaternion_math import quaternions_to_matrices
from ..geometry.rotations import blend_transforms, orthonormalize
from ..ik.hips_reach import HipsReach
from ..model.prior import LOSS, free_mask

FEET, ROOT_AND_HEAD = free_mask(["left_foot", "right_foot"]), free_mask(["root", "head"])   # clip_shares' sets
CLIP_SHARES = (0.7, 0.5)  # Bake: a free root's and head's placement this share of the way from the plain prior's to
                          # the clip prior's, with both feet pinned and with a foot free (clip_shares)
HEAD_SHIFTS = 2          # a pinned head the solve left off its target: this many shifts of the root toward it at most
SMOOTH_SECONDS = 0.3     # Bake: the prior's placements averaged over this long a window of the clip (frame to frame
                         # they jitter; measured on unseen Bandai styles: the hips 6.4 -> 6.1 cm)


def smoothed(targets, free, window):
    """(F, 6, 4, 4) frames of one clip with each free target's placement averaged over `window` frames centred on
    each (positions, and rotations as the nearest rotation to their mean); the pinned ones as given."""
    free = np.asarray(free, bool)
    if window < 2 or not free.any() or len(targets) < 2:
        return targets
    out = np.array(targets, np.float64)
    half = window // 2
    padded = np.concatenate([np.repeat(out[:1], half, 0), out, np.repeat(out[-1:], half, 0)])
    kernel = np.ones(2 * half + 1) / (2 * half + 1)
    slots = np.nonzero(free)[0]
    flat = padded[:, slots, :3, :].reshape(len(padded), -1)
    mean = np.stack([np.convolve(flat[:, c], kernel, mode="valid") for c in range(flat.shape[1])], axis=1)
    mean = mean.reshape(len(out), len(slots), 3, 4)
    placed = out[:, slots]
    placed[..., :3, :3] = orthonormalize(mean[..., :3])
    placed[..., :3, 3] = mean[..., 3]
    out[:, slots] = placed
    return out


def clip_shares(free, root_and_head=True):
    """(..., 6) the clip prior's share of each target's placement in a Bake, for free sets `free` (..., 6) bool; the
    plain prior's is the rest. A free foot: 1 (the clip prior alone: how the head and hands move over the clip says
    where a walk's feet are, which one frame does not). With root_and_head, a free root and head go between the two
    priors' answers: CLIP_SHARES[0] of the way to the clip prior's with both feet pinned, CLIP_SHARES[1] with a foot
    free. Measured on the Bandai rig's 35 unseen clips with three clip priors (docs/results.md): root and head free,
    all joints 4.02-4.16 cm (the clip prior alone) -> 3.98-4.09; the VR case 5.38-5.68 (the plain prior's root) ->
    5.19-5.50. root_and_head is for a clip prior trained on lengths (prior.LOSS); one trained before, on squares,
    placed them worse than the plain prior on the demo rig (the shipped model's then: 2.40 -> 2.52 cm) and is left
    out. Anything else free: 0 (the plain prior's)."""
    free = np.asarray(free, bool)
    feet_pinned = ~(free & FEET).any(axis=-1, keepdims=True)
    between = np.where(feet_pinned, CLIP_SHARES[0], CLIP_SHARES[1]) * (ROOT_AND_HEAD & bool(root_and_head))
    return free * np.where(FEET, 1.0, between)


class NoPrior(ValueError):
    """The model has no target prior (trained before free targets existed)."""


class FreeTargets:
    """The free targets of K characters that share a model (one set for all, or one each), and the hips stage's last
    solution between calls."""

    def __init__(self, model, free, prior=None):
        """free: (6,) bool or target names (one set for every character), or (K, 6) bool (one set each). prior: what
        places the free targets (default: the model's learned one; prior.UprightPrior for the baseline)."""
        free = np.asarray(free)
        if free.dtype != bool:
            free = free_mask(free)              # names
        if free.all(axis=-1).any():
            raise ValueError("all six targets are free: pin at least one")
        if free.any() and model.prior is None and prior is None:
            raise NoPrior("this model has no target prior (it was trained before free targets existed): train it "
                          "again to leave targets free")
        self.free = free
        self.prior = model.prior if prior is None else prior
        # the clip prior (Bake's free feet and its share of a free root and head), unless another prior was given to
        # place everything (the baseline)
        self.clip_prior = getattr(model, "clip_prior", None) if prior is None else None
        self.clip_shares = clip_shares(free, self.clip_prior is not None and self.clip_prior.meta.get("loss") == LOSS)
        self.follow = free[..., 1:].copy()     # effectors the network places (Solver.step's follow)
        self.hips = HipsReach.for_model(model) if free[..., 0].any() else None
        self.last = None                         # the hips stage's last (K, 6) solution

    @property
    def any(self):
        return bool(self.free.any())

    def complete(self, targets, sequence=False, dt=1 / 30):
        """(K, 6, 4, 4) targets with the free ones placed by the prior (a copy). sequence: the K rows are the frames
        of one clip in order, dt seconds apart: where the model has a clip prior, its placements take the shares
        clip_shares gave when this was made."""
        completed = self.prior.complete(targets, self.free)
        if sequence and self.clip_prior is not None and self.clip_shares.any():
            shares = np.broadcast_to(self.clip_shares, completed.shape[:2])
            clip = self.clip_prior.complete(targets, self.free, dt)
            alone, between = shares == 1.0, (shares > 0.0) & (shares < 1.0)
            completed[alone] = clip[alone]
            completed[between] = blend_transforms(completed[between], clip[between], shares[between])
        return completed

    def fill(self, targets, sequence=False, anchors=None, dt=1 / 30):
        """(K, 6, 4, 4) targets with the free ones placed (a copy): the prior, then the hips stage (place). sequence:
        the K rows are frames of one character in order (Bake), dt seconds apart: the hips stage then starts each
        frame from the one before. anchors: (K, 5, 3) the limbs' anchors in the root's frame as a solve put them
        (HipsReach.anchors_of), else the mean pose's."""
        if not self.any:
            return np.array(targets, np.float64)
        return self.place(self.complete(targets, sequence, dt), sequence, anchors)

    def place(self, completed, sequence=False, anchors=None, tight=False, start=None, roll=True):
        """The hips stage on targets the prior completed (a copy; as is without a free root); tight, start, roll: see
        HipsReach.place (start: (K, 5), the sequence's own otherwise)."""
        out = np.array(completed, np.float64)
        if self.hips is None:
            return out
        free = np.broadcast_to(self.free, out.shape[:2])
        rows = np.nonzero(free[:, 0])[0]
        before = out[rows, 0].copy()
        local = None if anchors is None else np.asarray(anchors)[rows]
        solution = np.zeros((len(rows), 5))
        if sequence:                             # one set for the clip
            u = None
            for i, row in enumerate(rows):
                u = u if start is None else start[i:i + 1]
                out[row:row + 1, 0], u = self.hips.place(out[row:row + 1], ~free[row], u,
                                                         None if local is None else local[i:i + 1], tight, roll)
                solution[i] = u
        else:
            if start is None:
                start = self.last if self.last is not None and len(self.last) == len(rows) else None
            placed = np.empty_like(before)
            one_set = len(rows) > 0 and (free[rows] == free[rows[0]]).all()
            sets = [~free[rows[0]]] if one_set else np.unique(~free[rows], axis=0)
            for pinned in sets:                                     # characters with the same pinned set together
                same = np.nonzero((~free[rows] == pinned).all(axis=1))[0]
                placed[same], solution[same] = self.hips.place(
                    out[rows[same]], pinned, None if start is None else start[same],
                    None if local is None else local[same], tight, roll)
            out[rows, 0] = placed
        self.last = solution
        # the root's change, applied to the free effectors (a rigid inverse: the rotation's transpose)
        inverse = np.broadcast_to(np.eye(4), before.shape).copy()
        inverse[:, :3, :3] = np.swapaxes(before[:, :3, :3], -1, -2)
        inverse[:, :3, 3] = -np.einsum("kba,kb->ka", before[:, :3, :3], before[:, :3, 3])
        moved = out[rows, 0] @ inverse
        riding = free[rows, 1:]
        ride = out[rows, 1:]
        ride[riding] = (np.broadcast_to(moved[:, None], ride.shape)[riding]) @ ride[riding]
        out[rows, 1:] = ride
        return out

    def step(self, solver, targets, refine_iterations, sequence=False, clip_dt=None, **settings):
        """solver.step on `targets` with the free ones filled in: the prior places them; with the root free, a first
        pass of the network (no refinement) at the prior's root shows where its spine puts the shoulders and the
        head, and the hips stage works from those; then the solve, the free effectors following the network
        (Solver.step's follow). clip_dt: a sequence's time between frames for the clip prior (default: dt).
        settings: solver.step's others (ground, desired_contact, task, phase, dt, contact, measure_errors). Returns
        the filled targets."""
        filled = self.complete(targets, sequence, clip_dt or settings.get("dt", 1 / 30))
        if sequence:
            filled = smoothed(filled, self.free, max(1, int(round(SMOOTH_SECONDS / settings.get("dt", 1 / 30)))))
        if self.hips is not None:
            solver.step(filled, **{**settings, "measure_errors": False}, refine_iterations=0, graph=False)
            local = quaternions_to_matrices(solver.q)
            pose = kinematics.forward(solver.skeleton, local, filled[:, 0, :3, :3], filled[:, 0, :3, 3])
            settings = {**settings, "contact": solver.settings[:, 2:4].copy(), "task": None}
            completed, started = filled, self.last
            anchors = self.hips.anchors_of(pose.positions, completed[:, 0])
            filled = self.place(completed, sequence, anchors)
        solver.step(filled, refine_iterations=refine_iterations, follow=self.follow, graph=False, **settings)
        # a pinned target missed (the spine could not bring a shoulder the stage's slack further, or a roll took the
        # body where the network's spine does not follow): for those characters or frames the hips stage again with
        # no slack, then also with no roll, and the solve, each kept where it lowers the worst pinned miss
        pinned = ~np.broadcast_to(self.free, filled.shape[:2])[:, 1:]
        rooted = np.broadcast_to(self.free, filled.shape[:2])[:, 0]              # the rows self.last holds
        rolled = rooted.copy()                  # where the no-slack stage rolled: only there may no roll differ
        for roll in (True, False):
            worst = _worst_pinned(solver, pinned)
            missed = (worst > solver.tolerance) & (roll | rolled)
            if self.hips is None or refine_iterations <= 0 or not missed.any():
                break
            kept, before = self.last, _snapshot(solver)
            tight = self.place(completed, sequence, anchors, True, started, roll=roll)
            rolled[rooted] = self.last[:, 4] != 0.0
            retried = filled.copy()
            retried[missed] = tight[missed]
            solver.step(retried, refine_iterations=refine_iterations, follow=self.follow, graph=False, **settings)
            better = missed & (_worst_pinned(solver, pinned) < worst)
            _restore(solver, before, ~better)
            filled[better] = retried[better]
            self.last = np.where(better[rooted][:, None], self.last, kept)
        if self.hips is not None and refine_iterations > 0:
            filled = self._shift_to_head(solver, filled, refine_iterations)
        return filled

    def _shift_to_head(self, solver, filled, refine_iterations):
        """With the root free and the head pinned, a head the solve left off its target (the spine at its limits
        where the hips stage put the root; the VR case's usual miss) brings the whole body along: the root moves by
        the head's miss and the pose is refined again, no network pass (free effectors ride along), at most
        HEAD_SHIFTS times. Kept for the characters (frames) where it lowers the worst pinned miss; the others keep
        the solve as it was. Returns the targets with the roots that were kept."""
        free = np.broadcast_to(self.free, filled.shape[:2])
        shifting = free[:, 0] & ~free[:, 5]
        pinned = ~free[:, 1:]
        for _ in range(HEAD_SHIFTS):
            errors = np.nan_to_num(solver.errors, nan=0.0)
            rows = shifting & (errors[:, 4] > solver.tolerance)
            if not rows.any():
                break
            head = solver.refiner.chain_forward(solver.q, filled[:, 0])[:, solver.effector_slots[4], :3, 3]
            moved = filled.copy()
            moved[rows, 0, :3, 3] += filled[rows, 5, :3, 3] - head[rows]
            before, worst = _snapshot(solver), np.where(pinned, errors, 0.0).max(axis=1)
            solver.refine_again(moved, refine_iterations, self.follow)
            keep = rows & (_worst_pinned(solver, pinned) < worst)
            _restore(solver, before, ~keep)
            filled[keep] = moved[keep]
        return filled


def _snapshot(solver):
    """What a solve left in the solver (pose, errors, status, hips), to go back to."""
    return solver.q.copy(), solver.errors.copy(), solver.status.copy(), solver.last_hips.copy()


def _restore(solver, before, rows):
    """Characters `rows` ((K,) bool) back to the solve `before` (_snapshot)."""
    q, errors, status, hips = before
    solver.q[rows], solver.errors[rows], solver.status[rows] = q[rows], errors[rows], status[rows]
    solver.last_q[rows], solver.last_hips[rows] = q[rows], hips[rows]


def _worst_pinned(solver, pinned):
    """(K,) each character's largest miss of a pinned effector (pinned (K, 5) bool; a non-finite miss is infinite)."""
    return np.where(pinned, np.nan_to_num(solver.errors, nan=np.inf), 0.0).max(axis=1)
