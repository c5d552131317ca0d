"""Training that knows the rig's own clips from retargeted library motion: the own clips make their share of every
epoch, validation comes from them when there are enough, and the metrics and the dataset summary say which is which."""

import json

import numpy as np
from synthetic import synthetic_dataset

from neural_ik.neural_network.model import checkpoint, trainer


def _mixed(own=5, library=20, frames=30):
    data = synthetic_dataset(frames_per_action=frames, actions=own + library, seed=3)
    for k, entry in enumerate(data.meta["actions"]):
        if k >= own:      # what extraction writes for a BVH file retargeted from another skeleton
            entry["source"] = {"kind": "library", "file": f"{entry['name']}.bvh", "skeleton": "other", "retargeted": True}
        elif k == 0:      # a BVH file of the rig's own skeleton counts as its own motion
            entry["source"] = {"kind": "library", "file": "a.bvh", "skeleton": "rig", "retargeted": False}
    return data


def _contradicting(data, own):
    """The dataset with every library frame's inputs replaced by an own frame's (so paired with another pose)."""
    action = np.asarray(data.action)
    own_rows, library_rows = np.nonzero(action < own)[0], np.nonzero(action >= own)[0]
    data.arrays["inputs"] = data.arrays["inputs"].copy()
    data.arrays["inputs"][library_rows] = data.arrays["inputs"][np.resize(own_rows, len(library_rows))]
    return data


def test_own_clips_are_weighted_and_validate(tmp_path):
    data = _mixed()
    own = data.own_action_mask()
    assert own.tolist() == [True] * 5 + [False] * 20
    assert "(5 of its own, 20 retargeted)" in data.summary_text()
    tr = trainer.Trainer(data, trainer.TrainConfig(seed=1, val_fraction=0.3, mirror=False), tmp_path)
    names = [str(n) for n in data.arrays["action_names"]]
    assert tr.validation_note == "own clips"
    assert set(tr._val_action_names()) <= {names[k] for k in range(5)}
    rows = tr._epoch_rows()
    share = np.mean(tr.own_rows[rows])
    assert abs(share - 0.25) < 0.01                          # 4 own clips against 20 library ones: repeated
    assert np.all(np.isin(np.where(tr.own_rows)[0], rows))   # every own row is in every epoch
    tr.config.epochs = 1
    tr.run()
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["sources"] == {"own_frames": 150, "retargeted_frames": 600, "validation": "own clips",
                                  "library": "trained on"}


def test_too_few_own_clips_validate_on_their_last_stretch_and_all_still_train(tmp_path):
    """Two own clips among a library (a user's walk and run): validation is the last 20 % of each (their style is
    what "best" means), the 10 frames before it go to neither side, the rest of both trains and makes the own share
    of every epoch; no library frame validates."""
    data = _mixed(own=2, library=12, frames=60)
    action = np.asarray(data.action)
    tr = trainer.Trainer(data, trainer.TrainConfig(seed=0, mirror=False, limb_mix=0.0), tmp_path)
    assert tr.validation_note == "own clips (the last 20 % of each)"
    assert sorted(set(tr.val.action.tolist())) == [0, 1] and len(tr.val) == 24
    train_set, val_set = data.split_stretches([0, 1], 0.2, 10)
    for a in (0, 1):
        frames = np.asarray(data.frame)[action == a]
        held = np.sort(np.asarray(val_set.frame)[np.asarray(val_set.action) == a])
        trained = np.sort(np.asarray(train_set.frame)[np.asarray(train_set.action) == a])
        np.testing.assert_array_equal(held, frames[-12:])               # 20 % of 60 frames, the clip's end
        np.testing.assert_array_equal(trained, frames[:60 - 12 - 10])    # the gap of 10 frames on neither side
    assert len(train_set) == 2 * 38 + 12 * 60
    assert np.sum(tr.own_rows) == 2 * 38 and np.sum(~tr.own_rows) == 12 * 60
    assert abs(np.mean(tr.own_rows[tr._epoch_rows()]) - 0.25) < 0.01


