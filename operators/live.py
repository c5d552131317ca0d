"""Live IK operators: load_model, export_onnx, create_targets, run (modal), stop, bake.

Thin shells: they gather the armature and their settings, call one function of blender/ (models: load and export;
live_session: targets, sessions; bake: the bake) and report in plain words. The Run operator's timer plumbing lives
in `LiveRunner`, a plain class the operator inherits, so a test can drive invoke()/modal() with stand-in context and
event objects (timers never fire in the bpy module).
"""

import os
import time

import bpy
from bpy.app.handlers import persistent
from bpy.props import BoolProperty, IntProperty, StringProperty

from .. import state
from ..blender.errors import LiveError
from ..blender.live.session import place_targets, start_session, stop_all
from ..blender.live.tick import LiveStopped
from ..blender.models import export_model, forget_models, load_model
from ..blender.rig import rig_model
from ..blender.rig.armatures import armature_to_use
from ..blender.workflows.bake import bake
from ..neural_network.data.files import FileRefused
from .common import cancelled, poll_armature


class NEURAL_IK_OT_load_model(bpy.types.Operator):
    """Load a checkpoint (.npz) or ONNX model as the active armature's model (refused if made for another rig)"""
    bl_idname = "neural_ik.load_model"
    bl_label = "Load Model"
    bl_options = {"REGISTER", "UNDO"}

    filepath: StringProperty(subtype="FILE_PATH")
    filter_glob: StringProperty(default="*.npz;*.onnx", options={"HIDDEN"})

    @classmethod
    def poll(cls, context):
        return poll_armature(cls, context)

    def invoke(self, context, _event):
        context.window_manager.fileselect_add(self)
        return {"RUNNING_MODAL"}

    def execute(self, context):
        try:
            obj = armature_to_use(context, LiveError)
            path = load_model(obj, self.filepath)
        except LiveError as exc:
            return cancelled(self, exc)
        self.report({"INFO"}, f"{os.path.basename(path)} now drives {obj.name}")
        return {"FINISHED"}


class NEURAL_IK_OT_export_onnx(bpy.types.Operator):
    """Export the active armature's model as one ONNX file (opset 17) with a JSON sidecar for game engines"""
    bl_idname = "neural_ik.export_onnx"
    bl_label = "Export ONNX"
    bl_options = {"REGISTER"}

    filepath: StringProperty(subtype="FILE_PATH")
    filter_glob: StringProperty(default="*.onnx", options={"HIDDEN"})

    @classmethod
    def poll(cls, context):
        return poll_armature(cls, context)

    def invoke(self, context, _event):
        if not self.filepath:
            self.filepath = "neural_ik.onnx"
        context.window_manager.fileselect_add(self)
        return {"RUNNING_MODAL"}

    def execute(self, context):
        try:
            onnx_path, side = export_model(armature_to_use(context, LiveError), self.filepath)
        except LiveError as exc:
            return cancelled(self, exc)
        self.report({"INFO"}, f"wrote {os.path.basename(onnx_path)} and {os.path.basename(side)}")
        return {"FINISHED"}


class NEURAL_IK_OT_create_targets(bpy.types.Operator):
    """Create six empties (root, hands, feet, head) on the rig's current pose, in their own collection"""
    bl_idname = "neural_ik.create_targets"
    bl_label = "Create Targets"
    bl_options = {"REGISTER", "UNDO"}

    @classmethod
    def poll(cls, context):
        return poll_armature(cls, context)

    def execute(self, context):
        try:
            obj = armature_to_use(context, LiveError)
            collection = place_targets(context, obj)
        except LiveError as exc:
            return cancelled(self, exc)
        self.report({"INFO"}, f"placed 6 targets for {obj.name} in collection {collection.name!r}")
        return {"FINISHED"}


# ---- live sessions -----------------------------------------------------------------------------------------------

class LiveRunner:
    """The Run IK modal logic, without bpy.types.Operator (so tests can drive it with stand-in objects)."""
    session = None
    timer = None
    last_tick = 0.0

    def start_session(self, context):
        try:
            self.session = start_session(context)
        except (LiveError, LiveStopped, rig_model.RigError, FileRefused) as exc:
            return cancelled(self, exc)
        rate = context.scene.neural_ik.live_rate
        wm = context.window_manager
        self.timer = wm.event_timer_add(1.0 / rate, window=context.window)
        self.session.timer = self.timer
        wm.modal_handler_add(self)
        self.report({"INFO"}, f"live IK on {', '.join(self.session.names)}: Esc to stop")
        return {"RUNNING_MODAL"}

    def invoke(self, context, _event):
        return self.start_session(context)

    def modal(self, context, event):
        session = self.session
        if session is None or session.stopped:
            return self.finish(context, session.stop_reason if session else "")
        if event.type == "ESC":
            session.stop("")
            return self.finish(context, "")
        if context.mode.startswith("EDIT"):   # Edit Mode rebuilds the bones live mode holds: stop before it does
            session.stop("live IK stopped: Edit Mode changes the bones it drives")
            return self.finish(context, session.stop_reason)
        if event.type == "TIMER":   # other timers' events arrive too: keep to the configured rate
            now = time.perf_counter()
            if now - self.last_tick < 0.8 / max(context.scene.neural_ik.live_rate, 1.0):
                return {"PASS_THROUGH"}
            self.last_tick = now
            try:
                session.tick.tick(context.scene)
            except LiveStopped as exc:
                session.stop(str(exc))
                return self.finish(context, str(exc))
            except Exception as exc:   # never leave a half-driven rig behind a traceback
                session.stop(f"live IK stopped: {type(exc).__name__}: {exc}")
                return self.finish(context, session.stop_reason)
            return {"RUNNING_MODAL"}
        return {"PASS_THROUGH"}

    def finish(self, context, reason):
        if self.timer is not None:
            context.window_manager.event_timer_remove(self.timer)
            self.timer = None
        if reason:
            self.report({"WARNING"}, reason)
        else:
            self.report({"INFO"}, "live IK stopped; the pose and action are as they were")
        return {"CANCELLED"}


