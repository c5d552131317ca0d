"""Evaluate in Blender's window: the modal runner (one clip per TIMER event, a progress bar, Esc) driven with stand-in
context and events, since timers never fire in the bpy module. Real Blender, the demo rig and the shipped model."""

import json
import os

import numpy as np
from conftest import REPO
from test_import_modal import ESC, TIMER, StandInContext

MODEL = os.path.join(REPO, "weights", "demo.npz")
ACTIONS = ("idle_stand_01", "walk_normal_03", "crouch_deep_03")


def _runner(settings):
    from neural_ik.operators.evaluate import EvaluateRunner

    class Runner(EvaluateRunner):
        def __init__(self):
            self.reports = []

        def settings(self):
            return dict(settings)

        def report(self, levels, text):
            self.reports.append((next(iter(levels)), text))

    return Runner()


def _demo_scene():
    """The demo rig (seed 1: motion the shipped model never saw) with its first action assigned and frame 7 set."""
    import bpy

    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    assert bpy.ops.neural_ik.create_demo_rig(seed=1) == {"FINISHED"}
    rig = bpy.context.scene.neural_ik.armature
    names = [a.name for a in bpy.data.actions]
    assert all(name in names for name in ACTIONS), names
    bpy.context.scene.frame_set(7)
    return rig


def _state(rig):
    import bpy

    return (sorted(a.name for a in bpy.data.actions), rig.animation_data.action.name, bpy.context.scene.frame_current,
            rig.neural_ik.model_path)


def _settings(rig, tmp_path, name):
    return {"armature": rig.name, "actions": ",".join(ACTIONS), "model_path": MODEL, "refine_iterations": 2,
            "baseline": False, "poles": False, "json_path": str(tmp_path / name)}


def test_modal_evaluation_gives_the_synchronous_result(empty_scene, tmp_path):
    import bpy

    rig = _demo_scene()
    before = _state(rig)
    settings = _settings(rig, tmp_path, "sync.json")
    assert bpy.ops.neural_ik.evaluate(**settings) == {"FINISHED"}
    sync = json.loads((tmp_path / "sync.json").read_text())
    assert _state(rig) == before

    context, runner = StandInContext(), _runner(_settings(rig, tmp_path, "modal.json"))
    assert runner.start_evaluation(context) == {"RUNNING_MODAL"}
    wm = context.window_manager
    assert wm.handlers == [runner] and len(wm.timers) == 1 and wm.progress == [("begin", 0, 3)]
    assert runner.modal(context, type("Event", (), {"type": "MOUSEMOVE"})) == {"PASS_THROUGH"}
    results = [runner.modal(context, TIMER) for _ in ACTIONS]
    assert results == [{"RUNNING_MODAL"}] * 2 + [{"FINISHED"}]             # one clip per TIMER event
    assert wm.progress[1:] == [("update", i) for i in (1, 2, 3)] and wm.ended == 1 and wm.timers == []
    texts = [t for t in context.workspace.texts if t]
    assert texts[0] == f"Evaluating: clip 1 of 3 ({ACTIONS[0]}), Esc to cancel" and "clip 3 of 3" in texts[-1]
    assert context.workspace.texts[-1] is None
    assert runner.reports[-1][0] == "INFO" and runner.reports[-1][1].startswith("Evaluated 3 clips")

    modal = json.loads((tmp_path / "modal.json").read_text())
    assert [c["name"] for c in modal["clips"]] == list(ACTIONS) == [c["name"] for c in sync["clips"]]
    for method in ("network", "refined"):
        for key in ("mpjpe_cm", "inner_mpjpe_cm"):
            np.testing.assert_allclose(modal["results"][method][key], sync["results"][method][key], rtol=1e-9)
        np.testing.assert_allclose(modal["results"][method]["effector_cm"]["mean"],
                                   sync["results"][method]["effector_cm"]["mean"], rtol=1e-9)
    assert _state(rig) == before                 # no baked action left, the user's action, frame and model back


