"""The reach sweep (report/reach_sweep.py): equal steps, the distance range asked for, every region around the
shoulder visited, and the loop closing on itself."""

import numpy as np
import pytest

from neural_ik.neural_network.report.reach_sweep import lap_length, sweep_path


@pytest.mark.parametrize("outward", [(-1.0, 0.0, 0.0), (1.0, 0.0, 0.0)])
def test_sweep_visits_every_region_in_equal_steps(outward):
    shoulder, arm = np.array([0.2, 0.05, 1.4]), 0.55
    steps = int(lap_length(arm) / 0.0065) + 1
    path = sweep_path(shoulder, arm, steps, 0.0065, outward=outward)
    assert path.shape == (steps, 3)
    step = np.linalg.norm(np.diff(path, axis=0), axis=-1)
    assert step.min() > 0.0064 and step.max() <= 0.0065 + 1e-12
    distance = np.linalg.norm(path - shoulder, axis=-1) / arm
    assert distance.min() == pytest.approx(0.6, abs=1e-3) and distance.max() == pytest.approx(1.05, abs=1e-3)
    assert distance[0] == pytest.approx(0.9)
    direction = (path - shoulder) / (distance[:, None] * arm)
    forward, side, up = -direction[:, 1], direction[:, 0] * outward[0], direction[:, 2]
    regions = {"front": forward > 0.9, "side": side > 0.8, "overhead": up > 0.85, "low": up < -0.85,
               "across": side < -0.6, "behind": forward < -0.6}
    for name, where in regions.items():
        assert where.any(), name
    again = sweep_path(shoulder, arm, 2 * steps, 0.0065, outward=outward)     # past a lap: the loop again, no jump
    assert np.linalg.norm(np.diff(again, axis=0), axis=-1).max() <= 0.0065 + 1e-12


def test_sweep_refuses_empty_paths():
    with pytest.raises(ValueError):
        sweep_path(np.zeros(3), 0.5, 0, 0.01)


# ---- the refinement never pops (issue 23): a hand target swept around the shoulder, live ticks --------------------

def sweep_live(obj, rig, model, side, step=0.0065):
    """Live ticks (refinement 2) of the demo rig from the first frame of idle_stand_01 while the `side` hand's target
    ramps to the sweep's start and goes round one lap; read from Blender's evaluated pose after each tick. Returns
    (per step the largest turn of a mapped bone in degrees, its role, the hand's miss in metres, whether the target
    is within 98 % of the arm from the evaluated shoulder)."""
    import bpy
    from live_helpers import place_targets
    from mathutils import Matrix

    from neural_ik.blender.live.tick import LiveTick, targets_of
    from neural_ik.blender.rig import pose_read
    from neural_ik.neural_network.geometry.rotations import angle_between
    from neural_ik.neural_network.skeleton.roles import ROLE_INDEX

    bpy.context.view_layer.objects.active = obj
    bpy.ops.neural_ik.create_targets()
    sample = pose_read.read_action(rig, obj, bpy.data.actions["idle_stand_01"])
    obj.animation_data_clear()
    place_targets(obj, rig, sample, 0)
    obj.neural_ik.refine_iterations = 2
    upper, fore, hand = (ROLE_INDEX[f"{side}{n}"] for n in ("Arm", "ForeArm", "Hand"))
    target = targets_of(obj)[1 if side == "Left" else 2]
    to_world = np.array(obj.matrix_world) @ np.diag([1.0 / rig.scale] * 3 + [1.0])
    to_world[:3, :3] = to_world[:3, :3] @ rig.basis.T
    mapped = [j for j in range(1, len(rig.role_mask)) if rig.role_mask[j]]
    tick = LiveTick([(obj, model, None)])
    tick.start()
    scene = bpy.context.scene
    try:
        tick.tick(scene)
        bpy.context.view_layer.update()
        arm = float(np.linalg.norm(rig.skeleton.offsets[fore]) + np.linalg.norm(rig.skeleton.offsets[hand]))
        start = sample.positions[0, hand]
        shoulder = pose_read.armature_pose_heads(obj, rig)[upper]
        lap = sweep_path(shoulder, arm, int(lap_length(arm) / step) + 1, step,
                         outward=(1.0 if side == "Left" else -1.0, 0.0, 0.0))
        ramp = start + (lap[0] - start) * np.linspace(0, 1, int(np.linalg.norm(lap[0] - start) / step) + 2)[1:, None]
        turns, worst, miss, within, before = [], [], [], [], None
        for p in np.concatenate([ramp, lap]):
            m = np.array(target.matrix_world)
            m[:3, 3] = (to_world @ np.append(p, 1.0))[:3]
            target.matrix_world = Matrix(m.tolist())
            tick.tick(scene)
            bpy.context.view_layer.update()
            rotations = pose_read.armature_pose_matrices(obj, rig)[mapped, :3, :3]
            heads = pose_read.armature_pose_heads(obj, rig)
            miss.append(np.linalg.norm(heads[hand] - p))
            within.append(np.linalg.norm(p - heads[upper]) <= 0.98 * arm)
            if before is not None:
                turned = np.degrees(angle_between(before, rotations))
                turns.append(turned.max())
                worst.append(mapped[int(np.argmax(turned))])
            before = rotations
    finally:
        tick.stop()
    return np.array(turns), np.array(worst), np.array(miss), np.array(within)


@pytest.mark.slow
@pytest.mark.parametrize("side", ["Right", "Left"])
def test_a_hand_swept_round_the_shoulder_never_pops(empty_scene, side):
    """A deliberately poor model (a linear fit to the demo clips: their narrow motion, nothing of the space round the
    shoulder), so the refinement is what is tested: one lap of the sweep (front, side, overhead, behind, low, across;
    0.6-1.05 arm lengths, 0.65 cm a step), a live tick with refinement 2 each step. No step turns a mapped bone more
    than 15 degrees, and the hand lands within 1 mm wherever its target is within 98 % of the arm."""
    import bpy
    from live_helpers import demo_armature, linear_model_for

    from neural_ik.blender import models
    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.neural_network.skeleton.roles import ROLES
    from neural_ik.properties import get_bone_map

    obj = demo_armature()
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    model = linear_model_for(rig.skeleton, [pose_read.read_action(rig, obj, a) for a in bpy.data.actions])
    obj.neural_ik.model_path = ""
    models.loaded_models[obj.name] = ("", model, None)
    try:
        turns, worst, miss, within = sweep_live(obj, rig, model, side)
    finally:
        models.loaded_models.pop(obj.name, None)
    print(f"\n{side} hand, {len(miss)} steps: largest turn a step {turns.max():.1f} deg ({ROLES[worst[np.argmax(turns)]]}), "
          f"steps over 15 deg {int((turns > 15).sum())}; within 98 % of the arm {int(within.sum())} steps, hand miss "
          f"there at most {1000 * miss[within].max():.3f} mm")
    assert within.sum() > 300 and (~within).sum() > 100          # the lap goes both inside and beyond the reach
    assert turns.max() <= 15.0
    assert miss[within].max() < 1e-3
