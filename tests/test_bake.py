"""Bake, Export and Load Model as operators on the demo rig: a new action that reproduces its source, nothing else
touched; model files refused for another rig without changing the armature."""

import numpy as np
import pytest
from live_helpers import (
    assign_action,
    demo_armature,
    drive_with,
    humanoid_skeleton,
    linear_model_for,
    place_targets,
    random_model,
    runs,
    sample_inputs,
)

from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES

EFF = list(EFFECTOR_ROLES)


@pytest.fixture
def demo(empty_scene):
    """The demo rig driven by a linear model fitted to three quarters of its clips (the fourth quarter is held out)."""
    import bpy

    from neural_ik.blender import models
    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.properties import get_bone_map

    obj = demo_armature()
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    names = sorted(a.name for a in bpy.data.actions)
    train = [pose_read.read_action(rig, obj, bpy.data.actions[n]) for i, n in enumerate(names) if i % 4 != 3]
    model = linear_model_for(rig.skeleton, train)
    drive_with(obj, model)
    held = [n for i, n in enumerate(names) if i % 4 == 3]
    assert not set(held) & {s.name for s in train}
    yield obj, rig, model, held
    models.loaded_models.pop(obj.name, None)


def _fingerprints(bpy):
    """Every action's curves and keys, to show a bake changes nothing but the action it adds."""
    from neural_ik.blender.rig import action_layouts

    out = {}
    for action in bpy.data.actions:
        keys = []
        for fc in action_layouts.all_action_fcurves(action):
            co = np.empty(2 * len(fc.keyframe_points), np.float32)
            fc.keyframe_points.foreach_get("co", co)
            keys.append((fc.data_path, fc.array_index, co.tobytes()))
        out[action.name] = sorted(keys)
    return out


def test_bake_reproduces_a_held_out_action(demo):
    import bpy

    from neural_ik.blender.rig import pose_read

    obj, rig, model, held = demo
    source = bpy.data.actions[held[0]]
    assign_action(obj, source)
    before = _fingerprints(bpy)
    bpy.ops.neural_ik.bake(source_action=source.name, refine_iterations=4)
    assert runs(obj, model)                    # the model fitted here, not the shipped one
    baked = obj.animation_data.action
    assert baked.name == f"{source.name}.nik"
    after = _fingerprints(bpy)
    assert set(after) - set(before) == {baked.name}
    assert all(after[name] == keys for name, keys in before.items())
    reference = pose_read.read_action(rig, obj, source)
    result = pose_read.read_action(rig, obj, baked)
    np.testing.assert_array_equal(result.frames, reference.frames)
    miss = np.linalg.norm(result.positions[:, EFF] - reference.positions[:, EFF], axis=-1)
    mask = rig.role_mask
    mpjpe = np.linalg.norm(result.positions[:, mask] - reference.positions[:, mask], axis=-1).mean()
    print(f"\nbaked {source.name}: effector error mean {100 * miss.mean():.3f} cm max {100 * miss.max():.3f} cm, "
          f"MPJPE {100 * mpjpe:.2f} cm")
    assert np.max(np.abs(result.hips_position - reference.hips_position)) < 1e-5
    assert miss.max() < 2e-3 and mpjpe < 0.02
    # once more: Blender's own numbering, the first bake left alone
    first = _fingerprints(bpy)[baked.name]
    bpy.ops.neural_ik.bake(source_action=source.name, refine_iterations=0)
    assert obj.animation_data.action.name == f"{source.name}.nik.001"
    assert _fingerprints(bpy)[baked.name] == first


def _key_targets(obj, rig, sample, rows):
    """Create the six target empties and key them on frames 1, 2, ... at the given rows of a character-space
    ActionSample (location and rotation keys on every frame: they move, as a user's animated targets do)."""
    import bpy

    from neural_ik.blender.live.tick import targets_of

    bpy.ops.neural_ik.create_targets()
    for frame, row in enumerate(rows, start=1):
        place_targets(obj, rig, sample, row)
        for target in targets_of(obj):
            target.keyframe_insert("location", frame=frame)
            target.keyframe_insert("rotation_euler", frame=frame)
    return len(rows)


def _targets_in_character_space(obj, rig):
    """(6, 3) positions of the root and effector empties as Blender evaluates them now, in character space (metres)."""
    from neural_ik.blender.live.tick import targets_of

    to_object = np.linalg.inv(np.array(obj.matrix_world))
    return np.array([rig.scale * rig.basis @ (to_object @ np.array(t.matrix_world))[:3, 3] for t in targets_of(obj)])


@pytest.fixture
def keyed_targets(demo):
    """The demo with its six targets keyed along a held-out clip: (obj, rig, model, frames)."""
    import bpy

    from neural_ik.blender.rig import pose_read

    obj, rig, model, held = demo
    sample = pose_read.read_action(rig, obj, bpy.data.actions[held[1]])
    frames = _key_targets(obj, rig, sample, range(0, 36, 3))
    return obj, rig, model, frames


