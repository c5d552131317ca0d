"""Every sidebar panel drawn into a real Blender UILayout, in each state of the work.

The bpy module has a window and a screen but never draws a region, so a Panel never receives a layout from
Blender. `WindowManager.popmenu_begin__internal` (the C function behind `wm.popup_menu`) does hand out a real
UILayout without a GPU; with the context overridden to the 3D viewport's sidebar region (the region the panels
live in), each panel's own `draw()` runs against it: real `prop`, `prop_search`, `template_list` (which calls the
UIList's `draw_item`) and `progress` calls. The popup is never shown: `popmenu_end__internal` reads the
window's event state, which a window without a display lacks (it crashes), so the popups stay allocated and Blender
reports them at exit ("Error: Not freed memory blocks", docs/architecture.md says why it is harmless).

What a panel drew is read back from that same layout with `UILayout.introspect()` (Blender's own account of a
layout's buttons: each one's text, and the operator or property behind it; tests/test_panels.Drawn), so each state's
labels, offered operators and the reasons for greyed-out buttons are asserted, not only the absence of errors.

Blender does not raise for a property or operator that does not exist, or for an exception inside a UIList
callback: it prints (to stdout or stderr). The tests therefore capture the process's file descriptors 1 and 2 and
fail on those messages too.
"""

import os
import re
from contextlib import contextmanager

import numpy as np
import pytest

BLENDER_UI_ERRORS = re.compile(r"rna_uiItem|property not found|unknown operator|Traceback|Error:|could not find|"
                               r"not found in|AttributeError|TypeError|KeyError|ValueError")


@contextmanager
def sidebar_layout(title="Neural IK"):
    """(context, object with .layout) inside the 3D viewport's sidebar region of the real window."""
    import bpy

    wm = bpy.context.window_manager
    window = wm.windows[0]
    area = next(a for a in window.screen.areas if a.type == "VIEW_3D")
    region = next(r for r in area.regions if r.type == "UI")
    with bpy.context.temp_override(window=window, screen=window.screen, area=area, region=region):
        popup = wm.popmenu_begin__internal(title, icon="NONE")
        yield bpy.context, popup


def panel_classes():
    import neural_ik.panels.main as main

    return [cls for cls in main.classes]


class Drawn:
    """What one panel drew, read back from its real UILayout with `UILayout.introspect()`: Blender's own list of the
    buttons the layout holds, each with the text it draws and the operator or property it stands for.

    labels: the texts of the labels, in order; text: them joined by spaces (a wrapped label reads as one line);
    operators: [(idname, text)] of the operator buttons (idname 'neural_ik.bake'); properties: their 'Struct.prop'."""

    def __init__(self, title, items):
        self.labels, self.operators, self.properties = [], [], []
        self._read(items)
        if self.labels and self.labels[0] == title:       # the popup's own title, not the panel's
            self.labels.pop(0)
        self.text = " ".join(self.labels)

    def _read(self, items):
        for item in items:
            if "items" in item:
                self._read(item["items"])
            elif "operator" in item:
                self.operators.append((item["operator"].removeprefix("bpy.ops.").split("(")[0], item["draw_string"]))
            elif "rna" in item:
                self.properties.append(item["rna"].split("[")[0])
            elif item["draw_string"]:
                self.labels.append(item["draw_string"])

    def has_operator(self, idname, text=None):
        return any(name == idname and (text is None or drawn == text) for name, drawn in self.operators)

    def __repr__(self):
        return f"Drawn(labels={self.labels}, operators={self.operators})"


