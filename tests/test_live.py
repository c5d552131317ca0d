"""Live IK on a real armature: the tick class and the modal operator's logic, checked through Blender's own pose."""

import numpy as np
import pytest
from live_helpers import (
    Event,
    StandInContext,
    assign_action,
    demo_armature,
    drive_with,
    follow_empties,
    linear_model_for,
    place_targets,
    pose_channels,
    runner_reporting_to,
)

from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES


@pytest.fixture(scope="module")
def demo_data():
    """Demo rig samples read once: (train samples, held-out samples)."""
    import bpy

    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.properties import get_bone_map

    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    obj = demo_armature()
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    actions = sorted((a for a in bpy.data.actions if not a.name.endswith(".nik")), key=lambda a: a.name)
    samples = [pose_read.read_action(rig, obj, a) for a in actions]
    held = [s for i, s in enumerate(samples) if i % 4 == 3]
    train = [s for i, s in enumerate(samples) if i % 4 != 3]
    return rig, linear_model_for(rig.skeleton, train), held


@pytest.fixture
def live_rig(empty_scene, demo_data):
    """A fresh demo rig with targets at influence 1, a model cached for it, and the first held-out action assigned."""
    import bpy

    from neural_ik.blender import models
    from neural_ik.blender.live import session as live_session
    from neural_ik.blender.rig import rig_model
    from neural_ik.properties import get_bone_map

    rig0, model, held = demo_data
    obj = demo_armature()
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    assert rig.skeleton.fingerprint() == rig0.skeleton.fingerprint()
    drive_with(obj, model)
    bpy.ops.neural_ik.create_targets()
    assign_action(obj, bpy.data.actions[held[0].name])
    follow_empties(obj)                 # the empties drive, over the action (which Run IK takes off and Stop restores)
    yield obj, rig, model, held
    models.loaded_models.pop(obj.name, None)
    live_session.stop_all("")


def test_tick_lands_effectors_on_held_out_poses(live_rig):
    """Targets from actions the model never saw: with refinement the five effectors land within 1 mm in Blender's own
    evaluated pose in >= 99% of frames, and refinement does not make MPJPE against the reference worse (> 0.5 cm)."""
    import bpy

    from neural_ik.blender.live.tick import LiveTick
    from neural_ik.blender.rig import pose_read

    obj, rig, model, held = live_rig
    tick = LiveTick([(obj, model, None)])
    tick.start()
    mask = rig.role_mask
    landed, net_err, mpjpe_net, mpjpe_ref = [], [], [], []
    frames = [(s, i) for s in held for i in range(0, len(s.frames), 7)]
    for sample, i in frames:
        place_targets(obj, rig, sample, i)
        heads = {}
        for iterations in (0, 4):
            obj.neural_ik.refine_iterations = iterations
            tick.tick(bpy.context.scene)
            bpy.context.view_layer.update()
            heads[iterations] = pose_read.armature_pose_heads(obj, rig)
        target = sample.positions[i, list(EFFECTOR_ROLES)]
        miss = np.linalg.norm(heads[4][list(EFFECTOR_ROLES)] - target, axis=-1)
        landed.append(miss.max() < 1e-3)
        net_err.append(np.linalg.norm(heads[0][list(EFFECTOR_ROLES)] - target, axis=-1).mean())
        mpjpe_net.append(np.linalg.norm(heads[0][mask] - sample.positions[i, mask], axis=-1).mean())
        mpjpe_ref.append(np.linalg.norm(heads[4][mask] - sample.positions[i, mask], axis=-1).mean())
    tick.stop()
    print(f"\n{len(frames)} held-out frames: network effector error {100 * np.mean(net_err):.2f} cm, landed within 1 mm "
          f"{100 * np.mean(landed):.1f}%, MPJPE network {100 * np.mean(mpjpe_net):.2f} cm, refined "
          f"{100 * np.mean(mpjpe_ref):.2f} cm")
    assert len(frames) >= 50
    assert np.mean(net_err) > 5e-3            # the network alone does miss: refinement has work to do
    assert np.mean(landed) >= 0.99
    assert np.mean(mpjpe_ref) <= np.mean(mpjpe_net) + 0.005


