"""Live IK operators: load_model, export_onnx, create_targets, run (modal), stop, bake.

Thin shells: they gather the armature, its bone map and its model, call blender/ (the live tick, reading and
writing rigs) or the core, and report in plain words. The modal logic lives in `LiveRunner`, a plain class the Run
operator inherits, so a test can drive invoke()/modal()
with stand-in context and event objects (timers never fire in the bpy module).
"""

import os
import time

import bpy
import numpy as np
from bpy.app.handlers import persistent
from bpy.props import IntProperty, StringProperty

from .. import state
from ..blender import pose_read, pose_write, rig_model
from ..blender.live import TARGET_LABELS, TARGET_SLOTS, LiveCharacter, LiveStopped, LiveTick, missing_targets
from ..neural_network.data.features import detect_contacts
from ..neural_network.data.files import FileRefused
from ..neural_network.runtime.onnx_export import check_rig, export_onnx, load_model_file
from ..neural_network.runtime.solver import Solver
from ..neural_network.runtime.status import describe
from ..neural_network.skeleton.roles import EFFECTOR_ROLES, FOOT_ROLES, ROLE_INDEX, TASKS, task_from_name
from ..properties import get_bone_map
from .common import poll_armature

# Models loaded for armatures in this Blender session: {object name: (path, Model, onnx bytes or None)}.
loaded_models = {}


class LiveError(Exception):
    """Bad input for a live operator, with the message for the user."""


def armature_of(context):
    obj = context.active_object
    if obj is None or obj.type != "ARMATURE":
        obj = context.scene.neural_ik.armature
    if obj is None:
        raise LiveError("select an armature first")
    if obj.type != "ARMATURE":
        raise LiveError(f"{obj.name!r} is not an armature")
    if obj.mode == "EDIT":
        raise LiveError(f"{obj.name!r} is in Edit Mode: switch to Object or Pose Mode first")
    return obj


def rig_of(obj):
    try:
        return rig_model.read_rig(obj, get_bone_map(obj))
    except rig_model.RigError as exc:
        raise LiveError(str(exc)) from None


def model_key(path):
    """What identifies a loaded model file: its path and its modification time and size, so a model retrained to the
    same path is read again; "" for no file."""
    if not path:
        return ""
    try:
        info = os.stat(path)
    except OSError:
        return os.path.abspath(path)
    return f"{os.path.abspath(path)}|{info.st_mtime_ns}|{info.st_size}"


def model_of(obj, rig=None):
    """(Model, onnx bytes) for an armature: cached, or loaded from its model path and checked against its rig."""
    path = bpy.path.abspath(obj.neural_ik.model_path) if obj.neural_ik.model_path else ""
    key = model_key(path)
    cached = loaded_models.get(obj.name)
    if cached and cached[0] == key:     # same file, unchanged since it was loaded (or a model given in memory, key "")
        model, data = cached[1], cached[2]
    elif path:
        try:
            model, data = load_model_file(path)
        except FileRefused as exc:
            raise LiveError(str(exc)) from None
        loaded_models[obj.name] = (key, model, data)
    else:
        raise LiveError(f"{obj.name} has no model: train one or use Load Model")
    try:
        check_rig(model, (rig or rig_of(obj)).skeleton, f"the model of {obj.name}")
    except FileRefused as exc:
        raise LiveError(str(exc)) from None
    return model, data


def _cancel(op, exc):
    op.report({"ERROR"}, str(exc))
    return {"CANCELLED"}


class NIK_OT_load_model(bpy.types.Operator):
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
            obj = armature_of(context)
            rig = rig_of(obj)
            if not self.filepath:
                raise LiveError("choose a model file (.npz checkpoint or .onnx)")
            path = bpy.path.abspath(self.filepath)
            model, data = load_model_file(path, rig.skeleton)
        except (LiveError, FileRefused) as exc:
            return _cancel(self, exc)
        loaded_models[obj.name] = (model_key(path), model, data)
        obj.neural_ik.model_path = path
        self.report({"INFO"}, f"{os.path.basename(path)} now drives {obj.name}")
        return {"FINISHED"}


