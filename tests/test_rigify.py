"""Rigify, generated in the bpy wheel from Blender's human meta-rig (once per session, tests/conftest.py): auto-map,
and extraction reading Blender's evaluated pose of the DEF- bones (their keys live on controls)."""

import numpy as np
from rigify_helpers import RIGIFY_MAP, key_controls
from test_rig_io import state_hash


def _evaluated_heads(obj, frames, bones):
    """(F, B, 3) heads of `bones` from Blender's evaluated pose at each frame (the naive frame_set loop)."""
    import bpy

    scene = bpy.context.scene
    now = scene.frame_current
    out = np.empty((len(frames), len(bones), 3))
    for i, f in enumerate(frames):
        scene.frame_set(int(f))
        ev = obj.evaluated_get(bpy.context.evaluated_depsgraph_get())
        out[i] = [tuple(ev.pose.bones[b].head) for b in bones]
    scene.frame_set(now)
    return out


def test_auto_map_maps_the_deform_bones(rigify_rig):
    import bpy

    from neural_ik.blender.rig.bone_maps import bone_map_of

    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    assert bone_map_of(rigify_rig) == RIGIFY_MAP
    # its deform bones hang from ORG-/MCH- bones, not from each other: no problem for a driven rig (the panel lists
    # none, the report says why)
    from neural_ik.blender.rig.bone_maps import auto_map, driven_map_problems
    from neural_ik.panels.main import bone_map_problems

    result = auto_map(rigify_rig)
    assert any("outside its chain" in p for p in result.problems)
    problems, note = driven_map_problems(rigify_rig, result.mapping, result.problems)
    assert problems == [] and "evaluated pose" in note
    assert bone_map_problems(rigify_rig) == []


def test_extract_reads_the_evaluated_deform_bones_and_leaves_the_scene(rigify_rig):
    import bpy

    from neural_ik.blender.rig import rig_model
    from neural_ik.blender.rig.evaluated_pose import number_properties
    from neural_ik.blender.workflows.extract import extract_dataset
    from neural_ik.neural_network.geometry import kinematics
    from neural_ik.neural_network.skeleton.roles import ROLES

    obj = rigify_rig
    key_controls(obj, "sway", frames=12, seed=1)
    bpy.context.scene.frame_set(5)
    obj.pose.bones["upper_arm_parent.L"]["IK_FK"] = 0.25          # a switch the user left half-way
    before, switches = state_hash(obj), number_properties(obj)
    rig = rig_model.read_rig(obj, RIGIFY_MAP)
    assert rig.driven and "constraints" in rig.driven[0]
    dataset, notes = extract_dataset(bpy.context, obj, dict(RIGIFY_MAP))
    assert state_hash(obj) == before and number_properties(obj) == switches
    assert any("evaluated pose" in n for n in notes)
    assert dataset.meta["pose_source"].startswith("evaluated")
    assert list(dataset.action_names) == ["sway"] and len(dataset) == 12
    height = dataset.skeleton.height
    bones = [RIGIFY_MAP[r] for r in ROLES]
    expected = _evaluated_heads(obj, dataset.frame, bones) @ rig.basis.T * rig.scale
    assert np.max(np.abs(dataset.positions - expected)) < 1e-4 * height
    # the role chain's FK (the network's) reproduces them from the stored local rotations
    from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix

    pose = kinematics.forward(dataset.skeleton, axis_angle_to_matrix(dataset.rotations.astype(np.float64)),
                              dataset.hips_rotation.astype(np.float64), dataset.hips_position.astype(np.float64),
                              dataset.arrays.get("bridges"), dataset.arrays.get("offsets"))
    assert np.max(np.abs(pose.positions - expected)) < 1e-4 * height


def _set_limbs(obj, **values):
    """Set the limbs' switches (IK_FK, pole_vector) as a user does in Rigify's panel."""
    for bone in ("upper_arm_parent.L", "upper_arm_parent.R", "thigh_parent.L", "thigh_parent.R"):
        for key, value in values.items():
            obj.pose.bones[bone][key] = value


