"""Faults (issue 7, part 3): a writer killed mid-write, and the live and training sessions interrupted every way a
user can interrupt them. Afterwards nothing keeps running (no neural_ik thread in threading.enumerate(), no timer
registered, no live session), nothing was printed as an error, and the rig is as it was.

The kill test runs the real writers (checkpoint.save_model, Dataset.save, onnx_export.export_onnx) in a child
process without Blender, makes them write a file of a couple of hundred megabytes over an existing one, and sends
SIGKILL as soon as their temporary file has bytes in it: the previous file must be byte for byte intact and load.
Cancel during training is covered in test_train_operator.py; a deleted target and undo through the handler in
test_live.py.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from live_helpers import Event, StandInContext, pose_channels, runner_reporting_to

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WRITER = """
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("neural_network", {init!r}, submodule_search_locations=[{folder!r}])
package = importlib.util.module_from_spec(spec); sys.modules["neural_network"] = package; spec.loader.exec_module(package)
from neural_network.data import dataset
from neural_network.data.features import FeatureSpec
from neural_network.model import checkpoint
from neural_network.model.model import Model
from neural_network.runtime import onnx_export
from neural_network.skeleton.skeleton import Skeleton

kind, path, hidden = sys.argv[1], sys.argv[2], int(sys.argv[3])
eye = lambda n: np.broadcast_to(np.eye(3), (n, 3, 3)).copy()
skeleton = Skeleton([f"bone{{i}}" for i in range(23)], np.zeros((23, 3)), eye(23), eye(23), np.zeros((23, 3)))
spec = FeatureSpec(eye(5), np.eye(3))
f32 = lambda *shape: np.full(shape, 0.5, np.float32)
model = Model(skeleton, spec, [f32(50, hidden), f32(hidden), f32(hidden, 69), f32(69)], f32(50), f32(50),
              eye(23), -f32(23, 3), f32(23, 3))
print("writing", flush=True)
if kind == "checkpoint":
    checkpoint.save_model(path, model)
elif kind == "onnx":
    onnx_export.export_onnx(model, path)
else:
    n = hidden
    arrays = {{name: np.zeros((n,) + shape, dtype) for name, (shape, dtype) in dataset.ROW_ARRAYS.items()}}
    arrays["role_mask"] = np.ones(23, bool)
    arrays["action_names"] = np.array(["a"])
    meta = {{"kind": dataset.KIND, "layout_version": 1, "skeleton": skeleton.to_json(), "feature_spec": spec.to_json(),
            "actions": [{{"name": "a"}}]}}
    dataset.Dataset(arrays, meta).save(path)
print("finished", flush=True)
"""


def _previous_file(kind, path):
    """A small valid file of the kind, written with the add-on's own writer; returns a loader for it."""
    from live_helpers import humanoid_skeleton, random_model
    from synthetic import synthetic_dataset

    from neural_ik.neural_network.data.dataset import Dataset
    from neural_ik.neural_network.model import checkpoint
    from neural_ik.neural_network.runtime.model_files import load_model_file
    from neural_ik.neural_network.runtime.onnx_export import export_onnx

    if kind == "dataset":
        synthetic_dataset(frames_per_action=5, actions=2).save(path)
        return lambda: len(Dataset.load(path)) == 10
    model = random_model(humanoid_skeleton(), hidden=(8,))
    if kind == "checkpoint":
        checkpoint.save_model(path, model)
    else:
        export_onnx(model, path)
    return lambda: load_model_file(path)[0].layer_sizes == [50, 8, 69]


