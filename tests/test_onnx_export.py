"""ONNX export: the graph equals the NumPy model, the metadata describes it, and bad files are refused before use."""

import json
import os

import numpy as np
import pytest
from live_helpers import humanoid_skeleton, inputs_of, random_model, random_poses

from neural_ik.neural_network.data.files import FileRefused
from neural_ik.neural_network.model import checkpoint
from neural_ik.neural_network.runtime import model_files, onnx_export


@pytest.fixture(scope="module")
def model():
    return random_model(humanoid_skeleton())


def validation_inputs(model, n=500):
    _, hips_R, _, pose = random_poses(model.skeleton, n, seed=11)
    x = inputs_of(model.feature_spec, pose, hips_R, task=2, phase=0.3)
    return np.concatenate([x, x + np.random.default_rng(0).normal(0, 3.0, x.shape).astype(np.float32)])  # some clamp


def test_onnxruntime_equals_numpy_model(model, tmp_path):
    import onnx
    import onnxruntime as ort

    path = tmp_path / "m.onnx"
    onnx_path, side = onnx_export.export_onnx(model, path)
    proto = onnx.load(onnx_path)
    assert proto.opset_import[0].version == 17
    assert {n.op_type for n in proto.graph.node} >= {"Sub", "Div", "MatMul", "Add", "Tanh", "Min", "Max"}
    session = ort.InferenceSession(onnx_path)          # a plain session, default options
    x = validation_inputs(model)
    (out,) = session.run(None, {"inputs": x})
    expected = model.predict_clamped(x)
    assert np.max(np.abs(out - expected)) <= 1e-5
    low, high = (np.asarray(a, np.float32).reshape(-1) for a in (model.limit_low, model.limit_high))
    clamped = (expected == low) | (expected == high)
    assert clamped.any()                               # the clamp inside the graph was exercised


def test_metadata_and_sidecar_describe_the_model(model, tmp_path):
    import onnx

    onnx_path, side = onnx_export.export_onnx(model, tmp_path / "m.onnx")
    props = {p.key: p.value for p in onnx.load(onnx_path).metadata_props}
    with open(side) as handle:
        sidecar = json.load(handle)
    assert set(sidecar) == set(props)
    assert json.loads(props["neural_ik.bone_map"])["LeftHand"] == "bone_LeftHand"
    assert props["neural_ik.rig_fingerprint"] == model.skeleton.fingerprint()
    np.testing.assert_allclose(sidecar["neural_ik.mean_pose"], model.mean_pose, atol=1e-12)
    assert len(sidecar["neural_ik.input_names"]) == 50 and sidecar["neural_ik.units"].startswith("metres")
    loaded, data = model_files.load_onnx(onnx_path)
    x = validation_inputs(model, 50)
    np.testing.assert_allclose(loaded.predict_clamped(x), model.predict_clamped(x), atol=1e-6)
    assert loaded.skeleton.fingerprint() == model.skeleton.fingerprint()


def test_checkpoint_and_onnx_load_for_the_right_rig_only(model, tmp_path):
    onnx_path, _ = onnx_export.export_onnx(model, tmp_path / "m.onnx")
    checkpoint.save_model(tmp_path / "m.npz", model)
    for path in (onnx_path, tmp_path / "m.npz"):
        loaded, _ = model_files.load_model_file(path, model.skeleton)
        assert loaded.layer_sizes == model.layer_sizes
        other = humanoid_skeleton(drop=("Spine2",))
        with pytest.raises(FileRefused, match="another rig"):
            model_files.load_model_file(path, other)


def test_truncated_nan_and_foreign_files_are_refused(model, tmp_path):
    import onnx
    from onnx import numpy_helper

    onnx_path, _ = onnx_export.export_onnx(model, tmp_path / "m.onnx")
    data = open(onnx_path, "rb").read()
    cases = {"truncated.onnx": data[: len(data) // 2], "empty.onnx": b"", "text.onnx": b"not a model at all"}
    proto = onnx.load(onnx_path)
    for init in proto.graph.initializer:
        if init.name == "W1":
            bad = numpy_helper.to_array(init).copy()
            bad[0, 0] = np.nan
            init.CopyFrom(numpy_helper.from_array(bad, "W1"))
    cases["nan.onnx"] = proto.SerializeToString()
    proto = onnx.load(onnx_path)
    proto.graph.output[0].name = "something_else"
    cases["renamed.onnx"] = proto.SerializeToString()
    proto = onnx.load(onnx_path)
    del proto.metadata_props[:]
    cases["nometa.onnx"] = proto.SerializeToString()
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(FileRefused) as info:
            model_files.load_model_file(path, model.skeleton)
        assert name in str(info.value) or str(path) in str(info.value), (name, str(info.value))
    with pytest.raises(FileRefused, match="folder"):
        model_files.load_model_file(tmp_path, model.skeleton)
    bad = random_model(model.skeleton)
    bad.weights[0][3, 3] = np.inf
    with pytest.raises(FileRefused, match="NaN or infinite"):
        onnx_export.export_onnx(bad, tmp_path / "never.onnx")
    assert not os.path.exists(tmp_path / "never.onnx")


def test_export_is_atomic(model, tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    onnx_export.export_onnx(model, path)
    before = path.read_bytes()
    other = random_model(model.skeleton, seed=9)

    def failing_write(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_write)
    with pytest.raises(OSError):
        onnx_export.export_onnx(other, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []


def test_without_the_onnx_package_export_and_onnx_loading_refuse_in_words(model, tmp_path, monkeypatch):
    import sys

    path = str(tmp_path / "m.onnx")
    onnx_export.export_onnx(model, path)
    monkeypatch.setitem(sys.modules, "onnx", None)      # what Blender without the bundled wheels has
    with pytest.raises(FileRefused, match="needs the onnx package"):
        onnx_export.export_onnx(model, str(tmp_path / "again.onnx"))
    with pytest.raises(FileRefused, match="needs the onnx package"):
        model_files.load_model_file(path, model.skeleton)
    assert not (tmp_path / "again.onnx").exists()