def test_bake_keys_both_chains_and_each_action_plays_right_in_any_order(rigify_rig):
    """Bake keys the FK and the IK controls, never a DEF- bone and never a switch: assigned after the user's clip or
    before it, the baked action gives the source's DEF- hands, feet and head whichever way the user sets the IK/FK
    switches (pole or none), and the clip (keyed on the IK controls, no switch) plays its own again: its hands and
    feet at once, its whole pose once the controls it does not key are cleared (Pose > Clear Transform: Blender
    leaves them where the last action put them)."""
    import bpy
    from live_helpers import assign_action, linear_model_for
    from rigify_helpers import rest_pose

    from neural_ik.blender import models
    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.blender.rig.action_layouts import all_action_fcurves
    from neural_ik.blender.rig.evaluated_pose import number_properties
    from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES, ROLES

    obj = rigify_rig
    actions = [key_controls(obj, f"clip{k}", frames=16, seed=k, amplitude=1.0 + 0.2 * k) for k in range(3)]
    source = actions[2]
    assign_action(obj, actions[0])
    bpy.context.scene.frame_set(3)
    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    rig = rig_model.read_rig(obj, RIGIFY_MAP)
    samples = list(pose_read.read_actions(rig, obj, actions[:2]))
    models.loaded_models[obj.name] = ("", linear_model_for(rig.skeleton, samples), None)
    frames = list(range(1, 17))
    every = [RIGIFY_MAP[r] for r in ROLES]
    effectors = [every.index(RIGIFY_MAP[ROLES[r]]) for r in EFFECTOR_ROLES]
    hands_feet = [every.index(RIGIFY_MAP[r]) for r in ("LeftHand", "RightHand", "LeftFoot", "RightFoot")]
    rest_pose(obj)
    assign_action(obj, source)
    clip = _evaluated_heads(obj, frames, every)         # the clip's own pose, with the file's switches: IK, no pole
    switches = number_properties(obj)
    try:
        assert bpy.ops.neural_ik.bake(source_action=source.name, refine_iterations=4) == {"FINISHED"}
    finally:
        models.loaded_models.pop(obj.name, None)
    baked = obj.animation_data.action
    assert baked.name == f"{source.name}.nik"
    assert number_properties(obj) == switches
    paths = [fc.data_path for fc in all_action_fcurves(baked)]
    keyed = {path.split('"')[1] for path in paths}
    assert not any(name.startswith("DEF-") for name in keyed)
    assert all(path.rsplit(".", 1)[-1] in ("location", "rotation_quaternion", "rotation_euler", "scale")
               for path in paths)                                                       # no switch
    assert {"torso", "hand_fk.L", "toe_fk.R", "hand_ik.L", "upper_arm_ik.R", "upper_arm_ik_target.L", "foot_ik.R",
            "thigh_ik.L", "thigh_ik_target.R", "toe_ik.L", "foot_heel_ik.R"} <= keyed      # both chains

    _set_limbs(obj, IK_FK=1.0)
    assign_action(obj, baked)
    fk = _evaluated_heads(obj, frames, every)           # the solved pose: the FK chain, as Bake checked it
    _set_limbs(obj, IK_FK=0.0)
    misses, inner = {}, {}
    # (what the user plays, the switches the user sets first (None: as they are), whether the pose is cleared
    # first), in an order that plays each after the other
    for label, action, ik_fk, pole, clear in (
            ("baked, IK", baked, 0.0, False, False), ("clip after baked", source, None, None, False),
            ("clip after baked, cleared", source, None, None, True), ("baked, FK", baked, 1.0, False, False),
            ("baked, IK with pole", baked, 0.0, True, False), ("baked, IK/FK 0.3", baked, 0.3, False, False),
            ("baked, IK again", baked, 0.0, False, False), ("clip again, cleared", source, None, None, True)):
        if ik_fk is not None:
            _set_limbs(obj, IK_FK=ik_fk, pole_vector=pole)
        set_now = number_properties(obj)
        assign_action(obj, action)
        if clear:
            rest_pose(obj)
        heads = _evaluated_heads(obj, frames, every)
        assert number_properties(obj) == set_now, label                 # playing it changed no switch
        if action is baked:
            misses[label] = float(np.max(np.linalg.norm(heads[:, effectors] - clip[:, effectors], axis=-1)))
            inner[label] = float(np.max(np.linalg.norm(heads - fk, axis=-1)))
        elif clear:
            misses[label] = float(np.max(np.linalg.norm(heads - clip, axis=-1)))
        else:
            misses[label] = float(np.max(np.linalg.norm(heads[:, hands_feet] - clip[:, hands_feet], axis=-1)))
    misses = {k: v * rig.scale for k, v in misses.items()}
    inner = {k: v * rig.scale for k, v in inner.items()}
    print("DEF- hands, feet and head vs the source's (mm; clip after baked: hands and feet; cleared: every head): "
          + ", ".join(f"{k} {1e3 * v:.3f}" for k, v in misses.items()))
    print("every DEF- head vs the FK chain's (mm): " + ", ".join(f"{k} {1e3 * v:.3f}" for k, v in inner.items()))
    assert max(misses.values()) < 1e-3, misses
    assert misses["clip after baked, cleared"] < 1e-6 and misses["clip again, cleared"] < 1e-6, misses
    # the IK chain's middle joints: on the solved ones with a pole; without one Blender's IK solver bends the chain in
    # the keyed plane and decides how far to stretch its two bones (about 1%)
    assert inner["baked, FK"] < 1e-6 and inner["baked, IK with pole"] < 1e-3, inner
    assert max(inner.values()) < 2e-2, inner