class NIK_OT_export_onnx(bpy.types.Operator):
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
            obj = armature_of(context)
            model, _data = model_of(obj)
            if not self.filepath:
                raise LiveError("choose where to write the .onnx file")
            path = bpy.path.abspath(self.filepath)
            if not path.lower().endswith(".onnx"):
                path += ".onnx"
            onnx_path, side = export_onnx(model, path)
        except (LiveError, FileRefused) as exc:
            return _cancel(self, exc)
        except OSError as exc:
            return _cancel(self, f"could not write {self.filepath}: {exc.strerror or exc}")
        self.report({"INFO"}, f"wrote {os.path.basename(onnx_path)} and {os.path.basename(side)}")
        return {"FINISHED"}


class NIK_OT_create_targets(bpy.types.Operator):
    """Create six empties (root, hands, feet, head) on the rig's current pose, in their own collection"""
    bl_idname = "neural_ik.create_targets"
    bl_label = "Create Targets"
    bl_options = {"REGISTER", "UNDO"}

    @classmethod
    def poll(cls, context):
        return poll_armature(cls, context)

    def execute(self, context):
        try:
            obj = armature_of(context)
            rig = rig_of(obj)
        except LiveError as exc:
            return _cancel(self, exc)
        matrices = pose_read.armature_pose_matrices(obj, rig)
        world = np.array(obj.matrix_world, np.float64)
        roles = [ROLE_INDEX["Hips"]] + list(EFFECTOR_ROLES)
        collection_name = f"{obj.name} IK Targets"
        collection = bpy.data.collections.get(collection_name)
        if collection is None:
            collection = bpy.data.collections.new(collection_name)
            context.scene.collection.children.link(collection)
        size = 0.06 * rig.skeleton.height / max(rig.scale, 1e-9)
        settings = obj.neural_ik
        for slot, label, role in zip(TARGET_SLOTS, TARGET_LABELS, roles):
            m = world @ matrices[role]
            m[:3, :3] /= np.linalg.norm(m[:3, :3], axis=0)
            empty = getattr(settings, slot)
            if empty is None:
                empty = bpy.data.objects.new(f"{obj.name} {label} target", None)
                empty.empty_display_type = "PLAIN_AXES" if role else "CIRCLE"
                collection.objects.link(empty)
                setattr(settings, slot, empty)
            empty.empty_display_size = size * (4 if role == 0 else 1)
            empty.matrix_world = _matrix(m)
        self.report({"INFO"}, f"placed 6 targets for {obj.name} in collection {collection.name!r}")
        return {"FINISHED"}


def _matrix(m):
    from mathutils import Matrix

    return Matrix(np.asarray(m).tolist())


# ---- live sessions -----------------------------------------------------------------------------------------------

class LiveSession:
    """A running Run IK: the tick, why it stopped, and the timer. Kept in state.live_sessions for the panel."""

    def __init__(self, tick):
        self.tick = tick
        self.stop_reason = ""
        self.stopped = False
        self.timer = None

    @property
    def names(self):
        return [c.name for c in self.tick.characters]

    def stop(self, reason=""):
        if self.stopped:
            return
        self.stopped = True
        self.stop_reason = reason
        self.tick.stop()
        for name in self.names:
            if state.live_sessions.get(name) is self:
                del state.live_sessions[name]

    def timing_us(self):
        return self.tick.timing_us()

    def tick_stats(self):
        """Tick time for the panel: mean and p99 in microseconds (and milliseconds), and the tick count."""
        mean, p99 = self.tick.timing_us()
        return {"mean_us": mean, "p99_us": p99, "mean_ms": mean / 1000, "p99_ms": p99 / 1000,
                "ticks": len(self.tick.times), "status": self.tick.messages()}


def stop_all(reason):
    for session in {id(s): s for s in state.live_sessions.values()}.values():
        session.stop(reason)