class NEURAL_IK_OT_run(LiveRunner, bpy.types.Operator):
    """Drive the rig live from its target empties (every armature with a model and targets); Esc stops"""
    bl_idname = "neural_ik.run"
    bl_label = "Run IK"
    bl_options = {"REGISTER"}

    @classmethod
    def poll(cls, context):
        if state.live_sessions:
            cls.poll_message_set("Live IK is already running: Esc or Stop ends it")
            return False
        return poll_armature(cls, context)

    def execute(self, _context):
        self.report({"ERROR"}, "Run IK needs Blender's window (it runs on a timer); use Bake to solve a frame range")
        return {"CANCELLED"}


class NEURAL_IK_OT_stop(bpy.types.Operator):
    """Stop live IK and put the pose and action back"""
    bl_idname = "neural_ik.stop"
    bl_label = "Stop"
    bl_options = {"REGISTER"}

    @classmethod
    def poll(cls, context):
        if not state.live_sessions:
            cls.poll_message_set("Live IK is not running")
            return False
        return True

    def execute(self, _context):
        if not state.live_sessions:
            self.report({"INFO"}, "live IK is not running")
            return {"CANCELLED"}
        stop_all("")
        self.report({"INFO"}, "live IK stopped")
        return {"FINISHED"}


# ---- bake -------------------------------------------------------------------------------------------------------

class NEURAL_IK_OT_bake(bpy.types.Operator):
    """Solve every frame of a range and write a new action '<source>.nik' (targets from the empties or an action)

    From an action, the hips and the unmapped in-between bones (a pelvis between the hips and the thighs) are given:
    the solve's FK uses their pose per frame and the new action keys them with the source's values. From the
    empties, in-between bones stay in the armature's current pose, which the solve takes as it is."""
    bl_idname = "neural_ik.bake"
    bl_label = "Bake"
    bl_options = {"REGISTER", "UNDO"}

    source_action: StringProperty(name="Source Action", description="Re-solve this action's effectors (empty: the "
                                  "target empties)")
    frame_start: IntProperty(name="Start", default=0, description="First frame (0: the source's first frame or the "
                             "scene's start)")
    frame_end: IntProperty(name="End", default=0, description="Last frame (0: the source's last or the scene's end)")
    refine_iterations: IntProperty(name="Refinement", min=0, max=50, default=4,
                                   description="Least-squares iterations that make effectors land exactly (0: none)")
    lock_feet: BoolProperty(name="Lock Feet", default=False,
                            description="Hold each planted foot where it landed (position and heading) for its whole "
                            "contact; contacts are found in the targets' own motion")

    @classmethod
    def poll(cls, context):
        return poll_armature(cls, context)

    def execute(self, context):
        try:
            obj = armature_to_use(context, LiveError)
            _action, summary = bake(context, obj, self.source_action, self.frame_start, self.frame_end,
                                    self.refine_iterations, lock_feet=self.lock_feet)
        except LiveError as exc:
            return cancelled(self, exc)
        self.report({"INFO"}, summary)
        return {"FINISHED"}


# ---- registration: stop cleanly on undo, redo, file load, unregister --------------------------------------------

@persistent
def _stop_on_undo(*_args):
    if state.live_sessions:
        stop_all("live IK stopped: undo or redo changes the scene under it")


@persistent
def _stop_on_load(*_args):
    if state.live_sessions:
        stop_all("live IK stopped: a file is being loaded")
    forget_models()


HANDLERS = (("undo_pre", _stop_on_undo), ("redo_pre", _stop_on_undo), ("load_pre", _stop_on_load))


def register_extra():
    for name, handler in HANDLERS:
        handlers = getattr(bpy.app.handlers, name)
        if handler not in handlers:
            handlers.append(handler)


def unregister_extra():
    stop_all("live IK stopped: the add-on was disabled")
    for name, handler in HANDLERS:
        handlers = getattr(bpy.app.handlers, name)
        while handler in handlers:
            handlers.remove(handler)


classes = (NEURAL_IK_OT_load_model, NEURAL_IK_OT_export_onnx, NEURAL_IK_OT_create_targets, NEURAL_IK_OT_run,
           NEURAL_IK_OT_stop, NEURAL_IK_OT_bake)