def test_library_never_trains_the_own_clips_alone_on_the_same_validation(tmp_path):
    data = _mixed(own=2, library=12, frames=60)
    both = trainer.Trainer(data, trainer.TrainConfig(seed=0, mirror=False, limb_mix=0.0), tmp_path)
    alone = trainer.Trainer(data, trainer.TrainConfig(seed=0, mirror=False, limb_mix=0.0, library="never"), tmp_path)
    np.testing.assert_array_equal(alone.val.inputs, both.val.inputs)
    assert alone.own_rows.all() and len(alone.train) == 2 * 38
    assert alone.sources["library"] == "left out" and both.sources["library"] == "trained on"


def test_library_auto_trains_both_ways_and_keeps_the_better_on_the_own_clips(tmp_path):
    """library "auto": the own clips alone and with the library, each in its folder; the library run is the output's
    model.npz (byte for byte) only when it is better on the own clips' validation both refined at the inner joints
    and by the network alone's score, else the own clips' run is; metrics.json says which, with both figures (the
    refined ones recomputed here from each folder's model)."""
    from neural_ik.neural_network.model import library_choice

    data = _mixed(own=5, library=6, frames=40)
    config = trainer.TrainConfig(seed=0, epochs=3, batch_size=32, mirror=False, limb_mix=0.0)
    result = library_choice.train(data, config, str(tmp_path))
    report = json.loads((tmp_path / "metrics.json").read_text())["library"]
    runs = report["runs"]
    assert set(runs) == {"own clips only", "with the library"}
    val = trainer.Trainer(data, config, str(tmp_path / "own clips only")).val      # the frames both were judged on
    for name, run in runs.items():
        model = checkpoint.load_model(str(tmp_path / name / "model.npz"))
        assert abs(run["refined_inner_mpjpe_cm"] - library_choice.refined_inner_cm(model, val)) < 1e-9
    own, library = runs["own clips only"], runs["with the library"]
    wins = (library["refined_inner_mpjpe_cm"] < own["refined_inner_mpjpe_cm"] and library["score"] < own["score"])
    better = "with the library" if wins else "own clips only"
    assert report["kept"] == better and report["said"].startswith(f"kept {better}")
    kept = (tmp_path / better / "model.npz").read_bytes()
    assert (tmp_path / "model.npz").read_bytes() == kept
    assert result.paths["model"] == str(tmp_path / "model.npz")
    for name in runs:                                 # each run judged on the own clips, and only one trained on them
        sources = json.loads((tmp_path / name / "metrics.json").read_text())["sources"]
        assert sources["validation"] == "own clips"
        assert sources["library"] == ("left out" if name == "own clips only" else "trained on")


def test_library_auto_with_too_few_own_clips_to_judge_trains_once_with_the_library(tmp_path):
    """Two own clips: only their last stretches validate, too close to what trains to judge reach, so Compare runs
    no own-only training; the library run has the whole time and the report says why and how to leave it out."""
    from neural_ik.neural_network.model import library_choice

    data = _mixed(own=2, library=6, frames=40)
    config = trainer.TrainConfig(seed=0, epochs=2, batch_size=32, mirror=False, limb_mix=0.0)
    library_choice.train(data, config, str(tmp_path))
    report = json.loads((tmp_path / "metrics.json").read_text())["library"]
    assert set(report["runs"]) == {"with the library"} and report["kept"] == "with the library"
    assert report["said"].endswith("2 own clips are too few to judge the library without it (only their last "
                                   "stretches validate): Library > Leave Out trains them alone")
    assert not (tmp_path / "own clips only").exists()


