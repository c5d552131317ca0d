"""BVH files in: a folder imported as actions on one armature (the later files' keys retargeted onto the first
file's armature, or onto a given one), one file per step so a modal operator can run it on a timer; single files for
the evaluation; the one lister of a folder's .bvh files.

Raises DataError with a message for the user.
"""

import fnmatch
import os

import bpy
import numpy as np

from ...neural_network.geometry.rotations import (
    axis_angle_to_matrix,
    blender_axis_angle,
    euler_to_matrix,
    matrix_to_axis_angle,
    matrix_to_quaternion,
    quaternion_to_matrix,
)
from ..errors import DataError
from ..rig import action_layouts, pose_write, rig_model
from ..rig.action_sources import mark_source
from ..rig.bone_maps import auto_map_object
from .extract import scene_fps
from .retarget import Retargeter

CALIBRATION_FILES = 8       # files of a folder that calibrate a source skeleton before its first file is retargeted


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


def _other_rate(path, scene):
    """True when a BVH file's frame rate differs from the scene's by more than 0.1 % (Blender's exporter writes
    30 fps as a frame time of 0.033333: not worth resampling)."""
    fps = scene_fps(scene)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.strip().startswith("Frame Time:"):
                    frame_time = float(line.split(":", 1)[1])
                    return frame_time > 0 and abs(1.0 / frame_time - fps) > 1e-3 * fps
    except (OSError, ValueError):
        return False
    return False


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
    """True when a file or action name matches one of the comma-separated fnmatch patterns: a pattern with wildcards
    matches the name or the name without its extension ('*_walk' matches 'a_walk.bvh'), a bare word matches names
    that contain it."""
    stem = os.path.splitext(name)[0]
    for pattern in (p.strip() for p in patterns.split(",")):
        if not pattern:
            continue
        if any(c in pattern for c in "*?["):
            if fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(stem, pattern):
                return True
        elif fnmatch.fnmatch(name, f"*{pattern}*"):
            return True
    return False