def _live_model(obj):
    """Three clips keyed on the controls, the rig auto-mapped, its samples, and a linear model of the first two loaded
    for the armature (live sessions find it there): (actions, RigModel, samples, model)."""
    import bpy
    from live_helpers import linear_model_for

    from neural_ik.blender import models
    from neural_ik.blender.rig import pose_read, rig_model

    actions = [key_controls(obj, f"clip{k}", frames=12, seed=k) for k in range(3)]
    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    rig = rig_model.read_rig(obj, RIGIFY_MAP)
    samples = list(pose_read.read_actions(rig, obj, actions))
    model = linear_model_for(rig.skeleton, samples[:2])
    models.loaded_models[obj.name] = ("", model, None)
    return actions, rig, samples, model


def test_run_ik_drives_the_controls_and_restores_switches_and_pose(rigify_rig):
    """Live IK on Rigify: the tick writes the controls (switches to FK while live) so that the evaluated DEF- hands,
    feet and head land on the targets; stopping puts back the switches, the pose and the action."""
    import bpy
    from live_helpers import assign_action, follow_empties, place_targets

    from neural_ik.blender import models
    from neural_ik.blender.live import session as live_session
    from neural_ik.blender.live.tick import LiveTick
    from neural_ik.blender.rig import pose_read
    from neural_ik.blender.rig.evaluated_pose import number_properties
    from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES

    obj = rigify_rig
    actions, rig, samples, model = _live_model(obj)
    try:
        assign_action(obj, actions[0])
        bpy.context.scene.frame_set(4)
        obj.pose.bones["thigh_parent.L"]["IK_FK"] = 0.3                  # a switch half-way, as a user may leave it
        assert bpy.ops.neural_ik.create_targets() == {"FINISHED"}
        follow_empties(obj)                                              # the empties drive, over the action
        before, switches = state_hash(obj), number_properties(obj)
        tick = LiveTick([(obj, model, None)])
        tick.start()
        assert obj.pose.bones["thigh_parent.L"]["IK_FK"] == 1.0           # FK while the solver drives the limbs
        obj.neural_ik.refine_iterations = 4
        misses = []
        for i in (2, 7, 11):
            place_targets(obj, rig, samples[2], i)
            tick.tick(bpy.context.scene)
            bpy.context.view_layer.update()
            heads = pose_read.armature_pose_heads(obj, rig)[list(EFFECTOR_ROLES)]
            misses.append(np.linalg.norm(heads - samples[2].positions[i, list(EFFECTOR_ROLES)], axis=-1).max())
        tick.stop()
        assert state_hash(obj) == before and number_properties(obj) == switches
        assert max(misses) < 1e-3, misses
    finally:
        models.loaded_models.pop(obj.name, None)
        live_session.stop_all("")


def _solved_pose_error(obj, rig, q, hips, roles):
    """(largest head distance over the rig height at `roles` (mask), largest hand/foot/head orientation difference in
    radians) between Blender's evaluated DEF- bones and the FK of local quaternions q (23, 4) from hips (4, 4)."""
    from neural_ik.blender.rig import pose_read
    from neural_ik.neural_network.geometry import kinematics
    from neural_ik.neural_network.geometry.rotations import quaternion_to_matrix
    from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES

    pose = kinematics.forward(rig.skeleton, quaternion_to_matrix(np.asarray(q, np.float64))[None], hips[None, :3, :3],
                              hips[None, :3, 3])
    heads = pose_read.armature_pose_heads(obj, rig)
    off = np.linalg.norm(heads[roles] - pose.positions[0, roles], axis=-1).max() / rig.skeleton.height
    effectors = list(EFFECTOR_ROLES)
    got = rig.basis @ pose_read.armature_pose_matrices(obj, rig)[effectors, :3, :3]
    got /= np.linalg.norm(got, axis=-2, keepdims=True)
    relative = np.swapaxes(got, -1, -2) @ pose.rotations[0, effectors]
    return off, np.arccos(np.clip((np.trace(relative, axis1=-2, axis2=-1) - 1) / 2, -1, 1)).max()