@pytest.mark.parametrize("kind, hidden", [("checkpoint", 300_000), ("onnx", 200_000), ("dataset", 250_000)])
def test_a_writer_killed_mid_write_leaves_the_previous_file_intact(addon, tmp_path, kind, hidden):
    path = str(tmp_path / ("model.onnx" if kind == "onnx" else f"{kind}.npz"))
    loads = _previous_file(kind, path)
    previous = open(path, "rb").read()
    code = WRITER.format(init=os.path.join(REPO, "neural_network", "__init__.py"), folder=os.path.join(REPO, "neural_network"))
    child = subprocess.Popen([sys.executable, "-c", code, kind, path, str(hidden)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    killed_at = None
    deadline = time.monotonic() + 120
    try:
        while child.poll() is None and time.monotonic() < deadline:
            temporary = [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
            if temporary and os.path.getsize(tmp_path / temporary[0]) > 0:
                child.send_signal(signal.SIGKILL)
                killed_at = os.path.getsize(tmp_path / temporary[0])
                break
            time.sleep(0.0005)
    finally:
        if child.poll() is None:
            child.kill()
        out, err = child.communicate()
    assert killed_at is not None, f"the writer finished before it could be killed: {out!r} {err[-500:]!r}"
    assert child.returncode == -signal.SIGKILL
    assert b"finished" not in out
    assert open(path, "rb").read() == previous, "the previous file changed"
    assert loads()


# ---- sessions interrupted ------------------------------------------------------------------------------------------

def _no_stray_work():
    """Nothing of the add-on keeps running: no thread, no timer, no live session, no training marked running."""
    import bpy

    from neural_ik import state
    from neural_ik.blender.workflows import training as train_ops

    threads = [t.name for t in threading.enumerate() if "neural_ik" in t.name]
    assert not threads, threads
    assert not bpy.app.timers.is_registered(train_ops._poll)
    assert not state.live_sessions
    assert not state.training.running


@pytest.fixture(scope="module")
def demo_model(addon):
    import bpy
    from live_helpers import demo_armature, linear_model_for

    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.properties import get_bone_map

    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    obj = demo_armature()
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    samples = [pose_read.read_action(rig, obj, a) for a in sorted(bpy.data.actions, key=lambda a: a.name)[::4]]
    return linear_model_for(rig.skeleton, samples)


@pytest.fixture
def live(empty_scene, demo_model):
    """A running Run IK (its modal logic driven with stand-in window-manager objects) on a fresh demo rig."""
    import bpy
    from live_helpers import demo_armature, drive_with

    from neural_ik.blender import models
    from neural_ik.blender.live import session as live_session

    obj = demo_armature()
    drive_with(obj, demo_model)
    bpy.ops.neural_ik.create_targets()
    bpy.context.view_layer.update()
    reports = []
    Runner = runner_reporting_to(reports)
    before = pose_channels(obj)
    action = obj.animation_data.action
    context = StandInContext()
    runner = Runner()
    assert runner.invoke(context, Event("NONE")) == {"RUNNING_MODAL"}
    obj.neural_ik.target_left_hand.location.z += 0.2
    assert runner.modal(context, Event("TIMER")) == {"RUNNING_MODAL"}
    assert np.abs(pose_channels(obj) - before).max() > 1e-4          # it really drove the rig
    yield obj, runner, context, reports, before, action
    live_session.stop_all("")
    models.loaded_models.clear()


def _ended(runner, context, reports, words):
    runner.last_tick = 0.0
    assert runner.modal(context, Event("TIMER")) == {"CANCELLED"}
    assert reports[-1][0] == "WARNING" and words in reports[-1][1], reports
    assert context.window_manager.removed


def test_loading_a_new_file_while_live(live, capfd):
    import bpy

    obj, runner, context, reports, before, action = live
    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    _ended(runner, context, reports, "a file is being loaded")
    _no_stray_work()
    assert "Traceback" not in capfd.readouterr().err


def _fire(handler_list):
    """Call every handler Blender has registered in bpy.app.handlers.<name>, as Blender does around undo and redo
    (the operators ed.undo/ed.redo need a window, which the bpy module has not)."""
    import bpy

    for handler in list(getattr(bpy.app.handlers, handler_list)):
        handler(bpy.context.scene, None)


def test_undo_and_redo_while_live(live, capfd):
    obj, runner, context, reports, before, action = live
    _fire("undo_pre")
    _ended(runner, context, reports, "undo or redo")
    _no_stray_work()
    np.testing.assert_array_equal(pose_channels(obj), before)
    again = type(runner)()
    assert again.invoke(context, Event("NONE")) == {"RUNNING_MODAL"}
    _fire("redo_pre")
    _ended(again, context, reports, "undo or redo")
    _no_stray_work()
    np.testing.assert_array_equal(pose_channels(obj), before)
    assert obj.animation_data.action == action
    assert "Traceback" not in capfd.readouterr().err


def test_deleting_the_armature_while_live(live, capfd):
    import bpy

    obj, runner, context, reports, before, action = live
    bpy.data.objects.remove(obj)
    _ended(runner, context, reports, "deleted")
    _no_stray_work()
    assert "Traceback" not in capfd.readouterr().err


def test_unregistering_the_add_on_while_live_restores_the_rig(live, addon, capfd):
    obj, runner, context, reports, before, action = live
    addon.unregister()
    try:
        _no_stray_work()
        np.testing.assert_array_equal(pose_channels(obj), before)
        assert obj.animation_data.action == action
    finally:
        addon.register()
    _ended(runner, context, reports, "disabled")
    assert "Traceback" not in capfd.readouterr().err


def test_unregistering_the_add_on_while_training(empty_scene, addon, tmp_path, capfd):
    import bpy
    from synthetic import synthetic_dataset

    from neural_ik import state
    from neural_ik.blender.workflows import training as train_ops
    from neural_ik.neural_network.model import checkpoint, trainer

    path = tmp_path / "data.npz"
    synthetic_dataset(frames_per_action=60, actions=4, seed=1).save(path)
    bpy.ops.neural_ik.train(filepath=str(path), directory=str(tmp_path), epochs=100000, mode="THREAD")
    thread = train_ops._Run.thread
    assert thread is not None and thread.is_alive() and bpy.app.timers.is_registered(train_ops._poll)
    waited = 0.0
    while state.training.epoch < 1 and thread.is_alive() and waited < 30:
        thread.join(0.02)
        waited += 0.02
    addon.unregister()
    try:
        assert not thread.is_alive()
        _no_stray_work()
    finally:
        addon.register()
    checkpoint.load_model(tmp_path / trainer.MODEL_FILE)       # the best model so far is whole
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]
    assert "Traceback" not in capfd.readouterr().err
