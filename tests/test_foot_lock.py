"""Foot lock (neural_network/ik/foot_lock.py): contacts with hysteresis, planted targets held, the fade after
lift-off. Pure NumPy; the Blender side (Bake with Lock Feet) is tested in test_bake_foot_lock.py."""

import numpy as np

from neural_ik.neural_network.data import features
from neural_ik.neural_network.ik import foot_lock

FPS, HEIGHT = 30.0, 1.7


def _walk(frames=120, slide=0.004, step_every=30):
    """Ankles of a walk: each foot is down for 20 frames of every 30 and sliding forward `slide` m a frame while
    down (a retargeted clip's skate), then swings 0.25 m up and 0.8 m forward. Returns (F, 2, 3)."""
    feet = np.zeros((frames, 2, 3))
    for foot in range(2):
        x, phase = 0.0, foot * step_every // 2
        for f in range(frames):
            t = (f + phase) % step_every
            if t < 20:
                x += slide
                z = 0.0
            else:
                x += 0.08
                z = 0.25 * np.sin(np.pi * (t - 20) / 10)
            feet[f, foot] = (x, 0.2 * (foot - 0.5), z)
    return feet


def _targets(feet, turn=0.0):
    frames = len(feet)
    targets = np.broadcast_to(np.eye(4), (frames, 6, 4, 4)).copy()
    for foot, t in enumerate(foot_lock.FOOT_TARGETS):
        targets[:, t, :3, 3] = feet[:, foot]
        angles = turn * np.arange(frames)       # the clip's foot turns a little every frame
        c, s = np.cos(angles), np.sin(angles)
        targets[:, t, 0, 0], targets[:, t, 0, 1], targets[:, t, 1, 0], targets[:, t, 1, 1] = c, -s, s, c
    targets[:, 1, :3, 3] = np.random.default_rng(0).normal(size=(frames, 3))      # a hand: must not change
    return targets


def test_planted_feet_finds_the_stance_and_does_not_chatter():
    feet = _walk()
    planted = foot_lock.planted_feet(feet, FPS, HEIGHT)
    assert 0.5 < planted.mean() < 0.8
    noisy = feet + np.random.default_rng(1).normal(scale=0.004, size=feet.shape)       # 4 mm jitter
    flags = foot_lock.planted_feet(noisy, FPS, HEIGHT)
    # every contact lasts at least 3 frames, and there are no more contacts than steps
    for foot in range(2):
        spans = foot_lock._spans(flags[:, foot])
        assert all(end - start >= 3 for start, end in spans)
        assert len(spans) <= 5


def test_hysteresis_keeps_a_contact_that_hovers_at_the_threshold():
    feet = _walk(slide=0.0)
    stance = foot_lock._spans(foot_lock.planted_feet(feet, FPS, HEIGHT)[:, 0])[1]
    feet[stance[0]:stance[0] + 5, 0, 2] = np.linspace(0.0, 0.1, 5)     # rises slowly after landing ...
    hover = np.arange(stance[0] + 5, stance[1])
    feet[hover, 0, 2] = np.where(hover % 2, 0.145, 0.125)     # ... then hovers about the landing threshold 0.136
    flags = features.detect_contacts(feet, 0.0, FPS, HEIGHT)[:, 0]
    assert 0 < flags[hover].sum() < len(hover)                 # the plain detection chatters here
    assert foot_lock.planted_feet(feet, FPS, HEIGHT)[stance[0]:stance[1], 0].all()


def test_planted_feet_stand_still_and_the_rest_is_untouched():
    feet = _walk()
    targets = _targets(feet, turn=0.01)
    planted = foot_lock.planted_feet(feet, FPS, HEIGHT)
    locked = foot_lock.lock_feet(targets, planted)
    for foot, t in enumerate(foot_lock.FOOT_TARGETS):
        for start, end in foot_lock._spans(planted[:, foot]):
            xy = locked[start:end, t, :2, 3]
            assert np.abs(xy - xy[0]).max() < 1e-12                   # held where it landed
            h = foot_lock.heading(locked[start:end, t, :3, :3])
            assert np.abs(h - h[0]).max() < 1e-9                       # and its heading with it
        # the clip's height is kept
        np.testing.assert_allclose(locked[:, t, 2, 3], targets[:, t, 2, 3])
        # the rotation stays a rotation
        r = locked[:, t, :3, :3]
        np.testing.assert_allclose(r @ np.swapaxes(r, 1, 2), np.broadcast_to(np.eye(3), r.shape), atol=1e-12)
    untouched = [0, 1, 2, 5]
    np.testing.assert_array_equal(locked[:, untouched], targets[:, untouched])
    # the skate the clip had is gone: the planted feet move less than 1 % of it
    def skate(tg):
        step = np.linalg.norm(np.diff(foot_lock.foot_positions(tg)[..., :2], axis=0), axis=-1)
        both = planted[1:] & planted[:-1]
        return step[both].mean()
    assert skate(locked) < 0.01 * skate(targets)


