"""Bake over generated ground on the demo rig: a walk and a run over a 15 degree slope, 15 cm steps and +-5 cm bumps,
measured from Blender's evaluated pose: soles on the surface, turned to its normal, joint limits, no pops."""

import numpy as np
import pytest
import terrain
from live_helpers import assign_action, demo_armature

from neural_ik.neural_network.skeleton.roles import FOOT_ROLES, ROLE_INDEX

TOES = [ROLE_INDEX["LeftToeBase"], ROLE_INDEX["RightToeBase"]]
FEET = list(FOOT_ROLES)


@pytest.fixture(scope="module")
def demo_rig(addon):
    import bpy

    from neural_ik.blender import models
    from neural_ik.blender.rig import rig_model
    from neural_ik.properties import get_bone_map

    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    obj = demo_armature()
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    model, _data = models.model_of(obj, rig)
    yield obj, rig, model


def _evaluated(obj, rig, action, frames):
    """(heads (F, 23, 3), rotations (F, 23, 3, 3), local rotations (F, 23, 3, 3)) of the mapped roles from Blender's
    evaluated pose, character space."""
    import bpy

    from neural_ik.blender.rig import pose_read

    assign_action(obj, action)
    heads, rotations, local = [], [], []
    for f in frames:
        bpy.context.scene.frame_set(int(f))
        heads.append(pose_read.armature_pose_heads(obj, rig))
        rotations.append(pose_read.armature_pose_rotations(obj, rig))
        local.append(np.array([np.array(obj.pose.bones[rig.bone_names[b]].matrix_basis.to_3x3()) if b >= 0
                               else np.eye(3) for b in rig.role_bones]))
    return np.array(heads), np.array(rotations), np.array(local)


def _largest_turn(local, mask):
    """The largest change of any mapped bone's local rotation between two frames (degrees)."""
    rel = np.swapaxes(local[:-1], -1, -2) @ local[1:]
    cos = np.clip((np.trace(rel, axis1=-2, axis2=-1) - 1) / 2, -1, 1)
    return float(np.degrees(np.arccos(cos))[:, mask].max())