def draw_everything(capfd):
    """Draw every panel (when its poll allows) and every menu; fails on anything Blender printed as an error.
    Returns {panel bl_idname: Drawn} of the panels drawn, each in its own real layout."""
    import bpy

    import neural_ik.panels.lists as lists

    capfd.readouterr()
    drawn = {}
    for cls in panel_classes():
        title = f"panel {cls.bl_idname}"
        with sidebar_layout(title) as (context, popup):
            assert context.region.type == "UI" and context.area.type == "VIEW_3D"
            assert getattr(bpy.types, cls.__name__) is cls, f"{cls.__name__} is not registered"
            if hasattr(cls, "poll") and not cls.poll(context):
                continue
            cls.draw(popup, context)
            drawn[cls.bl_idname] = Drawn(title, popup.layout.introspect())
    with sidebar_layout() as (context, popup):
        for menu in (lists.NEURAL_IK_MT_operators, lists.NEURAL_IK_MT_bone_map_presets):
            menu.draw(popup, context)
        for host in lists.HOST_MENUS:   # Blender's Object/Pose menus, with the Neural IK submenu appended (F3)
            menu = getattr(bpy.types, host)
            assert lists.draw_object_menu in menu.draw._draw_funcs
            if bpy.app.version >= (5, 0, 0):
                menu.draw(popup, context)
            else:   # Blender 4.2's own Object menu crashes in this popup (operator_menu_enum): draw only ours
                lists.draw_object_menu(popup, context)
    captured = capfd.readouterr()
    err = captured.out + captured.err
    problems = [line for line in err.splitlines() if BLENDER_UI_ERRORS.search(line)]
    assert not problems, "Blender reported while drawing:\n" + "\n".join(problems)
    return drawn


def refusal(name):
    """The reason Blender gives for refusing bpy.ops.neural_ik.<name> in this context (its poll message): what the
    greyed-out button's tooltip says."""
    import bpy

    op = getattr(bpy.ops.neural_ik, name)
    assert not op.poll(), f"neural_ik.{name} is available"
    with pytest.raises(RuntimeError) as info:
        op()
    return str(info.value)


# ---- scene states -------------------------------------------------------------------------------------------


def make_humanoid(name="Humanoid"):
    """A real armature with one bone per role (bone names = role names), built with Blender's edit bones."""
    import bpy

    from neural_ik.blender.workflows.demo_rig import build_armature
    from neural_ik.neural_network.skeleton.roles import ROLE_PARENTS, ROLES

    heads, bones = {}, []
    for i, role in enumerate(ROLES):
        parent = ROLE_PARENTS[i]
        side = -0.15 if role.startswith("Left") else 0.15 if role.startswith("Right") else 0.0
        head = np.array([side, 0.0, 1.0]) if parent < 0 else heads[ROLES[parent]] + np.array(
            [side * 0.5, 0.0, -0.2 if "Thigh" in role or "Shin" in role or "Foot" in role else 0.15])
        heads[role] = head
        bones.append((role, ROLES[parent] if parent >= 0 else None, tuple(head), tuple(head + [0.0, 0.0, 0.1]), 0.0,
                      False))
    return build_armature(bpy.context, name, bones)


@pytest.fixture
def training_state(monkeypatch):
    """A fresh real TrainingProgress installed as the add-on's training state (restored afterwards)."""
    import neural_ik.state as state

    progress = state.TrainingProgress()
    monkeypatch.setattr(state, "training", progress)
    monkeypatch.setattr(state, "live_sessions", {})
    return progress


def write_loss_plot(path, history):
    from neural_ik.neural_network.report import plot_svg

    epochs = [h["epoch"] for h in history]
    plot_svg.loss_curve_svg(path, epochs, {"train": [h["train_loss"] for h in history],
                                           "validation": [h["val_effector_cm_mean"] for h in history]})


def write_dataset(path, actions):
    """A dataset file as the extractor writes it (arrays sized from the actions' samples)."""
    from neural_ik.neural_network.data.files import save_npz

    rows = sum(a["samples"] for a in actions)
    meta = {"kind": "neural_ik.dataset", "layout_version": 1, "fps": 30.0, "units": "m", "actions": actions,
            "skeleton": {"name": "Humanoid"}, "source": "test.blend"}
    save_npz(path, {"inputs": np.zeros((rows, 50), np.float32)}, meta)


