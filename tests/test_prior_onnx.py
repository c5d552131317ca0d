"""The target prior in the ONNX export: its own graph (<name>.prior.onnx) equals TargetPrior.predict, the metadata
and sidecar say how to use it, an .onnx model loads back with it, and a broken prior file is refused."""

import json
import os

import numpy as np
import pytest
from live_helpers import HIPS_HEIGHT, humanoid_skeleton, random_model, random_poses, targets_of

from neural_ik.neural_network.data.files import FileRefused
from neural_ik.neural_network.model import prior
from neural_ik.neural_network.runtime import model_files, onnx_export


def _targets(skeleton, n, seed):
    _local, hips_R, hips_p, pose = random_poses(skeleton, n, seed=seed)
    return targets_of(pose, hips_R, hips_p)


@pytest.fixture(scope="module")
def model():
    """A random model with a prior trained for a few steps (weights away from their initial draw)."""
    model = random_model(humanoid_skeleton())
    training = prior.PriorTraining(prior.references_of(model.feature_spec), HIPS_HEIGHT, seed=4)
    targets = _targets(model.skeleton, 640, seed=5)
    for start in range(0, len(targets), 64):
        training.step(targets[start:start + 64], 2e-3)
    model.prior = training.prior({"note": "test"})
    model.prior.mirror_frames = np.tile(np.diag([-1.0, 1.0, 1.0]), (prior.NUM_TARGETS, 1, 1))   # it answers both
    return model


@pytest.fixture()
def exported(model, tmp_path):
    onnx_path, side = onnx_export.export_onnx(model, tmp_path / "m.onnx")
    return onnx_path, side, onnx_export.prior_path(onnx_path)


def _free_sets(n, seed=6):
    return prior.draw_free_sets(np.random.default_rng(seed), n)


def test_the_prior_graph_equals_the_numpy_prior_and_the_sidecar_describes_it(model, exported):
    import onnx
    import onnxruntime as ort

    onnx_path, side, prior_path = exported
    assert os.path.basename(prior_path) == "m.prior.onnx"
    with open(side) as handle:
        section = json.load(handle)["neural_ik.prior"]
    props = {p.key: p.value for p in onnx.load(onnx_path).metadata_props}
    assert json.loads(props["neural_ik.prior"]) == section
    assert section["file"] == "m.prior.onnx"
    assert section["input"]["name"] == "prior_inputs" and section["input"]["shape"] == ["batch", 60]
    assert section["output"]["name"] == "prior_outputs" and section["output"]["shape"] == ["batch", 54]
    assert section["layer_sizes"] == [60, *prior.DEFAULT_PRIOR_HIDDEN, 54] and section["targets"] == list(prior.TARGETS)
    assert len(section["references"]) == 54 and section["height"] == HIPS_HEIGHT
    np.testing.assert_array_equal(np.reshape(section["mirror_frames"], (6, 3, 3)), model.prior.mirror_frames)
    assert "mirror image" in section["mirror"]
    targets = _targets(model.skeleton, 300, seed=7)
    free = _free_sets(len(targets))
    x, _frames = prior.prior_inputs(targets, free, model.prior.references, model.prior.height)
    # what an engine builds from the sidecar's numbers alone is what the prior builds
    rebuilt, _frames = prior.prior_inputs(targets, free, np.reshape(section["references"], (6, 3, 3)),
                                          section["height"])
    np.testing.assert_array_equal(rebuilt, x)
    assert section["heading_weights"] == prior.HEADING_WEIGHTS.tolist()
    (out,) = ort.InferenceSession(prior_path, providers=["CPUExecutionProvider"]).run(None, {"prior_inputs": x})
    assert out.shape == (300, 54)
    np.testing.assert_allclose(out, model.prior.predict(x), atol=1e-5)


def test_an_onnx_model_loads_back_with_its_prior(model, exported):
    onnx_path, _side, _prior_path = exported
    loaded, data = model_files.load_model_file(onnx_path, model.skeleton)
    assert data == open(onnx_path, "rb").read()
    assert loaded.prior is not None and loaded.prior.layer_sizes == model.prior.layer_sizes
    np.testing.assert_array_equal(loaded.prior.mirror_frames, model.prior.mirror_frames)
    targets = _targets(model.skeleton, 50, seed=8)
    for free in (prior.free_mask(["root", "head"]), prior.free_mask(["root", "left_foot", "right_foot"]),
                 _free_sets(len(targets), seed=9)):
        np.testing.assert_allclose(loaded.prior.complete(targets, free), model.prior.complete(targets, free),
                                   atol=1e-9)


