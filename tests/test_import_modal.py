"""Import BVH Folder in Blender's window: the modal runner (one file per TIMER event, progress, Esc) driven with
stand-in context and events, since timers never fire in the bpy module. Real Blender, on BVH files written from the
demo rig by Blender's exporter (tests/demo_bvh.py)."""

import types

import numpy as np
from test_rig_io import gather


class StandInWindowManager:
    """Records what the runner asks of the window manager (the real one's timers never fire here)."""

    def __init__(self):
        self.progress, self.timers, self.handlers, self.ended = [], [], [], 0

    def progress_begin(self, low, high):
        self.progress.append(("begin", low, high))

    def progress_update(self, value):
        self.progress.append(("update", value))

    def progress_end(self):
        self.ended += 1

    def event_timer_add(self, seconds, window=None):
        timer = object()
        self.timers.append(timer)
        return timer

    def event_timer_remove(self, timer):
        self.timers.remove(timer)

    def modal_handler_add(self, operator):
        self.handlers.append(operator)


class StandInWorkspace:
    def __init__(self):
        self.texts = []

    def status_text_set(self, text):
        self.texts.append(text)


class StandInContext:
    """The real context for scene, objects and view layer; stand-ins for the window manager and status bar."""

    def __init__(self):
        self.window_manager, self.workspace, self.window = StandInWindowManager(), StandInWorkspace(), None

    def __getattr__(self, name):
        import bpy

        return getattr(bpy.context, name)


def _runner(folder):
    from neural_ik.operators.data import BvhImportRunner

    class Runner(BvhImportRunner):
        def __init__(self):
            self.directory, self.global_scale, self.files, self.exclude, self.onto_active = str(folder), 0.01, "", "", False
            self.reports = []

        def report(self, levels, text):
            self.reports.append((next(iter(levels)), text))

    return Runner()


TIMER, ESC = types.SimpleNamespace(type="TIMER"), types.SimpleNamespace(type="ESC")


def _folder(tmp_path, files):
    folder = gather(tmp_path, files.folder, files.files[:3])
    (folder / "cut.bvh").write_text("HIERARCHY\nROOT Hips\n{\n")     # sorted first: a skipped file before the rest
    return folder


def _actions():
    """Every action's name and keyframe values, as plain data (survives loading a new scene)."""
    import bpy

    result = {}
    for action in bpy.data.actions:
        from neural_ik.blender.rig import action_layouts

        curves = action_layouts.action_fcurves(action, action_layouts.action_slot_for_any(action))
        values = []
        for fc in sorted(curves, key=lambda c: (c.data_path, c.array_index)):
            buf = np.empty(2 * len(fc.keyframe_points), np.float32)
            fc.keyframe_points.foreach_get("co", buf)
            values.append(buf)
        result[action.name] = np.concatenate(values)
    return result


def test_modal_import_gives_the_synchronous_result(demo_bvh, empty_scene, tmp_path):
    import bpy

    from neural_ik.blender.workflows.bvh_import import import_bvh_files, import_messages

    folder = _folder(tmp_path, demo_bvh)
    FILES = demo_bvh.files[:3]
    # run_modal as the file browser sets it: in background mode (the bpy module) the operator still runs synchronously
    assert bpy.ops.neural_ik.import_bvh_folder(directory=str(folder), global_scale=0.01, run_modal=True) == {"FINISHED"}
    sync_actions = _actions()
    assert sorted(sync_actions) == sorted(f[:-4] for f in FILES)
    for o in list(bpy.data.objects):
        bpy.data.objects.remove(o)
    for a in list(bpy.data.actions):
        bpy.data.actions.remove(a)
    sync_messages = import_messages(*import_bvh_files(bpy.context, str(folder), 0.01))
    assert sync_messages[0][0] == "WARNING" and "cut.bvh" in sync_messages[0][1]

    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    context, runner = StandInContext(), _runner(folder)
    assert runner.invoke(context, None) == {"RUNNING_MODAL"}
    wm = context.window_manager
    assert wm.handlers == [runner] and len(wm.timers) == 1 and wm.progress == [("begin", 0, 4)]
    assert runner.modal(context, types.SimpleNamespace(type="MOUSEMOVE")) == {"PASS_THROUGH"}
    results = [runner.modal(context, TIMER) for _ in range(4)]
    assert results == [{"RUNNING_MODAL"}] * 3 + [{"FINISHED"}]               # one file per TIMER event
    assert wm.progress[1:] == [("update", i) for i in range(1, 5)] and wm.ended == 1 and wm.timers == []
    assert [t for t in context.workspace.texts if t][0].startswith("Importing BVH: file 1 of 4 (cut.bvh)")
    assert "file 4 of 4" in [t for t in context.workspace.texts if t][-1] and context.workspace.texts[-1] is None

    assert runner.reports == sync_messages
    modal_actions = _actions()
    assert sorted(modal_actions) == sorted(sync_actions)
    for name, values in sync_actions.items():        # retargeted clips included: the same keys to the last bit
        np.testing.assert_array_equal(modal_actions[name], values)
    armatures = [o for o in bpy.data.objects if o.type == "ARMATURE"]
    assert len(bpy.data.objects) == 1 and len(armatures) == 1
    assert bpy.context.scene.neural_ik.armature == armatures[0] and bpy.context.view_layer.objects.active == armatures[0]


def test_escape_keeps_the_first_file_and_leaves_nothing_stray(demo_bvh, empty_scene, tmp_path):
    import bpy

    from neural_ik.blender.workflows.bvh_import import _data_snapshot

    FILES = demo_bvh.files[:3]
    folder = gather(tmp_path, demo_bvh.folder, FILES)
    first = sorted(FILES)[0]
    context, runner = StandInContext(), _runner(folder)
    assert runner.invoke(context, None) == {"RUNNING_MODAL"}
    assert runner.modal(context, TIMER) == {"RUNNING_MODAL"}
    assert [a.name for a in bpy.data.actions] == [first[:-4]]

    # a file caught half way (its temporary armature already in): a real import after the step's snapshot
    runner.importer._pending = _data_snapshot()
    bpy.ops.import_anim.bvh(filepath=str(folder / sorted(FILES)[1]), global_scale=0.01)
    assert len(bpy.data.objects) == 2 and len(bpy.data.actions) == 2

    assert runner.modal(context, ESC) == {"FINISHED"}          # something was imported: it gets an undo step
    assert [a.name for a in bpy.data.actions] == [first[:-4]] and bpy.data.actions[0].use_fake_user
    assert [o.type for o in bpy.data.objects] == ["ARMATURE"] and len(bpy.data.armatures) == 1
    rig = bpy.data.objects[0]
    assert rig.animation_data.action.name == first[:-4]
    assert bpy.context.scene.neural_ik.armature == rig
    assert runner.reports == [("WARNING", f"import cancelled after 1 of 3 files; kept 1 actions on {rig.name!r}")]
    wm = context.window_manager
    assert wm.timers == [] and wm.ended == 1 and context.workspace.texts[-1] is None


def test_escape_before_any_file_changes_nothing(demo_bvh, empty_scene, tmp_path):
    import bpy

    context, runner = StandInContext(), _runner(gather(tmp_path, demo_bvh.folder, demo_bvh.files[:1]))
    assert runner.invoke(context, None) == {"RUNNING_MODAL"}
    assert runner.modal(context, ESC) == {"CANCELLED"}
    assert len(bpy.data.objects) == 0 and len(bpy.data.actions) == 0
    assert runner.reports == [("WARNING", "import cancelled after 0 of 1 files; nothing was imported")]
