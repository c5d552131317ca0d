"""Terrain: a clip made on flat ground, fitted to the ground under each foot.

The clip's motion was captured on flat ground at height 0 (the armature origin's level). Given, per frame and foot,
the height and normal of the ground under the foot's target (Blender casts the rays), `fit_to_ground` moves:

- each foot target up or down by the ground's height under it, so a planted sole rests on the surface at the foot's
  own height above the ground in the clip; during a contact the height is the one under the foot, between contacts
  it goes from the lift-off's height to the next landing's with a smoothstep over the swing, so a step's edge passing
  under a swinging foot does not make it pop;
- each planted foot turned about its ankle toward the surface normal (the tilt fades in and out over `blend_frames`
  around the contact); the ankle's joint limits are the refinement's to keep;
- the body (root target, hands, head) by the higher of the two feet's ground heights, smoothed over time, so the
  character walks up a slope or a stair instead of crouching into it; where a leg then cannot reach its lower foot,
  `foot_lock.hips_drop` brings the body down just enough (so the upper leg bends no more than it must).

The network's ground inputs stay as training saw them (normal +Z, height 0 under the clip's feet): every dataset has
flat ground, so a tilted normal would be out of distribution; the slope is applied here, to the targets, instead.
Pure NumPy.
"""

import math

import numpy as np

from .foot_lock import BODY_TARGETS, FOOT_TARGETS, _spans, cover, smoothstep

UP = np.array([0.0, 0.0, 1.0])
EDGE = 0.02      # m: two ground heights further apart than this (beyond what a slope explains) are two surfaces


def foot_ground(planted, hit_height):
    """(F, 2) the ground height each foot target stands over: the hit under it while planted, and between two
    contacts a smoothstep from the lift-off's height to the next landing's (before the first contact and after the
    last: the nearest contact's; a foot never planted: the hit under it, smoothed by the same rule over the clip)."""
    planted = np.asarray(planted, bool)
    hit_height = np.asarray(hit_height, np.float64)
    out = hit_height.copy()
    for foot in range(2):
        spans = _spans(planted[:, foot])
        if not spans:
            continue
        h = hit_height[:, foot]
        out[:spans[0][0], foot] = h[spans[0][0]]
        out[spans[-1][1]:, foot] = h[spans[-1][1] - 1]
        for (_s0, e0), (s1, _e1) in zip(spans[:-1], spans[1:]):
            x = (np.arange(e0, s1) - e0 + 1) / (s1 - e0 + 1)
            out[e0:s1, foot] = h[e0 - 1] + (h[s1] - h[e0 - 1]) * smoothstep(x)
    return out


def ground_rates(planted, free_rate):
    """(F, 2) `foot_ground`'s rule made causal, for a live tick, which cannot see the ground under the next landing:
    per frame, the share of the way from the foot's ground so far to the hit under it now that the foot's ground
    goes. 1 in a contact (the hit under the planted foot); through a swing the smoothstep's step over what is left of
    it, so a ground that holds still under the foot gives foot_ground's curve exactly and the landing the hit itself
    (before the first contact the swing starts at the first frame); 0 after the last contact (its height is held);
    `free_rate` throughout for a foot never planted (exponential smoothing)."""
    planted = np.asarray(planted, bool)
    rates = np.zeros(planted.shape)
    for foot in range(2):
        spans = _spans(planted[:, foot])
        if not spans:
            rates[:, foot] = free_rate
            continue
        swings = [(0, spans[0][0])] + [(e0, s1) for (_s0, e0), (s1, _e1) in zip(spans[:-1], spans[1:])]
        for e0, s1 in swings:
            f = np.arange(e0, s1)
            done, now = smoothstep((f - e0) / (s1 - e0 + 1)), smoothstep((f - e0 + 1) / (s1 - e0 + 1))
            rates[e0:s1, foot] = (now - done) / (1.0 - done)
        for start, end in spans:
            rates[start:end, foot] = 1.0
    return rates