def test_escape_stops_writes_nothing_and_puts_the_scene_back(empty_scene, tmp_path):
    rig = _demo_scene()
    rig.neural_ik.model_path = ""
    before = _state(rig)
    context, runner = StandInContext(), _runner(_settings(rig, tmp_path, "out.json"))
    assert runner.start_evaluation(context) == {"RUNNING_MODAL"}
    assert runner.modal(context, TIMER) == {"RUNNING_MODAL"}
    assert runner.modal(context, ESC) == {"CANCELLED"}
    assert runner.reports == [("WARNING", "evaluation cancelled after 1 of 3 clips; nothing was written")]
    assert not (tmp_path / "out.json").exists()
    assert _state(rig) == before
    wm = context.window_manager
    assert wm.timers == [] and wm.ended == 1 and context.workspace.texts[-1] is None


def test_bad_settings_never_start_the_modal(empty_scene, tmp_path):
    rig = _demo_scene()
    before = _state(rig)
    context, runner = StandInContext(), _runner(dict(_settings(rig, tmp_path, "out.json"), actions="nope"))
    assert runner.start_evaluation(context) == {"CANCELLED"}
    assert runner.reports == [("ERROR", f"no action of {rig.name!r} matches 'nope'")]
    assert context.window_manager.handlers == [] and context.window_manager.timers == []
    assert _state(rig) == before and not (tmp_path / "out.json").exists()


def test_a_bvh_folder_with_a_model_is_imported_a_file_per_step_then_evaluated(empty_scene, demo_bvh, tmp_path):
    """With a model and a BVH folder the clips go onto the model's armature first, one file per TIMER event (the
    window stays responsive and Esc works from the start), then one clip per event; the same figures as the
    synchronous run, and the imported clips leave with the run. Esc during the import undoes it too."""
    import bpy

    rig = _demo_scene()
    before = _state(rig)
    files = ",".join(name[:-4] for name in demo_bvh.files[:2])
    settings = dict(_settings(rig, tmp_path, "sync.json"), actions="", bvh_folder=demo_bvh.folder, files=files)
    assert bpy.ops.neural_ik.evaluate(**settings) == {"FINISHED"}
    sync = json.loads((tmp_path / "sync.json").read_text())
    assert _state(rig) == before

    context, runner = StandInContext(), _runner(dict(settings, json_path=str(tmp_path / "modal.json")))
    assert runner.start_evaluation(context) == {"RUNNING_MODAL"}
    assert _state(rig) == before                               # nothing imported before the first TIMER event
    wm = context.window_manager
    assert wm.progress == [("begin", 0, 4)]                     # two files, then (about) as many clips
    assert runner.modal(context, TIMER) == {"RUNNING_MODAL"}    # the first file
    texts = [t for t in context.workspace.texts if t]
    assert texts[0].startswith("Evaluating: importing file 1 of 2") and "importing file 2 of 2" in texts[-1]
    results = [runner.modal(context, TIMER) for _ in range(3)]
    assert results == [{"RUNNING_MODAL"}] * 2 + [{"FINISHED"}]
    assert wm.progress[1:] == [("update", i) for i in (1, 2, 3, 4)] and wm.timers == []
    modal = json.loads((tmp_path / "modal.json").read_text())
    assert [c["name"] for c in modal["clips"]] == [c["name"] for c in sync["clips"]] and len(modal["clips"]) == 2
    np.testing.assert_allclose(modal["results"]["refined"]["inner_mpjpe_cm"],
                               sync["results"]["refined"]["inner_mpjpe_cm"], rtol=1e-9)
    assert _state(rig) == before

    context, runner = StandInContext(), _runner(dict(settings, json_path=str(tmp_path / "esc.json")))
    assert runner.start_evaluation(context) == {"RUNNING_MODAL"}
    assert runner.modal(context, TIMER) == {"RUNNING_MODAL"}    # one file imported onto the rig
    assert len(bpy.data.actions) == len(before[0]) + 1
    assert runner.modal(context, ESC) == {"CANCELLED"}
    assert not (tmp_path / "esc.json").exists() and _state(rig) == before
