"""Fuzzing with a fixed budget (issue 7, part 2): the live tick with arbitrary target transforms, and the file loaders
with damaged files.

- The tick: every entry of the six target matrices may be any float, NaN or infinite; the tick drives a real
  armature through the ONNX Runtime engine and must neither raise, nor write a non-finite rotation, nor warn. (The
  solver alone is fuzzed in test_solver.py; bone-map auto-detection with random hierarchies in test_bone_map.py.)
- The loaders: a valid dataset, checkpoint and ONNX file with bit flips, truncation, inserted and overwritten bytes
  must load into a complete, checked object or be refused with FileRefused/ValueError, never another exception.

Budgets are fixed (max_examples, derandomized) so the module runs in well under a minute.
"""

import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_helpers import pose_channels

BUDGET = settings(max_examples=60, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# ---- damaged files ----------------------------------------------------------------------------------------------

mutation = st.one_of(
    st.tuples(st.just("flip"), st.floats(0, 1, exclude_max=True), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("overwrite"), st.floats(0, 1, exclude_max=True), st.binary(min_size=1, max_size=16)),
)


def mutate(raw, mutations):
    data = bytearray(raw)
    for m in mutations:
        if not data:
            break
        at = min(int(m[1] * len(data)), len(data) - 1)
        if m[0] == "flip":
            data[at] ^= 1 << m[2]
        elif m[0] == "truncate":
            del data[at:]
        elif m[0] == "insert":
            data[at:at] = m[2]
        else:
            data[at:at + len(m[2])] = m[2]
    return bytes(data)


@pytest.fixture(scope="module")
def good_files(addon):
    from live_helpers import humanoid_skeleton, random_model
    from synthetic import synthetic_dataset

    from neural_ik.neural_network.model import checkpoint
    from neural_ik.neural_network.runtime.onnx_export import export_onnx

    folder = tempfile.mkdtemp(prefix="nik_fuzz_")
    model = random_model(humanoid_skeleton(), hidden=(8,))
    paths = {"dataset": os.path.join(folder, "data.npz"), "checkpoint": os.path.join(folder, "model.npz"),
             "onnx": os.path.join(folder, "model.onnx")}
    synthetic_dataset(frames_per_action=6, actions=2, seed=3).save(paths["dataset"])
    checkpoint.save_model(paths["checkpoint"], model)
    export_onnx(model, paths["onnx"])
    raw = {kind: open(path, "rb").read() for kind, path in paths.items()}
    return folder, raw, model


def _load(kind, path):
    from neural_ik.neural_network.data.dataset import Dataset
    from neural_ik.neural_network.model import checkpoint
    from neural_ik.neural_network.runtime.model_files import load_model_file

    if kind == "dataset":
        return Dataset.load(path)
    if kind == "checkpoint":
        return checkpoint.load_model(path)
    return load_model_file(path)[0]


def _check_complete(kind, loaded, original):
    """A loaded object must be whole: every array with its documented shape, finite where it must be."""
    from neural_ik.neural_network.data.dataset import ROW_ARRAYS
    from neural_ik.neural_network.model.model import check_model

    if kind == "dataset":
        n = len(loaded)
        assert n > 0 and all(loaded.arrays[k].shape[0] == n for k in ROW_ARRAYS)
        return
    check_model(loaded)      # raises FileRefused if any shape or number is wrong
    assert loaded.skeleton.fingerprint() == original.skeleton.fingerprint()     # damage never passes as another rig


@pytest.mark.parametrize("kind", ["dataset", "checkpoint", "onnx"])
def test_damaged_files_load_whole_or_are_refused(good_files, kind):
    from neural_ik.neural_network.data.files import FileRefused

    folder, raw, model = good_files
    outcomes = {"refused": 0, "loaded": 0}

    @BUDGET
    @given(st.lists(mutation, min_size=1, max_size=3))
    def check(mutations):
        path = os.path.join(folder, f"damaged_{kind}" + (".onnx" if kind == "onnx" else ".npz"))
        with open(path, "wb") as handle:
            handle.write(mutate(raw[kind], mutations))
        try:
            loaded = _load(kind, path)
        except FileRefused as exc:
            assert str(exc)                       # a reason in words
            outcomes["refused"] += 1
            return
        except ValueError as exc:                 # allowed by the contract, but it must say something
            assert str(exc)
            outcomes["refused"] += 1
            return
        _check_complete(kind, loaded, model)
        outcomes["loaded"] += 1

    check()
    assert outcomes["refused"] > 0                # the damage was real: most variants are refused


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4), max_leaves=12)


