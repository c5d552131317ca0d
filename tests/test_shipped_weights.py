"""The model shipped in weights/: it fits the demo rig, its ONNX export agrees with it, and the demo rig uses it."""

import json
import os

import numpy as np
from conftest import REPO

from neural_ik.neural_network.model import checkpoint
from neural_ik.neural_network.runtime import model_files

WEIGHTS = os.path.join(REPO, "weights")


def test_the_demo_rig_comes_with_the_shipped_model_and_it_solves(empty_scene):
    """Bake with the shipped model, read back from Blender's evaluated pose of the baked action against the source
    clip's effectors: refined, they land (measured 0.007 cm worst); the network alone comes close (measured 0.41 cm
    mean, 2.1 cm worst). A bake one frame late misses by 9 cm, the rest pose by 120 cm."""
    import bpy
    from live_helpers import evaluated_effectors

    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES
    from neural_ik.properties import get_bone_map

    bpy.ops.neural_ik.create_demo_rig(seed=3)
    obj = bpy.context.scene.neural_ik.armature
    assert os.path.samefile(bpy.path.abspath(obj.neural_ik.model_path), os.path.join(WEIGHTS, "demo.npz"))
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    model = checkpoint.load_model(os.path.join(WEIGHTS, "demo.npz"), rig.skeleton.fingerprint())   # refuses another rig
    assert model.layer_sizes == [50, 128, 96, 69]
    source = bpy.data.actions["walk_slow_01"]
    frames = range(1, 13)
    reference = pose_read.read_action(rig, obj, source, frames[0], frames[-1]).positions[:, list(EFFECTOR_ROLES)]
    for iterations, name, mean_cm, worst_cm in ((4, "walk_slow_01.nik", 0.01, 0.05),
                                                (0, "walk_slow_01.nik.001", 1.5, 4.0)):
        before = set(bpy.data.actions)
        bpy.ops.neural_ik.bake(source_action=source.name, frame_start=frames[0], frame_end=frames[-1],
                               refine_iterations=iterations)
        baked = [a for a in bpy.data.actions if a not in before]
        assert [a.name for a in baked] == [name]
        miss_cm = 100 * np.linalg.norm(evaluated_effectors(obj, rig, baked[0], frames) - reference, axis=-1)
        print(f"\nbaked with {iterations} refine iterations: effector error mean {miss_cm.mean():.3f} cm, "
              f"worst {miss_cm.max():.3f} cm")
        assert miss_cm.mean() < mean_cm and miss_cm.max() < worst_cm


def test_shipped_onnx_equals_the_checkpoint_and_carries_its_metadata():
    import onnxruntime

    model = checkpoint.load_model(os.path.join(WEIGHTS, "demo.npz"))
    onnx_model, _ = model_files.load_model_file(os.path.join(WEIGHTS, "demo.onnx"), model.skeleton)
    session = onnxruntime.InferenceSession(os.path.join(WEIGHTS, "demo.onnx"), providers=["CPUExecutionProvider"])
    x = (model.input_mean + model.input_std * np.random.default_rng(0).normal(size=(64, 50))).astype(np.float32)
    (out,) = session.run(None, {session.get_inputs()[0].name: x})
    np.testing.assert_allclose(out, model.predict_clamped(x), atol=1e-5)
    np.testing.assert_allclose(onnx_model.predict_clamped(x), model.predict_clamped(x), atol=1e-5)
    with open(os.path.join(WEIGHTS, "demo.json")) as handle:
        sidecar = json.load(handle)
    assert sidecar["neural_ik.rig_fingerprint"] == model.skeleton.fingerprint()
    with open(os.path.join(WEIGHTS, "demo_metrics.json")) as handle:
        metrics = json.load(handle)
    assert metrics["best"]["frames"] > 0 and np.isfinite(metrics["best"]["effector_cm_mean"])
