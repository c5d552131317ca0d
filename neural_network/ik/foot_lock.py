"""Foot lock: a planted foot's target stays where it landed for the whole contact.

Retargeted or noisy motion slides its feet: the hips' path was scaled by the ratio of leg lengths, or the capture
drifted. A bake from such a clip takes its effectors as targets, so the solve slides as the clip does. Here each foot
target becomes the clip's plus an offset that changes only where it must:

- `planted_feet` finds the contacts in the clip itself, per foot, with hysteresis: a foot lands when its ankle is
  low and slow (`features.detect_contacts`' thresholds) and lifts off only when it is clearly higher or faster, so a
  flag does not chatter on a noisy ankle; a contact shorter than `min_frames` is dropped.
- `lock_feet` walks the frames in order. While a foot is planted its target's horizontal position and heading are
  those it had when it landed (the clip's height and tilt are kept, so the heel still rises before a step), unless
  the clip's foot moves on too far (then the lock lets go); after lift-off the offset to the clip fades to nothing
  over `blend_frames` (smoothstep), and a landing within the fade locks wherever the foot then is. So the target
  never jumps: at landing the offset does not change, and afterwards it changes by at most the clip's own slide
  spread over the fade.

A locked foot can be out of its leg's reach where the clip's hips travel farther than its steps (exactly the
retargeted clip whose feet slide). `hips_drop` then says how far the hips must come down for both legs to reach,
smoothed over time so the body sinks into the step and rises out of it without a pop; the bake lowers the hips (and
the root target, the hands and the head: the whole body sinks, the feet stay) by it.

Targets are (F, 6, 4, 4) matrices in character space (+Z up) in the order hips, left hand, right hand, left foot,
right foot, head (`runtime.inputs`). Pure NumPy.
"""

import numpy as np

from ..data.features import CONTACT_HEIGHT, CONTACT_SPEED, foot_height_and_speed
from ..skeleton.roles import ROLE_INDEX

FOOT_TARGETS = (3, 4)            # left foot, right foot in the six targets
BODY_TARGETS = (0, 1, 2, 5)      # the root (hips), both hands and the head: they come down with the hips
LIFT_HEIGHT = 1.5                # lift-off: higher than this many times the landing height threshold ...
LIFT_SPEED = 1.5                 # ... or faster than this many times the landing speed threshold
RELEASE = 0.08                   # a lock lets go when the clip's foot has moved this share of the rig's height on


def planted_feet(foot_positions, fps, rig_height, min_frames=3):
    """(F, 2) bool: each foot planted, from (F, 2, 3) ankle positions of one clip (ground at its lowest ankle)."""
    height, speed = foot_height_and_speed(np.asarray(foot_positions, np.float64), 0.0, fps)
    lands = (height < CONTACT_HEIGHT * rig_height) & (speed < CONTACT_SPEED * rig_height)
    stays = (height < LIFT_HEIGHT * CONTACT_HEIGHT * rig_height) & (speed < LIFT_SPEED * CONTACT_SPEED * rig_height)
    planted = np.zeros(lands.shape, bool)
    for foot in range(2):
        on = False
        for f in range(len(lands)):
            on = lands[f, foot] or (on and stays[f, foot])
            planted[f, foot] = on
        for start, end in _spans(planted[:, foot]):
            if end - start < min_frames:
                planted[start:end, foot] = False
    return planted


def smoothstep(x):
    """3 x^2 - 2 x^3: 0 -> 1 over x in 0..1 with zero slope at both ends."""
    return x * x * (3.0 - 2.0 * x)


def foot_positions(targets):
    """(F, 2, 3) the foot targets' positions of (F, 6, 4, 4) targets."""
    return np.asarray(targets)[:, list(FOOT_TARGETS)][..., :3, 3]


def _spans(flags):
    """[(start, end)] of the runs of True in a 1-D bool array (end exclusive)."""
    edges = np.flatnonzero(np.diff(np.concatenate(([False], flags, [False])).astype(np.int8)))
    return list(zip(edges[0::2], edges[1::2]))


def heading(rotations):
    """(...,) the heading (radians about +Z) of rotation matrices: the direction their Y axis (a Blender bone's
    length, heel to toe on a foot) points on the ground."""
    forward = np.asarray(rotations)[..., :, 1]
    return np.arctan2(forward[..., 1], forward[..., 0])


def _turn_z(angle):
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def lock_feet(targets, planted, blend_frames=4, max_offset=np.inf):
    """(F, 6, 4, 4) targets with each planted foot held where it landed (horizontal position and heading); `planted`
    is (F, 2) bool, from `planted_feet`. A lock whose foot has moved on more than `max_offset` (m) in the clip is let
    go there, as at a lift-off (a pivot or a shuffle the contact test took for a stance: holding it would leave the
    foot behind the body); the foot locks again at its next landing. The other targets are returned as given."""
    out = np.array(targets, np.float64, copy=True)
    planted = np.asarray(planted, bool)
    for foot, t in enumerate(FOOT_TARGETS):
        clip_xy = out[:, t, :2, 3].copy()
        clip_heading = heading(out[:, t, :3, :3])
        state = None
        for f in range(len(out)):
            state = lock_step(state, clip_xy[f], clip_heading[f], planted[f, foot], blend_frames, max_offset=max_offset)
            apply_lock(out[f, t], clip_xy[f], state)
    return out