# ---- the states the issue lists -----------------------------------------------------------------------------


CHOOSE_FIRST = "Choose an armature in Rig first"
SELECT_ONE = "Select an armature (or choose one in the Neural IK panel)"


def test_no_armature(empty_scene, training_state, capfd):
    """Nothing to work on: the panels offer the demo rig, and every panel whose buttons are greyed out says why; the
    operators themselves refuse with the reason their tooltip shows."""
    drawn = draw_everything(capfd)
    assert list(drawn) == [cls.bl_idname for cls in panel_classes()]
    main = drawn["NEURAL_IK_PT_main"]
    assert main.labels == ["Learned full-body IK for an armature"]
    assert main.operators == [("neural_ik.create_demo_rig", "Create Demo Rig")]
    assert drawn["NEURAL_IK_PT_rig"].labels == ["Choose the armature to map, train and drive"]
    for panel, greyed in (("data", "extract"), ("training", "train"), ("bake_export", "bake"),
                          ("bake_export", "export_onnx")):
        shown = drawn[f"NEURAL_IK_PT_{panel}"]
        assert shown.has_operator(f"neural_ik.{greyed}") and CHOOSE_FIRST in shown.labels, (panel, shown)
    live = drawn["NEURAL_IK_PT_live"]
    assert live.labels == [CHOOSE_FIRST] and live.operators == []
    for name in ("extract", "bake", "export_onnx", "run", "create_targets", "load_model"):
        assert SELECT_ONE in refusal(name), name
    assert "Live IK is not running" in refusal("stop")
    assert "Training is not running" in refusal("cancel_training")


def test_unmapped_rig(empty_scene, training_state, capfd):
    from neural_ik.neural_network.skeleton.roles import ESSENTIAL_ROLES, ROLES
    from neural_ik.panels.main import bone_map_problems
    from neural_ik.properties import set_bone_map

    obj = make_humanoid()
    empty_scene.neural_ik.armature = obj
    assert bone_map_problems(obj) and "Auto Map" in bone_map_problems(obj)[0]
    rig = draw_everything(capfd)["NEURAL_IK_PT_rig"]
    assert "No bones are mapped yet: press Auto Map or choose a preset." in rig.text
    assert f"0 of {len(ROLES)} roles mapped" in rig.labels and "The bone map is complete" not in rig.labels
    assert rig.has_operator("neural_ik.auto_map", "Auto Map")
    # A map that names bones the rig lacks, and leaves an essential role empty: both are problems in words.
    set_bone_map(obj, {role: f"missing_{role}" for role in ESSENTIAL_ROLES[1:]})
    problems = bone_map_problems(obj)
    assert any(ESSENTIAL_ROLES[0] in p for p in problems)
    assert len(problems) >= len(ESSENTIAL_ROLES)
    rig = draw_everything(capfd)["NEURAL_IK_PT_rig"]
    for problem in problems[:8]:                    # the first eight in words, then how many more
        assert problem in rig.text, problem
    assert f"... and {len(problems) - 8} more" in rig.labels and problems[8] not in rig.text
    assert f"{len(ESSENTIAL_ROLES) - 1} of {len(ROLES)} roles mapped" in rig.labels