def test_a_missing_or_broken_prior_file_is_refused_in_one_line(model, exported, tmp_path):
    import onnx
    from onnx import numpy_helper

    onnx_path, _side, prior_path = exported
    good = open(prior_path, "rb").read()
    nan = onnx.load(prior_path)
    for init in nan.graph.initializer:
        if init.name == "prior_W1":
            bad = numpy_helper.to_array(init).copy()
            bad[2, 3] = np.nan
            init.CopyFrom(numpy_helper.from_array(bad, "prior_W1"))
    renamed = onnx.load(prior_path)
    renamed.graph.output[0].name = "something_else"
    other_rig = onnx_export.build_prior_onnx(model.prior, humanoid_skeleton(drop=("Spine2",)).fingerprint())
    cases = {"truncated": (good[: len(good) // 2], "not a readable ONNX file"),
             "NaN weights": (nan.SerializeToString(), "layer 1 holds NaN"),
             "renamed output": (renamed.SerializeToString(), "is not a Neural IK target prior"),
             "another rig's": (other_rig.SerializeToString(), "another rig"),
             "missing": (None, "which is missing")}
    for case, (content, words) in cases.items():
        if content is None:
            os.remove(prior_path)
        else:
            with open(prior_path, "wb") as handle:
                handle.write(content)
        with pytest.raises(FileRefused, match=words) as info:
            model_files.load_model_file(onnx_path, model.skeleton)
        message = str(info.value)
        assert "m.prior.onnx" in message and "\n" not in message, (case, message)
    with open(prior_path, "wb") as handle:
        handle.write(good)
    assert model_files.load_model_file(onnx_path, model.skeleton)[0].prior is not None


def test_a_broken_prior_is_refused_before_anything_is_written(model, tmp_path):
    broken = type(model)(**{**model.__dict__, "prior": prior.TargetPrior(
        [w.copy() for w in model.prior.weights], model.prior.height, model.prior.references)})
    broken.prior.weights[2][0, 0] = np.inf
    with pytest.raises(FileRefused, match="target prior's layer 1 holds NaN or infinite"):
        onnx_export.export_onnx(broken, tmp_path / "never.onnx")
    assert list(tmp_path.iterdir()) == []


def test_a_model_without_a_prior_exports_and_loads_as_before(model, tmp_path):
    import onnx

    plain = type(model)(**{**model.__dict__, "prior": None})
    onnx_path, side = onnx_export.export_onnx(plain, tmp_path / "plain.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.json", "plain.onnx"]
    with open(side) as handle:
        assert "neural_ik.prior" not in json.load(handle)
    assert "neural_ik.prior" not in {p.key for p in onnx.load(onnx_path).metadata_props}
    loaded, _data = model_files.load_model_file(onnx_path, model.skeleton)
    assert loaded.prior is None


def test_an_ensemble_prior_exports_as_one_graph_that_answers_its_members_mean_and_loads_back_as_one(model, tmp_path):
    import onnxruntime as ort

    members = []
    for seed in (11, 12):
        training = prior.PriorTraining(model.prior.references, HIPS_HEIGHT, seed=seed, hidden=(32, 24))
        for start in range(0, 320, 64):
            training.step(_targets(model.skeleton, 64, seed=start + seed), 2e-3)
        members.append(training.prior())
    ensemble = type(model)(**{**model.__dict__, "prior": prior.merge(members)})
    onnx_path, _side = onnx_export.export_onnx(ensemble, tmp_path / "e.onnx")
    targets = _targets(model.skeleton, 80, seed=13)
    x, _frames = prior.prior_inputs(targets, _free_sets(len(targets)), model.prior.references, HIPS_HEIGHT)
    (out,) = ort.InferenceSession(onnx_export.prior_path(onnx_path), providers=["CPUExecutionProvider"]).run(
        None, {"prior_inputs": x})
    np.testing.assert_allclose(out, np.mean([m.predict(x) for m in members], axis=0), atol=1e-5)
    loaded, _data = model_files.load_model_file(onnx_path, model.skeleton)
    assert loaded.prior.meta["members"] == 2 and [p.layer_sizes for p in prior.split(loaded.prior)] == [
        [60, 32, 24, 54]] * 2
