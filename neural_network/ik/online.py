"""Bake's edits of a clip's targets (foot lock, the ground under the feet, the body brought down where a leg cannot
reach), one frame at a time, for a live tick.

Bake sees the whole clip: it finds the contacts, then edits every frame knowing the next (foot_lock.lock_feet,
terrain.fit_to_ground, foot_lock.hips_drop). A live tick sees only the frame the scene is on, and the ground, the
empties and the influences may change between ticks. `OnlineEdits` keeps one character's state across ticks and
applies the same rules causally:

- Lock Feet: `foot_lock.lock_step`, the very rule `lock_feet` runs over a clip, one frame per tick (the contacts are
  the action's, found once: `planted`).
- Ground: the foot's ground goes toward the hit under the foot now by the share `terrain.ground_rates` gives (1 in a
  contact, a smoothstep over what is left of a swing, so the foot reaches the hit under it as it lands, with no look
  at the ground ahead); planted feet tilt toward the normal by `terrain.contact_weight` (the action's timeline, known
  ahead); the body (root, hands, head) rises by the lower foot's ground through EXPONENTIAL smoothing (time constant
  BODY_FRAMES frames: it never jumps, and lags the feet by about that many frames).
- Hips drop: `foot_lock.hips_need` from the final targets; the drop RISES AT MOST `DROP_RISE` rig heights a frame
  (rate-limited: a need that jumps, say an empty dragged away, comes in over a few frames, with the leg straight
  meanwhile) and FALLS BY EXPONENTIAL SMOOTHING (time constant DROP_FRAMES), so the body neither pops down nor up.
  With Lock Feet the drop is also never below `lock_drop`, Bake's own (foot_lock.hips_drop, look-ahead included)
  for the action's targets locked as lock_feet locks them, computed once: a locked foot falls out of reach fastest
  in the last frame or two before it lifts off (the hips travel on, the leg is straight), too fast for a rate limit;
  the clip's timeline is known ahead, so the body starts down before, as in Bake.

Frames, not ticks, are the time: a tick on the same frame as the one before recomputes that frame from the state the
frame before left (the empties or the ground may have moved), a step forward of up to MAX_STEP frames advances by
that many (playback that drops frames), and anything else - a step back, a scrub, a jump, a loop to the start -
starts afresh from the frame it lands on, where no continuity is owed.

Targets are (6, 4, 4) matrices in character space (+Z up): root (hips), left hand, right hand, left foot, right foot,
head. Pure NumPy.
"""

import math

import numpy as np

from .foot_lock import (
    BODY_TARGETS,
    FOOT_TARGETS,
    apply_lock,
    foot_positions,
    heading,
    hips_drop,
    hips_need,
    lock_feet,
    lock_step,
)
from .terrain import contact_weight, ground_rates, tilt_rows

MAX_STEP = 4                 # frames forward that still continue the motion (more: a jump)
BODY_FRAMES = 4.0            # time constant of the body's rise with the ground (frames)
DROP_RISE = 0.01             # the hips drop grows by at most this share of the rig's height a frame ...
DROP_FRAMES = 4.0            # ... and shrinks with this time constant (frames)
REACH = 0.995                # hips_need's: a leg reaches this share of its length
FREE_RATE = 1.0 - math.exp(-1.0 / BODY_FRAMES)    # a foot never planted follows the ground by exponential smoothing
_FRESH = (None, None, None, None, None)           # lock state per foot, foot grounds, body lift, hips drop
_FEET, _BODY = list(FOOT_TARGETS), list(BODY_TARGETS)
_UP = (0.0, 0.0, 1.0)
_LEVEL = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))     # no tilt