def test_mapped_rig_without_dataset(empty_scene, training_state, capfd, tmp_path):
    from neural_ik.neural_network.skeleton.roles import ROLES
    from neural_ik.panels.lists import role_status
    from neural_ik.panels.main import bone_map_problems
    from neural_ik.properties import set_bone_map

    obj = make_humanoid()
    empty_scene.neural_ik.armature = obj
    set_bone_map(obj, {role: role for role in ROLES})
    assert bone_map_problems(obj) == []
    assert all(role_status(item, obj)[0] == "CHECKMARK" for item in obj.neural_ik.bone_map)
    empty_scene.neural_ik.dataset_path = str(tmp_path / "not_extracted_yet.npz")
    drawn = draw_everything(capfd)
    assert drawn["NEURAL_IK_PT_main"].labels == ["Humanoid"]
    rig = drawn["NEURAL_IK_PT_rig"]
    assert f"{len(ROLES)} of {len(ROLES)} roles mapped" in rig.labels and "The bone map is complete" in rig.labels
    assert "Dataset: not_extracted_yet.npz does not exist yet" in drawn["NEURAL_IK_PT_data"].labels
    live = drawn["NEURAL_IK_PT_live"]
    assert "No model yet: Train Starter Model (Training) or Load Model" in live.text
    assert live.has_operator("neural_ik.run", "Run IK") and not live.has_operator("neural_ik.stop")
    shown = drawn["NEURAL_IK_PT_training"]                     # the first hour: a model with no clips of its own
    assert shown.has_operator("neural_ik.train_starter", "Train Starter Model")
    assert ("First hour on your rig: Auto Map, Train Starter Model (5 minutes, motion that ships with Neural IK), "
            "Create Targets, Run IK" in shown.text)
    assert all(CHOOSE_FIRST not in shown.labels for shown in drawn.values())


def test_dataset_summary_read_from_file(empty_scene, training_state, capfd, tmp_path):
    from neural_ik.panels.common import dataset_summary, read_meta

    obj = make_humanoid()
    empty_scene.neural_ik.armature = obj
    path = str(tmp_path / "data.npz")
    actions = [{"name": "walk", "frame_start": 1, "frame_end": 40, "task": 1, "samples": 40},
               {"name": "idle", "frame_start": 1, "frame_end": 25, "task": 0, "samples": 25},
               {"name": "run", "frame_start": 1, "frame_end": 10, "task": 1, "samples": 10}]
    write_dataset(path, actions)
    empty_scene.neural_ik.dataset_path = path
    meta, reason = read_meta(path)
    assert reason is None
    facts = dataset_summary(meta)
    assert facts["actions"] == 3 and facts["frames"] == 75
    assert dict(facts["per_task"]) == {"idle": 25, "locomotion": 50}
    data = draw_everything(capfd)["NEURAL_IK_PT_data"]
    summary = data.labels[data.labels.index("3 actions, 75 frames"):]
    assert summary == ["3 actions, 75 frames", "Idle: 25 frames", "Locomotion: 50 frames", "Rig: Humanoid", "30 fps"]
    # The cache follows the file: a rewritten dataset is read again.
    write_dataset(path, actions[:1])
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    assert dataset_summary(read_meta(path)[0])["frames"] == 40
    assert "1 actions, 40 frames" in draw_everything(capfd)["NEURAL_IK_PT_data"].labels
    # A file that is not a dataset is reported, not raised.
    with open(path, "wb") as handle:
        handle.write(b"not a zip")
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 2 * 10**9))
    meta, reason = read_meta(path)
    assert meta is None and "cannot be read" in reason
    data = draw_everything(capfd)["NEURAL_IK_PT_data"]
    assert f"Dataset: {reason}" in data.labels and not any("frames" in label for label in data.labels)


def epoch_table(shown):
    """The Training panel's table of recent epochs as drawn: a header and five rows of four cells."""
    start = shown.labels.index("Recent epochs (validation error in cm)") + 1
    cells = shown.labels[start:start + 24]
    return [cells[i:i + 4] for i in range(0, 24, 4)]


