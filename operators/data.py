"""Data operators: bring a folder of BVH files in as actions on one armature, and extract a training set.

The operators are thin; the work is in the plain functions `import_bvh_files` and `extract_dataset` (also used by
the CLI, the tests and benchmarks/extract.py), which raise DataError with a message for the user. The import is
step-wise (BvhFolderImport, one file per step) so that in Blender's window it runs modally, one file per timer event
(BvhImportRunner); headless it runs every step at once.
"""

import fnmatch
import os

import bpy
import numpy as np
from bpy.props import BoolProperty, FloatProperty, StringProperty

from ..blender import action_layouts, pose_read, pose_write, rig_model
from ..neural_network.data.dataset import DatasetBuilder, task_index
from ..neural_network.data.files import FileRefused
from ..neural_network.geometry.rotations import (
    axis_angle_to_matrix,
    blender_axis_angle,
    euler_to_matrix,
    matrix_to_axis_angle,
    matrix_to_quaternion,
    quaternion_to_matrix,
)
from ..neural_network.skeleton.roles import ROLES
from ..properties import get_bone_map, set_bone_map
from .common import chosen_armature, poll_armature, poll_not_editing


class DataError(ValueError):
    """Bad input for import or extraction, with a message meant for the user."""


# ---- bone map -----------------------------------------------------------------------------------------------------


def _bone_map_module():
    try:
        from ..neural_network.skeleton import bone_map
    except ImportError:
        return None
    return bone_map if hasattr(bone_map, "auto_map") else None


def auto_map_object(obj):
    """Auto-map an armature with the bone-map module when it exists; returns the MapResult or None."""
    module = _bone_map_module()
    if module is None:
        return None
    result = _auto_map_result(obj, module)
    set_bone_map(obj, result.mapping)
    obj.neural_ik.preset = getattr(result, "preset", "") or ""
    return result


def _auto_map_result(obj, module):
    bones = [(b.name, b.parent.name if b.parent else None) for b in obj.data.bones]
    heads = {b.name: tuple(b.head_local) for b in obj.data.bones}
    return module.auto_map(bones, heads)


def bone_map_of(obj):
    """The stored bone map; when nothing is stored yet, what auto-mapping finds (not stored: extraction changes
    nothing of the user's)."""
    mapping = get_bone_map(obj)
    module = _bone_map_module()
    if not any(mapping.values()) and module is not None:
        mapping = {role: _auto_map_result(obj, module).mapping.get(role, "") or "" for role in ROLES}
    return mapping


# ---- BVH import ---------------------------------------------------------------------------------------------------


def check_bvh_file(path):
    """None for a complete BVH file, else the reason it cannot be imported (not BVH, truncated, unreadable)."""
    try:
        with open(path, encoding="utf-8", errors="strict") as handle:
            text = handle.read()
    except UnicodeDecodeError:
        return "is not a BVH file (not text)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    head, sep, motion = text.partition("MOTION")
    if not head.lstrip().startswith("HIERARCHY"):
        return "is not a BVH file (no HIERARCHY header)"
    if not sep:
        return "is truncated (no MOTION section)"
    channels = 0
    for line in head.splitlines():
        words = line.split()
        if words and words[0] == "CHANNELS":
            channels += int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    if channels == 0:
        return "is not a usable BVH file (no joint channels)"
    lines = [line.split() for line in motion.splitlines() if line.strip()]
    try:
        declared = int(lines[0][1]) if lines[0][0] == "Frames:" else -1
        float(lines[1][-1])
    except (IndexError, ValueError):
        return "is truncated (no frame count or frame time)"
    rows = lines[2:]
    complete = 0
    for row in rows:
        if len(row) != channels:
            break
        complete += 1
    if declared <= 0:
        return "has no frames"
    if complete < declared:
        return f"is truncated ({complete} of {declared} frames complete)"
    return None


def _hierarchy(arm):
    return tuple((b.name, b.parent.name if b.parent else "") for b in arm.bones)


def _remove_new_data(objects_before, armatures_before, actions_before, keep_action=None):
    for obj in [o for o in bpy.data.objects if o.as_pointer() not in objects_before]:
        bpy.data.objects.remove(obj)
    for arm in [a for a in bpy.data.armatures if a.as_pointer() not in armatures_before and a.users == 0]:
        bpy.data.armatures.remove(arm)
    for act in [a for a in bpy.data.actions if a.as_pointer() not in actions_before and a != keep_action]:
        bpy.data.actions.remove(act)