def test_library_auto_with_a_time_limit_lets_the_better_run_train_on(tmp_path):
    """With a time limit, Compare gives the own clips alone OWN_TIME_SHARE of it and the library run
    LIBRARY_TIME_SHARE; the better of the two (here the own clips: the library contradicts them) then carries on
    from where it stopped (its epochs and history go on, its learning rate rises again and decays) for the rest of
    the limit, and the other run's folder stays as it was. Neither stops early: each uses its share whole (here an
    early stop would come after one epoch without a better score)."""
    from neural_ik.neural_network.model import library_choice

    data = _contradicting(_mixed(own=5, library=6, frames=60), own=5)
    limit = 6.0
    config = trainer.TrainConfig(seed=0, epochs=100000, batch_size=32, mirror=False, limb_mix=0.0, time_limit=limit,
                                 patience=1, patience_steps=1, early_stop_from=0.0)
    result = library_choice.train(data, config, str(tmp_path))
    report = json.loads((tmp_path / "metrics.json").read_text())["library"]
    assert {run["stopped"] for run in report["runs"].values()} == {"time limit"}, report["runs"]
    kept = report["kept"]
    assert kept == "own clips only", report["said"]
    other = next(name for name in report["runs"] if name != kept)
    share = {"own clips only": library_choice.OWN_TIME_SHARE, "with the library": library_choice.LIBRARY_TIME_SHARE}
    history = json.loads((tmp_path / kept / "metrics.json").read_text())["history"]
    rises = [i for i in range(1, len(history)) if history[i]["lr"] > 1.01 * history[i - 1]["lr"]]
    assert len(rises) == 1, "the kept run did not carry on (or restarted more than once)"
    i = rises[0]                                                         # its first epoch after the other run
    assert history[i - 1]["seconds"] <= share[kept] * limit + 0.5 < history[-1]["seconds"]
    assert history[i]["epoch"] >= history[i - 1]["epoch"]                # epochs go on, not from 0
    assert history[-1]["lr"] < history[i]["lr"]                           # warm again, then decays
    assert report["runs"][kept]["seconds"] > share[kept] * limit + 0.5
    assert report["runs"][other]["seconds"] <= share[other] * limit + 0.5
    assert result.seconds <= limit + 1.0
    assert (tmp_path / "model.npz").read_bytes() == (tmp_path / kept / "model.npz").read_bytes()


def test_library_auto_with_a_library_that_contradicts_the_own_clips_keeps_them_alone(tmp_path):
    """A library that contradicts the own clips (the inputs of the own clips' frames, each paired with another pose):
    training with it can only do worse on the own clips, and "auto" keeps the own-only run."""
    from neural_ik.neural_network.model import library_choice

    data = _contradicting(_mixed(own=5, library=6, frames=60), own=5)
    config = trainer.TrainConfig(seed=0, epochs=30, batch_size=32, mirror=False, limb_mix=0.0, own_share=0.0)
    library_choice.train(data, config, str(tmp_path))
    report = json.loads((tmp_path / "metrics.json").read_text())["library"]
    print("\n" + report["said"])
    assert report["kept"] == "own clips only", report["said"]


def test_without_library_motion_nothing_changes(tmp_path):
    data = synthetic_dataset(frames_per_action=30, actions=6, seed=3)
    tr = trainer.Trainer(data, trainer.TrainConfig(seed=1, mirror=False), tmp_path)
    assert tr.validation_note == "all clips" and tr.own_rows is None
    assert np.array_equal(tr._epoch_rows(), np.arange(len(tr.train)))
    assert data.summary_text().startswith("180 frames from 6 actions of rig")


def test_the_library_is_kept_only_when_better_on_the_own_clips_by_both_measures():
    """Own style first: the library run is kept only when, on the own clips' validation, it beats the own clips alone
    refined at the inner joints and by the network alone's score; a win by one measure keeps the own clips. The
    report gives both runs' figures and the rule."""
    from neural_ik.neural_network.model import library_choice

    def run(effector, inner):
        return trainer.TrainResult(None, {"effector_cm_mean": effector, "inner_mpjpe_cm": inner}, [], "time limit",
                                   60.0, {})

    results = {"own": run(3.83, 2.52), "library": run(3.30, 2.40)}           # the library's score is lower
    assert library_choice.better(results, {"own": 2.13, "library": 2.71}) == "own"
    assert library_choice.better(results, {"own": 2.13, "library": 2.05}) == "library"
    assert library_choice.better({"own": run(3.0, 2.2), "library": run(3.3, 2.4)}, {"own": 2.13, "library": 2.05}) \
        == "own"                                                              # refined better, score worse
    assert library_choice.better({"library": run(3.3, 2.4)}, {"library": 2.71}) == "library"   # the only run
    report = library_choice.library_report(results, {"own": 2.13, "library": 2.71}, "own")
    assert report["said"] == ("kept own clips only (your clips' validation; own clips only: inner joints 2.13 cm "
                              "refined, effector + inner 6.35 cm alone; with the library: inner joints 2.71 cm "
                              "refined, effector + inner 5.70 cm alone). The library is kept only when it is better "
                              "by both")
    assert report["runs"]["with the library"]["refined_inner_mpjpe_cm"] == 2.71


