"""The clip prior (model/prior.py, a TargetPrior with a window): it reads how each pinned target moves over the clip,
so it places what one frame cannot show; its windows stay inside each clip; it round-trips in checkpoints and in the
ONNX export; a Bake (FreeTargets with sequence) takes the free feet from it, and with both feet pinned the free root
and head.
No Blender needed."""

import json
import os

import numpy as np
import pytest
from live_helpers import HIPS_HEIGHT, humanoid_skeleton, random_model

from neural_ik.neural_network.data.files import FileRefused
from neural_ik.neural_network.geometry.rotations import angle_between
from neural_ik.neural_network.model import checkpoint, prior
from neural_ik.neural_network.runtime import model_files, onnx_export
from neural_ik.neural_network.runtime.free_targets import CLIP_SHARES, FreeTargets, clip_shares

FPS = 30.0
VR = prior.free_mask(["root", "left_foot", "right_foot"])


def _walking_clips(clips, frames, seed):
    """(clips, frames, 6, 4, 4) targets of bodies gliding along x at a speed of their own (-1..1 m/s), all facing +x:
    the head and hands keep one place about the root whatever the speed, the feet lead by 0.4 s of the motion. One
    frame of the head and hands looks the same at every speed; their motion over the clip says where the feet are."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames) / FPS
    offsets = np.array([[0, 0, 1.0], [0.1, 0.3, 1.2], [0.1, -0.3, 1.2], [0, 0.1, 0.1], [0, -0.1, 0.1], [0, 0, 1.6]])
    out = np.broadcast_to(np.eye(4), (clips, frames, 6, 4, 4)).copy()
    for c in range(clips):
        speed = rng.uniform(-1.0, 1.0)
        body = np.stack([speed * t + rng.uniform(-2, 2), np.full(frames, rng.uniform(-2, 2)), np.zeros(frames)], -1)
        out[c, :, :, :3, 3] = body[:, None] + offsets[None]
        out[c, :, 3:5, 0, 3] += 0.4 * speed
    return out


def _train(clips, window, steps=500, seed=0):
    """A prior (a clip prior with `window`) trained on the clips' frames, every frame with its window in its clip."""
    flat = clips.reshape(-1, 6, 4, 4)
    action = np.repeat(np.arange(len(clips)), clips.shape[1])
    frame = np.tile(np.arange(clips.shape[1]), len(clips))
    rows = prior.clip_window_rows(action, frame, window, FPS) if window else None
    training = prior.PriorTraining(np.broadcast_to(np.eye(3), (6, 3, 3)), HIPS_HEIGHT, seed, (64, 64), 3e-3,
                                   window=window)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        b = rng.integers(0, len(flat), 128)
        training.step(flat[b], 3e-3, None if rows is None else flat[rows[b]][..., :3, 3])
    return training.prior()


def test_windows_stay_inside_each_clip_and_its_mirror_copy():
    # two actions, then the mirror copy of the first numbered after them (augment.with_mirror): frames 0..4, 0..2, 0..4
    action = np.array([0] * 5 + [1] * 3 + [2] * 5)
    frame = np.array([0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4])
    rows = prior.clip_window_rows(action, frame, (-2 / FPS, 1 / FPS), FPS)
    expected = [[0, 1], [0, 2], [0, 3], [1, 4], [2, 4], [5, 6], [5, 7], [5, 7], [8, 9], [8, 10], [8, 11], [9, 12],
                [10, 12]]
    np.testing.assert_array_equal(rows, expected)
    # a clip's frames dt apart: offsets in seconds become frames at its rate
    np.testing.assert_array_equal(prior.window_rows(4, (-0.5, 0.25), 0.25), [[0, 1], [0, 2], [0, 3], [1, 3]])


def test_window_inputs_are_each_pinned_targets_move_in_the_ground_frame():
    rng = np.random.default_rng(1)
    targets = _walking_clips(1, 12, seed=2)[0]
    yaw = rng.uniform(-np.pi, np.pi)
    turn = np.array([[np.cos(yaw), -np.sin(yaw), 0], [np.sin(yaw), np.cos(yaw), 0], [0, 0, 1.0]])
    targets[:, :, :3, :3] = turn @ targets[:, :, :3, :3]
    window = rng.normal(size=(12, 3, 6, 3))
    free = prior.free_mask(["root", "head"])
    refs = np.broadcast_to(np.eye(3), (6, 3, 3))
    x, (origin, R) = prior.prior_inputs(targets, free, refs, 1.7, window)
    plain, _frames = prior.prior_inputs(targets, free, refs, 1.7)
    assert x.shape == (12, prior.num_inputs((0.1, 0.2, 0.3))) == (12, 60 + 54)
    np.testing.assert_array_equal(x[:, :60], plain)
    for n in range(12):
        for offset in range(3):
            for k in range(6):
                got = x[n, 60 + 18 * offset + 3 * k: 60 + 18 * offset + 3 * k + 3]
                want = np.zeros(3) if free[k] else R[n].T @ (targets[n, k, :3, 3] - window[n, offset, k]) / 1.7
                np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(R[0][:, 0], turn[:, 0], atol=1e-9)     # the frame faces the targets' heading


