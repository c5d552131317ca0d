"""Bake on the ground on a generated Rigify rig: a clip keyed on the IK controls, baked over a floor raised 10 cm,
keys the controls so that the evaluated DEF- bones stand 10 cm higher, exactly."""

import numpy as np
from rigify_helpers import RIGIFY_MAP, key_controls


def test_bake_on_a_raised_floor_lifts_the_deform_bones_of_a_control_rig(rigify_rig):
    import bpy
    from live_helpers import assign_action, linear_model_for

    from neural_ik.blender import models
    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES, ROLES

    obj = rigify_rig
    actions = [key_controls(obj, f"clip{k}", frames=16, seed=k) for k in range(3)]
    assign_action(obj, actions[0])
    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    rig = rig_model.read_rig(obj, RIGIFY_MAP)
    models.loaded_models[obj.name] = ("", linear_model_for(rig.skeleton, list(pose_read.read_actions(rig, obj, actions[:2]))),
                                      None)
    bones = [RIGIFY_MAP[ROLES[r]] for r in EFFECTOR_ROLES]
    frames = list(range(1, 17))

    def deform_heads(action):
        assign_action(obj, action)
        out = []
        for f in frames:
            bpy.context.scene.frame_set(f)
            out.append([np.array(obj.matrix_world @ obj.pose.bones[b].head) for b in bones])
        return np.array(out)

    source = actions[2]
    want = deform_heads(source)
    floor = bpy.data.meshes.new("Floor")
    floor.from_pydata([(-5, -5, 0.1), (5, -5, 0.1), (5, 5, 0.1), (-5, 5, 0.1)], [], [(0, 1, 2, 3)])
    ground = bpy.data.objects.new("Floor", floor)
    bpy.context.scene.collection.objects.link(ground)
    obj.neural_ik.ground_object = ground
    try:
        assert bpy.ops.neural_ik.bake(source_action=source.name, refine_iterations=4) == {"FINISHED"}
    finally:
        models.loaded_models.pop(obj.name, None)
    got = deform_heads(obj.animation_data.action)
    lifted = want + np.array([0.0, 0.0, 0.1])
    miss = np.linalg.norm(got - lifted, axis=-1)
    print(f"\nRigify on a floor 10 cm up: DEF- hands, feet, head {miss.max() * 1000:.3f} mm from the clip's + 10 cm")
    assert miss.max() < 1e-3


def test_run_ik_on_a_control_rig_playing_its_clip_stands_it_on_a_raised_floor(rigify_rig):
    """Run IK live on a generated Rigify rig whose clip keys the IK controls, a floor 10 cm up: each tick follows
    the scene's frame through the clip and writes the controls so that the evaluated DEF- hands, feet and head stand
    10 cm above the clip's (the body rises with the floor); Stop gives the rig its clip back."""
    import bpy
    from live_helpers import assign_action, linear_model_for

    from neural_ik.blender.live.tick import LiveTick
    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES, ROLES

    obj = rigify_rig
    actions = [key_controls(obj, f"live_clip{k}", frames=16, seed=10 + k) for k in range(3)]
    assign_action(obj, actions[0])
    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    rig = rig_model.read_rig(obj, RIGIFY_MAP)
    model = linear_model_for(rig.skeleton, list(pose_read.read_actions(rig, obj, actions[:2])))
    bones = [RIGIFY_MAP[ROLES[r]] for r in EFFECTOR_ROLES]
    frames = list(range(1, 17))
    source = actions[2]
    assign_action(obj, source)
    want = []
    for f in frames:
        bpy.context.scene.frame_set(f)
        want.append([np.array(obj.matrix_world @ obj.pose.bones[b].head) for b in bones])
    floor = bpy.data.meshes.new("Live Floor")
    floor.from_pydata([(-5, -5, 0.1), (5, -5, 0.1), (5, 5, 0.1), (-5, 5, 0.1)], [], [(0, 1, 2, 3)])
    ground = bpy.data.objects.new("Live Floor", floor)
    bpy.context.scene.collection.objects.link(ground)
    obj.neural_ik.ground_object = ground
    obj.neural_ik.refine_iterations = 4
    tick = LiveTick([(obj, model, None)])
    tick.start()
    got = []
    try:
        for f in frames:
            bpy.context.scene.frame_set(f)
            tick.tick(bpy.context.scene)
            bpy.context.view_layer.update()
            got.append([np.array(obj.matrix_world @ obj.pose.bones[b].head) for b in bones])
    finally:
        tick.stop()
        obj.neural_ik.ground_object = None
        bpy.data.objects.remove(ground)
    miss = np.linalg.norm(np.array(got) - (np.array(want) + np.array([0.0, 0.0, 0.1])), axis=-1)
    print(f"\nRigify live on a floor 10 cm up: DEF- hands, feet, head {miss.max() * 1000:.3f} mm from the clip's + 10 cm")
    assert miss.max() < 1e-3
    assert obj.animation_data.action == source