def _rest_rotations(arm):
    return {b.name: np.array(b.matrix_local, np.float64) for b in arm.bones}


def _retarget_action(action, source_rest, target_rest, parents, modes):
    """Re-express an action keyed on one import's rest matrices in another's (same hierarchy).

    Blender's importer sets basis_j = rest_j^T E_j rest_j (E_j: the file's joint rotation), so the world rotations
    are the same on any import when basis_target = Q^T basis_source Q with Q = rest_source^T rest_target. Locations
    turn by Q too and absorb the difference of the rest offsets, so a bone keyed with location (BVH position
    channels) keeps the file's own joint positions: l_t = Q^T l_s + rest_t^T (offset_s - offset_t).
    """
    channels = action_layouts.bone_channels(action_layouts.action_fcurves(action, action_layouts.action_slot_for_any(action)))
    bones = {bone for bone, _, _ in channels}
    for bone in bones:
        src, dst = source_rest[bone], target_rest[bone]
        Q = src[:3, :3].T @ dst[:3, :3]
        parent = parents.get(bone)
        src_offset = src[:3, 3] - (source_rest[parent][:3, 3] if parent else 0.0)
        dst_offset = dst[:3, 3] - (target_rest[parent][:3, 3] if parent else 0.0)
        head_shift = dst[:3, :3].T @ (src_offset - dst_offset)
        if np.max(np.abs(Q - np.eye(3))) < 1e-7 and np.max(np.abs(head_shift)) < 1e-7:
            continue
        mode = modes[bone]
        width = 4 if mode in ("QUATERNION", "AXIS_ANGLE") else 3
        prop = rig_model.rotation_property(mode)
        _rewrite_keys([channels.get((bone, prop, i)) for i in range(width)], _turned_rotations, mode, Q)
        _rewrite_keys([channels.get((bone, "location", i)) for i in range(3)], _moved_locations, Q, head_shift)


def _rewrite_keys(curves, change, *args):
    """Replace the key values of a channel's curves (one per component; left alone unless all exist with the same
    number of keys) by change(values (keys, components), *args), keeping the key frames."""
    if not all(fc is not None for fc in curves):
        return
    keys = [np.empty(2 * len(fc.keyframe_points), np.float32) for fc in curves]
    for fc, buf in zip(curves, keys):
        fc.keyframe_points.foreach_get("co", buf)
    if len({len(k) for k in keys}) != 1:
        return
    new = change(np.stack([k[1::2] for k in keys], -1).astype(np.float64), *args)
    for i, (fc, buf) in enumerate(zip(curves, keys)):
        buf[1::2] = new[:, i]
        fc.keyframe_points.foreach_set("co", buf)
        fc.update()


def _turned_rotations(values, mode, Q):
    """Rotation keys (keys, components) in `mode` with each rotation R turned into Q^T R Q, in the same mode."""
    if mode == "QUATERNION":
        mats = quaternion_to_matrix(values)
    elif mode == "AXIS_ANGLE":
        mats = axis_angle_to_matrix(values[:, 1:] / np.maximum(
            np.linalg.norm(values[:, 1:], axis=-1, keepdims=True), 1e-12) * values[:, :1])
    else:
        mats = euler_to_matrix(values, mode)
    mats = Q.T @ mats @ Q
    if mode == "QUATERNION":
        return pose_write.continuous_quaternions(matrix_to_quaternion(mats))
    if mode == "AXIS_ANGLE":
        return blender_axis_angle(matrix_to_axis_angle(mats))
    return pose_write.euler_sequence(mats, mode)


def _moved_locations(values, Q, shift):
    """Location keys (keys, 3) l turned and shifted: Q^T l + shift (as rows)."""
    return values @ Q + shift