def test_unrefined_live_tick_puts_the_deform_bones_on_the_solved_pose(rigify_rig):
    """The plain live tick (no refinement: the run-time graph's own outputs, control_live's one product for the
    single-joint controls and its mathutils steps for the torso, neck and head) poses the controls so that Blender's
    evaluated DEF- bones take the pose the solver solved: heads within 1e-4 of the rig height and the hands', feet's
    and head's orientations within 1e-3 rad of its FK."""
    import bpy
    from live_helpers import follow_empties, place_targets

    from neural_ik.blender import models
    from neural_ik.blender.live import session as live_session
    from neural_ik.blender.live.tick import LiveTick
    from neural_ik.neural_network.geometry.quaternion_math import multiply_quaternions
    from neural_ik.neural_network.skeleton.roles import ROLES

    obj = rigify_rig
    _, rig, samples, model = _live_model(obj)
    mask = rig.skeleton.role_mask
    try:
        assert bpy.ops.neural_ik.create_targets() == {"FINISHED"}
        follow_empties(obj)
        obj.neural_ik.refine_iterations = 0
        tick = LiveTick([(obj, model, None)])
        tick.start()
        solver = tick.live_groups[0].solver
        heads_off, turned = [], []
        for i in (1, 6, 10):
            place_targets(obj, rig, samples[2], i)
            tick.tick(bpy.context.scene)
            assert solver.used_runtime and solver.pending is not None       # the graph's outputs were written
            hips = solver.hips[0].copy()
            bpy.context.view_layer.update()
            off, angle = _solved_pose_error(obj, rig, solver.q[0], hips, mask)
            heads_off.append(off)
            turned.append(angle)
        # bolder poses than the linear model's (its spine barely turns), through the refined tick's entry: every
        # joint of the solved pose turned by ~0.25 rad more. Rigify's neck is one control over both neck bones, so
        # the upper neck's head goes where the neck's bend puts it (the head's own joint is placed): not compared.
        writer = tick.live_groups[0].controlled[0][1]
        placed = mask.copy()
        placed[ROLES.index("NeckUpper")] = False
        bold_heads, bold_turned = [], []
        for seed in range(3):
            turn = np.concatenate([np.ones((23, 1)), np.random.default_rng(seed).normal(0, 0.15, (23, 3))], axis=1)
            q = multiply_quaternions(solver.q[0], turn / np.linalg.norm(turn, axis=1, keepdims=True))
            writer.write_solved(q, hips)
            bpy.context.view_layer.update()
            off, angle = _solved_pose_error(obj, rig, q, hips, placed)
            bold_heads.append(off)
            bold_turned.append(angle)
        tick.stop()
        print(f"unrefined tick: heads off by up to {max(heads_off):.1e} of the height, effectors turned by up to "
              f"{max(turned):.1e} rad; bolder poses: {max(bold_heads):.1e}, {max(bold_turned):.1e} rad")
        assert max(heads_off) < 1e-5 and max(bold_heads) < 1e-5, (heads_off, bold_heads)
        assert max(turned) < 1e-3 and max(bold_turned) < 1e-3, (turned, bold_turned)
    finally:
        models.loaded_models.pop(obj.name, None)
        live_session.stop_all("")


def test_panels_draw_the_control_map_and_the_evaluated_dataset(rigify_rig, capfd, tmp_path):
    import bpy
    from test_panels import draw_everything

    from neural_ik.blender.rig.control_rig import control_map_summary
    from neural_ik.blender.workflows.extract import write_dataset

    obj = rigify_rig
    key_controls(obj, "sway", frames=6, seed=2)
    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    path, dataset, _notes = write_dataset(bpy.context, str(tmp_path / "rigify.npz"))
    assert dataset.meta["pose_source"].startswith("evaluated")
    summary = control_map_summary(obj, RIGIFY_MAP)
    assert "23 controls" in summary and "torso" in summary
    bpy.context.scene.neural_ik.dataset_path = path
    drawn = draw_everything(capfd)
    assert " ".join(summary.split()) in drawn["NEURAL_IK_PT_rig"].text
    assert "Read from Blender's evaluated pose (driven bones)" in drawn["NEURAL_IK_PT_data"].labels