def test_training_running(empty_scene, training_state, capfd, tmp_path):
    from neural_ik.neural_network.skeleton.roles import ROLES
    from neural_ik.properties import set_bone_map

    obj = make_humanoid()
    empty_scene.neural_ik.armature = obj
    set_bone_map(obj, {role: role for role in ROLES})
    empty_scene.neural_ik.show_loss_weights = True
    history = [{"epoch": e, "train_loss": 1.0 / e, "val_effector_cm_mean": 3.0 + abs(e - 3),
                "val_inner_mpjpe_cm": 2.0} for e in range(1, 8)]
    plot = str(tmp_path / "loss.svg")
    write_loss_plot(plot, history)
    training_state.running = True
    training_state.epoch, training_state.epochs = 5, 20
    training_state.train_loss, training_state.val_error_cm, training_state.seconds_left = 0.2, 3.4, 75.0
    training_state.history = history
    training_state.plot_path = plot
    training_state.best_metrics = {"effector_cm_mean": 2.5, "inner_mpjpe_cm": 3.1, "frames": 100}
    training_state.message = "training"
    drawn = draw_everything(capfd)
    assert drawn["NEURAL_IK_PT_main"].labels == ["Training: epoch 5/20"]
    shown = drawn["NEURAL_IK_PT_training"]
    assert shown.has_operator("neural_ik.cancel_training", "Cancel") and not shown.has_operator("neural_ik.train")
    assert shown.has_operator("wm.path_open", "Open loss.svg")
    for line in ("Loss: 0.2", "Validation error: 3.40 cm", "Time left: 1m 15s", "training",
                 "Recent epochs (validation error in cm)", "Best checkpoint (this run)"):
        assert line in shown.labels, (line, shown)
    best = shown.labels[shown.labels.index("Best checkpoint (this run)") + 1:]
    assert best == ["Effector error", "2.50 cm", "Inner joints", "3.10 cm"]
    assert epoch_table(shown)[:2] == [["Epoch", "Loss", "Effector", "Inner"], ["3", "0.3333", "3.00", "2.00"]]
    assert [row[0] for row in epoch_table(shown)[1:]] == ["3", "4", "5", "6", "7"]
    # The loss curve as UI text: the last five epochs, and the best one (epoch 3) kept in view and marked.
    import neural_ik.panels.main as main

    rows = main.recent_epochs(history)
    assert [r[0] for r in rows] == ["3", "4", "5", "6", "7"] and [r[4] for r in rows] == [True] + [False] * 4
    assert rows[0][1:4] == ("0.3333", "3.00", "2.00")
    history.extend({"epoch": e, "train_loss": 0.1, "val_effector_cm_mean": 9.0, "val_inner_mpjpe_cm": 2.0}
                   for e in range(8, 10))
    assert [r[0] for r in main.recent_epochs(history)] == ["3", "6", "7", "8", "9"]
    shown = draw_everything(capfd)["NEURAL_IK_PT_training"]
    assert [row[0] for row in epoch_table(shown)[1:]] == ["3", "6", "7", "8", "9"]
    # A run that failed: the reason is drawn in words, and Train is offered again.
    training_state.running = False
    training_state.error = "the dataset holds no frames"
    drawn = draw_everything(capfd)
    shown = drawn["NEURAL_IK_PT_training"]
    assert "the dataset holds no frames" in shown.labels and "Time left: 1m 15s" not in shown.labels
    assert shown.has_operator("neural_ik.train", "Train") and not shown.has_operator("neural_ik.cancel_training")
    assert drawn["NEURAL_IK_PT_main"].labels == ["Humanoid"]