def test_a_clip_prior_places_the_feet_one_frame_cannot_show():
    train = _walking_clips(40, 90, seed=3)
    plain = _train(train, ())
    clip = _train(train, (-0.5, -0.2, 0.2, 0.5))
    misses = {"plain": [], "clip": []}
    for targets in _walking_clips(8, 90, seed=4):       # other speeds and places
        truth = targets[:, 3:5, :3, 3]
        misses["plain"].append(np.linalg.norm(plain.complete(targets, VR)[:, 3:5, :3, 3] - truth, axis=-1).mean())
        placed = clip.complete(targets, VR, dt=1 / FPS)
        np.testing.assert_array_equal(placed[:, ~VR], targets[:, ~VR])     # the pinned ones as given
        misses["clip"].append(np.linalg.norm(placed[:, 3:5, :3, 3] - truth, axis=-1).mean())
    plain_miss, clip_miss = np.mean(misses["plain"]), np.mean(misses["clip"])
    assert plain_miss > 0.1, plain_miss            # the feet lead by up to 40 cm: one frame cannot say how far
    assert clip_miss < 0.3 * plain_miss, (clip_miss, plain_miss)
    with pytest.raises(ValueError, match="time step"):
        clip.complete(targets, VR)


def test_a_frame_with_a_broken_target_spoils_no_other_frames_window():
    clip = _train(_walking_clips(6, 60, seed=7), (-0.5, 0.5), steps=20)
    targets = _walking_clips(1, 60, seed=8)[0]
    placed = clip.complete(targets, VR, 1 / FPS)
    broken = targets.copy()
    broken[30, 1, :3, 3] = np.nan                       # one frame's left hand
    again = clip.complete(broken, VR, 1 / FPS)
    near = [15, 45]                                     # the frames whose window (0.5 s = 15 frames) reads frame 30
    assert np.isfinite(np.delete(again, 30, axis=0)).all()
    assert np.abs(again[near] - placed[near]).max() > 1e-6      # they read it as no motion, not as before


def _model_with_both():
    model = random_model(humanoid_skeleton())
    clips = _walking_clips(6, 60, seed=5)
    model.prior = _train(clips, (), steps=20, seed=1)
    model.clip_prior = _train(clips, prior.WINDOW, steps=20, seed=2)
    for p in (model.prior, model.clip_prior):
        p.mirror_frames = np.tile(np.diag([-1.0, 1.0, 1.0]), (prior.NUM_TARGETS, 1, 1))    # both answer the mirror
    return model, clips[0]


def test_a_bake_takes_the_free_feet_from_the_clip_prior_and_the_root_and_head_between_the_two_priors():
    model, clip = _model_with_both()
    free = prior.free_mask(["root", "head", "left_foot", "left_hand"])
    loose = FreeTargets(model, free)
    baked = loose.complete(clip, sequence=True, dt=1 / FPS)
    from_plain = model.prior.complete(clip, free)
    from_clip = model.clip_prior.complete(clip, free, 1 / FPS)
    np.testing.assert_array_equal(baked[:, 3], from_clip[:, 3])                 # the free foot: the clip prior's
    np.testing.assert_array_equal(baked[:, 1], from_plain[:, 1])                # the free hand: the plain prior's
    np.testing.assert_array_equal(baked[:, ~free], clip[:, ~free])
    assert np.abs(from_plain[:, 3, :3, 3] - from_clip[:, 3, :3, 3]).max() > 1e-3   # two answers apart
    # the root and head: a foot is free, so half way (CLIP_SHARES[1]) between the two answers
    _assert_between(baked[:, [0, 5]], from_plain[:, [0, 5]], from_clip[:, [0, 5]], CLIP_SHARES[1])
    # a live tick (no clip) and a baseline prior take the plain prior's answer alone
    np.testing.assert_array_equal(loose.complete(clip), from_plain)
    assert FreeTargets(model, free, prior=model.prior).clip_prior is None
    # both feet pinned: the free root and head CLIP_SHARES[0] of the way to the clip prior's, a free hand the plain one's
    free = prior.free_mask(["root", "head", "right_hand"])
    baked = FreeTargets(model, free).complete(clip, sequence=True, dt=1 / FPS)
    from_plain, from_clip = model.prior.complete(clip, free), model.clip_prior.complete(clip, free, 1 / FPS)
    _assert_between(baked[:, [0, 5]], from_plain[:, [0, 5]], from_clip[:, [0, 5]], CLIP_SHARES[0])
    np.testing.assert_array_equal(baked[:, 2], from_plain[:, 2])
    assert np.abs(from_plain[:, [0, 5], :3, 3] - from_clip[:, [0, 5], :3, 3]).max() > 1e-3
    # a clip prior trained before, on squares (its meta says no loss), places the feet alone
    assert model.clip_prior.meta["loss"] == prior.LOSS
    model.clip_prior.meta = {}
    np.testing.assert_array_equal(FreeTargets(model, free).complete(clip, sequence=True, dt=1 / FPS), from_plain)
    # per frame: each set its own shares
    sets = np.array([prior.free_mask(["root", "head"]), VR])
    np.testing.assert_array_equal(clip_shares(sets), [[CLIP_SHARES[0], 0, 0, 0, 0, CLIP_SHARES[0]],
                                                      [CLIP_SHARES[1], 0, 0, 1, 1, 0]])
    np.testing.assert_array_equal(clip_shares(sets, root_and_head=False), [[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 0]])