@pytest.mark.parametrize("clip", ["walk_normal_03", "run_steady_02"])
@pytest.mark.parametrize("ground", ["slope", "steps", "bumps"])
def test_bake_fits_a_clip_to_the_ground(demo_rig, clip, ground):
    import bpy

    from neural_ik.blender.live.ground import Ground
    from neural_ik.neural_network.ik import foot_lock
    from neural_ik.neural_network.ik import terrain as terrain_math
    from neural_ik.neural_network.report import metrics

    obj, rig, model = demo_rig
    source = bpy.data.actions[clip]
    start, end = (int(f) for f in source.frame_range)
    frames = np.arange(start, end + 1)
    src_heads, src_rot, src_local = _evaluated(obj, rig, source, frames)
    travel = src_heads[-1, 0] - src_heads[0, 0]
    mesh = getattr(terrain, ground)(travel)
    try:
        obj.neural_ik.ground_object = mesh
        assign_action(obj, source)
        assert bpy.ops.neural_ik.bake(source_action=source.name, refine_iterations=4) == {"FINISHED"}
        baked = obj.animation_data.action
        heads, rot, local = _evaluated(obj, rig, baked, frames)
        fps = bpy.context.scene.render.fps
        planted = foot_lock.planted_feet(src_heads[:, FEET], fps, rig.skeleton.height)
        cast = Ground([mesh], bpy.context.evaluated_depsgraph_get())
        surface = {}
        for name, joints in (("ankle", FEET), ("ball", TOES)):
            h, n = cast.cast(heads[:, joints].reshape(-1, 3), 2.0)
            surface[name] = (h.reshape(-1, 2), n.reshape(-1, 2, 3))
        # in contact frames the sole rests on the surface: of the ankle and the ball, the one nearer the ground is as
        # high above it as in the clip above its flat ground (within 1 cm), and neither is more than 5 mm lower
        clearance = np.stack([heads[:, FEET, 2] - surface["ankle"][0] - src_heads[:, FEET, 2],
                              heads[:, TOES, 2] - surface["ball"][0] - src_heads[:, TOES, 2]])
        on = np.abs(clearance.min(axis=0))[planted]
        sink = -clearance.min(axis=0)[planted]
        # the sole's normal: the foot's axis that points up while the clip's foot is flat (ankle and ball both at
        # their lowest), against the ground's under the sole (its pitch from the ground under ankle and ball)
        flat = planted & (src_heads[:, FEET, 2] - src_heads[:, FEET, 2].min(0) < 0.02) & (
            src_heads[:, TOES, 2] - src_heads[:, TOES, 2].min(0) < 0.02)
        up_local = np.einsum("fkji,j->fki", src_rot[:, FEET], np.array([0.0, 0.0, 1.0]))
        sole_axis = np.array([up_local[flat[:, k], k].mean(0) for k in range(2)])
        sole_axis /= np.linalg.norm(sole_axis, axis=-1, keepdims=True)
        sole = np.einsum("fkij,kj->fki", rot[:, FEET], sole_axis)
        ankle_hits = np.concatenate([heads[:, FEET, :2], surface["ankle"][0][..., None]], axis=-1)
        ball_hits = np.concatenate([heads[:, TOES, :2], surface["ball"][0][..., None]], axis=-1)
        normal = terrain_math.support(ankle_hits, ball_hits, surface["ankle"][1], surface["ball"][1])[1]
        tilt = np.degrees(np.arccos(np.clip(np.sum(sole * normal, -1), -1, 1)))[flat]
        roles = rig.role_mask.copy()
        roles[0] = False                                          # the hips are given
        # joint limits hold: no joint further outside the model's limits than the clip itself goes
        excess = (metrics.limit_excess(local, model.mean_pose, model.limit_low, model.limit_high).max(axis=(0, 2))
                  - metrics.limit_excess(src_local, model.mean_pose, model.limit_low, model.limit_high).max(axis=(0, 2))
                  )[roles]
        turn, src_turn = _largest_turn(local, rig.role_mask), _largest_turn(src_local, rig.role_mask)
        print(f"\n{clip} on {ground}: ankle off the surface (contacts) max {on.max() * 100:.2f} cm, sink max "
              f"{sink.max() * 1000:.1f} mm, sole tilt max {tilt.max():.1f} deg p95 {np.percentile(tilt, 95):.1f} "
              f"({flat.sum()} flat frames), "
              f"limit excess max {excess.max():.2f} deg, largest turn {turn:.1f} deg (clip {src_turn:.1f})")
        assert on.max() < 0.01
        assert sink.max() < 0.005
        assert np.percentile(tilt, 95) < 5.0
        assert excess.max() < 0.5
        assert turn <= 1.5 * src_turn
    finally:
        obj.neural_ik.ground_object = None
        bpy.data.objects.remove(mesh)


def test_a_ground_far_below_the_feet_is_refused_in_one_line(demo_rig):
    import bpy

    obj, _rig, _model = demo_rig
    mesh = terrain.slope([0.0, -1.0, 0.0], degrees=0.0)
    mesh.location.z = -10.0
    actions = set(bpy.data.actions.keys())
    try:
        obj.neural_ik.ground_object = mesh
        with pytest.raises(RuntimeError, match=r"no ground under the (left|right) foot at frame \d+: GroundSlope is not "
                                               r"within [\d.]+ m below it"):
            bpy.ops.neural_ik.bake(source_action="walk_normal_03")
        assert set(bpy.data.actions.keys()) == actions                 # nothing made
    finally:
        obj.neural_ik.ground_object = None
        bpy.data.objects.remove(mesh)


def test_a_ground_that_is_not_a_mesh_is_refused_in_one_line(demo_rig):
    """The panel's picker offers meshes only; Python can set anything, and Bake says what is wrong."""
    import bpy

    obj, _rig, _model = demo_rig
    empty = bpy.data.objects.new("NotGround", None)
    bpy.context.scene.collection.objects.link(empty)
    actions = set(bpy.data.actions.keys())
    try:
        obj.neural_ik.ground_object = empty
        with pytest.raises(RuntimeError, match=r"the ground 'NotGround' is not a mesh \(empty\)"):
            bpy.ops.neural_ik.bake(source_action="walk_normal_03")
        assert set(bpy.data.actions.keys()) == actions
    finally:
        obj.neural_ik.ground_object = None
        bpy.data.objects.remove(empty)