def test_model_ready(empty_scene, training_state, capfd, tmp_path):
    """A real checkpoint loaded with Load Model: the Training panel shows its best metrics, read from the file."""
    import bpy
    from live_helpers import demo_armature, random_model

    from neural_ik.blender import models
    from neural_ik.blender.rig import rig_model
    from neural_ik.neural_network.model.checkpoint import save_model
    from neural_ik.panels.common import metric_lines, read_meta
    from neural_ik.properties import get_bone_map

    obj = demo_armature()
    empty_scene.neural_ik.armature = obj
    model = random_model(rig_model.read_rig(obj, get_bone_map(obj)).skeleton)
    model.meta["metrics"] = {"effector_cm_mean": 1.25, "effector_cm_p95": 3.5, "inner_mpjpe_cm": 2.0, "frames": 50}
    model_path = str(tmp_path / "model.npz")
    save_model(model_path, model)
    bpy.context.view_layer.objects.active = obj
    try:
        bpy.ops.neural_ik.load_model(filepath=model_path)
        assert bpy.path.abspath(obj.neural_ik.model_path) == model_path
        meta, reason = read_meta(obj.neural_ik.model_path)
        assert reason is None and meta["kind"] == "neural_ik.model"
        lines = dict(metric_lines(meta["metrics"]))
        assert lines["Effector error"] == "1.25 cm" and lines["Inner joints"] == "2.00 cm" and "Frames" not in lines
        training_state.epoch, training_state.epochs = 20, 20
        training_state.message = "finished: best epoch 17"
        drawn = draw_everything(capfd)
        shown = drawn["NEURAL_IK_PT_training"]
        best = shown.labels[shown.labels.index("Best checkpoint (model.npz)") + 1:]
        assert best == ["Effector error", "1.25 cm", "Effector error p95", "3.50 cm", "Inner joints", "2.00 cm"]
        assert "finished: best epoch 17" in shown.labels
        live = drawn["NEURAL_IK_PT_live"]
        assert "No model yet" not in live.text and live.has_operator("neural_ik.run")
        assert "First hour on your rig" not in shown.text
    finally:
        models.loaded_models.pop(obj.name, None)


def test_live_running(empty_scene, training_state, capfd):
    """A real live session, started the way Run IK starts one (LiveTick + LiveSession in state.live_sessions), ticked
    twice; the panel shows Stop instead of Run IK and the session's own tick time, and Run IK refuses while it runs.
    Stopped, the panel offers Run IK again."""
    import bpy
    from live_helpers import demo_armature, drive_with, random_model

    import neural_ik.state as state
    from neural_ik.blender import models
    from neural_ik.blender.live import session as live_session
    from neural_ik.blender.live.tick import LiveTick
    from neural_ik.blender.rig import rig_model
    from neural_ik.panels.common import format_number
    from neural_ik.panels.main import tick_times_ms
    from neural_ik.properties import get_bone_map

    obj = demo_armature()
    empty_scene.neural_ik.armature = obj
    model = random_model(rig_model.read_rig(obj, get_bone_map(obj)).skeleton)
    drive_with(obj, model)
    try:
        bpy.context.view_layer.objects.active = obj
        bpy.ops.neural_ik.create_targets()
        tick = LiveTick(live_session.live_entries(bpy.context))
        assert tick.live_groups[0].solver.model is model
        tick.start()
        session = live_session.LiveSession(tick)
        state.live_sessions[obj.name] = session
        tick.tick(empty_scene)
        tick.tick(empty_scene)
        drawn = draw_everything(capfd)
        mean, p99, ticks = tick_times_ms(session)
        mean_us, p99_us = tick.timing_us()
        assert ticks == 2 and mean == pytest.approx(mean_us / 1000) and p99 == pytest.approx(p99_us / 1000)
        assert drawn["NEURAL_IK_PT_main"].labels == [f"Live IK running on {obj.name}"]
        live = drawn["NEURAL_IK_PT_live"]
        assert live.has_operator("neural_ik.stop", "Stop") and not live.has_operator("neural_ik.run")
        assert (f"Tick: {format_number(mean, '{:.2f}')} ms mean, {format_number(p99, '{:.2f}')} ms p99" in live.labels
                and "2 ticks" in live.labels)
        assert "Live IK is already running: Esc or Stop ends it" in refusal("run")
        session.stop()
        assert obj.name not in state.live_sessions
        drawn = draw_everything(capfd)
        live = drawn["NEURAL_IK_PT_live"]
        assert live.has_operator("neural_ik.run", "Run IK") and not live.has_operator("neural_ik.stop")
        assert not any(label.startswith("Tick:") for label in live.labels)
        assert drawn["NEURAL_IK_PT_main"].labels == [obj.name]
        assert "Live IK is not running" in refusal("stop")
    finally:
        models.loaded_models.pop(obj.name, None)
        live_session.stop_all("")