def test_bake_from_animated_target_empties_lands_every_frame(keyed_targets):
    """Targets keyed along a held-out clip: every baked frame, played back and read from Blender's evaluated pose,
    has its hips on the root target and its five effectors within 1 mm of their targets at that frame."""
    import bpy

    from neural_ik.blender.rig import pose_read

    obj, rig, model, frames = keyed_targets
    scene = bpy.context.scene
    scene.frame_set(5)
    assert bpy.ops.neural_ik.bake(frame_start=1, frame_end=frames, refine_iterations=4) == {"FINISHED"}
    assert runs(obj, model)
    action = obj.animation_data.action
    assert action.name == f"{obj.name}.nik" and scene.frame_current == 5
    assert tuple(action.frame_range) == (1, frames)
    miss, hips, travel = [], [], []
    for frame in range(1, frames + 1):
        scene.frame_set(frame)
        heads = pose_read.armature_pose_heads(obj, rig)
        targets = _targets_in_character_space(obj, rig)
        miss.append(np.linalg.norm(heads[EFF] - targets[1:], axis=-1))
        hips.append(np.linalg.norm(heads[0] - targets[0]))
        travel.append(targets[1:])
    miss = np.array(miss)
    print(f"\nbaked from keyed empties: {frames} frames, effector miss max {1000 * miss.max():.3f} mm")
    assert np.ptp(np.array(travel), axis=0).max() > 0.05         # the targets did move over the range
    assert max(hips) < 1e-4
    assert miss.max() < 1e-3


def test_bake_from_empties_solves_with_the_task_and_contacts_of_the_panel(keyed_targets):
    """Without refinement a baked frame is the network's pose for its inputs: with the armature's Task and Left/Right
    Contact settings, the baked rotations are what the model gives for exactly those settings, and other settings
    give another pose (so the comparison would see settings that did not arrive)."""
    import bpy

    from neural_ik.blender.rig import pose_read
    from neural_ik.blender.workflows.bake import bake_targets_from_empties
    from neural_ik.neural_network.runtime.solver import Solver
    from neural_ik.neural_network.skeleton.roles import TASKS

    obj, rig, model, frames = keyed_targets
    _frames, targets = bake_targets_from_empties(bpy.context, obj, rig, 1, frames)
    links = pose_read.current_links(obj, rig)
    mapped = np.where(rig.role_mask)[0][1:]                        # the hips are the root target's
    baked = {}
    for task, left, right in (("IDLE", True, True), ("LOCOMOTION", False, True), ("CROUCH", True, False)):
        settings = obj.neural_ik
        settings.task, settings.contact_left, settings.contact_right = task, left, right
        assert bpy.ops.neural_ik.bake(frame_start=1, frame_end=frames, refine_iterations=0) == {"FINISHED"}
        got = pose_read.read_action(rig, obj, obj.animation_data.action).local_rotations[:, mapped]
        solver = Solver(model, None, characters=frames, links=links)
        expected = solver.solve(targets, 0.0, np.array([[left, right]], np.float64),
                                np.full(frames, TASKS.index(task.lower())), np.arange(frames) / frames,
                                refine_iterations=0, dt=1 / 30).local[:, mapped]
        np.testing.assert_allclose(got, expected, atol=1e-4, err_msg=task)
        baked[task] = got
    assert np.abs(baked["IDLE"] - baked["LOCOMOTION"]).max() > 1e-2
    assert np.abs(baked["IDLE"] - baked["CROUCH"]).max() > 1e-2


def test_export_and_load_model_operators(demo, tmp_path):
    """Export ONNX writes the armature's own model: onnxruntime gives the NumPy model's outputs on the inputs of
    held-out clips, and the JSON sidecar and the file's metadata describe that model. Load Model takes it back."""
    import json

    import bpy
    import onnx
    import onnxruntime as ort

    from neural_ik.blender.models import model_of
    from neural_ik.blender.rig import pose_read
    from neural_ik.neural_network.model import checkpoint
    from neural_ik.neural_network.runtime import onnx_export

    obj, rig, model, held = demo
    path = tmp_path / "demo.onnx"
    assert bpy.ops.neural_ik.export_onnx(filepath=str(path)) == {"FINISHED"}
    assert runs(obj, model)
    x = np.concatenate([sample_inputs(model.feature_spec, rig.skeleton, pose_read.read_action(
        rig, obj, bpy.data.actions[name])) for name in held[:3]]).astype(np.float32)
    (out,) = ort.InferenceSession(str(path)).run(None, {"inputs": x})
    expected = model.predict_clamped(x)
    assert np.max(np.abs(out - expected)) <= 1e-5 * max(1.0, np.abs(expected).max())
    with open(tmp_path / "demo.json") as handle:
        sidecar = json.load(handle)
    stored = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    described = json.loads(json.dumps(onnx_export.metadata(model)))
    assert sidecar == described
    assert {key: value if isinstance(described.get(key), str) else json.loads(value)
            for key, value in stored.items()} == described
    assert sidecar["neural_ik.rig_fingerprint"] == rig.skeleton.fingerprint()
    np.testing.assert_array_equal(sidecar["neural_ik.mean_pose"], np.asarray(model.mean_pose, np.float64))
    np.testing.assert_array_equal(sidecar["neural_ik.limits"]["high"], np.asarray(model.limit_high, np.float64))
    assert sidecar["neural_ik.layer_sizes"] == list(model.layer_sizes)
    bpy.ops.neural_ik.load_model(filepath=str(path))
    assert obj.neural_ik.model_path == str(path)
    np.testing.assert_allclose(model_of(obj)[0].predict_clamped(x), expected, atol=1e-5)
    foreign = tmp_path / "other.npz"
    checkpoint.save_model(foreign, random_model(humanoid_skeleton()))
    for bad, words in ((foreign, "another rig"), (tmp_path / "missing.onnx", "does not exist"), (tmp_path, "folder")):
        with pytest.raises(RuntimeError, match=words):
            bpy.ops.neural_ik.load_model(filepath=str(bad))
        assert obj.neural_ik.model_path == str(path)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(path.read_bytes()[:300])
    with pytest.raises(RuntimeError, match="truncated"):
        bpy.ops.neural_ik.load_model(filepath=str(truncated))
    assert obj.neural_ik.model_path == str(path)
