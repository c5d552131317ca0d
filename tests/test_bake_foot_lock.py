"""Bake with Lock Feet on the demo rig: a walk made to slide (its hips travel 6 % farther than its steps, as a clip
retargeted onto longer legs does) is baked with and without Lock Feet, and measured from Blender's evaluated pose."""

import numpy as np
import pytest
from live_helpers import assign_action, demo_armature, drive_with, evaluated_effectors, linear_model_for, make_sliding, runs

CM = 100.0


@pytest.fixture
def sliding_walk(empty_scene):
    import bpy

    from neural_ik.blender import models
    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.properties import get_bone_map

    obj = demo_armature()
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    names = sorted(a.name for a in bpy.data.actions)
    walk = next(n for n in names if "walk" in n)
    train = [pose_read.read_action(rig, obj, bpy.data.actions[n]) for n in names if n != walk]
    model = linear_model_for(rig.skeleton, train)
    drive_with(obj, model)
    assert runs(obj, model)
    source = bpy.data.actions[walk].copy()
    source.name = "sliding_walk"
    make_sliding(rig, source)
    yield obj, rig, source
    models.loaded_models.pop(obj.name, None)


def _skate(feet, contacts):
    """Mean horizontal speed (cm per frame) of the feet through their contacts."""
    step = np.linalg.norm(np.diff(feet[..., :2], axis=0), axis=-1) * CM
    both = (contacts[1:] > 0.5) & (contacts[:-1] > 0.5)
    return float(step[both].mean())


def test_lock_feet_stops_the_sliding_and_leaves_the_rest_on_the_clip(sliding_walk):
    import bpy

    from neural_ik.blender.rig import pose_read
    from neural_ik.neural_network.data.features import detect_contacts
    from neural_ik.neural_network.ik import foot_lock

    obj, rig, source = sliding_walk
    start, end = (int(f) for f in source.frame_range)
    frames = list(range(start, end + 1))
    clip = evaluated_effectors(obj, rig, source, frames)                # (F, 5, 3): hands, feet, head
    fps = bpy.context.scene.render.fps
    contacts = detect_contacts(clip[:, 2:4], 0.0, fps, rig.skeleton.height)
    planted = foot_lock.planted_feet(clip[:, 2:4], fps, rig.skeleton.height)

    assign_action(obj, source)
    assert bpy.ops.neural_ik.bake(source_action=source.name, refine_iterations=4) == {"FINISHED"}
    plain = evaluated_effectors(obj, rig, obj.animation_data.action, frames)
    assign_action(obj, source)
    assert bpy.ops.neural_ik.bake(source_action=source.name, refine_iterations=4, lock_feet=True) == {"FINISHED"}
    locked_action = obj.animation_data.action
    locked = evaluated_effectors(obj, rig, locked_action, frames)

    source_skate, plain_skate = _skate(clip[:, 2:4], contacts), _skate(plain[:, 2:4], contacts)
    locked_skate = _skate(locked[:, 2:4], contacts)
    print(f"\nskate cm/frame: clip {source_skate:.3f}, baked {plain_skate:.3f}, baked with Lock Feet {locked_skate:.4f}")
    assert source_skate > 0.3                                          # the clip does slide
    assert abs(plain_skate - source_skate) < 0.05 * source_skate       # a plain bake slides as the clip does
    assert locked_skate <= 0.1 * source_skate
    # where a leg cannot reach its locked foot the body comes down (hips, hands and head alike), smoothly
    drop = pose_read.read_action(rig, obj, source).hips_position[:, 2] - pose_read.read_action(
        rig, obj, locked_action).hips_position[:, 2]
    print(f"hips lowered up to {drop.max() * CM:.2f} cm, in {np.mean(drop > 1e-4) * 100:.0f} % of frames")
    assert drop.min() > -1e-6 and np.abs(np.diff(drop, 2)).max() < 0.05 * max(drop.max(), 1e-3)
    lowered = clip.copy()
    lowered[..., 2] -= drop[:, None]
    # hands and head stay on the clip's (lowered with the hips); so do the feet away from their contacts and the
    # fade after each (not lowered)
    np.testing.assert_array_less(np.linalg.norm(locked[:, [0, 1, 4]] - lowered[:, [0, 1, 4]], axis=-1), 1e-3)
    fade = np.zeros_like(planted)
    for foot in range(2):
        for _start, e in foot_lock._spans(planted[:, foot]):
            fade[e:e + 5, foot] = True
    free = ~planted & ~fade
    assert free.sum() > 0.15 * free.size
    assert np.linalg.norm(locked[:, 2:4] - clip[:, 2:4], axis=-1)[free].max() < 1e-3
    # the feet keep the clip's height
    assert np.abs(locked[:, 2:4, 2] - clip[:, 2:4, 2]).max() < 1e-3