def lock_step(state, clip_xy, clip_heading, planted, blend_frames=4, frames=1, max_offset=np.inf):
    """lock_feet's rule for one foot and one frame, `frames` after the last (a live tick may skip some): the state
    (None at first) of the frame before -> this frame's. A state is (offset_xy (2,), offset_turn: the output minus
    the clip's; the locked position and heading, None when not locked; the offset the fade started from, None when
    not fading; frames since lift-off; whether this contact's lock was let go for moving on past `max_offset`)."""
    offset_xy, offset_turn, locked_xy, locked_heading, fade_from, since_lift, released = state or (
        _NO_OFFSET, 0.0, None, 0.0, None, 0, False)
    if not planted:
        released = False
    elif released and locked_xy is None and fade_from is None:
        released = False                         # the fade after a let-go is over: plant again where the foot is
    elif locked_xy is not None and np.hypot(*(locked_xy - clip_xy)) > max_offset:
        released = True
    planted = planted and not released
    if planted:
        if locked_xy is None:                      # landing: lock where the target is now (no jump)
            locked_xy = clip_xy + offset_xy
            locked_heading = clip_heading + offset_turn
        offset_xy = locked_xy - clip_xy
        offset_turn = float(np.angle(np.exp(1j * (locked_heading - clip_heading))))
    elif locked_xy is not None or fade_from is not None:
        if locked_xy is not None:                  # lift-off: fade the offset out from here
            fade_from, since_lift, locked_xy = (offset_xy.copy(), offset_turn), 0, None
        since_lift += frames
        x = min(since_lift / (blend_frames + 1), 1.0)
        keep = 1.0 - smoothstep(x)
        offset_xy, offset_turn = fade_from[0] * keep, fade_from[1] * keep
        if keep == 0.0:
            fade_from = None
    return offset_xy, offset_turn, locked_xy, locked_heading, fade_from, since_lift, released


_NO_OFFSET = np.zeros(2)
_NO_OFFSET.flags.writeable = False


def apply_lock(target, clip_xy, state):
    """Move one foot target (4, 4) (in place) by a lock_step state's offset from the clip's position `clip_xy`."""
    offset_xy, offset_turn = state[0], state[1]
    if offset_turn or offset_xy.any():
        target[:2, 3] = clip_xy + offset_xy
        target[:3, :3] = _turn_z(offset_turn) @ target[:3, :3]


def leg_lengths(skeleton):
    """(2,) each leg's length, thigh's head to ankle (left, right)."""
    return np.array([np.linalg.norm(skeleton.offsets[ROLE_INDEX[side + "Shin"]])
                     + np.linalg.norm(skeleton.offsets[ROLE_INDEX[side + "Foot"]]) for side in ("Left", "Right")])


def hips_need(thighs, feet, leg_lengths, reach=0.995):
    """(...,) how far (along -Z) the hips must come down so each ankle target in `feet` (..., 2, 3) is within `reach`
    of its leg's length (2,) from the thigh's head `thighs` (..., 2, 3); 0 where both already are."""
    v = np.asarray(thighs, np.float64) - np.asarray(feet, np.float64)
    longest = reach * np.asarray(leg_lengths, np.float64)
    horizontal = np.minimum(np.sum(v[..., :2] ** 2, axis=-1), longest ** 2)
    return np.max(np.maximum(v[..., 2] - np.sqrt(longest ** 2 - horizontal), 0.0), axis=-1)


def hips_drop(thighs, feet, leg_lengths, reach=0.995, window=6):
    """(F,) how far (along -Z) the hips must come down so each ankle target in `feet` (F, 2, 3) is within `reach` of
    its leg's length (2,) from the thigh's head `thighs` (F, 2, 3); 0 where both already are. Smoothed by `cover`,
    so the drop is at least the need in every frame and changes gently."""
    return cover(hips_need(thighs, feet, leg_lengths, reach), window)


def cover(need, window):
    """(F,) a smooth curve at or above `need` (F,) >= 0 everywhere: a running maximum over `window` frames each side,
    then a weighted average over the same window (every value the average takes at frame i is a maximum over a
    window holding frame i, so it never falls below need[i]); zeros stay zeros away from any need."""
    need = np.asarray(need, np.float64)
    if not need.any():
        return need.copy()
    w = int(window)
    envelope = np.max(np.lib.stride_tricks.sliding_window_view(np.pad(need, w, mode="edge"), 2 * w + 1), axis=1)
    x = (np.arange(2 * w + 1) + 1) / (2 * w + 2)
    kernel = smoothstep(x) * (1 - x)                      # a smooth bump
    return np.convolve(np.pad(envelope, w, mode="edge"), kernel / kernel.sum(), mode="valid")
