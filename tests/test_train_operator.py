"""neural_ik.train and neural_ik.cancel_training in real Blender: synchronous in background mode, a NumPy thread
otherwise, Cancel keeps the best checkpoint, one run at a time, loading a file stops the run."""

import os
import threading

import bpy
import pytest
from synthetic import synthetic_dataset

from neural_ik import state
from neural_ik.neural_network.model import checkpoint, trainer
from neural_ik.neural_network.skeleton.roles import ROLES
from neural_ik.properties import set_bone_map


@pytest.fixture(scope="module")
def dataset_file(tmp_path_factory):
    data = synthetic_dataset(frames_per_action=100, actions=5, seed=2)
    path = tmp_path_factory.mktemp("data") / "synthetic.npz"
    data.save(path)
    return str(path), data


def matching_armature(data):
    bpy.ops.object.armature_add()
    obj = bpy.context.active_object
    set_bone_map(obj, dict(zip(ROLES, data.skeleton.bone_names)))
    return obj


def wait_for(condition, thread, seconds=30.0):
    waited = 0.0
    while not condition() and thread.is_alive() and waited < seconds:
        thread.join(0.02)
        waited += 0.02


def test_background_training_points_the_armature_at_the_best_checkpoint(empty_scene, dataset_file, tmp_path):
    path, data = dataset_file
    obj = matching_armature(data)
    assert bpy.app.background
    result = bpy.ops.neural_ik.train(filepath=path, directory=str(tmp_path), epochs=3)
    assert result == {"FINISHED"}
    assert obj.neural_ik.model_path == str(tmp_path / trainer.MODEL_FILE)
    model = checkpoint.load_model(obj.neural_ik.model_path, expected_fingerprint=data.skeleton.fingerprint())
    assert len(model.meta["history"]) == 3 and model.meta["metrics"]["frames"] > 0
    for name in (trainer.METRICS_FILE, trainer.PLOT_FILE):
        assert os.path.getsize(tmp_path / name) > 0
    assert not state.training.running and state.training.epoch == 3


def test_cancel_stops_the_training_thread_and_keeps_the_best(empty_scene, dataset_file, tmp_path):
    path, data = dataset_file
    obj = matching_armature(data)
    bpy.ops.neural_ik.train(filepath=path, directory=str(tmp_path), epochs=100000, batch_size=32, mode="THREAD")
    from neural_ik.blender.workflows import training as train_module
    thread = train_module._Run.thread
    assert thread is not None and thread.is_alive() and state.training.running
    wait_for(lambda: state.training.epoch >= 2, thread)
    with pytest.raises(RuntimeError, match="already going on"):
        bpy.ops.neural_ik.train(filepath=path, directory=str(tmp_path), epochs=2, mode="THREAD")
    bpy.ops.neural_ik.cancel_training()
    assert not thread.is_alive() and not state.training.running
    assert obj.neural_ik.model_path == str(tmp_path / trainer.MODEL_FILE)
    model = checkpoint.load_model(obj.neural_ik.model_path)
    assert model.meta["metrics"] == state.training.best_metrics
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".tmp")]


def test_the_thread_prepares_the_data_and_a_cancel_there_trains_nothing(empty_scene, dataset_file, tmp_path,
                                                                        monkeypatch):
    """Data preparation (mirror, limb mix, statistics: tens of seconds on a large dataset) runs on the training thread,
    so the operator returns at once; Cancel during it stops the run before any training and allows no second run
    until the thread has ended."""
    from neural_ik.blender.workflows import training as train_module
    from neural_ik.neural_network.data import limb_mix
    path, data = dataset_file
    matching_armature(data)
    entered, release = threading.Event(), threading.Event()
    original = limb_mix.with_limb_mix

    def held(*args, **kwargs):
        entered.set()
        release.wait(30)
        return original(*args, **kwargs)

    monkeypatch.setattr(limb_mix, "with_limb_mix", held)
    monkeypatch.setattr(train_module, "JOIN_SECONDS", 0.1)
    bpy.ops.neural_ik.train(filepath=path, directory=str(tmp_path), epochs=100000, mode="THREAD")
    thread = train_module._Run.thread
    assert entered.wait(10) and thread is not threading.current_thread()
    assert thread.is_alive() and state.training.message == "preparing data"
    bpy.ops.neural_ik.cancel_training()
    assert thread.is_alive() and train_module.is_running()
    with pytest.raises(RuntimeError, match="already going on"):
        bpy.ops.neural_ik.train(filepath=path, directory=str(tmp_path), epochs=1, mode="THREAD")
    release.set()
    thread.join(30)
    assert not thread.is_alive() and not state.training.running and not state.training.error
    assert "cancelled while preparing the data" in state.training.message
    assert not os.path.exists(tmp_path / trainer.MODEL_FILE)