def test_refined_inner_joints_of_the_recorded_pose_are_exact_and_of_a_network_are_not(tmp_path):
    """The verdict's figure, on a rig whose in-between bones move frame to frame (per-frame links): a stand-in network
    that answers each validation frame's recorded pose (its effectors on their targets already) scores 0 after
    refinement; without refinement a trained network scores what validation_metrics says its inner joints miss, and
    refined it scores above 0."""
    from synthetic import with_moving_links

    from neural_ik.neural_network.model import library_choice

    data = with_moving_links(_mixed(own=5, library=6, frames=40))
    tr = trainer.Trainer(data, trainer.TrainConfig(seed=0, epochs=3, batch_size=32, mirror=False, limb_mix=0.0),
                         str(tmp_path))
    model = tr.run().model
    assert tr.val.bridges is not None

    class Recorded:
        skeleton, mean_pose = model.skeleton, model.mean_pose
        limit_low, limit_high = np.full(69, -np.pi), np.full(69, np.pi)

        @staticmethod
        def solve_local(inputs):
            rows = [np.nonzero((tr.val.inputs == x).all(axis=1))[0][0] for x in inputs]
            return tr.val.local_rotations[rows]

    assert library_choice.refined_inner_cm(Recorded, tr.val, chunk=7) < 1e-3
    alone = trainer.validation_metrics(model, tr.val)["inner_mpjpe_cm"]
    assert abs(library_choice.refined_inner_cm(model, tr.val, iterations=0, chunk=7) - alone) < 1e-4
    assert library_choice.refined_inner_cm(model, tr.val) > 1e-2


def test_library_compare_cancelled_keeps_what_it_has_and_trains_no_further(tmp_path):
    """Cancel at the end of Compare's first run (the own clips alone): the library run never starts, and the output
    folder gets that run's model and a metrics.json that says so. Cancelled before anything trained, Compare stops
    as a single run does."""
    import pytest

    from neural_ik.neural_network.model import library_choice

    data = _mixed(own=5, library=4, frames=40)
    config = trainer.TrainConfig(seed=0, epochs=2, mirror=False, limb_mix=0.0)
    progress = trainer.Progress()
    epochs = []

    def cancel_after_the_first_run(entry):
        epochs.append(entry)
        if len(epochs) == 2:
            progress.cancel.set()
    result = library_choice.train(data, config, str(tmp_path), progress, on_epoch=cancel_after_the_first_run)
    report = json.loads((tmp_path / "metrics.json").read_text())["library"]
    assert set(report["runs"]) == {"own clips only"} and result.stopped == "epochs"
    assert not (tmp_path / "with the library" / "model.npz").exists()
    assert (tmp_path / "model.npz").read_bytes() == (tmp_path / "own clips only" / "model.npz").read_bytes()
    progress.cancel.set()
    with pytest.raises(trainer.Cancelled):
        library_choice.train(data, config, str(tmp_path / "again"), progress)


def test_library_rows_count_less_at_the_inner_joints_only_with_enough_own_clips(tmp_path):
    """With four or more own clips the library's rows teach reach (their inner joints and rotations count
    library_style in the losses); with fewer the library teaches the style too (all rows count fully)."""
    many = trainer.Trainer(_mixed(own=5, library=10), trainer.TrainConfig(mirror=False, limb_mix=0.0), tmp_path)
    few = trainer.Trainer(_mixed(own=2, library=10), trainer.TrainConfig(mirror=False, limb_mix=0.0), tmp_path)
    alone = trainer.Trainer(_mixed(own=5, library=10), trainer.TrainConfig(mirror=False, limb_mix=0.0,
                                                                           library="never"), tmp_path)
    assert many.library_style == 0.25 and few.library_style == 1.0 and alone.library_style == 1.0
    seen = []
    evaluate = trainer.losses.evaluate

    def spy(ctx, weights, deltas, batch, need_grad=True):
        seen.append(batch.get("style"))
        return evaluate(ctx, weights, deltas, batch, need_grad)
    trainer.losses.evaluate = spy
    try:
        rows = np.concatenate([np.nonzero(many.own_rows)[0][:4], np.nonzero(~many.own_rows)[0][:4]])
        many.train_step(rows, 1e-3)
        few.train_step(np.arange(8), 1e-3)
    finally:
        trainer.losses.evaluate = evaluate
    assert seen[0][:4].tolist() == [1.0] * 4 and seen[0][4:8].tolist() == [0.25] * 4 and seen[1] is None