@pytest.mark.parametrize("kind", ["checkpoint", "onnx"])
def test_any_metadata_value_loads_whole_or_is_refused(good_files, kind):
    """The JSON metadata is validated: any key set to any JSON value (or to text that is not JSON) is refused in
    words or gives a whole model."""
    import copy
    import json

    import onnx

    from neural_ik.neural_network.data import files
    from neural_ik.neural_network.data.files import FileRefused
    from neural_ik.neural_network.model import checkpoint

    folder, raw, model = good_files
    if kind == "checkpoint":
        meta, arrays = files.load_npz(os.path.join(folder, "model.npz"), checkpoint.KIND)
        keys = sorted(meta)
    else:
        proto = onnx.load_model_from_string(raw["onnx"])
        keys = sorted(p.key for p in proto.metadata_props)

    def attempt(key, value, as_text):
        path = os.path.join(folder, "meta_" + ("model.onnx" if kind == "onnx" else "model.npz"))
        if kind == "checkpoint":
            files.save_npz(path, arrays, dict(meta, **{key: value}))
        else:
            changed = onnx.load_model_from_string(raw["onnx"])
            for entry in changed.metadata_props:
                if entry.key == key:
                    entry.value = str(value)[:40] if as_text else json.dumps(value)
            with open(path, "wb") as handle:
                handle.write(changed.SerializeToString())
        try:
            loaded = _load(kind, path)
        except (FileRefused, ValueError) as exc:
            assert str(exc)
            return
        _check_complete(kind, loaded, model)

    # A whole, readable skeleton of another rig (one bone 5 cm longer) under the same fingerprint: refused, never
    # loaded as this rig's model.
    skeleton_key = "skeleton" if kind == "checkpoint" else "neural_ik.skeleton"
    edited = copy.deepcopy(meta[skeleton_key] if kind == "checkpoint" else json.loads(
        next(p.value for p in proto.metadata_props if p.key == skeleton_key)))
    edited["offsets"][3][2] += 0.05
    attempt(skeleton_key, edited, False)

    @BUDGET
    @given(st.sampled_from(keys), json_values, st.booleans())
    def check(key, value, as_text):
        attempt(key, value, as_text)

    check()


# ---- the live tick --------------------------------------------------------------------------------------------------

special = st.sampled_from([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, 1e-12, 1.0, -1.0])


@pytest.fixture(scope="module")
def live_tick(addon):
    """A demo rig with targets, driven by a LiveTick through ONNX Runtime (the engine the UI uses)."""
    import bpy
    from live_helpers import demo_armature, linear_model_for

    from neural_ik.blender.live.tick import LiveTick
    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.neural_network.runtime.onnx_export import build_onnx
    from neural_ik.properties import get_bone_map

    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    obj = demo_armature()
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    samples = [pose_read.read_action(rig, obj, a) for a in sorted(bpy.data.actions, key=lambda a: a.name)[::4]]
    model = linear_model_for(rig.skeleton, samples)
    bpy.ops.neural_ik.create_targets()
    tick = LiveTick([(obj, model, build_onnx(model).SerializeToString())])
    assert tick.groups[0][0].engine_name == "onnxruntime"
    tick.start()
    yield obj, tick
    tick.stop()


@pytest.mark.filterwarnings("error::RuntimeWarning")     # nor prints NumPy's warnings into Blender's console
@BUDGET
@given(data=st.data())
def test_tick_never_raises_and_never_writes_non_finite_rotations(live_tick, data):
    import bpy
    from mathutils import Matrix

    from neural_ik.blender.live.tick import targets_of

    obj, tick = live_tick
    targets = targets_of(obj)
    originals = [np.array(t.matrix_world) for t in targets]
    try:
        for k in data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True)):
            m = originals[k].copy()
            for _ in range(data.draw(st.integers(1, 6))):
                i, j = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))
                m[i, j] = data.draw(st.one_of(special, st.floats(-1e4, 1e4, allow_nan=False)))
            targets[k].matrix_world = Matrix(m.tolist())
        obj.neural_ik.refine_iterations = data.draw(st.integers(0, 3))
        tick.tick(bpy.context.scene)           # must not raise
        pose = pose_channels(obj)
        assert np.isfinite(pose).all()
        q = pose[:4 * len(obj.pose.bones)].reshape(-1, 4)
        assert np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-3)
    finally:
        for target, m in zip(targets, originals):
            target.matrix_world = Matrix(m.tolist())


def test_sizes_are_checked_before_arrays_are_read(tmp_path, monkeypatch):
    """A small compressed file that unpacks to more than a Neural IK file can hold is refused unread."""
    import json

    from neural_ik.neural_network.data import files

    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, meta=np.array(json.dumps({"kind": "neural_ik.model"})), big=np.zeros(4_000_000, np.uint8))
    assert path.stat().st_size < 100_000
    monkeypatch.setattr(files, "MAX_NPZ_BYTES", 1_000_000)
    with pytest.raises(files.FileRefused, match="would unpack to"):
        files.load_npz(path, "neural_ik.model")
    monkeypatch.setattr(files, "MAX_NPZ_BYTES", 8_000_000)
    meta, arrays = files.load_npz(path, "neural_ik.model")
    assert arrays["big"].shape == (4_000_000,)