def smooth(values, window):
    """A moving average over `window` frames each side with a smooth (triangular) weight, edges held."""
    w = int(window)
    if w <= 0 or len(values) < 2:
        return np.asarray(values, np.float64).copy()
    kernel = np.concatenate([np.arange(1, w + 2), np.arange(w, 0, -1)]).astype(np.float64)
    return np.convolve(np.pad(values, w, mode="edge"), kernel / kernel.sum(), mode="valid")


def contact_weight(planted, blend_frames):
    """(F, 2) 1 inside contacts, fading to 0 over `blend_frames` before each landing and after each lift-off."""
    planted = np.asarray(planted, bool)
    out = planted.astype(np.float64)
    n = len(planted)
    for foot in range(2):
        for start, end in _spans(planted[:, foot]):
            for i in range(1, blend_frames + 1):
                w = smoothstep(1.0 - i / (blend_frames + 1))
                if start - i >= 0:
                    out[start - i, foot] = max(out[start - i, foot], w)
                if end - 1 + i < n:
                    out[end - 1 + i, foot] = max(out[end - 1 + i, foot], w)
    return out


def tilt_toward(normals, weight):
    """(..., 3, 3) rotations turning +Z toward `normals` (..., 3) by the share `weight` (...,) of the angle: about the
    horizontal axis +Z x n, in closed form (Rodrigues' formula with that axis' zero Z). One normal (3,) with a scalar
    weight is worked in Python floats (a live tick's foot: a few dozen NumPy calls on scalars cost far more)."""
    if np.ndim(normals) == 1 and np.ndim(weight) == 0:
        return np.array(tilt_rows(*(float(v) for v in normals), float(weight)))
    n = np.asarray(normals, np.float64)
    x, y, z = n[..., 0], n[..., 1], n[..., 2]
    across = np.hypot(x, y)
    angle = np.arctan2(across, z) * np.asarray(weight, np.float64)
    safe = np.where(across > 1e-12, across, 1.0)
    ax, ay = np.where(across > 1e-12, -y / safe, 0.0), np.where(across > 1e-12, x / safe, 0.0)
    rows = _tilt_rows(ax, ay, np.cos(angle), np.sin(angle))
    out = np.empty(n.shape + (3,))
    for i in range(3):
        for j in range(3):
            out[..., i, j] = rows[i][j]
    return out


def tilt_rows(x, y, z, weight):
    """tilt_toward for one normal (x, y, z) and weight, in Python floats: the rotation as three row tuples."""
    across = math.hypot(x, y)
    angle = math.atan2(across, z) * weight
    ax, ay = (-y / across, x / across) if across > 1e-12 else (0.0, 0.0)
    return _tilt_rows(ax, ay, math.cos(angle), math.sin(angle))


def _tilt_rows(ax, ay, c, s):
    """The rotation by the angle of cosine c and sine s about the horizontal unit axis (ax, ay, 0), as rows."""
    t = 1.0 - c
    return ((c + t * ax * ax, t * ax * ay, s * ay), (t * ax * ay, c + t * ay * ay, -s * ax), (-s * ay, s * ax, c))


def balls(targets, toe_offsets):
    """(F, 2, 3) where each foot target puts the ball of its foot (the toe bone's head): ankle + R_foot @ offset, the
    offsets (2, 3) in the foot's frame (Skeleton.offsets of the toe roles)."""
    feet = np.asarray(targets)[:, list(FOOT_TARGETS)]
    return feet[..., :3, 3] + np.einsum("fkij,kj->fki", feet[..., :3, :3], np.asarray(toe_offsets, np.float64))