def list_bvh_files(directory, files="", exclude="", max_files=0):
    """Sorted names of the .bvh files of a folder that match `files` (comma-separated patterns, see `matches`;
    empty: all) and not `exclude`, at most `max_files` of them (0: all). Raises DataError for a missing folder or
    when no file is left."""
    if not directory or not os.path.isdir(directory):
        raise DataError(f"folder {directory!r} does not exist" if directory else "choose a folder of .bvh files")
    names = sorted(f for f in os.listdir(directory) if f.lower().endswith(".bvh")
                   and os.path.isfile(os.path.join(directory, f)))
    if not names:
        raise DataError(f"no BVH files in {directory}: the folder holds no .bvh files")
    names = [f for f in names if (not files or matches(f, files)) and not (exclude and matches(f, exclude))]
    if not names:
        raise DataError(f"no .bvh file in {directory} matches {files or '*'!r}" + (f" without {exclude!r}" if exclude else ""))
    return names[:max_files] if max_files else names


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
        names = list_bvh_files(directory, files, exclude)
        addon_utils.enable("io_anim_bvh", default_set=False)
        if context.object is not None and context.object.mode != "OBJECT":
            bpy.ops.object.mode_set(mode="OBJECT")
        self.directory, self.global_scale, self.names = directory, global_scale, names
        self.onto = onto is not None
        self.position = 0                   # files done (imported or skipped)
        self.imported, self.skipped = [], []
        self.target_name, self.hierarchy, self.target_rest, self.parents, self.modes = None, None, None, {}, {}
        self.skeleton_name = None           # the first file's armature name (the skeleton later files share)
        self.retargeter = None              # made on the first file of another skeleton (onto a given armature)
        self.retarget_all = False           # tests: carry even files of the target's own skeleton through the roles
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
            # onto an armature the scene's frame rate is the rig's: a file of another rate is resampled to it
            bpy.ops.import_anim.bvh(filepath=path, global_scale=self.global_scale, update_scene_fps=target is None,
                                    update_scene_duration=target is None,
                                    use_fps_scale=target is not None and _other_rate(path, bpy.context.scene))
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
        skeleton = arm_obj.name
        retargeted = False
        if target is None:
            self._take_target(arm_obj)
            self.skeleton_name = skeleton
        elif _hierarchy(arm_obj.data) != self.hierarchy or self.retarget_all:
            try:
                if self.retargeter is None:
                    self.retargeter = Retargeter(target, skip={a.name for a in bpy.data.actions
                                                               if a.as_pointer() not in before[2]})
                if not self.retargeter.calibrated(arm_obj):
                    self._calibrate_skeleton(name, arm_obj)
                carried = self.retargeter.carry(arm_obj, action, os.path.splitext(name)[0])
            except DataError as exc:
                _remove_new_data(*before)
                self.skipped.append((name, f"could not be retargeted onto {target.name!r}: {exc}"))
                return
            _remove_new_data(*before, keep_action=carried)
            action, retargeted = carried, True
        else:
            _retarget_action(action, _rest_rotations(arm_obj.data), self.target_rest, self.parents, self.modes)
            arm_obj.animation_data.action = None
            _remove_new_data(*before, keep_action=action)
            skeleton = self.skeleton_name or target.name
        action.name = os.path.splitext(name)[0]
        action.use_fake_user = True      # actions not assigned to anything must survive saving
        mark_source(action, name, skeleton, retargeted)
        self.imported.append(action.name)

    def _calibrate_skeleton(self, name, arm_obj):
        """Before the first file of a source skeleton is retargeted: up to CALIBRATION_FILES other files of the
        folder (spread over it) inform that skeleton's calibration with theirs, so every file of a library is carried
        the same way (one clip's mean forearm twist is not the library's). They are imported and removed again."""
        hierarchy = _hierarchy(arm_obj.data)
        others = [n for n in self.names if n != name]
        picks = others[::max(1, len(others) // CALIBRATION_FILES)][:CALIBRATION_FILES]
        for other in picks:
            path = os.path.join(self.directory, other)
            if check_bvh_file(path):
                continue
            before = _data_snapshot()
            try:
                bpy.ops.import_anim.bvh(filepath=path, global_scale=self.global_scale, update_scene_fps=False,
                                        update_scene_duration=False)
                new = next((o for o in bpy.data.objects if o.as_pointer() not in before[0] and o.type == "ARMATURE"),
                           None)
                if new is not None and new.animation_data and new.animation_data.action and \
                        _hierarchy(new.data) == hierarchy:
                    self.retargeter.add_to_calibration(new, new.animation_data.action)
            except Exception:        # a file that cannot inform the calibration is simply not used for it
                pass
            finally:
                _remove_new_data(*before)

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


def import_messages(target, imported, skipped):
    """The reports of a finished import, [(level, text)]: one warning per skipped file, then the summary."""
    messages = [("WARNING", f"skipped {name}: it {reason}") for name, reason in skipped]
    messages.append(("INFO", f"imported {len(imported)} actions onto {target.name!r}"
                             + (f", skipped {len(skipped)} files" if skipped else "")))
    return messages


def import_bvh(path, global_scale=0.01):
    """One file through Blender's own BVH importer onto an armature of its own (the scene takes its frame rate);
    returns the new armature object. Raises DataError for a file that cannot be imported."""
    import addon_utils

    problem = check_bvh_file(path)
    if problem:
        raise DataError(f"{os.path.basename(path)} {problem}")
    addon_utils.enable("io_anim_bvh", default_set=False)
    before = set(bpy.data.objects)
    bpy.ops.import_anim.bvh(filepath=path, global_scale=global_scale, update_scene_fps=True, update_scene_duration=False)
    new = [o for o in bpy.data.objects if o not in before and o.type == "ARMATURE"]
    if not new:
        raise DataError(f"{os.path.basename(path)} did not import as an armature")
    return new[0]


def remove_imported(obj):
    """Remove an armature object that import_bvh made, with its armature data and action when nothing else uses them."""
    action = obj.animation_data.action if obj.animation_data else None
    data = obj.data
    bpy.data.objects.remove(obj)
    if data.users == 0:
        bpy.data.armatures.remove(data)
    if action is not None and action.users == 0:
        bpy.data.actions.remove(action)