# ---- the operators the panels offer ---------------------------------------------------------------------------


def test_operators_have_tooltips_and_say_why_unavailable(empty_scene):
    """Every registered operator has a tooltip, and when its poll refuses in an empty scene it says why."""
    import bpy

    ops = [name for name in dir(bpy.types) if name.startswith("NEURAL_IK_OT_")]
    missing_tooltip, silent_poll = [], []
    for class_name in ops:
        op = getattr(bpy.ops.neural_ik, class_name[len("NEURAL_IK_OT_"):])
        rna = op.get_rna_type()
        if not rna.description.strip() or rna.description.strip() == rna.name:
            missing_tooltip.append(class_name)
        if op.poll():
            continue
        try:
            op()
        except RuntimeError as exc:
            if "context is incorrect" in str(exc):
                silent_poll.append(class_name)
    from neural_ik.panels.lists import MENU_OPERATORS

    unlisted = [n for n in ops if n[len("NEURAL_IK_OT_"):] not in MENU_OPERATORS + ("apply_preset",)]
    assert not unlisted, f"operators missing from the Neural IK menu (so not found by F3): {unlisted}"
    unregistered = [n for n in MENU_OPERATORS + ("apply_preset",) if "NEURAL_IK_OT_" + n not in ops]
    assert not unregistered, f"operators the menus offer that are not registered: {unregistered}"
    assert not missing_tooltip, f"operators without a tooltip: {missing_tooltip}"
    assert not silent_poll, f"operators whose poll fails without saying why: {silent_poll}"


def test_harness_sees_what_blender_prints(empty_scene, capfd):
    """The stderr check is not vacuous: a missing property and an exception inside a UIList's draw_item (which
    template_list calls while the layout is built) both show up."""
    import bpy

    class NEURAL_IK_UL_test_failing(bpy.types.UIList):
        def draw_item(self, context, layout, data, item, icon, active_data, active_propname, index=0, flt_flag=0):
            raise ValueError("draw_item ran")

    bpy.utils.register_class(NEURAL_IK_UL_test_failing)
    try:
        bpy.data.objects.new("Probe", None)
        capfd.readouterr()
        with sidebar_layout() as (context, popup):
            popup.layout.prop(context.scene, "no_such_property")
            popup.layout.template_list("NEURAL_IK_UL_test_failing", "", bpy.data, "objects",
                                       context.scene, "frame_current")
        captured = capfd.readouterr()
        err = captured.out + captured.err
    finally:
        bpy.utils.unregister_class(NEURAL_IK_UL_test_failing)
    assert "no_such_property" in err and BLENDER_UI_ERRORS.search(err)
    assert "draw_item ran" in err


def test_a_typo_in_an_operator_or_its_property_fails_the_draw(empty_scene, capfd):
    """panels.common.operator fills the properties it is given and raises on a name that does not exist (Blender
    itself would only print an unknown operator and draw nothing), so a typo in a panel cannot draw a quiet button."""
    from neural_ik.panels.common import operator

    with sidebar_layout() as (context, popup):
        props = operator(popup.layout, "bake", text="Bake", source_action="walk", frame_start=3, frame_end=None)
        assert props.source_action == "walk" and props.frame_start == 3
        assert props.frame_end == type(props).bl_rna.properties["frame_end"].default       # None: the default
        with pytest.raises(AttributeError, match="source_actoin"):
            operator(popup.layout, "bake", text="Bake", source_actoin="walk")
        with pytest.raises(AttributeError, match="neural_ik.bakee is not registered"):
            operator(popup.layout, "bakee", text="Bake")
    capfd.readouterr()


