"""The data operators on bad input (plain messages, nothing partial left behind) and the dataset file's round trip
and refusals. Real Blender, on BVH files written from the demo rig by Blender's exporter (tests/demo_bvh.py)."""

import json
import os
import zipfile

import numpy as np
import pytest
from test_rig_io import gather, state_hash, use_map

OTHER_SKELETON = """HIERARCHY
ROOT Pelvis
{
  OFFSET 0 0 0
  CHANNELS 6 Xposition Yposition Zposition Zrotation Xrotation Yrotation
  JOINT Chest
  {
    OFFSET 0 10 0
    CHANNELS 3 Zrotation Xrotation Yrotation
    End Site
    {
      OFFSET 0 10 0
    }
  }
}
MOTION
Frames: 2
Frame Time: 0.033333
0 90 0 0 0 0 0 0 0
0 91 0 0 0 0 0 0 0
"""


def _import(folder, scale=0.01):
    import bpy

    return bpy.ops.neural_ik.import_bvh_folder(directory=str(folder), global_scale=scale)


def _demo_armature(tmp_path, demo_bvh, count=2):
    """The first `count` demo BVH files (walk, run, ...) imported with the add-on's operator, bone map set."""
    import bpy

    _import(gather(tmp_path, demo_bvh.folder, demo_bvh.files[:count]))
    obj = bpy.context.active_object
    use_map(obj, demo_bvh.bone_map)
    return obj


def test_extract_operator_writes_a_dataset_that_loads_back_equal(demo_bvh, empty_scene, tmp_path):
    import bpy

    from neural_ik.neural_network.data.dataset import Dataset
    from neural_ik.neural_network.data.features import NUM_INPUTS
    from neural_ik.neural_network.skeleton.roles import TASKS

    obj = _demo_armature(tmp_path, demo_bvh)
    before = state_hash(obj)
    out = tmp_path / "set.npz"
    assert bpy.ops.neural_ik.extract(filepath=str(out)) == {"FINISHED"}
    assert state_hash(obj) == before
    data = Dataset.load(out)
    n = sum(bpy.data.actions[str(name)].frame_range[1] - bpy.data.actions[str(name)].frame_range[0] + 1
            for name in data.action_names)
    assert len(data) == n
    assert data.inputs.shape == (n, NUM_INPUTS) and data.inputs.dtype == np.float32
    assert np.all(np.isnan(data.positions[:, ~data.skeleton.role_mask]))
    assert set(data.task) == {TASKS.index("locomotion")}          # walk and run
    for a in range(len(data.action_names)):
        rows = np.where(data.action == a)[0]
        assert np.all(np.diff(rows) == 1) and np.all(np.diff(data.frame[rows]) == 1)   # consecutive frames
        assert data.phase[rows[0]] == 0.0 and 0.0 < data.phase[rows[-1]] < 1.0
    # round trip keeps every array and the metadata
    again = tmp_path / "again.npz"
    data.save(again)
    back = Dataset.load(again)
    assert set(back.arrays) == set(data.arrays)
    for name, value in data.arrays.items():
        np.testing.assert_array_equal(back.arrays[name], value)
    assert back.meta == json.loads(json.dumps(data.meta))
    assert back.skeleton.fingerprint() == data.skeleton.fingerprint()
    train, val = data.split_by_action(seed=1, val_fraction=0.3)
    assert len(train) + len(val) == len(data)
    assert not set(train.action) & set(val.action)
    assert "frames" in data.summary_text()


def test_task_override_property_wins_over_the_name(demo_bvh, empty_scene, tmp_path):
    import bpy

    from neural_ik.blender.workflows.extract import extract_dataset
    from neural_ik.neural_network.skeleton.roles import TASKS

    obj = _demo_armature(tmp_path, demo_bvh)
    walk = bpy.data.actions["walk_normal_03"]
    walk.neural_ik_task = "JUMP"
    data, _ = extract_dataset(bpy.context, obj)
    names = list(data.action_names)
    assert set(data.task[data.action == names.index(walk.name)]) == {TASKS.index("jump")}
    assert set(data.task[data.action == names.index("run_easy_01")]) == {TASKS.index("locomotion")}


def test_load_refuses_truncated_wrong_kind_and_wrong_version(demo_bvh, empty_scene, tmp_path):
    import bpy

    from neural_ik.blender.workflows.extract import extract_dataset
    from neural_ik.neural_network.data.dataset import Dataset
    from neural_ik.neural_network.data.files import FileRefused, save_npz

    obj = _demo_armature(tmp_path, demo_bvh, 1)
    data, _ = extract_dataset(bpy.context, obj)
    good = tmp_path / "good.npz"
    data.save(good)
    raw = good.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(FileRefused, match="truncated or corrupt"):
        Dataset.load(cut)
    wrong_kind = tmp_path / "kind.npz"
    save_npz(wrong_kind, data.arrays, dict(data.meta, kind="neural_ik.model"))
    with pytest.raises(FileRefused, match="'neural_ik.model' file, expected 'neural_ik.dataset'"):
        Dataset.load(wrong_kind)
    old = tmp_path / "old.npz"
    save_npz(old, data.arrays, dict(data.meta, layout_version=0))
    with pytest.raises(FileRefused, match="layout version 0"):
        Dataset.load(old)
    bad_shape = tmp_path / "shape.npz"
    save_npz(bad_shape, dict(data.arrays, rotations=data.rotations[:, :20]), data.meta)
    with pytest.raises(FileRefused, match="rotations has shape"):
        Dataset.load(bad_shape)
    not_finite = tmp_path / "nan.npz"
    inputs = data.inputs.copy()
    inputs[3, 7] = np.nan
    save_npz(not_finite, dict(data.arrays, inputs=inputs), data.meta)
    with pytest.raises(FileRefused, match="inputs holds non-finite"):
        Dataset.load(not_finite)
    mask = tmp_path / "mask.npz"
    flipped = np.asarray(data.arrays["role_mask"]).copy()
    flipped[5] = not flipped[5]                     # a role the skeleton maps said unmapped (or the reverse)
    save_npz(mask, dict(data.arrays, role_mask=flipped), data.meta)
    with pytest.raises(FileRefused, match="role_mask does not match"):
        Dataset.load(mask)
    assert zipfile.is_zipfile(good)


