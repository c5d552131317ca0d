"""The trainer end to end on a small synthetic dataset: it learns, it cancels cleanly, it resumes exactly, its
checkpoints round-trip and refuse what they cannot trust, and the core never imports bpy."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from synthetic import humanoid_skeleton, synthetic_dataset, with_moving_links

from neural_ik.neural_network.data import files
from neural_ik.neural_network.data.files import FileRefused
from neural_ik.neural_network.model import checkpoint, losses, prior, trainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def data():
    return synthetic_dataset(frames_per_action=120, actions=6, seed=1)


def fk_loss_on_training_rows(tr, weights):
    rows = np.arange(len(tr.train))
    batch = tr.train.batch(np.concatenate([rows, rows]))
    batch["pair_valid"] = np.zeros(len(rows), np.float32)
    x = tr.train_inputs[np.concatenate([rows, rows])]
    from neural_ik.neural_network.model import network
    out, _ = network.forward(weights, x)
    return losses.evaluate(tr.loss_context, losses.LossWeights(), out, batch, need_grad=False).parts["fk"]


def test_training_reduces_the_fk_loss_tenfold(data, tmp_path):
    tr = trainer.Trainer(data, trainer.TrainConfig(epochs=60, batch_size=64, patience=0), tmp_path)
    before = fk_loss_on_training_rows(tr, tr.weights)
    result = tr.run()
    after = fk_loss_on_training_rows(tr, tr.weights)
    assert after < before / 10, (before, after)
    assert result.stopped == "epochs" and len(result.history) == 60
    for name in ("model", "metrics", "plot"):
        assert os.path.getsize(result.paths[name]) > 0
    assert result.paths["plot"].endswith("loss.svg")
    assert "train loss" in open(result.paths["plot"], encoding="utf-8").read()
    summary = json.load(open(result.paths["metrics"]))
    best_score = min(h["val_effector_cm_mean"] + h["val_inner_mpjpe_cm"] for h in summary["history"])
    assert trainer.score(summary["best"]) == pytest.approx(best_score)
    best = checkpoint.load_model(result.paths["model"], expected_fingerprint=data.skeleton.fingerprint())
    assert best.meta["metrics"] == result.metrics
    assert np.allclose(trainer.validation_metrics(best, tr.val)["effector_cm_mean"], result.metrics["effector_cm_mean"])


def test_held_out_actions_never_share_frames_with_training(data, tmp_path):
    tr = trainer.Trainer(data, trainer.TrainConfig(seed=4, val_fraction=0.3), tmp_path)
    assert len(tr.val) > 0 and len(tr.train) > 0
    assert not set(tr.train.action.tolist()) & set(tr.val.action.tolist())
    again = trainer.Trainer(data, trainer.TrainConfig(seed=4, val_fraction=0.3), tmp_path)
    assert np.array_equal(again.val.action, tr.val.action)


def test_cancel_keeps_a_loadable_best_checkpoint_and_no_partial_file(data, tmp_path):
    progress = trainer.Progress()
    tr = trainer.Trainer(data, trainer.TrainConfig(epochs=100000, batch_size=32, patience=0), tmp_path, progress)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(result=tr.run()))
    thread.start()
    while thread.is_alive() and progress.epoch < 2:
        thread.join(0.01)
    progress.cancel.set()
    thread.join(10)
    assert not thread.is_alive()
    result = outcome["result"]
    assert result.stopped == "cancelled" and not progress.running
    model = checkpoint.load_model(tmp_path / trainer.MODEL_FILE)
    assert model.meta["metrics"]["effector_cm_mean"] == pytest.approx(result.metrics["effector_cm_mean"])
    assert sorted(os.listdir(tmp_path)) == sorted([trainer.MODEL_FILE, trainer.STATE_FILE, trainer.METRICS_FILE,
                                                   trainer.PLOT_FILE])


class CancelAfterEpoch(trainer.Progress):
    """Sets its cancel flag as soon as the trainer reports the given epoch (a stand-in for a user's click)."""

    def __init__(self, stop_at):
        super().__init__()
        self.stop_at = stop_at

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "epoch" and value == getattr(self, "stop_at", -1):
            self.cancel.set()


def test_an_interrupted_run_resumes_to_the_same_weights(data, tmp_path):
    config = trainer.TrainConfig(epochs=5, batch_size=64, patience=0)
    os.makedirs(tmp_path / "a")
    os.makedirs(tmp_path / "b")
    straight = trainer.Trainer(data, config, tmp_path / "a")
    straight.run()
    first = trainer.Trainer(data, config, tmp_path / "b", CancelAfterEpoch(3))
    assert first.run().stopped == "cancelled"
    resumed = trainer.Trainer(data, config, tmp_path / "b", resume=True)
    assert resumed.start_epoch == 3 and len(resumed.history) == 3
    # every member of both priors' ensembles comes back as it was saved (their optimisers start afresh)
    for training in ("prior", "clip"):
        saved, back = getattr(first, training).members, getattr(resumed, training).members
        assert len(back) == config.prior_members == 2
        assert not np.array_equal(saved[0].weights[0], saved[1].weights[0])      # trained apart
        for member, restored in zip(saved, back):
            for a, b in zip(member.weights, restored.weights):
                assert np.array_equal(a, b)
    result = resumed.run()
    assert result.stopped == "epochs" and [h["epoch"] for h in result.history] == [1, 2, 3, 4, 5]
    for a, b in zip(straight.weights, resumed.weights):
        assert np.array_equal(a, b)


def test_time_limit_stops_training(data, tmp_path):
    result = trainer.train(data, trainer.TrainConfig(epochs=100000, time_limit=0.5, patience=0), tmp_path)
    assert result.stopped == "time limit"
    checkpoint.load_model(result.paths["model"])


def test_checkpoint_round_trip_and_refusals(data, tmp_path):
    tr = trainer.Trainer(data, trainer.TrainConfig(epochs=1), tmp_path)
    model = tr.model()
    path = tmp_path / "m.npz"
    checkpoint.save_model(path, model)
    loaded = checkpoint.load_model(path, expected_fingerprint=data.skeleton.fingerprint())
    assert np.array_equal(loaded.predict_clamped(data.inputs[:9]), model.predict_clamped(data.inputs[:9]))
    assert loaded.layer_sizes == [50, 128, 96, 69]

    other_rig = humanoid_skeleton(missing=("Spine2",))
    with pytest.raises(FileRefused, match="another rig"):
        checkpoint.load_model(path, expected_fingerprint=other_rig.fingerprint())

    meta, arrays = files.load_npz(path, checkpoint.KIND)

    def rewrite(name, change_meta=None, change_arrays=None):
        m, a = json.loads(json.dumps(meta)), {k: v.copy() for k, v in arrays.items()}
        (change_meta or (lambda _m: None))(m)
        (change_arrays or (lambda _a: None))(a)
        target = tmp_path / name
        files.save_npz(target, a, m)
        return target

    with pytest.raises(FileRefused, match="layout"):
        checkpoint.load_model(rewrite("layout.npz", change_meta=lambda m: m.update(layout_version=99)))
    with pytest.raises(FileRefused, match="NaN"):
        checkpoint.load_model(rewrite("nan.npz", change_arrays=lambda a: a["W1"].__setitem__((0, 0), np.nan)))
    with pytest.raises(FileRefused, match="shape"):
        checkpoint.load_model(rewrite("shape.npz", change_arrays=lambda a: a.update(W1=a["W1"][:, :5])))
    with pytest.raises(FileRefused, match="fingerprint"):
        checkpoint.load_model(rewrite("fp.npz", change_meta=lambda m: m.update(rig_fingerprint="0" * 16)))
    with pytest.raises(FileRefused, match="neural_ik.model"):
        checkpoint.load_model(rewrite("kind.npz", change_meta=lambda m: m.update(kind="neural_ik.dataset")))
    for bad in ([0.1], [0.1, float("nan")], "low"):
        with pytest.raises(FileRefused, match="contact_height"):
            checkpoint.load_model(rewrite("contact.npz", change_meta=lambda m, bad=bad: m["feature_spec"].update(
                contact_height=bad)))
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(path.read_bytes()[: os.path.getsize(path) // 2])
    with pytest.raises(FileRefused, match="truncated"):
        checkpoint.load_model(truncated)


def test_the_training_core_runs_without_bpy(tmp_path):
    code = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("neural_network", {os.path.join(REPO, "neural_network", "__init__.py")!r},
                                              submodule_search_locations=[{os.path.join(REPO, "neural_network")!r}])
package = importlib.util.module_from_spec(spec); sys.modules["neural_network"] = package; spec.loader.exec_module(package)
from neural_network.data import dataset
from neural_network.model import checkpoint, losses, network, trainer
from neural_network.report import plot_svg
import numpy as np
rng = np.random.default_rng(0)
plot_svg.loss_curve_svg({str(tmp_path / "curve.svg")!r}, [1, 2, 3], {{"loss": [3.0, 2.0, 1.0]}})
w = network.xavier_init([50, 8, 69], rng)
out, cache = network.forward(w, rng.normal(size=(4, 50)).astype(np.float32))
network.Adam(w).step(w, network.backward(w, cache, out))
assert "bpy" not in sys.modules and "mathutils" not in sys.modules, sorted(m for m in sys.modules if "bpy" in m)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_one_long_clip_never_becomes_the_validation_set():
    """The split keeps an action longer than a third of the validation budget in training (with 4+ actions)."""
    data = synthetic_dataset(frames_per_action=40, actions=12, seed=3)
    data.arrays["action"] = np.where(data.arrays["action"] <= 5, 0, data.arrays["action"])   # action 0: half the rows
    for seed in range(20):
        train, val = data.split_by_action(seed=seed, val_fraction=0.3)
        assert len(val) > 0 and 0 not in set(val.arrays["action"])
        assert not set(train.arrays["action"]) & set(val.arrays["action"])


# ---- left/right mirror augmentation ----------------------------------------------------------------------------


def mirrored_positions(data):
    """S x with left and right roles swapped: where FK of the mirrored pose must put every joint."""
    from neural_ik.neural_network.data import augment
    return (data.positions.astype(np.float64) @ augment.REFLECT)[:, augment.MIRROR_ROLES]


@pytest.mark.parametrize("moving", [False, True])
def test_mirroring_twice_is_the_identity(data, moving):
    from neural_ik.neural_network.data import augment
    from neural_ik.neural_network.geometry import rotations
    source = with_moving_links(data) if moving else data
    mirror = augment.mirror_check(source)
    assert mirror.ok, mirror.reason
    once = augment.mirror_dataset(source, mirror)
    twice = augment.mirror_dataset(once, mirror)
    mask = source.skeleton.role_mask
    assert not np.allclose(once.inputs, source.inputs, atol=1e-2)          # the mirror image is another motion
    assert np.array_equal(once.action, source.action)                      # a dataset of its own: ids name its actions
    assert all(str(n).endswith(augment.MIRROR_SUFFIX) for n in once.action_names[once.action])
    for name in ("positions", "hips_rotation", "hips_position", "inputs") + (("bridges", "offsets") if moving else ()):
        assert np.allclose(twice.arrays[name][:, mask] if name == "positions" else twice.arrays[name],
                           source.arrays[name][:, mask] if name == "positions" else source.arrays[name], atol=2e-4), name
    back = rotations.axis_angle_to_matrix(twice.rotations.astype(np.float64))[:, mask]
    assert np.allclose(back, rotations.axis_angle_to_matrix(source.rotations.astype(np.float64))[:, mask], atol=1e-4)
    assert np.array_equal(once.contacts, source.contacts[:, ::-1]) and np.array_equal(twice.contacts, source.contacts)
    frames = mirror.frames[mask]
    assert np.allclose(np.linalg.det(frames), -1.0) and np.allclose(frames @ mirror.frames[augment.MIRROR_ROLES][mask],
                                                                     np.eye(3), atol=1e-9)


@pytest.mark.parametrize("moving", [False, True])
def test_fk_of_a_mirrored_pose_is_the_mirrored_positions(data, moving):
    """The mirrored dataset's positions are FK of its rotations (what the loss compares), and they equal the mirror
    image of the original positions on this symmetric rig; effector orientations are mirrored too."""
    from neural_ik.neural_network.data import augment
    from neural_ik.neural_network.geometry import kinematics, rotations
    source = with_moving_links(data) if moving else data
    mirror = augment.mirror_check(source)
    flipped = augment.mirror_dataset(source, mirror)
    mask = source.skeleton.role_mask
    local = rotations.axis_angle_to_matrix(flipped.rotations.astype(np.float64))
    links = [flipped.arrays[k].astype(np.float64) if moving else None for k in ("bridges", "offsets")]
    pose = kinematics.forward(source.skeleton, local, flipped.hips_rotation.astype(np.float64),
                              flipped.hips_position.astype(np.float64), *links)
    assert np.allclose(pose.positions[:, mask], flipped.positions[:, mask], atol=1e-5)
    assert np.abs(pose.positions[:, mask] - mirrored_positions(source)[:, mask]).max() < 1e-4
    original = kinematics.forward(source.skeleton, rotations.axis_angle_to_matrix(source.rotations.astype(np.float64)),
                                  source.hips_rotation.astype(np.float64), source.hips_position.astype(np.float64),
                                  *[source.arrays[k].astype(np.float64) if moving else None for k in ("bridges", "offsets")])
    for j in (10, 14, 17, 21, 6):        # hands, feet, head: G'_m(j) = S G_j T_j
        k = augment.MIRROR_ROLES[j]
        expected = augment.REFLECT @ original.rotations[:, j] @ mirror.frames[j]
        assert np.allclose(pose.rotations[:, k], expected, atol=1e-5)


def test_an_asymmetric_rig_is_not_mirrored(tmp_path):
    from neural_ik.neural_network.data import augment
    skel = humanoid_skeleton()
    skel.offsets[14] *= 1.3          # the right hand sits 30% further down the forearm than the left
    lopsided = synthetic_dataset(frames_per_action=30, actions=4, seed=2, skeleton=skel)
    mirror = augment.mirror_check(lopsided)
    assert not mirror.ok and "differ by up to" in mirror.reason
    one_sided = synthetic_dataset(frames_per_action=30, actions=4, seed=2,
                                  skeleton=humanoid_skeleton(missing=("Spine2", "NeckUpper", "LeftShoulder")))
    assert "one side only" in augment.mirror_check(one_sided).reason
    tr = trainer.Trainer(lopsided, trainer.TrainConfig(epochs=1, limb_mix=0.0), tmp_path)
    assert tr.mirror_note.startswith("skipped") and len(tr.train) == len(lopsided.split_by_action(0, 0.1)[0])


def test_training_sees_each_frame_and_its_mirror_image_and_validates_on_recorded_motion(data, tmp_path):
    tr = trainer.Trainer(data, trainer.TrainConfig(epochs=1, limb_mix=0.0), tmp_path)
    plain = trainer.Trainer(data, trainer.TrainConfig(epochs=1, mirror=False, limb_mix=0.0), tmp_path)
    assert tr.mirror_note == "on" and plain.mirror_note == "off"
    assert len(tr.train) == 2 * len(plain.train) and np.array_equal(tr.val.inputs, plain.val.inputs)
    half = len(plain.train)
    assert set(tr.train.action[:half].tolist()).isdisjoint(tr.train.action[half:].tolist())
    assert np.all(tr.train.prev[half:] >= half)          # frame pairs never cross into the recorded half
    assert tr.model().meta["mirror"] == "on"


def test_early_stopping_waits_for_both_epochs_and_steps(data, tmp_path):
    """Without improvement (learning rate 0) a run stops after `patience` epochs, unless that is fewer than
    `patience_steps` steps (a small dataset's epoch is only a few steps), and never before `early_stop_from` of the
    schedule."""
    def stopped_after(patience_steps, early_stop_from=0.0):
        config = trainer.TrainConfig(epochs=50, batch_size=64, learning_rate=0.0, patience=2,
                                     patience_steps=patience_steps, early_stop_from=early_stop_from)
        result = trainer.train(data, config, tmp_path)
        return result.stopped, len(result.history)

    steps = len(trainer.Trainer(data, trainer.TrainConfig(epochs=1), tmp_path).train) // 64
    assert stopped_after(0) == ("early stop", 3)
    assert stopped_after(5 * steps) == ("early stop", 6)
    assert stopped_after(0, early_stop_from=0.5) == ("early stop", 25)     # not before half of the schedule


def test_a_run_started_from_a_model_begins_where_it_left_off_and_counts_time_from_started(data, tmp_path):
    """start_from: the model's weights, normalisation and mean pose (limits widened to the data's), so before any step
    the run predicts what the model predicts; a model of another rig is refused. config.started: the time limit counts
    from then (the data's preparation included), so a limit already spent trains no step."""
    import time

    first = trainer.Trainer(data, trainer.TrainConfig(epochs=2, batch_size=64, patience=0), tmp_path).run().model
    again = trainer.Trainer(data, trainer.TrainConfig(epochs=2, batch_size=64, patience=0), tmp_path, start_from=first)
    x = np.asarray(data.inputs[:50])
    np.testing.assert_allclose(again.model().predict(x), first.predict(x), atol=1e-5)
    # each prior member starts from its part of the merged prior: the ensemble answers what the model's prior did
    inputs, _frames = prior.prior_inputs(prior.targets_of_rows(again.val.positions, again.val.global_rotations),
                                         prior.free_mask(["root", "head"]), first.prior.references, first.prior.height)
    assert first.prior.meta["members"] == 2
    np.testing.assert_allclose(again.model().prior.predict(inputs), first.prior.predict(inputs), atol=1e-5)
    assert np.all(again.model().limit_low <= first.limit_low) and np.all(again.model().limit_high >= first.limit_high)
    other = synthetic_dataset(frames_per_action=40, actions=4, seed=2, skeleton=humanoid_skeleton(missing=("Spine2",)))
    with pytest.raises(ValueError, match="another rig"):
        trainer.Trainer(other, trainer.TrainConfig(epochs=1), tmp_path, start_from=first)
    (tmp_path / "late").mkdir()
    late = trainer.Trainer(data, trainer.TrainConfig(epochs=50, batch_size=64, time_limit=5.0, started=time.time() - 6),
                           tmp_path / "late")
    result = late.run()
    assert result.stopped == "time limit" and result.seconds >= 6.0 and result.history == []


def test_the_model_keeps_its_data_planted_ankle_height_through_files(data, tmp_path):
    """What a contact flag means without the clip's lowest ankle (a live tick): the trained model's input layout holds
    each ankle's median height over its ground in the training rows where that foot is planted, through the
    checkpoint and the ONNX sidecar."""
    from neural_ik.neural_network.runtime import model_files, onnx_export
    from neural_ik.neural_network.skeleton.roles import FOOT_ROLES
    tr = trainer.Trainer(data, trainer.TrainConfig(epochs=1, batch_size=64, patience=0), tmp_path)
    result = tr.run()
    model = checkpoint.load_model(result.paths["model"])
    train = tr.train
    planted = train.contacts > 0.5
    expected = [np.median(train.positions[planted[:, k], f, 2] - train.ground[planted[:, k], k])
                for k, f in enumerate(FOOT_ROLES)]
    assert 0 < np.mean(train.contacts) < 1
    np.testing.assert_allclose(model.feature_spec.contact_height, expected, atol=1e-6)
    assert model.feature_spec.same_frames(data.feature_spec) and data.feature_spec.contact_height is None
    again = model_files.model_from_onnx_proto(onnx_export.build_onnx(model))
    assert again.feature_spec.contact_height == model.feature_spec.contact_height