def draw_live_box(armature):
    """Drawn: what the Live panel draws for `armature`, read back from its real layout."""
    import neural_ik.panels.main as main

    with sidebar_layout("live box") as (context, popup):
        context.scene.neural_ik.armature = armature
        main.NEURAL_IK_PT_live.draw(popup, context)
        return Drawn("live box", popup.layout.introspect())


def test_live_box_shows_each_targets_source_its_influences_the_ground_and_lock_feet(empty_scene, training_state,
                                                                                     capfd):
    """The Live box says where each target comes from (empty, action, blend; no empty and no action either) and
    draws its two influences as fields (keyable with I), the Ground object and collection and Lock Feet: with the
    armature's action, without one, and while live (the action is off the armature then, the session follows it)."""
    import bpy
    from live_helpers import demo_armature, follow_empties, random_model

    import neural_ik.state as state
    from neural_ik.blender import models
    from neural_ik.blender.live import session as live_session
    from neural_ik.blender.live.motion import LAYER_SLOTS
    from neural_ik.blender.live.tick import LiveTick
    from neural_ik.blender.rig import rig_model
    from neural_ik.properties import get_bone_map

    obj = demo_armature()
    action = obj.animation_data.action
    assert action is not None                   # the demo rig plays its first clip
    empty_scene.neural_ik.armature = obj
    settings = obj.neural_ik
    labels = {"root": "Root", "left_hand": "Left hand", "right_hand": "Right hand", "left_foot": "Left foot",
              "right_foot": "Right foot", "head": "Head"}

    def sources(drawn):
        return dict(label.split(": ") for label in drawn.labels if label.split(": ")[0] in labels.values())

    drawn = draw_live_box(obj)
    assert f"Targets over {action.name}" in drawn.labels
    assert sources(drawn) == dict.fromkeys(labels.values(), "action")       # no empties yet: all from the action
    # each target's two influences as fields, in the targets' rows; the ground and Lock Feet
    assert drawn.properties.count("NIK_TargetLayer.position") == len(LAYER_SLOTS)
    assert drawn.properties.count("NIK_TargetLayer.rotation") == len(LAYER_SLOTS)
    for name in ("ground_object", "ground_collection", "lock_feet"):
        assert f"NIK_ObjectSettings.{name}" in drawn.properties

    bpy.context.view_layer.objects.active = obj
    assert bpy.ops.neural_ik.create_targets() == {"FINISHED"}
    assert sources(draw_live_box(obj)) == dict.fromkeys(labels.values(), "empty")     # the targets it made drive
    follow_empties(obj, 0.0, 0.0)
    settings.layer_right_hand.position = settings.layer_right_hand.rotation = 1.0
    settings.layer_left_hand.position = 0.5
    assert sources(draw_live_box(obj)) == {**dict.fromkeys(labels.values(), "action"), "Right hand": "empty",
                                           "Left hand": "blend"}
    bpy.data.objects.remove(settings.target_head)
    obj.animation_data.action = None
    drawn = draw_live_box(obj)
    assert "Targets (no action: the empties drive)" in drawn.labels
    assert sources(drawn) == {**dict.fromkeys(labels.values(), "empty"), "Head": "no empty"}
    draw_everything(capfd)

    obj.animation_data.action = action          # live: the session takes the action off and follows it
    models.loaded_models[obj.name] = ("", random_model(rig_model.read_rig(obj, get_bone_map(obj)).skeleton), None)
    try:
        tick = LiveTick(live_session.live_entries(bpy.context))
        tick.start()
        state.live_sessions[obj.name] = live_session.LiveSession(tick)
        tick.tick(empty_scene)
        assert obj.animation_data.action is None
        drawn = draw_live_box(obj)
        assert f"Targets over {action.name}" in drawn.labels
        assert sources(drawn) == {**dict.fromkeys(labels.values(), "action"), "Right hand": "empty",
                                   "Left hand": "blend", "Head": "action"}
        draw_everything(capfd)
    finally:
        models.loaded_models.pop(obj.name, None)
        live_session.stop_all("")