def test_loading_another_file_stops_the_training_thread(empty_scene, dataset_file, tmp_path):
    path, data = dataset_file
    matching_armature(data)
    bpy.ops.neural_ik.train(filepath=path, directory=str(tmp_path), epochs=100000, mode="THREAD")
    from neural_ik.blender.workflows import training as train_module
    thread = train_module._Run.thread
    wait_for(lambda: state.training.epoch >= 1, thread)
    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    assert not thread.is_alive()
    checkpoint.load_model(tmp_path / trainer.MODEL_FILE)


def test_bad_inputs_are_refused_in_plain_words(empty_scene, dataset_file, tmp_path):
    path, _ = dataset_file
    with pytest.raises(RuntimeError, match="does not exist"):
        bpy.ops.neural_ik.train(filepath=str(tmp_path / "missing.npz"), directory=str(tmp_path))
    with pytest.raises(RuntimeError, match="output folder"):
        bpy.ops.neural_ik.train(filepath=path, directory=str(tmp_path / "no" / "such"))
    not_a_dataset = tmp_path / "model.npz"
    bpy.ops.neural_ik.train(filepath=path, directory=str(tmp_path), epochs=1)
    with pytest.raises(RuntimeError, match="expected 'neural_ik.dataset'"):
        bpy.ops.neural_ik.train(filepath=str(not_a_dataset), directory=str(tmp_path))
    assert not state.training.running


def test_library_compare_through_the_operator_keeps_the_better_run_and_says_which(empty_scene, tmp_path):
    """A dataset with four own clips and library motion, trained from the operator with Library on Compare (the
    default): two runs in their folders, the armature points at the output folder's model (the better's copy), and
    what was kept is in the panel's state and metrics.json; on Use, one run."""
    import json

    data = synthetic_dataset(frames_per_action=40, actions=8, seed=3)
    for k, entry in enumerate(data.meta["actions"]):
        if k >= 4:
            entry["source"] = {"kind": "library", "file": f"{entry['name']}.bvh", "skeleton": "other", "retargeted": True}
    path = str(tmp_path / "mixed.npz")
    data.save(path)
    obj = matching_armature(data)
    out = tmp_path / "compare"
    out.mkdir()
    assert bpy.context.scene.neural_ik.library == "AUTO"
    assert bpy.ops.neural_ik.train(filepath=path, directory=str(out), epochs=2) == {"FINISHED"}
    kept = json.loads((out / trainer.METRICS_FILE).read_text())["library"]["kept"]
    assert obj.neural_ik.model_path == str(out / trainer.MODEL_FILE)
    assert (out / trainer.MODEL_FILE).read_bytes() == (out / kept / trainer.MODEL_FILE).read_bytes()
    assert state.training.library.startswith(f"kept {kept}")
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["own clips only", "with the library"]
    bpy.context.scene.neural_ik.library = "ALWAYS"
    once = tmp_path / "use"
    once.mkdir()
    assert bpy.ops.neural_ik.train(filepath=path, directory=str(once), epochs=2) == {"FINISHED"}
    assert "library" not in json.loads((once / trainer.METRICS_FILE).read_text())
    assert sorted(p.name for p in once.iterdir() if p.is_dir()) == [] and not state.training.library