def test_stopped_session_restores_pose_and_action(live_rig):
    import bpy

    from neural_ik.blender.live.tick import LiveTick

    obj, rig, model, held = live_rig
    action = obj.animation_data.action
    bpy.context.scene.frame_set(5)
    before = pose_channels(obj)
    tick = LiveTick([(obj, model, None)])
    tick.start()
    assert obj.animation_data.action is None            # the action cannot overwrite the live pose
    place_targets(obj, rig, held[1], 10)
    tick.tick(bpy.context.scene)
    assert np.abs(pose_channels(obj) - before).max() > 1e-3
    mean_us, p99_us = tick.timing_us()
    assert 0 < mean_us <= p99_us
    tick.stop()
    assert obj.animation_data.action == action
    np.testing.assert_array_equal(pose_channels(obj), before)


def test_modal_runs_on_timer_events_and_stops_on_escape(live_rig):
    from neural_ik import state

    obj, rig, model, held = live_rig
    reports = []
    Runner = runner_reporting_to(reports)
    context = StandInContext()
    before = pose_channels(obj)
    runner = Runner()
    assert runner.invoke(context, Event("NONE")) == {"RUNNING_MODAL"}
    assert context.window_manager.handlers == [runner]
    assert context.window_manager.timers == [pytest.approx(1 / 60)]
    assert state.live_sessions[obj.name] is runner.session
    place_targets(obj, rig, held[0], 20)
    assert runner.modal(context, Event("TIMER")) == {"RUNNING_MODAL"}
    assert np.abs(pose_channels(obj) - before).max() > 1e-3
    assert runner.modal(context, Event("MOUSEMOVE")) == {"PASS_THROUGH"}
    assert runner.modal(context, Event("ESC")) == {"CANCELLED"}
    assert context.window_manager.removed == [("timer", 1 / 60)]
    assert obj.name not in state.live_sessions
    np.testing.assert_array_equal(pose_channels(obj), before)
    assert obj.animation_data.action is not None


