"""Bake, Export and Load Model as operators on the demo rig: a new action that reproduces its source, nothing else
touched; model files refused for another rig without changing the armature."""

import numpy as np
import pytest
from live_helpers import assign_action, demo_armature, humanoid_skeleton, linear_model_for, random_model

from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES

EFF = list(EFFECTOR_ROLES)


@pytest.fixture
def demo(empty_scene):
    import bpy

    from neural_ik.blender import models, pose_read, rig_model
    from neural_ik.properties import get_bone_map

    obj = demo_armature()
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    names = sorted(a.name for a in bpy.data.actions)
    train = [pose_read.read_action(rig, obj, bpy.data.actions[n]) for i, n in enumerate(names) if i % 4 != 3]
    model = linear_model_for(rig.skeleton, train)
    models.loaded_models[obj.name] = ("", model, None)
    held = [n for i, n in enumerate(names) if i % 4 == 3]
    yield obj, rig, model, held
    models.loaded_models.pop(obj.name, None)


def _fingerprints(bpy):
    """Every action's curves and keys, to show a bake changes nothing but the action it adds."""
    from neural_ik.blender import action_layouts

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

    from neural_ik.blender import pose_read

    obj, rig, model, held = demo
    source = bpy.data.actions[held[0]]
    assign_action(obj, source)
    before = _fingerprints(bpy)
    bpy.ops.neural_ik.bake(source_action=source.name, refine_iterations=4)
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


def test_bake_from_target_empties(demo):
    import bpy

    obj, rig, model, held = demo
    bpy.ops.neural_ik.create_targets()
    frame = bpy.context.scene.frame_current
    bpy.ops.neural_ik.bake(frame_start=1, frame_end=4, refine_iterations=2)
    action = obj.animation_data.action
    assert action.name == f"{obj.name}.nik"
    assert bpy.context.scene.frame_current == frame
    bpy.context.scene.frame_set(2)
    from neural_ik.blender import pose_read

    heads = pose_read.armature_pose_heads(obj, rig)
    target = obj.neural_ik.target_left_foot.matrix_world.translation
    world = np.array(obj.matrix_world) @ np.append(rig.basis.T @ heads[EFF[2]] / rig.scale, 1.0)
    assert np.linalg.norm(world[:3] - np.array(target)) < 1e-3


def test_export_and_load_model_operators(demo, tmp_path):
    import bpy

    from neural_ik.neural_network.model import checkpoint

    obj, rig, model, held = demo
    path = tmp_path / "demo.onnx"
    bpy.ops.neural_ik.export_onnx(filepath=str(path))
    assert path.exists() and (tmp_path / "demo.json").exists()
    bpy.ops.neural_ik.load_model(filepath=str(path))
    assert obj.neural_ik.model_path == str(path)
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