def matches(name, patterns):
    """True when a file or action name matches one of the comma-separated fnmatch patterns (a bare word matches
    names that contain it)."""
    for pattern in (p.strip() for p in patterns.split(",")):
        if pattern and fnmatch.fnmatch(name, pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"):
            return True
    return False


def _data_snapshot():
    """Pointers of every object, armature and action now: what a file's import adds is what is not in here."""
    return ({o.as_pointer() for o in bpy.data.objects}, {a.as_pointer() for a in bpy.data.armatures},
            {a.as_pointer() for a in bpy.data.actions})


class BvhFolderImport:
    """One folder import, a file per `step()`: the synchronous path runs every step at once, the modal operator runs
    one per timer event so Blender's window stays responsive (a 280-file folder takes ~30 s).

    The target armature is kept by name, not by reference, so a step never holds a pointer across UI events.
    """

    def __init__(self, context, directory, global_scale=1.0, files="", exclude="", onto=None):
        import addon_utils

        directory = bpy.path.abspath(directory) if directory else ""
        if not directory or not os.path.isdir(directory):
            raise DataError(f"folder {directory!r} does not exist" if directory else "choose a folder of .bvh files")
        names = sorted(f for f in os.listdir(directory) if f.lower().endswith(".bvh")
                       and os.path.isfile(os.path.join(directory, f)))
        if not names:
            raise DataError(f"folder {directory} holds no .bvh files")
        names = [f for f in names if (not files or matches(f, files)) and not (exclude and matches(f, exclude))]
        if not names:
            raise DataError(f"no .bvh file in {directory} matches {files or '*'!r}" + (f" without {exclude!r}" if exclude else ""))
        addon_utils.enable("io_anim_bvh", default_set=False)
        if context.object is not None and context.object.mode != "OBJECT":
            bpy.ops.object.mode_set(mode="OBJECT")
        self.directory, self.global_scale, self.names = directory, global_scale, names
        self.onto = onto is not None
        self.position = 0                   # files done (imported or skipped)
        self.imported, self.skipped = [], []
        self.target_name, self.hierarchy, self.target_rest, self.parents, self.modes = None, None, None, {}, {}
        self._pending = None                # snapshot before the file in progress; None between files
        if onto is not None:
            self._take_target(onto)

    @property
    def count(self):
        return len(self.names)

    @property
    def done(self):
        return self.position >= len(self.names)

    @property
    def target(self):
        return bpy.data.objects.get(self.target_name) if self.target_name else None

    def _take_target(self, obj):
        self.target_name, self.hierarchy = obj.name, _hierarchy(obj.data)
        self.target_rest = _rest_rotations(obj.data)
        self.parents = {b.name: (b.parent.name if b.parent else None) for b in obj.data.bones}
        self.modes = {pb.name: pb.rotation_mode for pb in obj.pose.bones}

    def step(self):
        """Import (or skip) the next file; returns its name."""
        name = self.names[self.position]
        self.position += 1
        self._pending = _data_snapshot()
        self._import_file(name, self._pending)
        self._pending = None
        return name

    def steps(self):
        """Generator over the remaining files: yields (files done, file count, name) after each."""
        while not self.done:
            name = self.step()
            yield self.position, self.count, name

    def _import_file(self, name, before):
        path = os.path.join(self.directory, name)
        problem = check_bvh_file(path)
        if problem:
            self.skipped.append((name, problem))
            return
        target = self.target
        if self.target_name and target is None:
            raise DataError(f"the armature {self.target_name!r} being imported onto is gone")
        try:
            bpy.ops.import_anim.bvh(filepath=path, global_scale=self.global_scale, update_scene_fps=target is None,
                                    update_scene_duration=target is None)
        except Exception as exc:   # the importer raises many kinds on bad content; all mean "skip this file"
            _remove_new_data(*before)
            reason = str(exc).strip().splitlines()
            self.skipped.append((name, f"could not be imported ({reason[-1] if reason else type(exc).__name__})"))
            return
        new_objects = [o for o in bpy.data.objects if o.as_pointer() not in before[0]]
        arm_obj = next((o for o in new_objects if o.type == "ARMATURE"), None)
        action = arm_obj.animation_data.action if arm_obj and arm_obj.animation_data else None
        if arm_obj is None or action is None:
            _remove_new_data(*before)
            self.skipped.append((name, "held no animated skeleton"))
            return
        if target is None:
            self._take_target(arm_obj)
        elif _hierarchy(arm_obj.data) != self.hierarchy:
            _remove_new_data(*before)
            self.skipped.append((name, f"has a different skeleton than {target.name!r}"))
            return
        else:
            _retarget_action(action, _rest_rotations(arm_obj.data), self.target_rest, self.parents, self.modes)
            arm_obj.animation_data.action = None
            _remove_new_data(*before, keep_action=action)
        action.name = os.path.splitext(name)[0]
        action.use_fake_user = True      # actions not assigned to anything must survive saving
        self.imported.append(action.name)

    def finish(self, context):
        """After the last step: (armature object, [imported action names], [(file name, reason) skipped]), the
        armature active, selected and chosen in the panel. Raises DataError when no file could be imported."""
        target = self.target
        if target is None or (self.onto and not self.imported):
            reasons = "; ".join(f"{n} {r}" for n, r in self.skipped)
            raise DataError(f"no file in {self.directory} could be imported: {reasons}")
        self._choose(context, target)
        return target, self.imported, self.skipped

    def abandon(self, context):
        """Stop early: remove what the file in progress left (if a step was interrupted), keep the actions imported
        so far on the armature. Returns the armature (None when nothing was imported)."""
        if self._pending is not None:
            _remove_new_data(*self._pending)
            self._pending = None
        target = self.target
        if target is None or not self.imported:
            return None
        self._choose(context, target)
        return target

    def _choose(self, context, target):
        context.view_layer.update()
        for obj in context.view_layer.objects:
            if obj is not None:
                obj.select_set(False)
        context.view_layer.objects.active = target
        target.select_set(True)
        context.scene.neural_ik.armature = target
        if not self.onto:
            auto_map_object(target)

    def run(self, context):
        """Every step, then finish: the synchronous import."""
        for _ in self.steps():
            pass
        return self.finish(context)


def import_bvh_files(context, directory, global_scale=1.0, files="", exclude="", onto=None):
    """Import every .bvh of a folder as actions on one armature: `onto` when given (its hierarchy must match),
    else the first good file's.

    files / exclude: comma-separated name patterns that pick files (empty `files`: all). Returns (armature object,
    [imported action names], [(file name, reason) skipped]). Raises DataError for a missing or empty folder or when no
    file could be imported.
    """
    return BvhFolderImport(context, directory, global_scale, files, exclude, onto).run(context)


def report_import(operator, result):
    """Report a finished import (skipped files, then the summary) and end the operator."""
    for level, text in import_messages(*result):
        operator.report({level}, text)
    return {"FINISHED"}


def import_messages(target, imported, skipped):
    """The reports of a finished import, [(level, text)]: one warning per skipped file, then the summary."""
    messages = [("WARNING", f"skipped {name}: it {reason}") for name, reason in skipped]
    messages.append(("INFO", f"imported {len(imported)} actions onto {target.name!r}"
                             + (f", skipped {len(skipped)} files" if skipped else "")))
    return messages


# ---- extraction ---------------------------------------------------------------------------------------------------


def target_armature(context):
    return chosen_armature(context)


def usable_actions(obj, rig):
    """([(action, its parsed channels)], [notes]) for every action in the file, by name."""
    mapped = {rig.bone_names[b] for b in rig.role_bones if b >= 0}
    usable, notes = [], []
    layouts = {}       # actions with the same curves (one rig's, one BVH folder's) are parsed once
    for action in sorted(bpy.data.actions, key=lambda a: a.name):
        channels = action_layouts.action_channels(obj, action, layouts)
        if not action_layouts.animated_bones(obj, action, channels) & mapped:
            notes.append(f"skipped action {action.name!r}: it animates none of the mapped bones")
            continue
        first, last = action_layouts.action_frame_range(action)
        if last < first:
            notes.append(f"skipped action {action.name!r}: it has no whole frame")
            continue
        usable.append((action, channels))
    return usable, notes


def extract_dataset(context, obj, mapping=None, actions=None):
    """(Dataset, notes) of every frame of every usable action of `obj`; changes nothing in the file."""
    if obj is None or obj.type != "ARMATURE":
        raise DataError("select an armature first (no armature is active or chosen in the Neural IK panel)")
    if obj.mode == "EDIT":
        raise DataError(f"{obj.name!r} is in Edit Mode: switch to Object or Pose Mode first")
    if not bpy.data.actions:
        raise DataError("this file has no actions to learn from: import BVH files or create the demo rig")
    mapping = bone_map_of(obj) if mapping is None else mapping
    if not any(mapping.values()):
        raise DataError(f"armature {obj.name!r} has no bone map yet: run Auto Map or fill the bone map")
    try:
        rig = rig_model.read_rig(obj, mapping)
    except rig_model.RigError as exc:
        raise DataError(str(exc)) from None
    chosen, notes = usable_actions(obj, rig)
    if actions is not None:
        wanted = set(actions)
        chosen = [(a, c) for a, c in chosen if a.name in wanted]
    if not chosen:
        raise DataError(f"no action animates the mapped bones of {obj.name!r}" + (f" ({notes[0]})" if notes else ""))
    scene = context.scene
    fps = scene.render.fps / (scene.render.fps_base or 1.0)
    ranges = [action_layouts.action_frame_range(a) for a, _ in chosen]
    total = sum(last - first + 1 for first, last in ranges)
    builder = DatasetBuilder(rig.skeleton, fps, source=os.path.basename(bpy.data.filepath) or obj.name, capacity=total)
    tasks = [task_index(a.name, getattr(a, "neural_ik_task", "AUTO")) for a, _ in chosen]
    for batch in pose_read.read_dataset_batches(rig, obj, [a for a, _ in chosen], tasks, channels=[c for _, c in chosen],
                                             ranges=ranges):
        finite = batch.finite_actions(rig.role_mask)
        if not finite.all():
            notes.extend(f"skipped action {name!r}: its keys hold NaN or infinite values"
                         for name, ok in zip(batch.names, finite) if not ok)
            if not finite.any():
                continue
            batch = batch.subset(finite)
        builder.add_batch(batch)
    if not builder.actions:
        raise DataError(f"no action of {obj.name!r} could be extracted: {'; '.join(notes[-3:])}")
    dataset = builder.finish({"armature": obj.name, "bone_map": {r: mapping.get(r, "") for r in ROLES}})
    return dataset, notes


# ---- operators ----------------------------------------------------------------------------------------------------


class BvhImportRunner:
    """The modal Import BVH Folder logic, without bpy.types.Operator (so tests can drive it with stand-in context and
    event objects: timers never fire in the bpy module). One file per TIMER event, a progress bar and "file i of n"
    in the status bar; Esc stops with the actions imported so far kept on the armature.

    Needs on self: directory, global_scale, files, exclude, onto_active and report()."""
    importer = None
    timer = None
    TIMER_SECONDS = 0.01

    def make_importer(self, context):
        onto = chosen_armature(context) if self.onto_active else None
        if self.onto_active and onto is None:
            raise DataError("select the armature to import onto (Onto Active Armature is on)")
        return BvhFolderImport(context, self.directory, self.global_scale, self.files, self.exclude, onto)

    def invoke(self, context, _event):
        try:
            importer = self.make_importer(context)
        except DataError as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        return self.start_import(context, importer)

    def start_import(self, context, importer):
        self.importer = importer
        wm = context.window_manager
        wm.progress_begin(0, importer.count)
        self.timer = wm.event_timer_add(self.TIMER_SECONDS, window=context.window)
        wm.modal_handler_add(self)
        self._show_status(context)
        return {"RUNNING_MODAL"}

    def modal(self, context, event):
        if event.type == "ESC":
            return self.stop(context)
        if event.type != "TIMER":      # the rest of the UI keeps working between files
            return {"PASS_THROUGH"}
        importer = self.importer
        try:
            importer.step()
        except Exception as exc:        # never leave half a file behind a traceback
            message = str(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
            return self.stop(context, f"import stopped at file {importer.position} of {importer.count}: {message}")
        context.window_manager.progress_update(importer.position)
        if not importer.done:
            self._show_status(context)
            return {"RUNNING_MODAL"}
        self._end(context)
        try:
            result = importer.finish(context)
        except DataError as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        return report_import(self, result)

    def stop(self, context, reason=""):
        """Esc (or a failure): the file in progress is undone, the files before it stay imported. FINISHED when
        something was imported, so the kept actions get their own undo step."""
        self._end(context)
        importer = self.importer
        target = importer.abandon(context)
        for name, why in importer.skipped:
            self.report({"WARNING"}, f"skipped {name}: it {why}")
        head = reason or f"import cancelled after {importer.position} of {importer.count} files"
        if target is None:
            self.report({"WARNING"}, f"{head}; nothing was imported")
            return {"CANCELLED"}
        self.report({"WARNING"}, f"{head}; kept {len(importer.imported)} actions on {target.name!r}")
        return {"FINISHED"}

    def cancel(self, context):
        """Blender ends the operator (file load, window closed): drop the timer and the progress bar."""
        self._end(context)
        if self.importer is not None:
            self.importer.abandon(context)

    def _show_status(self, context):
        importer = self.importer
        text = (f"Importing BVH: file {importer.position + 1} of {importer.count} "
                f"({importer.names[importer.position]}), Esc to cancel")
        workspace = getattr(context, "workspace", None)
        if workspace is not None:
            workspace.status_text_set(text)

    def _end(self, context):
        wm = context.window_manager
        if self.timer is not None:
            wm.event_timer_remove(self.timer)
            self.timer = None
            wm.progress_end()
            workspace = getattr(context, "workspace", None)
            if workspace is not None:
                workspace.status_text_set(None)


class NIK_OT_import_bvh_folder(BvhImportRunner, bpy.types.Operator):
    """In Blender's window (opened from the file browser) the import runs one file per timer event with a progress
    bar; called from Python, the CLI or in background mode it runs synchronously, as scripts expect"""
    bl_idname = "neural_ik.import_bvh_folder"
    bl_label = "Import BVH Folder"
    bl_description = ("Import every .bvh file of a folder with Blender's BVH importer as actions on one armature "
                      "(files with a different skeleton or broken files are reported and skipped; Esc stops)")
    bl_options = {"REGISTER", "UNDO"}

    directory: StringProperty(name="Folder", subtype="DIR_PATH", description="Folder holding .bvh files")
    global_scale: FloatProperty(name="Scale", default=1.0, min=1e-6, max=1e6,
                                description="Scale applied to the files (0.01 for centimetre data)")
    files: StringProperty(name="Files", description="Comma-separated name patterns of the files to import (empty: all)")
    exclude: StringProperty(name="Exclude", description="Comma-separated name patterns of files to leave out")
    onto_active: BoolProperty(name="Onto Active Armature", default=False,
                              description="Add the clips to the active armature (same skeleton) instead of a new one")
    run_modal: BoolProperty(name="Run Modal", default=False, options={"HIDDEN", "SKIP_SAVE"},
                            description="Set when opened from the UI: import on a timer so the window stays responsive")

    @classmethod
    def poll(cls, context):
        return poll_not_editing(cls, context)

    def invoke(self, context, _event):
        self.run_modal = True
        context.window_manager.fileselect_add(self)
        return {"RUNNING_MODAL"}

    def execute(self, context):
        try:
            importer = self.make_importer(context)
            if self.run_modal and context.window is not None and not bpy.app.background:
                return self.start_import(context, importer)
            result = importer.run(context)
        except DataError as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        return report_import(self, result)


class NIK_OT_extract(bpy.types.Operator):
    bl_idname = "neural_ik.extract"
    bl_label = "Extract Training Data"
    bl_description = ("Turn every frame of every action of the armature into a training set (.npz); the actions, "
                      "the scene frame and the armature's assigned action stay as they are")
    bl_options = {"REGISTER"}

    filepath: StringProperty(name="Dataset", subtype="FILE_PATH", description="Where to write the dataset (.npz)")

    @classmethod
    def poll(cls, context):
        return poll_armature(cls, context)

    def invoke(self, context, _event):
        if not self.filepath:
            self.filepath = context.scene.neural_ik.dataset_path or "dataset.npz"
        context.window_manager.fileselect_add(self)
        return {"RUNNING_MODAL"}

    def execute(self, context):
        path = bpy.path.abspath(self.filepath) if self.filepath else ""
        if not path:
            self.report({"ERROR"}, "choose a file to write the dataset to")
            return {"CANCELLED"}
        if not path.lower().endswith(".npz"):
            path += ".npz"
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            self.report({"ERROR"}, f"cannot write {path}: folder {folder} does not exist or is not writable")
            return {"CANCELLED"}
        try:
            dataset, notes = extract_dataset(context, target_armature(context))
            dataset.save(path)
        except (DataError, FileRefused) as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        except OSError as exc:
            self.report({"ERROR"}, f"cannot write {path}: {exc.strerror or exc}")
            return {"CANCELLED"}
        for note in notes:
            self.report({"WARNING"}, note)
        context.scene.neural_ik.dataset_path = path
        self.report({"INFO"}, f"wrote {dataset.summary_text()} to {path}")
        return {"FINISHED"}


classes = (NIK_OT_import_bvh_folder, NIK_OT_extract)

__all__ = ["import_bvh_files", "BvhFolderImport", "BvhImportRunner", "import_messages", "extract_dataset",
           "check_bvh_file", "DataError", "auto_map_object", "bone_map_of", "usable_actions"]