class OnlineEdits:
    """One live character's edits, frame by frame (see the module's docstring). `planted` (F, 2) are the action's
    contacts (foot_lock.planted_feet over its frames); thighs (2, 3) the thighs' heads in the root target's frame;
    legs (2,) the legs' lengths (foot_lock.leg_lengths); height the rig's; targets (F, 6, 4, 4) the action's, for
    lock_drop (zeros without)."""

    def __init__(self, planted, thighs, legs, height, blend_frames=4, targets=None):
        self.planted = np.asarray(planted, bool)
        self.contact_rows = [tuple(row) for row in self.planted.astype(np.float64).tolist()]   # contact inputs
        self.tilt = contact_weight(self.planted, blend_frames)
        self.keep = 1.0 - ground_rates(self.planted, FREE_RATE)     # the share of the foot's ground a frame keeps
        self.keep_rows, self.tilt_rows = self.keep.tolist(), self.tilt.tolist()
        self.thighs = np.asarray(thighs, np.float64)
        self.legs = np.asarray(legs, np.float64)
        self.reach = ((REACH * self.legs) ** 2).tolist()
        self.thigh_rows = self.thighs.tolist()
        self.rise = DROP_RISE * height
        self.blend_frames = blend_frames
        self.lock_drop = np.zeros(len(self.planted))
        if targets is not None:
            roots = np.asarray(targets, np.float64)[:, 0]
            thighs_now = np.einsum("fij,tj->fti", roots[:, :3, :3], self.thighs) + roots[:, None, :3, 3]
            self.lock_drop = hips_drop(thighs_now, foot_positions(lock_feet(targets, self.planted, blend_frames)),
                                       self.legs)
        self.frame = None
        self.tilt_key = self.tilts = None       # _tilts' last normals and weights, and its result
        self.before = self.after = _FRESH
        self.steps = 0

    def reset(self):
        self.frame = None

    def state(self):
        """The state a frame's edits left (for `restore`): the frame and what the next frame continues from."""
        return self.frame, tuple(self.after)

    def restore(self, state):
        """Continue from a `state()`, as if its frame had just been edited again."""
        self.frame, after = state
        self.after = list(after)

    def resume(self, index, state):
        """begin(index) with this frame's Lock Feet and ground parts taken from `state` (a state() of this frame
        before its drop, kept): only the drop is worked out again, from the frame before's."""
        self.begin(index)
        self.after[:4] = state[1][:4]

    def begin(self, index):
        """Start the edits of frame `index` (of the action's frames); returns False when they start afresh."""
        if self.frame is not None and index == self.frame:
            pass                                                   # the same frame: again from the frame before
        elif self.frame is not None and 0 < index - self.frame <= MAX_STEP:
            self.before, self.steps = self.after, index - self.frame
        else:
            self.before, self.steps = _FRESH, 0
        self.frame = index
        self.after = list(self.before)
        return self.before is not _FRESH

    def lock(self, targets):
        """Lock Feet on the foot targets of `targets` (6, 4, 4), in place."""
        f = self.frame
        for foot, t in enumerate(FOOT_TARGETS):
            clip_xy = targets[t, :2, 3].copy()
            state = lock_step(self.before[foot], clip_xy, float(heading(targets[t, :3, :3])), self.planted[f, foot],
                              self.blend_frames, max(self.steps, 1))
            apply_lock(targets[t], clip_xy, state)
            self.after[foot] = state

    def ground(self, targets, hit_height, hit_normal):
        """Put the feet of `targets` (6, 4, 4) on the ground under them and raise the body with it, in place:
        hit_height (2 floats) and hit_normal (2 of (x, y, z)) are the ground under each foot target now (character
        space). Returns each foot's ground [left, right]: the ground the network is told each foot stands on.
        (Two feet, a few numbers: Python floats, far cheaper per tick than NumPy calls on arrays this small.)"""
        f, before, steps = self.frame, self.before[2], self.steps
        if before is None:
            ground = list(hit_height)
        else:                   # the frames since the last (one, usually): the share of the way each goes, compounded
            keep = self.keep_rows[f] if steps == 1 else self.keep[f - steps + 1:f + 1].prod(axis=0).tolist()
            ground = [h + (b - h) * k for h, b, k in zip(hit_height, before, keep)]
        tilts = self._tilts(hit_normal, self.tilt_rows[f])
        if tilts is not None:                     # both feet's turns toward their ground in one product
            targets[3:5, :3, :3] = tilts @ targets[3:5, :3, :3]          # FOOT_TARGETS
        lowest = min(ground)
        lift = lowest if self.before[3] is None else lowest + (self.before[3] - lowest) * math.exp(-steps / BODY_FRAMES)
        targets[:, 2, 3] += (lift, lift, lift, ground[0], ground[1], lift)        # BODY_TARGETS, FOOT_TARGETS
        self.after[2], self.after[3] = ground, lift
        return ground

    def _tilts(self, normals, weights):
        """(2, 3, 3) each foot's terrain.tilt_toward its ground's normal by its tilt weight this frame, or None where
        neither turns (a foot in the air, level ground); kept while the normals and weights stay (planted feet)."""
        key = (normals[0], normals[1], weights[0], weights[1])
        if key == self.tilt_key:
            return self.tilts
        self.tilt_key = key
        rows = [_LEVEL if not weight or normal == _UP else tilt_rows(*normal, weight)
                for normal, weight in zip(normals, weights)]
        self.tilts = None if rows[0] is _LEVEL and rows[1] is _LEVEL else np.array(rows)
        return self.tilts

    def drop(self, targets, share=None, locked=False):
        """Bring the body of `targets` (6, 4, 4) down where a leg cannot reach its foot, in place; `share` (4,): how
        much of the drop each body target (root, hands, head) takes (1 - its empty's position influence: a pinned
        hand stays pinned); locked: Lock Feet is on (the drop is at least lock_drop). Returns the drop."""
        need = 0.0
        rows = targets[:5, :3, :].tolist()
        (a0, a1, a2, x0), (b0, b1, b2, y0), (c0, c1, c2, z0) = rows[0]                  # the root target
        for (x, y, z), foot, reach in zip(self.thigh_rows, rows[3:5], self.reach):     # FOOT_TARGETS
            gx = a0 * x + a1 * y + a2 * z + x0 - foot[0][3]
            gy = b0 * x + b1 * y + b2 * z + y0 - foot[1][3]
            gz = c0 * x + c1 * y + c2 * z + z0 - foot[2][3]
            if gx * gx + gy * gy + gz * gz > reach:
                # a foot farther from its thigh than the leg reaches: the hips must come down (hips_need: how far)
                root = targets[0]
                need = float(hips_need(self.thighs @ root[:3, :3].T + root[:3, 3], targets[_FEET, :3, 3], self.legs,
                                       REACH))
                break
        before = self.before[4]
        if before is None:
            drop = need
        elif need > before:
            drop = min(need, before + self.rise * self.steps)
        else:
            drop = need + (before - need) * math.exp(-self.steps / DROP_FRAMES)
        if locked:
            drop = max(drop, float(self.lock_drop[self.frame]))
        if drop:
            targets[_BODY, 2, 3] -= drop if share is None else drop * np.asarray(share, np.float64)
        self.after[4] = drop
        return drop