def test_modal_ticks_at_the_live_rate_and_lets_other_timer_events_pass(live_rig, monkeypatch):
    """Other timers' events reach the operator too: a TIMER event sooner than 0.8 / rate after the last tick passes
    through without a tick; the rate is read live. Time is a stand-in clock, so nothing depends on the machine's speed."""
    import types

    import bpy

    from neural_ik.operators import live as live_ops

    obj, rig, model, held = live_rig
    clock = [100.0]
    monkeypatch.setattr(live_ops, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    bpy.context.scene.neural_ik.live_rate = 20          # a tick at most every 0.8 / 20 = 40 ms
    context = StandInContext()
    runner = runner_reporting_to([])()
    assert runner.invoke(context, Event("NONE")) == {"RUNNING_MODAL"}
    assert context.window_manager.timers == [pytest.approx(1 / 20)]
    ticks = runner.session.tick.times
    place_targets(obj, rig, held[0], 20)
    outcomes = []
    for now, rate in ((100.0, 20), (100.03, 20), (100.041, 20), (100.1, 5), (100.2, 5), (100.202, 5)):
        clock[0] = now
        bpy.context.scene.neural_ik.live_rate = rate
        outcomes.append((runner.modal(context, Event("TIMER")), len(ticks)))
    assert outcomes == [({"RUNNING_MODAL"}, 1), ({"PASS_THROUGH"}, 1), ({"RUNNING_MODAL"}, 2),
                        ({"PASS_THROUGH"}, 2), ({"PASS_THROUGH"}, 2), ({"RUNNING_MODAL"}, 3)]
    assert runner.modal(context, Event("ESC")) == {"CANCELLED"}


def test_stop_operator_ends_the_session_and_puts_the_rig_back(live_rig):
    import bpy

    from neural_ik import state

    obj, rig, model, held = live_rig
    reports = []
    context = StandInContext()
    action = obj.animation_data.action
    bpy.context.scene.frame_set(7)
    before = pose_channels(obj)                  # the action's pose at this frame
    runner = runner_reporting_to(reports)()
    assert runner.invoke(context, Event("NONE")) == {"RUNNING_MODAL"}
    assert runner.session.tick.live_groups[0].solver.model is model
    place_targets(obj, rig, held[0], 20)
    assert runner.modal(context, Event("TIMER")) == {"RUNNING_MODAL"}
    assert np.abs(pose_channels(obj) - before).max() > 1e-3
    assert bpy.ops.neural_ik.stop() == {"FINISHED"}
    assert not state.live_sessions and runner.session.stopped
    np.testing.assert_array_equal(pose_channels(obj), before)
    assert obj.animation_data.action == action
    runner.last_tick = 0.0
    assert runner.modal(context, Event("TIMER")) == {"CANCELLED"}     # the operator ends at its next event
    assert context.window_manager.removed == [("timer", pytest.approx(1 / 60))]
    assert reports[-1] == ("INFO", "live IK stopped; the pose and action are as they were")
    assert not bpy.ops.neural_ik.stop.poll()
    bpy.context.view_layer.update()
    np.testing.assert_array_equal(pose_channels(obj), before)


def test_two_armatures_go_live_in_one_session(live_rig):
    """Every armature with a model and targets goes live with the active one: one session, one batched solve, each
    rig's effectors on its own targets; Esc puts both back."""
    import bpy

    from neural_ik import state
    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.properties import get_bone_map

    obj, rig, model, held = live_rig
    other = demo_armature()
    other.location = (2.0, -1.0, 0.0)
    other.rotation_euler.z = 0.7
    drive_with(other, model)
    bpy.ops.neural_ik.create_targets()
    assign_action(other, bpy.data.actions[held[1].name])
    other_rig = rig_model.read_rig(other, get_bone_map(other))
    bpy.context.view_layer.objects.active = obj
    bpy.context.view_layer.update()
    rigs = ((obj, rig, held[0], 20), (other, other_rig, held[1], 30))
    before = [pose_channels(o) for o, *_ in rigs]
    for o, *_ in rigs:
        o.neural_ik.refine_iterations = 4
    context = StandInContext()
    runner = runner_reporting_to([])()
    assert runner.invoke(context, Event("NONE")) == {"RUNNING_MODAL"}
    session = runner.session
    assert sorted(session.names) == sorted([obj.name, other.name])
    assert state.live_sessions[obj.name] is session and state.live_sessions[other.name] is session
    assert sum(g.k for g in session.tick.live_groups) == 2
    for o, r, sample, row in rigs:
        place_targets(o, r, sample, row)
    assert runner.modal(context, Event("TIMER")) == {"RUNNING_MODAL"}
    bpy.context.view_layer.update()
    for o, r, sample, row in rigs:
        miss = np.linalg.norm(pose_read.armature_pose_heads(o, r)[list(EFFECTOR_ROLES)]
                              - sample.positions[row, list(EFFECTOR_ROLES)], axis=-1)
        assert miss.max() < 1e-3, (o.name, miss)
    assert runner.modal(context, Event("ESC")) == {"CANCELLED"}
    assert not state.live_sessions
    for (o, *_), channels in zip(rigs, before):
        np.testing.assert_array_equal(pose_channels(o), channels)


def test_an_unexpected_error_in_a_tick_ends_the_session_and_puts_the_rig_back(live_rig, monkeypatch):
    """The catch-all: any exception inside a tick (here one raised by the solver) stops the session with its type and
    message as the reason, removes the timer and restores the pose and action; no traceback escapes the operator."""
    import gc

    from neural_ik import state

    obj, rig, model, held = live_rig
    reports = []
    context = StandInContext()
    action = obj.animation_data.action
    before = pose_channels(obj)
    runner = runner_reporting_to(reports)()
    assert runner.invoke(context, Event("NONE")) == {"RUNNING_MODAL"}
    place_targets(obj, rig, held[0], 20)
    assert runner.modal(context, Event("TIMER")) == {"RUNNING_MODAL"}
    solver = runner.session.tick.live_groups[0].solver

    def fails(*_args, **_kwargs):
        raise FloatingPointError("an injected fault")

    monkeypatch.setattr(solver, "step", fails)
    runner.last_tick = 0.0
    assert runner.modal(context, Event("TIMER")) == {"CANCELLED"}
    assert reports[-1] == ("WARNING", "live IK stopped: FloatingPointError: an injected fault")
    assert not state.live_sessions and runner.session.stopped
    assert context.window_manager.removed == [("timer", pytest.approx(1 / 60))]
    np.testing.assert_array_equal(pose_channels(obj), before)
    assert obj.animation_data.action == action
    assert gc.isenabled()


def test_deleted_target_or_undo_ends_the_session_cleanly(live_rig):
    import bpy

    from neural_ik import state
    from neural_ik.operators import live as live_ops

    obj, rig, model, held = live_rig
    reports = []
    Runner = runner_reporting_to(reports)
    # undo while live: the handler stops the session, the next event ends the operator with the reason
    context = StandInContext()
    runner = Runner()
    runner.invoke(context, Event("NONE"))
    live_ops._stop_on_undo(bpy.context.scene)
    assert not state.live_sessions
    assert runner.modal(context, Event("TIMER")) == {"CANCELLED"}
    assert "undo" in reports[-1][1] and reports[-1][0] == "WARNING"

    # a deleted target: the tick stops with a message and restores the rig
    before = pose_channels(obj)
    runner = Runner()
    runner.invoke(context, Event("NONE"))
    runner.modal(context, Event("TIMER"))
    bpy.data.objects.remove(obj.neural_ik.target_left_hand)
    runner.last_tick = 0.0
    assert runner.modal(context, Event("TIMER")) == {"CANCELLED"}
    assert "deleted" in reports[-1][1]
    assert not state.live_sessions
    np.testing.assert_array_equal(pose_channels(obj), before)


def test_target_reader_follows_objects_added_removed_and_renamed(live_rig):
    """The one-call read picks our objects by index into bpy.data.objects: after objects are added (one, and more
    than the uid buffer's slack), renamed (which re-sorts the list) or removed it still reads our own matrices, and a
    target deleted from the end of the list stops the session (a read that missed it would keep its last matrix)."""
    import bpy

    from neural_ik.blender.live.tick import LiveStopped, LiveTick, TargetReader

    obj, rig, model, held = live_rig
    tick = LiveTick([(obj, model, None)])
    reader = TargetReader(tick.live_groups[0].characters, tick.live_groups[0].solver)
    assert reader.shared
    ours = [obj] + reader.characters[0].targets

    def read_matches():
        reader.read()
        expected = np.stack([np.array(o.matrix_world, np.float32).T for o in ours])
        np.testing.assert_array_equal(reader.matrices[0], expected)

    read_matches()
    for target in ours[1:]:
        target.location.x += 0.25
    bpy.context.view_layer.update()
    read_matches()
    extra = bpy.data.objects.new("0 sorts first", None)                     # one object added, before ours
    read_matches()
    many = [bpy.data.objects.new(f"{i:02d} also first", None) for i in range(TargetReader.UID_SLACK + 4)]
    read_matches()                                                          # more than the slack at once
    extra.name = "zz sorts last"                                            # a rename re-sorts the list
    read_matches()
    for o in many:
        bpy.data.objects.remove(o)
    read_matches()
    head = obj.neural_ik.target_head
    head.name = "zzz the head target"                                       # now the last object of the list
    bpy.data.objects.remove(extra)
    read_matches()
    assert bpy.data.objects[-1] == head
    bpy.data.objects.remove(head)
    with pytest.raises(LiveStopped, match="no longer in the file|deleted"):
        reader.read()


def test_tick_holds_off_the_cyclic_collector_and_restores_it(live_rig):
    """With a collection due at every allocation, none starts inside a refined tick; the collector is on again after
    the tick, also after a tick that ends the session (a deleted target), and stays off when it was off."""
    import gc

    import bpy

    from neural_ik.blender.live.tick import LiveStopped, LiveTick

    obj, rig, model, held = live_rig
    obj.neural_ik.refine_iterations = 2
    tick = LiveTick([(obj, model, None)])
    tick.start()
    place_targets(obj, rig, held[0], 3)
    run, scene = tick.tick, bpy.context.scene         # bound before: making the bound method allocates
    started = []

    def note(phase, info):
        if phase == "start":
            started.append(info["generation"])

    threshold = gc.get_threshold()
    gc.callbacks.append(note)
    try:
        gc.set_threshold(1)
        run(scene)
        gc.collect()                                    # a collection is counted once the tick is over
        before = len(started)
        run(scene)
        during = len(started) - before
        enabled_after = gc.isenabled()
        gc.collect()
        collected_after = len(started) - before
        gc.disable()
        run(scene)
        stays_off = not gc.isenabled()
        gc.enable()
        bpy.data.objects.remove(obj.neural_ik.target_left_hand)
        with pytest.raises(LiveStopped):
            run(scene)
        enabled_after_stop = gc.isenabled()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(note)
        gc.enable()
        tick.stop()
    assert during == 0
    assert collected_after >= 1                          # the callback does see collections
    assert enabled_after and stays_off and enabled_after_stop


def test_non_finite_target_holds_the_last_pose(live_rig):
    import bpy

    from neural_ik.blender.live.tick import LiveTick

    obj, rig, model, held = live_rig
    tick = LiveTick([(obj, model, None)])
    tick.start()
    place_targets(obj, rig, held[0], 3)
    tick.tick(bpy.context.scene)
    good = pose_channels(obj)
    obj.neural_ik.target_head.location = (float("nan"), 0.0, 0.0)
    bpy.context.view_layer.update()
    assert not np.isfinite(np.array(obj.neural_ik.target_head.matrix_world)).all()
    tick.tick(bpy.context.scene)
    assert np.isfinite(pose_channels(obj)).all()
    np.testing.assert_allclose(pose_channels(obj), good, atol=1e-6)
    assert "holding the last good pose" in tick.messages()[obj.name]
    tick.stop()


def test_run_refuses_without_targets_or_model(empty_scene, demo_data):
    import bpy

    obj = demo_armature()
    with pytest.raises(RuntimeError, match="no root, left hand, right hand, left foot, right foot, head target"):
        bpy.ops.neural_ik.bake()     # the demo rig comes with the shipped model, but has no targets yet
    obj.neural_ik.model_path = ""
    with pytest.raises(RuntimeError, match="no model"):
        bpy.ops.neural_ik.bake()
    with pytest.raises(RuntimeError, match="needs Blender's window"):
        bpy.ops.neural_ik.run()
    assert obj.neural_ik.target_root is None


def test_entering_edit_mode_ends_the_session_and_restores_the_pose(live_rig):
    """Edit Mode rebuilds pose bones; live mode stops at the next event instead of writing into them."""
    import bpy

    from neural_ik import state

    obj, rig, model, held = live_rig
    reports = []
    Runner = runner_reporting_to(reports)
    context = StandInContext()
    before = pose_channels(obj)
    runner = Runner()
    runner.invoke(context, Event("NONE"))
    place_targets(obj, rig, held[0], 20)
    assert runner.modal(context, Event("TIMER")) == {"RUNNING_MODAL"}
    bpy.context.view_layer.objects.active = obj
    bpy.ops.object.mode_set(mode="EDIT")
    try:
        assert runner.modal(context, Event("TIMER")) == {"CANCELLED"}
        restored = pose_channels(obj)      # read before leaving Edit Mode, which re-evaluates the restored action
    finally:
        bpy.ops.object.mode_set(mode="OBJECT")
    assert reports[-1] == ("WARNING", "live IK stopped: Edit Mode changes the bones it drives")
    assert not state.live_sessions
    np.testing.assert_array_equal(restored, before)
    assert obj.animation_data.action is not None


def test_settings_edits_reach_the_next_tick_and_unnotified_changes_a_later_one(live_rig):
    """A panel or Python edit of a live setting (its update callback counts it) is read on the very next tick. A value
    changed behind Blender's back arrives later: a driver's within SETTINGS_ROUNDS ticks, a raw ID-property write on an
    armature without drivers within UNDRIVEN_ROUNDS ticks (the slices are real: neither is read at once)."""
    import bpy

    from neural_ik.blender.live.tick import LiveTick

    obj, _rig, model, _held = live_rig
    scene = bpy.context.scene

    def ticks_seeing(tick, count):
        seen = []
        for _ in range(count):
            tick.tick(scene)
            seen.append(tick.live_groups[0].iterations)
        return seen

    obj.neural_ik.refine_iterations = 0
    tick = LiveTick([(obj, model, None)])
    tick.start()
    tick.tick(scene)
    assert tick.live_groups[0].iterations == 0
    obj.neural_ik.refine_iterations = 3            # through RNA: the update callback fires
    tick.tick(scene)
    assert tick.live_groups[0].iterations == 3
    obj.neural_ik["refine_iterations"] = 1         # no callback: only the periodic re-read sees it
    seen = ticks_seeing(tick, LiveTick.UNDRIVEN_ROUNDS)
    tick.stop()
    assert seen[-1] == 1 and seen[0] == 3, seen

    obj["nik_iterations"] = 2                      # a driver: refine_iterations follows this custom property
    curve = obj.driver_add("neural_ik.refine_iterations")
    variable = curve.driver.variables.new()
    variable.targets[0].id = obj
    variable.targets[0].data_path = '["nik_iterations"]'
    curve.driver.expression = variable.name
    bpy.context.view_layer.update()
    assert obj.neural_ik.refine_iterations == 2
    tick = LiveTick([(obj, model, None)])
    tick.start()
    tick.tick(scene)
    assert tick.live_groups[0].iterations == 2
    obj["nik_iterations"] = 4
    bpy.context.view_layer.update()                # the driver writes the setting: no update callback
    assert obj.neural_ik.refine_iterations == 4
    seen = ticks_seeing(tick, LiveTick.SETTINGS_ROUNDS)
    tick.stop()
    assert seen[-1] == 4 and seen[0] == 2, seen


@pytest.mark.parametrize("hips_mode", ["YXZ", "AXIS_ANGLE"])
def test_euler_and_axis_angle_bones_get_the_solved_rotations_without_jumping_a_turn(live_rig, hips_mode):
    """A rig imported from BVH has Euler bones (Blender's importer keeps the file's channel order). Mixed orders, an
    Euler hips and an axis-angle bone: after a tick every mapped bone's matrix_basis is the solver's rotation; Euler
    angles are the solution nearest the ones the bone held (one offset by a whole turn keeps that turn, as Blender's
    to_euler(order, compat) would); quaternion-mode values are left alone; stop puts every value back."""
    import bpy
    from mathutils import Euler

    from neural_ik.blender.live.tick import LiveTick
    from neural_ik.neural_network.geometry.quaternion_math import quaternions_to_matrices

    obj, rig, model, held = live_rig
    orders = ["ZXY", "XYZ", "YZX", "ZYX", "XZY", "YXZ"]
    mapped = [(r, obj.pose.bones[rig.bone_names[int(b)]]) for r, b in enumerate(rig.role_bones) if b >= 0]
    for n, (_role, pb) in enumerate(mapped):
        pb.rotation_mode = "AXIS_ANGLE" if n == 5 else orders[n % len(orders)]
    mapped[0][1].rotation_mode = hips_mode                          # role 0: the hips
    turned = mapped[7][1]
    turned.rotation_euler = (2 * np.pi + 0.1, -2 * np.pi, 0.2)     # a whole turn on two axes, as keys can leave it
    bpy.context.scene.frame_set(3)
    before = pose_channels(obj)
    quaternions_before = {pb.name: tuple(pb.rotation_quaternion) for _role, pb in mapped}
    tick = LiveTick([(obj, model, None)])
    tick.start()
    place_targets(obj, rig, held[1], 12)
    tick.tick(bpy.context.scene)
    group = tick.live_groups[0]
    q = group.solver.q[0].astype(np.float64)
    hips_basis = quaternions_to_matrices(group.solver.runtime.hips_q[0].astype(np.float64))
    for r, pb in mapped:
        expected = hips_basis if r == 0 else quaternions_to_matrices(q[r])
        np.testing.assert_allclose(np.array(pb.matrix_basis)[:3, :3], expected, atol=2e-6, err_msg=pb.name)
        assert tuple(pb.rotation_quaternion) == quaternions_before[pb.name]      # not written: not their mode
    solved = Euler(turned.rotation_euler, turned.rotation_mode)
    assert 5.0 < solved.x < 7.6 and -7.6 < solved.y < -5.0     # still a turn away from zero, like the values before
    compat = np.array(solved.to_matrix().to_euler(turned.rotation_mode, Euler((2 * np.pi + 0.1, -2 * np.pi, 0.2))))
    np.testing.assert_allclose(np.array(solved), compat, atol=1e-5)
    tick.stop()
    np.testing.assert_array_equal(pose_channels(obj), before)