def test_the_target_never_jumps_and_returns_to_the_clip():
    feet = _walk(slide=0.01)
    targets = _targets(feet)
    planted = foot_lock.planted_feet(feet, FPS, HEIGHT)
    locked = foot_lock.lock_feet(targets, planted, blend_frames=4)
    # a fade longer than the swing: the next landing comes while the offset still fades, and locks where it is
    long_fade = foot_lock.lock_feet(targets, planted, blend_frames=15)
    for foot, t in enumerate(foot_lock.FOOT_TARGETS):
        clip_step = np.linalg.norm(np.diff(targets[:, t, :3, 3], axis=0), axis=-1)
        for out in (locked, long_fade):
            out_step = np.linalg.norm(np.diff(out[:, t, :3, 3], axis=0), axis=-1)
            # no step of the locked target is much larger than the clip's own largest step
            assert out_step.max() < 1.5 * clip_step.max()
            # landing keeps the offset it had: the landing frame moves the target exactly as the clip moves
            landings = np.flatnonzero(planted[1:, foot] & ~planted[:-1, foot]) + 1
            np.testing.assert_allclose(np.diff(out[:, t, :3, 3], axis=0)[landings - 1],
                                       np.diff(targets[:, t, :3, 3], axis=0)[landings - 1], atol=1e-12)
        # 5 frames after each lift-off the target is the clip's again
        for _start, end in foot_lock._spans(planted[:, foot]):
            if end + 5 < len(feet) and not planted[end:end + 5, foot].any():
                np.testing.assert_allclose(locked[end + 4, t], targets[end + 4, t], atol=1e-12)


def test_nothing_planted_changes_nothing():
    targets = _targets(_walk())
    np.testing.assert_array_equal(foot_lock.lock_feet(targets, np.zeros((len(targets), 2), bool)), targets)


def test_a_lock_lets_go_when_the_clip_moves_the_foot_too_far_and_plants_again():
    """A shuffle the contact test takes for one stance: the clip's planted foot drifts 1 cm a frame for 35 frames.
    The lock holds until the clip is 10 cm on, lets go and fades onto the clip over the blend frames, then plants
    the foot again where it is: it moves in short fades and stands still in between, never far behind the clip."""
    frames = 40
    feet = np.zeros((frames, 2, 3))
    feet[:, 0, 0] = np.where(np.arange(frames) < 5, 0.0, 0.01 * (np.arange(frames) - 5))
    feet[:, 1, 1] = 0.2
    targets = _targets(feet)
    planted = np.ones((frames, 2), bool)
    locked = foot_lock.lock_feet(targets, planted, blend_frames=4, max_offset=0.1)
    left = foot_lock.FOOT_TARGETS[0]
    offset = np.linalg.norm(locked[:, left, :2, 3] - targets[:, left, :2, 3], axis=-1)
    assert offset.max() <= 0.1 + 0.01 + 1e-12            # held until it is 10 cm behind, then let go ...
    step = np.linalg.norm(np.diff(locked[:, left, :2, 3], axis=0), axis=-1)
    assert step.max() < 0.1                               # ... fading back, not jumping ...
    let_go = np.flatnonzero(np.diff(offset) < 0)[0] + 1   # the first frame the foot catches up
    np.testing.assert_allclose(offset[let_go + 4], 0.0, atol=1e-12)    # ... onto the clip, and planted again there:
    assert (step[let_go + 5:let_go + 14] < 1e-12).all()   # still for the next 9 frames, while the clip moves on
    assert (step < 1e-12).mean() > 0.6                    # (the clip's foot moves in 35 of the 39 steps)
    unlimited = foot_lock.lock_feet(targets, planted, blend_frames=4)
    assert np.abs(np.diff(unlimited[:, left, :2, 3], axis=0)).max() < 1e-12     # without a limit: held throughout