def live_entries(context):
    """Every armature of the scene with a usable model and all six targets (the active one must qualify)."""
    active = armature_of(context)
    entries, models = [], {}
    for obj in [active] + [o for o in context.scene.objects if o.type == "ARMATURE" and o is not active]:
        if obj.name in state.live_sessions:
            if obj is active:
                raise LiveError(f"{obj.name} is already live")
            continue
        try:
            missing = missing_targets(obj)
            if missing:
                raise LiveError(f"{obj.name} has no {', '.join(missing)} target: use Create Targets first")
            model, data = model_of(obj)
        except LiveError:
            if obj is active:
                raise
            continue
        path = loaded_models[obj.name][0] if obj.name in loaded_models else ""
        model = models.setdefault(path, model) if path else model   # same file: one model, one batched call
        entries.append((obj, model, data))
    return entries


class LiveRunner:
    """The Run IK modal logic, without bpy.types.Operator (so tests can drive it with stand-in objects)."""
    session = None
    timer = None
    last_tick = 0.0

    def start_session(self, context):
        try:
            tick = LiveTick(live_entries(context))
        except (LiveError, LiveStopped, rig_model.RigError, FileRefused) as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        tick.start()
        self.session = LiveSession(tick)
        for name in self.session.names:
            state.live_sessions[name] = self.session
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


class NIK_OT_run(LiveRunner, bpy.types.Operator):
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


class NIK_OT_stop(bpy.types.Operator):
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

class BakeSource:
    """What a bake from an action takes from it: per frame the targets (its own effectors), the hips, its contacts,
    and what FK needs where unmapped in-between bones move (CMU's CC_Base_Pelvis): their bridges/offsets for the
    solve and their channel values for the baked action - given, as the hips are."""

    def __init__(self, frames, targets, hips_rotation, hips_position, contacts, task, links, inbetween):
        self.frames, self.targets, self.contacts, self.task = frames, targets, contacts, task
        self.hips_rotation, self.hips_position = hips_rotation, hips_position
        self.links = links              # (bridges (F, 23, 3, 3), offsets (F, 23, 3)) or None where the rest's hold
        self.inbetween = inbetween      # {bone: {property: (F, width)}} for pose_write.key_bone_values


def bake_source(obj, rig, action, frame_start, frame_end, fps):
    """BakeSource of an action's frames frame_start..frame_end (0: its own first / last frame)."""
    frames, targets, hips_rot, hips_pos, contacts, task, sample = _targets_from_action(
        obj, rig, action, frame_start, frame_end, fps)
    links = (sample.bridges, sample.offsets) if sample.moving_links else None
    bones = rig_model.inbetween_bones(rig)
    inbetween = pose_read.read_bone_values(rig, obj, action, bones, frames[0], frames[-1]) if bones else {}
    return BakeSource(frames, targets, hips_rot, hips_pos, contacts, task, links, inbetween)


def bake_targets_from_action(obj, rig, action, frame_start, frame_end, fps):
    """(frames, targets (F, 6, 4, 4), hips rotation, hips position, contacts (F, 2), task) from an action's own pose."""
    return _targets_from_action(obj, rig, action, frame_start, frame_end, fps)[:6]


def _targets_from_action(obj, rig, action, frame_start, frame_end, fps):
    sample = pose_read.read_action(rig, obj, action, frame_start if frame_start > 0 else None,
                                frame_end if frame_end > 0 else None)
    if len(sample.frames) == 0:
        raise LiveError(f"action {action.name!r} has no frames in {frame_start}-{frame_end}")
    n = len(sample.frames)
    targets = np.broadcast_to(np.eye(4), (n, 6, 4, 4)).copy()
    roles = [ROLE_INDEX["Hips"]] + list(EFFECTOR_ROLES)
    targets[:, :, :3, :3] = sample.rotations[:, roles]
    targets[:, :, :3, 3] = sample.positions[:, roles]
    contacts = detect_contacts(sample.positions[:, list(FOOT_ROLES)], 0.0, fps, rig.skeleton.height)
    override = getattr(action, "neural_ik_task", "AUTO")
    task = task_from_name(action.name) if override == "AUTO" else TASKS.index(override.lower())
    return sample.frames, targets, sample.hips_rotation, sample.hips_position, contacts, task, sample