def test_evaluate_measures_the_deform_bones_and_leaves_the_rig(rigify_rig, tmp_path):
    """Evaluate on Rigify: the network rows come from Bake (keyed controls) and are read from the evaluated DEF-
    bones; the refined row lands the effectors; the Blender IK rows are skipped with a reason; the switches, the pose
    and the actions are as before."""
    import json

    import bpy
    from live_helpers import assign_action, linear_model_for

    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.blender.rig.evaluated_pose import number_properties
    from neural_ik.neural_network.model.checkpoint import save_model
    from neural_ik.neural_network.skeleton.roles import ROLES

    obj = rigify_rig
    actions = [key_controls(obj, f"clip{k}", frames=12, seed=k, amplitude=1.0 + 0.2 * k) for k in range(2)]
    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    obj.pose.bones["upper_arm_parent.L"]["IK_FK"] = 0.25             # a switch the user left half-way
    obj.pose.bones["forearm_fk.R"].rotation_quaternion = (0.96, 0.2, 0.1, 0.17)    # an FK control Bake keys
    rig = rig_model.read_rig(obj, RIGIFY_MAP)
    samples = list(pose_read.read_actions(rig, obj, actions))
    model_path = tmp_path / "model.npz"
    save_model(str(model_path), linear_model_for(rig.skeleton, samples))
    assign_action(obj, actions[1])
    bpy.context.scene.frame_set(4)
    before, switches = state_hash(obj), number_properties(obj)
    objects, action_names = set(bpy.data.objects.keys()), set(bpy.data.actions.keys())
    out = tmp_path / "rigify.json"
    assert bpy.ops.neural_ik.evaluate(armature=obj.name, actions="clip0", model_path=str(model_path),
                                      refine_iterations=4, json_path=str(out)) == {"FINISHED"}
    assert state_hash(obj) == before and number_properties(obj) == switches
    assert set(bpy.data.objects.keys()) == objects and set(bpy.data.actions.keys()) == action_names
    report = json.loads(out.read_text())
    results = report["results"]
    assert list(results) == ["network", "refined"]
    assert set(report["skipped"]) == {"blender_ik", "blender_ik_poles"}
    assert "driven" in report["skipped"]["blender_ik"]
    # the reference is the evaluated DEF- chain (its height as the report measures it), not the keys or the rest pose
    assign_action(obj, actions[0])
    heads = _evaluated_heads(obj, range(1, 13), [RIGIFY_MAP[r] for r in ROLES]) @ rig.basis.T * rig.scale
    height = float(np.median(heads[..., 2].max(axis=1) - heads[..., 2].min(axis=1)))
    assert abs(report["rig_height_m"] - height) < 1e-5, (report["rig_height_m"], height)
    network, refined = results["network"], results["refined"]
    assert refined["effector_cm"]["max"] < 0.1, refined["effector_cm"]          # within 1 mm on the DEF- bones
    assert refined["effector_cm"]["mean"] < network["effector_cm"]["mean"]
    assert refined["inner_mpjpe_cm"] < 0.5 and refined["limit_violations"]["count"] == 0
    print(f"Rigify evaluate, training clip: network {10 * network['effector_cm']['max']:.3f} mm, refined "
          f"{10 * refined['effector_cm']['max']:.4f} mm effector max, refined inner {10 * refined['inner_mpjpe_cm']:.4f} mm")
    # the baked actions play under the switches as the user set them, and inside KeptScene: the next clip's reference
    # is read from the pose as it was, not with the controls the baked action keys and the clips do not (the IK
    # chain's first control, its twist without a pole)
    from neural_ik.blender.workflows.evaluate import evaluate_clip

    obj.neural_ik.model_path = str(model_path)
    for clip in actions[::-1]:
        out = evaluate_clip(bpy.context, obj, clip, RIGIFY_MAP, None, ("network",), str(model_path), 0, rig=rig)
    assert np.max(np.abs(out["reference"][0].positions - heads)) < 1e-6 * height
    assert number_properties(obj) == switches