def test_extract_bad_input_gives_plain_messages_and_no_file(demo_bvh, empty_scene, tmp_path):
    import bpy

    out = tmp_path / "never.npz"
    # no armature at all: the operator cannot run, and says why
    with pytest.raises(RuntimeError, match="Select an armature"):
        bpy.ops.neural_ik.extract(filepath=str(out))
    # an armature without any action
    bpy.ops.object.armature_add()
    with pytest.raises(RuntimeError, match="no actions to learn from"):
        bpy.ops.neural_ik.extract(filepath=str(out))
    assert not out.exists()

    obj = _demo_armature(tmp_path, demo_bvh, 1)
    # an unwritable path: a folder that does not exist, and a path below a regular file
    for target in (tmp_path / "missing" / "set.npz", tmp_path / "file.txt" / "set.npz"):
        (tmp_path / "file.txt").write_text("x")
        with pytest.raises(RuntimeError, match="cannot write"):
            bpy.ops.neural_ik.extract(filepath=str(target))
        assert not target.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]
    # an action that animates none of the mapped bones is skipped with a note; the rest is extracted
    other = bpy.data.objects.new("other", None)
    from neural_ik.blender.rig import action_layouts

    stray, _slot, curves = action_layouts.new_action(other, "stray-walk")   # an OBJECT slot for "other" (4.2: the action)
    stray.use_fake_user = True
    bpy.data.objects.remove(other)
    fc = curves.fcurves.new('pose.bones["Nope"].location', index=0)
    fc.keyframe_points.insert(1, 0.0)
    fc.keyframe_points.insert(9, 1.0)
    from neural_ik.blender.workflows.extract import extract_dataset

    data, notes = extract_dataset(bpy.context, obj)
    assert list(data.action_names) == [os.path.splitext(demo_bvh.files[0])[0]]
    assert any("stray-walk" in n and "none of the mapped bones" in n for n in notes)
    assert bpy.ops.neural_ik.extract(filepath=str(out)) == {"FINISHED"}
    assert out.exists()
    # an armature whose only actions animate other bones: nothing to extract
    for action in list(bpy.data.actions):
        if action.name != "stray-walk":
            if obj.animation_data:
                obj.animation_data.action = None
            bpy.data.actions.remove(action)
    out2 = tmp_path / "none.npz"
    with pytest.raises(RuntimeError, match="no action animates the mapped bones"):
        bpy.ops.neural_ik.extract(filepath=str(out2))
    assert not out2.exists()
    # unmapped essentials
    use_map(obj, dict(demo_bvh.bone_map, LeftHand="", RightFoot=""))
    with pytest.raises(RuntimeError, match="lacks the essential roles LeftHand, RightFoot"):
        bpy.ops.neural_ik.extract(filepath=str(out2))


def test_import_folder_bad_input(demo_bvh, empty_scene, tmp_path):
    import bpy

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RuntimeError, match="holds no .bvh files"):
        _import(empty)
    with pytest.raises(RuntimeError, match="does not exist"):
        _import(tmp_path / "nowhere")
    assert len(bpy.data.objects) == 0

    folder = gather(tmp_path, demo_bvh.folder, demo_bvh.files[:2], "mixed")
    (folder / "zz_other.bvh").write_text(OTHER_SKELETON)      # another skeleton
    (folder / "notes.bvh").write_text("this is not motion capture\n")
    (folder / "a_binary.bvh").write_bytes(bytes(range(256)) * 4)
    text = open(demo_bvh.path(demo_bvh.files[2]), encoding="utf-8").read()
    (folder / "cut.bvh").write_text(text[: int(len(text) * 0.7)])
    (folder / "cut_header.bvh").write_text(text[: text.index("MOTION") // 2])
    objects_before = len(bpy.data.objects)
    assert _import(folder) == {"FINISHED"}
    arm = [o for o in bpy.data.objects if o.type == "ARMATURE"]
    assert len(arm) == 1 and len(bpy.data.objects) == objects_before + 1     # the temporary imports are gone
    assert len(bpy.data.armatures) == 1
    assert sorted(a.name for a in bpy.data.actions) == sorted(os.path.splitext(f)[0] for f in demo_bvh.files[:2])
    assert all(a.use_fake_user for a in bpy.data.actions)
    assert bpy.context.scene.neural_ik.armature == arm[0]

    from neural_ik.blender.workflows.bvh_import import import_bvh_files

    for o in list(bpy.data.objects):
        bpy.data.objects.remove(o)
    _, imported, skipped = import_bvh_files(bpy.context, str(folder), 0.01)
    reasons = dict(skipped)
    assert "skeleton" in reasons["zz_other.bvh"]            # a different skeleton (no roles to map)
    assert "not a BVH file" in reasons["notes.bvh"] and "not" in reasons["a_binary.bvh"]
    assert "truncated" in reasons["cut.bvh"] and "truncated" in reasons["cut_header.bvh"]
    assert len(imported) == 2

    only_bad = tmp_path / "only_bad"
    only_bad.mkdir()
    (only_bad / "x.bvh").write_text("HIERARCHY\nROOT")
    with pytest.raises(RuntimeError, match="no file .* could be imported: x.bvh is truncated"):
        _import(only_bad)