def bake_targets_from_empties(context, obj, rig, frame_start, frame_end):
    """Sample the target empties at every frame (scene.frame_set; the current frame is restored)."""
    scene = context.scene
    character = LiveCharacter(obj, rig, None)
    frames = np.arange(frame_start, frame_end + 1)
    targets = np.zeros((len(frames), 6, 4, 4))
    current = scene.frame_current
    try:
        for i, f in enumerate(frames):
            scene.frame_set(int(f))
            character.read_targets(targets[i])
    finally:
        scene.frame_set(current)
    return frames, targets


class NIK_OT_bake(bpy.types.Operator):
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

    @classmethod
    def poll(cls, context):
        return poll_armature(cls, context)

    def execute(self, context):
        try:
            obj = armature_of(context)
            rig = rig_of(obj)
            model, data = model_of(obj, rig)
            settings = obj.neural_ik
            scene = context.scene
            inbetween = {}
            if self.source_action:
                action = bpy.data.actions.get(self.source_action)
                if action is None:
                    raise LiveError(f"there is no action called {self.source_action!r}")
                source = bake_source(obj, rig, action, self.frame_start, self.frame_end,
                                     scene.render.fps / scene.render.fps_base)
                frames, targets, hips_rot, hips_pos = source.frames, source.targets, source.hips_rotation, source.hips_position
                contacts, task, links, inbetween = source.contacts, source.task, source.links, source.inbetween
                name, desired = f"{action.name}.nik", contacts
            else:
                missing = missing_targets(obj)
                if missing:
                    raise LiveError(f"{obj.name} has no {', '.join(missing)} target: give a source action or "
                                    "create targets")
                start = self.frame_start or scene.frame_start
                end = self.frame_end or scene.frame_end
                if end < start:
                    raise LiveError(f"the frame range {start}-{end} is empty")
                frames, targets = bake_targets_from_empties(context, obj, rig, start, end)
                links = pose_read.current_links(obj, rig)        # in-between bones stay as they are now
                bones = rig_model.inbetween_bones(rig) if links is not None else []
                inbetween = pose_read.current_bone_values(rig, obj, bones, len(frames)) if bones else {}
                hips_rot = hips_pos = None
                contacts = None
                desired = np.array([[settings.contact_left, settings.contact_right]], np.float64)
                task = TASKS.index(settings.task.lower())
                name = f"{obj.name}.nik"
            n = len(frames)
            solver = Solver(model, data, characters=n, links=links)
            phase = (np.arange(n) / max(n, 1)) % 1.0
            result = solver.solve(targets, 0.0, desired, np.full(n, task), phase,
                                  refine_iterations=self.refine_iterations, dt=1.0 / 30, contact=contacts)
            if hips_rot is None:
                hips_rot, hips_pos = result.hips_rotation, result.hips_position
        except (LiveError, FileRefused, rig_model.RigError) as exc:
            return _cancel(self, exc)
        held = int(np.count_nonzero(result.status & 3))
        action = pose_write.write_action(obj, rig, name, frames, result.local, hips_rot, hips_pos)
        if inbetween:
            pose_write.key_bone_values(obj, action, frames, inbetween)
        ad = obj.animation_data_create()
        ad.action = action
        if hasattr(ad, "action_slot") and len(action.slots):
            ad.action_slot = action.slots[0]
        errors = result.errors[np.isfinite(result.errors).all(axis=1)]
        worst = float(errors.max()) * 100 if len(errors) else float("nan")
        note = f"; {held} frames held the previous pose ({describe(1)})" if held else ""
        self.report({"INFO"}, f"baked {n} frames into {action.name!r} (worst effector miss {worst:.2f} cm){note}")
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
    loaded_models.clear()


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


classes = (NIK_OT_load_model, NIK_OT_export_onnx, NIK_OT_create_targets, NIK_OT_run, NIK_OT_stop, NIK_OT_bake)