def _assert_between(baked, plain, clip, share):
    """Positions `share` of the way from the plain prior's to the clip prior's; rotations on the shortest path between
    the two, at the chordal blend's angle from the plain prior's."""
    np.testing.assert_allclose(baked[..., :3, 3], (1 - share) * plain[..., :3, 3] + share * clip[..., :3, 3],
                               atol=1e-12)
    to_plain, to_clip = angle_between(plain[..., :3, :3], baked[..., :3, :3]), angle_between(baked[..., :3, :3],
                                                                                              clip[..., :3, :3])
    total = angle_between(plain[..., :3, :3], clip[..., :3, :3])
    np.testing.assert_allclose(to_plain + to_clip, total, atol=1e-9)          # on the shortest path between them
    apart = total > 1e-3
    assert apart.any()
    # the chordal blend of two rotations: tan(angle to plain) = share sin(total) / ((1 - share) + share cos(total))
    want = np.arctan2(share * np.sin(total), (1 - share) + share * np.cos(total))
    np.testing.assert_allclose(to_plain[apart], want[apart], atol=1e-9)


def test_checkpoints_keep_the_clip_prior_and_refuse_one_that_does_not_fit(tmp_path):
    model, clip = _model_with_both()
    path = str(tmp_path / "m.npz")
    checkpoint.save_model(path, model)
    loaded = checkpoint.load_model(path)
    assert loaded.clip_prior.window == prior.WINDOW and not loaded.prior.window
    np.testing.assert_allclose(loaded.clip_prior.complete(clip, VR, 1 / FPS), model.clip_prior.complete(clip, VR, 1 / FPS),
                               atol=1e-6)
    for edit, message in ((lambda m: m["clip_prior"].update(window=[1.0, 2.0]), "do not map 96 inputs"),
                          (lambda m: m["clip_prior"].pop("window"), "window \\[\\] is not usable"),
                          (lambda m: m["clip_prior"].update(window=["soon"]), "not a list of seconds"),
                          (lambda m: m["prior"].update(window=list(prior.WINDOW)), "target prior's window")):
        arrays = dict(np.load(path, allow_pickle=False))
        meta = json.loads(arrays["meta"].tobytes())
        edit(meta)
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        np.savez(str(tmp_path / "bad.npz"), **arrays)
        with pytest.raises(FileRefused, match=message):
            checkpoint.load_model(str(tmp_path / "bad.npz"))


def test_the_clip_prior_exports_as_its_own_graph_and_loads_back(tmp_path):
    import onnxruntime as ort

    model, clip = _model_with_both()
    onnx_path, side = onnx_export.export_onnx(model, tmp_path / "m.onnx")
    clip_path = onnx_export.prior_path(onnx_path, clip=True)
    session = ort.InferenceSession(clip_path, providers=["CPUExecutionProvider"])
    rows = prior.window_rows(len(clip), prior.WINDOW, 1 / FPS)
    x, _frames = prior.prior_inputs(clip, VR, model.clip_prior.references, model.clip_prior.height,
                                    clip[rows][..., :3, 3])
    (out,) = session.run(None, {"prior_inputs": x})
    np.testing.assert_allclose(out, model.clip_prior.predict(x), atol=1e-5)
    section = json.load(open(side))["neural_ik.clip_prior"]
    assert section["file"] == "m.clip_prior.onnx" and section["window"] == list(prior.WINDOW)
    assert section["input"]["shape"] == ["batch", 60 + 18 * len(prior.WINDOW)] and "seconds" in section["input"]["layout"]
    loaded, _data = model_files.load_onnx(onnx_path)
    np.testing.assert_allclose(loaded.clip_prior.complete(clip, VR, 1 / FPS), model.clip_prior.complete(clip, VR, 1 / FPS),
                               atol=1e-5)
    np.testing.assert_allclose(loaded.prior.complete(clip, VR), model.prior.complete(clip, VR), atol=1e-5)
    os.remove(clip_path)
    with pytest.raises(FileRefused, match="needs its clip prior m.clip_prior.onnx beside it"):
        model_files.load_onnx(onnx_path)