def support(ankle_hits, ball_hits, ankle_normals, ball_normals, edge=EDGE):
    """(heights (F, 2), normals (F, 2, 3), across an edge (F, 2) bool): the ground a sole rests on, from the ground
    under its ankle and under the ball of its foot (points (F, 2, 3), unit normals (F, 2, 3)).

    On a smooth surface (the two heights differ as the normals' slope says, within `edge` m) the sole lies on the
    plane through both points, its roll from the normal under the ankle (on a bump that plane seats the sole better
    than either point's normal); the height is the ground's under the ankle. Across an edge (a step's nose, a kerb)
    the foot stands on the higher of the two, flat on that surface, with the rest of the sole over the drop."""
    a, b = np.asarray(ankle_hits, np.float64), np.asarray(ball_hits, np.float64)
    na, nb = np.asarray(ankle_normals, np.float64), np.asarray(ball_normals, np.float64)
    d = b - a
    mean = na + nb
    predicted = -np.sum(mean[..., :2] * d[..., :2], axis=-1) / np.maximum(mean[..., 2], 1e-6)
    smooth = np.abs(d[..., 2] - predicted) <= edge
    lateral = np.cross(na, d)
    plane = np.cross(d, lateral)
    length = np.linalg.norm(plane, axis=-1, keepdims=True)
    plane = np.where(length > 1e-9, plane / np.maximum(length, 1e-12), na)
    ball_higher = b[..., 2] > a[..., 2]
    heights = np.where(smooth | ~ball_higher, a[..., 2], b[..., 2])
    normals = np.where(smooth[..., None], plane, np.where(ball_higher[..., None], nb, na))
    return heights, normals, ~smooth


def hold_across_edges(planted, heights, normals, edges, tolerance=EDGE):
    """(heights, normals, planted for the fit): every contact that stands across an edge at any of its frames placed
    once, on the highest surface it meets (the normal there), for the whole contact: a foot rolling over a step's nose
    must not drop onto the lower tread halfway through its stance. First, frames at either end of such a contact
    that stand on another surface than most of its frames (within `tolerance` m), a quarter of the contact at most,
    leave it for the fit: the foot is landing or lifting off there (a toe-off whose ball passes over the next step's
    nose because the clip's stride does not match the stair). They are fitted as the swing is, and the rest of the
    contact stays on its tread instead of standing a step high over it. The planted flags returned are for the
    fit alone (the network's contact inputs stay the clip's)."""
    heights, normals = np.array(heights, np.float64), np.array(normals, np.float64)
    planted = np.array(planted, bool)
    edges = np.asarray(edges, bool)
    for foot in range(2):
        for start, end in _spans(planted[:, foot]):
            if not edges[start:end, foot].any():
                continue
            span = heights[start:end, foot]
            ordered = np.sort(span)          # how many of the contact's frames stand within tolerance of each
            shared = np.searchsorted(ordered, span + tolerance, "right") - np.searchsorted(ordered, span - tolerance)
            usual = np.abs(span - span[int(np.argmax(shared))]) <= tolerance      # on the most frames' surface
            first, last = int(np.argmax(usual)), len(span) - int(np.argmax(usual[::-1]))
            if first + len(span) - last <= len(span) // 4:
                planted[start:start + first, foot] = False
                planted[start + last:end, foot] = False
                start, end = start + first, start + last
            if edges[start:end, foot].any():
                top = start + int(np.argmax(heights[start:end, foot]))
                heights[start:end, foot] = heights[top, foot]
                normals[start:end, foot] = normals[top, foot]
    return heights, normals, planted


def fit_to_ground(targets, planted, hit_height, hit_normal, blend_frames=4, body_window=8):
    """(targets on the ground (F, 6, 4, 4), body lift (F,)): see the module's docstring. hit_height (F, 2) and
    hit_normal (F, 2, 3) are the ground under each foot target, in character space."""
    out = np.array(targets, np.float64, copy=True)
    ground = foot_ground(planted, hit_height)
    weight = contact_weight(planted, blend_frames)
    for foot, t in enumerate(FOOT_TARGETS):
        out[:, t, 2, 3] += ground[:, foot]
        out[:, t, :3, :3] = tilt_toward(hit_normal[:, foot], weight[:, foot]) @ out[:, t, :3, :3]
    lift = smooth(cover(ground.max(axis=1), body_window // 2), body_window // 2)
    out[:, list(BODY_TARGETS), 2, 3] += lift[:, None]
    return out, lift
