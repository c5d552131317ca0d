"""`neural_ik.evaluate`: re-solve real motion from its own effectors and measure it against the motion itself.

For every clip (an action of the active armature, or each BVH file of a folder imported on the fly) and every
method (the network alone, the network refined, Blender's IK without and with poles), the solved motion and the
reference are read from Blender's EVALUATED pose (the depsgraph's armature after actions and constraints), never
from the project's own FK, so the figures say what a user would see in the viewport.

The network side goes through `neural_ik.bake` (hips given, `<source>.nik` written) when that operator and a model
are available; the Blender IK side is `blender_ik.BaselineRig`. Results: a JSON file, a table in the console and
the operator's report, and a PNG (error over frames per clip, and a bar chart per role).
"""

import fnmatch
import os
import time

import bpy
import numpy as np
from bpy.props import BoolProperty, IntProperty, StringProperty

from ..blender import action_layouts, blender_ik
from ..neural_network.geometry.rotations import chordal_mean
from ..neural_network.report import eval_report, metrics
from ..neural_network.skeleton.roles import ROLES, task_from_name
from .common import poll_no_training, poll_not_editing

# Bone maps of the two real-mocap rigs, used when the armature carries no bone map of its own.
PRESETS = {
    "bandai": {
        "Hips": "Hips", "Spine": "Spine", "Spine1": "Chest", "NeckLower": "Neck", "Head": "Head",
        "LeftShoulder": "Shoulder_L", "LeftArm": "UpperArm_L", "LeftForeArm": "LowerArm_L", "LeftHand": "Hand_L",
        "RightShoulder": "Shoulder_R", "RightArm": "UpperArm_R", "RightForeArm": "LowerArm_R", "RightHand": "Hand_R",
        "LeftThigh": "UpperLeg_L", "LeftShin": "LowerLeg_L", "LeftFoot": "Foot_L", "LeftToeBase": "Toes_L",
        "RightThigh": "UpperLeg_R", "RightShin": "LowerLeg_R", "RightFoot": "Foot_R", "RightToeBase": "Toes_R",
    },
    "cmu": {
        "Hips": "CC_Base_Hip", "Spine": "CC_Base_Waist", "Spine1": "CC_Base_Spine01", "Spine2": "CC_Base_Spine02",
        "NeckLower": "CC_Base_NeckTwist01", "NeckUpper": "CC_Base_NeckTwist02", "Head": "CC_Base_Head",
        "LeftShoulder": "CC_Base_L_Clavicle", "LeftArm": "CC_Base_L_Upperarm", "LeftForeArm": "CC_Base_L_Forearm",
        "LeftHand": "CC_Base_L_Hand", "RightShoulder": "CC_Base_R_Clavicle", "RightArm": "CC_Base_R_Upperarm",
        "RightForeArm": "CC_Base_R_Forearm", "RightHand": "CC_Base_R_Hand",
        "LeftThigh": "CC_Base_L_Thigh", "LeftShin": "CC_Base_L_Calf", "LeftFoot": "CC_Base_L_Foot",
        "LeftToeBase": "CC_Base_L_ToeBase", "RightThigh": "CC_Base_R_Thigh", "RightShin": "CC_Base_R_Calf",
        "RightFoot": "CC_Base_R_Foot", "RightToeBase": "CC_Base_R_ToeBase",
    },
}

METHOD_LABELS = {
    "network": "network alone",
    "refined": "network + refinement",
    "blender_ik": "Blender IK, no poles",
    "blender_ik_poles": "Blender IK, poles from reference",
    "start_pose": "start pose only (no IK)",
}


class EvaluationError(Exception):
    """A problem with the inputs, in plain words for the user."""


# ---- bone map ------------------------------------------------------------------------------------------------


def bone_map_for(obj):
    """{role: bone}: the armature's stored bone map when it has one, else the preset whose bones it has."""
    stored = {item.role: item.bone for item in obj.neural_ik.bone_map} if hasattr(obj, "neural_ik") else {}
    if any(stored.values()):
        return {role: stored.get(role, "") for role in ROLES}
    names = set(obj.data.bones.keys())
    for preset in PRESETS.values():
        if all(bone in names for bone in preset.values()):
            return {role: preset.get(role, "") for role in ROLES}
    raise EvaluationError(f"armature {obj.name!r} has no bone map; map its bones first (Auto Map)")


def role_bone_names(bone_map):
    return [bone_map.get(role, "") or "" for role in ROLES]


# ---- reading Blender's evaluated pose ---------------------------------------------------------------------------


def character_basis(obj):
    """(C, s) rotation and uniform scale of the object's world matrix: armature space -> character space."""
    m = np.array(obj.matrix_world, dtype=np.float64)[:3, :3]
    scales = np.linalg.norm(m, axis=0)
    u, _, vt = np.linalg.svd(m / np.maximum(scales, 1e-12))
    unit = float(bpy.context.scene.unit_settings.scale_length or 1.0)
    return u @ vt, float(np.mean(scales)) * unit


class PoseReader:
    """Reads the mapped bones of one armature from the evaluated depsgraph, frame after frame."""

    def __init__(self, obj, bone_names):
        self.obj = obj
        names = list(obj.pose.bones.keys())
        self.index = np.array([names.index(b) if b in names else -1 for b in bone_names])
        self.mask = self.index >= 0
        self.count = len(names)
        self.buffer = np.empty(self.count * 16, np.float32)
        self.basis, self.scale = character_basis(obj)
        self.frames = []

    def read(self, depsgraph):
        """Append the current evaluated pose: armature-space matrix and matrix_basis of each mapped role."""
        pose = self.obj.evaluated_get(depsgraph).pose
        pose.bones.foreach_get("matrix", self.buffer)
        mat = self.buffer.reshape(self.count, 4, 4).transpose(0, 2, 1).astype(np.float64)
        pose.bones.foreach_get("matrix_basis", self.buffer)
        basis = self.buffer.reshape(self.count, 4, 4).transpose(0, 2, 1).astype(np.float64)
        idx = np.where(self.mask, self.index, 0)
        self.frames.append((mat[idx], basis[idx]))

    def world(self):
        """World-space heads (F, 23, 3) and bone orientations (F, 23, 3, 3) of the frames read so far."""
        world = np.array(self.obj.matrix_world, np.float64)
        mats = world[None, None] @ np.stack([m for m, _ in self.frames])
        rot = mats[..., :3, :3] / np.maximum(np.linalg.norm(mats[..., :3, :3], axis=-2, keepdims=True), 1e-12)
        return mats[..., :3, 3], rot

    def motion(self):
        """The frames read so far as a metrics.Motion in character space (metres)."""
        mats = np.stack([m for m, _ in self.frames])
        basis = np.stack([b for _, b in self.frames])
        rot = mats[..., :3, :3]
        rot = rot / np.maximum(np.linalg.norm(rot, axis=-2, keepdims=True), 1e-12)
        positions = self.scale * (mats[..., :3, 3] @ self.basis.T)
        rotations = self.basis @ rot
        local = basis[..., :3, :3] / np.maximum(np.linalg.norm(basis[..., :3, :3], axis=-2, keepdims=True), 1e-12)
        positions[:, ~self.mask] = np.nan
        eye = np.broadcast_to(np.eye(3), rotations.shape)
        rotations = np.where(self.mask[None, :, None, None], rotations, eye)
        local = np.where(self.mask[None, :, None, None], local, eye)
        return metrics.Motion(positions, rotations, local)


def play(scene, readers, frames, timed=True):
    """Set every frame, let Blender evaluate, read each reader; returns seconds spent in frame_set."""
    spent = 0.0
    for f in frames:
        t0 = time.perf_counter()
        scene.frame_set(int(f))
        spent += time.perf_counter() - t0
        depsgraph = bpy.context.evaluated_depsgraph_get()
        for reader in readers:
            reader.read(depsgraph)
    return spent


def action_frames(action):
    start, end = action.frame_range
    return np.arange(int(round(start)), int(round(end)) + 1)


# ---- the start pose of the baseline ------------------------------------------------------------------------------


def mean_pose_from_model(path, bone_map):
    """{bone: 3x3}: the model's mean local pose per role (the training clips' mean)."""
    from ..neural_network.runtime.onnx_export import load_model_file

    model, _data = load_model_file(path)       # checkpoint or ONNX, fully checked (FileRefused says why not)
    mean = np.asarray(model.mean_pose, np.float64)
    return {bone_map[role]: mean[j] for j, role in enumerate(ROLES) if bone_map.get(role)}


def mean_pose_from_clips(clips, bone_map, step=4):
    """{bone: 3x3}: chordal mean of each mapped bone's matrix_basis rotation over clips [(obj, action)]."""
    scene = bpy.context.scene
    names = role_bone_names(bone_map)
    samples = []
    for obj, action in clips:
        previous = obj.animation_data.action if obj.animation_data else None
        action_layouts.assign_action(obj, action)
        reader = PoseReader(obj, names)
        play(scene, [reader], action_frames(action)[::step])
        samples.append(reader.motion().local_rotations)
        if previous is not None:
            action_layouts.assign_action(obj, previous)
    local = np.concatenate(samples)
    return {bone: chordal_mean(local[:, j]) for j, bone in enumerate(names) if bone}


def limits_from(mean_pose, bone_map, model_path=None, local_rotations=None, margin_deg=10.0):
    """(mean_pose (23,3,3), low (23,3), high (23,3)) for joint-limit checks: the model's learned limits, else the
    range of the given training rotations plus a margin."""
    mean = np.stack([mean_pose.get(bone_map.get(role, ""), np.eye(3)) for role in ROLES])
    if model_path:
        from ..neural_network.runtime.onnx_export import load_model_file

        model, _data = load_model_file(model_path)
        return mean, np.asarray(model.limit_low, np.float64), np.asarray(model.limit_high, np.float64)
    if local_rotations is None:
        return None
    delta = metrics.matrix_to_axis_angle(np.swapaxes(mean, -1, -2)[None] @ local_rotations)
    margin = np.radians(margin_deg)
    return mean, delta.min(axis=0) - margin, delta.max(axis=0) + margin


# ---- one clip, every method -----------------------------------------------------------------------------------


def solve_network(context, obj, action, frames, refine):
    """Bake the network's solve of `action` (hips given) and return (the baked action, seconds per frame)."""
    if not hasattr(bpy.types, "NEURAL_IK_OT_bake"):
        raise EvaluationError("the network cannot be evaluated: the Bake operator is not available in this build")
    context.view_layer.objects.active = obj
    context.scene.neural_ik.armature = obj
    before = set(bpy.data.actions)
    t0 = time.perf_counter()
    try:
        bpy.ops.neural_ik.bake(source_action=action.name, frame_start=int(frames[0]), frame_end=int(frames[-1]),
                               refine_iterations=int(refine))
    except RuntimeError as exc:
        lines = str(exc).strip().splitlines()
        raise EvaluationError(f"Bake failed on {action.name}: {lines[-1] if lines else exc}") from None
    spent = time.perf_counter() - t0
    baked = [a for a in bpy.data.actions if a not in before]
    if not baked:
        raise EvaluationError(f"Bake wrote no action for {action.name}")
    return baked[0], spent / len(frames)


def evaluate_clip(context, obj, action, bone_map, mean_pose, methods, model_path="", refine=2):
    """{method: (Motion, seconds per frame)} plus "reference" for one clip. The scene's current frame is kept."""
    scene = context.scene
    names = role_bone_names(bone_map)
    frames = action_frames(action)
    out = {}
    action_layouts.assign_action(obj, action)
    reader = PoseReader(obj, names)
    play(scene, [reader], frames)
    out["reference"] = (reader.motion(), 0.0)
    if not np.isfinite(out["reference"][0].positions[:, reader.mask]).all():
        raise EvaluationError(f"action {action.name!r} holds NaN or infinite values: fix its keys before evaluating")
    reference_frames = None
    if "blender_ik_poles" in methods:
        positions, axes = reader.world()
        reference_frames = {"frames": frames,
                            "positions": {role: positions[:, j] for j, role in enumerate(ROLES) if bone_map.get(role)},
                            "axes": {role: axes[:, j] for j, role in enumerate(ROLES) if bone_map.get(role)}}
    for method in methods:
        if method in ("network", "refined"):
            if not model_path:
                continue
            solved = solve_network(context, obj, action, frames, 0 if method == "network" else refine)
            baked, seconds = solved
            try:
                action_layouts.assign_action(obj, baked)
                r = PoseReader(obj, names)
                play(scene, [r], frames)
                out[method] = (r.motion(), seconds)
            finally:
                action_layouts.assign_action(obj, action)
                bpy.data.actions.remove(baked)     # made by this run (Bake may give it a fake user)
        elif method in ("blender_ik", "blender_ik_poles", "start_pose"):
            rig = blender_ik.BaselineRig(scene, obj, bone_map, mean_pose, action, use_poles=method == "blender_ik_poles",
                                         reference_frames=reference_frames)
            try:
                rig.build()
                r = PoseReader(rig.copy, names)
                if method == "start_pose":
                    rig.set_constraints_enabled(False)
                    play(scene, [r], frames)
                    out[method] = (r.motion(), 0.0)
                    continue
                rig.set_constraints_enabled(False)
                bare = play(scene, [PoseReader(rig.copy, names)], frames)
                rig.set_constraints_enabled(True)
                solved_time = play(scene, [r], frames)
                out[method] = (r.motion(), max(solved_time - bare, 0.0) / len(frames))
            finally:
                rig.remove()
    return out



# ---- a whole run ------------------------------------------------------------------------------------------------


def task_of(action):
    override = getattr(action, "neural_ik_task", "AUTO")
    from ..neural_network.skeleton.roles import TASKS

    return TASKS.index(override.lower()) if override and override != "AUTO" else task_from_name(action.name)


def list_bvh_files(folder, patterns="", max_files=0):
    """Sorted .bvh paths of a folder whose names match any of the comma-separated glob patterns."""
    if not os.path.isdir(folder):
        raise EvaluationError(f"folder {folder} does not exist")
    names = sorted(f for f in os.listdir(folder) if f.lower().endswith(".bvh"))
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    if wanted:
        names = [n for n in names if any(fnmatch.fnmatch(n, p) or fnmatch.fnmatch(n[:-4], p) for p in wanted)]
    if max_files:
        names = names[:max_files]
    if not names:
        raise EvaluationError(f"no BVH files in {folder}" + (f" match {patterns!r}" if wanted else ""))
    return [os.path.join(folder, n) for n in names]


def import_bvh(path):
    """One armature per file through Blender's own BVH importer; returns the new armature object."""
    import addon_utils

    from .data import check_bvh_file

    problem = check_bvh_file(path)
    if problem:
        raise EvaluationError(f"{os.path.basename(path)} {problem}")
    addon_utils.enable("io_anim_bvh", default_set=False)
    before = set(bpy.data.objects)
    bpy.ops.import_anim.bvh(filepath=path, global_scale=0.01, update_scene_fps=True, update_scene_duration=False)
    new = [o for o in bpy.data.objects if o not in before and o.type == "ARMATURE"]
    if not new:
        raise EvaluationError(f"{os.path.basename(path)} did not import as an armature")
    return new[0]


def remove_imported(obj):
    action = obj.animation_data.action if obj.animation_data else None
    data = obj.data
    bpy.data.objects.remove(obj)
    if data.users == 0:
        bpy.data.armatures.remove(data)
    if action is not None and action.users == 0:
        bpy.data.actions.remove(action)


def _concatenate(motions):
    return metrics.Motion(np.concatenate([m.positions for m in motions]), np.concatenate([m.rotations for m in motions]),
                          np.concatenate([m.local_rotations for m in motions]))


def rig_height(motion, role_mask):
    """Median over frames of the mapped chain's vertical extent (metres), at least 0.1."""
    z = motion.positions[:, role_mask, 2]
    return float(max(np.median(np.nanmax(z, axis=1) - np.nanmin(z, axis=1)), 0.1))


class Collector:
    """Accumulates clips of every method and turns them into the report."""

    def __init__(self, methods):
        self.methods = methods
        self.motions = {m: [] for m in ("reference",) + tuple(methods)}
        self.seconds = {m: [] for m in methods}
        self.names, self.tasks, self.lengths = [], [], []
        self.fps = 30.0
        self.role_mask = None

    def add(self, name, task, results, fps, role_mask):
        if any(m not in results for m in self.methods):
            missing = [m for m in self.methods if m not in results]
            raise EvaluationError(f"{name}: no result for {', '.join(missing)}")
        self.names.append(name)
        self.tasks.append(task)
        self.fps, self.role_mask = fps, role_mask
        n = len(results["reference"][0].positions)
        self.lengths.append(n)
        for m in self.motions:
            self.motions[m].append(results[m][0])
            if m in self.seconds:
                self.seconds[m].append(results[m][1] * n)

    def report(self, limits=None, extra=None):
        actions = np.concatenate([np.full(n, i) for i, n in enumerate(self.lengths)])
        tasks = np.concatenate([np.full(n, t) for n, t in zip(self.lengths, self.tasks)])
        reference = _concatenate(self.motions["reference"])
        height = rig_height(reference, self.role_mask)
        results, frames = {}, {}
        for m in self.methods:
            r, f = metrics.evaluate(reference, _concatenate(self.motions[m]), self.role_mask, actions, self.fps, height,
                                    tasks=tasks, action_names=self.names, limits=limits)
            r["seconds_per_frame"] = float(sum(self.seconds[m]) / max(sum(self.lengths), 1))
            results[m], frames[m] = r, f
        report = {"kind": "neural_ik.evaluation", "methods": {m: METHOD_LABELS.get(m, m) for m in self.methods},
                  "clips": [{"name": n, "frames": k} for n, k in zip(self.names, self.lengths)], "fps": self.fps,
                  "rig_height_m": height, "results": results}
        report.update(extra or {})
        return report, frames, actions


def write_png(path, report, frames, actions):
    """Error over frames per clip and a bar chart per role, through neural_network/plot_png."""
    eval_report.evaluation_png(path, report, frames, actions)


def run_evaluation(context, options):
    """The whole evaluation; options is a dict of the operator's settings. Returns the report dict."""
    scene = context.scene
    methods = []
    model_path = bpy.path.abspath(options.get("model_path", "")) if options.get("model_path") else ""
    if model_path:
        if not os.path.isfile(model_path):
            raise EvaluationError(f"model {model_path} does not exist")
        methods += ["network", "refined"] if options.get("refine_iterations", 2) > 0 else ["network"]
    if options.get("baseline", True):
        methods.append("blender_ik")
        if options.get("poles", True):
            methods.append("blender_ik_poles")
    if options.get("start_pose", False):
        methods.append("start_pose")
    if not methods:
        raise EvaluationError("nothing to evaluate: give a model or turn the Blender IK baseline on")
    collector = Collector(tuple(methods))
    refine = int(options.get("refine_iterations", 2))
    folder = bpy.path.abspath(options.get("bvh_folder", "")) if options.get("bvh_folder") else ""
    t0 = time.perf_counter()
    if folder and model_path:
        # the network needs the armature it was trained on: the folder goes onto one armature (its first file's)
        # through the add-on's own importer, and the clips are the actions whose names match `files`
        # With an armature given (the one the model was trained on), the clips are added to it; else the folder
        # goes onto a new armature (its first file's). The clips are the actions the import added.
        list_bvh_files(folder, options.get("files", ""))
        onto = _armature(context, options["armature"]) if options.get("armature") else None
        before, actions_before = set(bpy.data.objects), set(bpy.data.actions)
        if onto is not None:
            context.view_layer.objects.active = onto
        try:
            bpy.ops.neural_ik.import_bvh_folder(directory=folder, global_scale=0.01, files=options.get("files", ""),
                                                onto_active=onto is not None)
        except RuntimeError as exc:
            lines = str(exc).strip().splitlines()
            raise EvaluationError(lines[-1] if lines else "the BVH folder could not be imported") from None
        added = [a for a in bpy.data.actions if a not in actions_before]
        new = [onto] if onto is not None else [o for o in bpy.data.objects if o not in before and o.type == "ARMATURE"]
        if not new or not added:
            raise EvaluationError(f"nothing was imported from {folder}")
        options = dict(options, armature=new[0].name, actions=",".join(a.name for a in added))
        folder = ""
    if folder:
        paths = list_bvh_files(folder, options.get("files", ""), options.get("max_files", 0))
        first = import_bvh(paths[0])
        bone_map = bone_map_for(first)
        remove_imported(first)
        mean_pose = _mean_pose(options, bone_map, model_path, None)
        for path in paths:
            obj = import_bvh(path)
            try:
                _store_model(obj, bone_map, model_path)
                action = obj.animation_data.action
                results = evaluate_clip(context, obj, action, bone_map, mean_pose, methods, model_path, refine)
                collector.add(os.path.basename(path)[:-4], task_of(action), results, _fps(scene), _mask(bone_map))
            finally:
                _remove_baked(obj)
                remove_imported(obj)
    else:
        obj = _armature(context, options.get("armature", ""))
        bone_map = bone_map_for(obj)
        chosen = _actions(obj, bone_map, options.get("actions", ""))
        mean_pose = _mean_pose(options, bone_map, model_path, (obj, chosen))
        previous = obj.animation_data.action if obj.animation_data else None
        saved = _saved_settings(context, obj)
        try:
            _store_model(obj, bone_map, model_path)
            for action in chosen:
                results = evaluate_clip(context, obj, action, bone_map, mean_pose, methods, model_path, refine)
                collector.add(action.name, task_of(action), results, _fps(scene), _mask(bone_map))
        finally:
            if previous is not None:
                action_layouts.assign_action(obj, previous)
            elif obj.animation_data is not None:
                obj.animation_data.action = None
            _restore_settings(context, obj, saved)
    limits = limits_from(mean_pose, bone_map, model_path,
                         _concatenate(collector.motions["reference"]).local_rotations if not model_path else None)
    report, frames, actions = collector.report(limits, {"model": model_path, "refine_iterations": refine,
                                                        "seconds": time.perf_counter() - t0})
    report["seconds"] = time.perf_counter() - t0
    if options.get("json_path"):
        eval_report.write_json(bpy.path.abspath(options["json_path"]), report)
    if options.get("png_path"):
        write_png(bpy.path.abspath(options["png_path"]), report, frames, actions)
    return report


def _fps(scene):
    return scene.render.fps / (scene.render.fps_base or 1.0)


def _mask(bone_map):
    return np.array([bool(bone_map.get(role)) for role in ROLES])


def _armature(context, name):
    if name:
        obj = bpy.data.objects.get(name)
    else:
        obj = getattr(context.scene.neural_ik, "armature", None) or context.active_object
    if obj is None or obj.type != "ARMATURE":
        raise EvaluationError("choose an armature to evaluate (or give a BVH folder)")
    if obj.mode == "EDIT":
        raise EvaluationError(f"{obj.name!r} is in Edit Mode: switch to Object or Pose Mode first")
    return obj


def _actions(obj, bone_map, names):
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    bones = {b for b in bone_map.values() if b}
    found = []
    for action in bpy.data.actions:
        if action.name.endswith(".nik") or blender_ik.TAG in action.name:
            continue
        paths = {blender_ik._bone_of_path(fc.data_path) for fc in action_layouts.all_action_fcurves(action)}
        if bones & paths:
            found.append(action)
    if wanted:
        exact = [bpy.data.actions[n] for n in wanted if n in bpy.data.actions]
        matched = [a for a in found if any(fnmatch.fnmatch(a.name, p) or fnmatch.fnmatch(a.name + ".bvh", p)
                                           for p in wanted)]
        found = list(dict.fromkeys(exact + matched))
        if not found:
            raise EvaluationError(f"no action of {obj.name!r} matches {names!r}")
    if not found:
        raise EvaluationError(f"armature {obj.name!r} has no actions that move its mapped bones")
    return found


def _mean_pose(options, bone_map, model_path, own):
    """The baseline's start pose: the model's mean pose, else the mean over a folder of training BVH files, else the
    mean over the evaluated actions themselves (flagged in the report as optimistic)."""
    if model_path:
        return mean_pose_from_model(model_path, bone_map)
    folder = bpy.path.abspath(options.get("mean_pose_folder", "")) if options.get("mean_pose_folder") else ""
    if folder:
        paths = list_bvh_files(folder, options.get("mean_pose_files_pattern", ""), options.get("mean_pose_files", 20))
        objs = [import_bvh(p) for p in paths]
        try:
            return mean_pose_from_clips([(o, o.animation_data.action) for o in objs], bone_map)
        finally:
            for o in objs:
                remove_imported(o)
    if own is not None:
        obj, actions = own
        return mean_pose_from_clips([(obj, a) for a in actions], bone_map)
    raise EvaluationError("the Blender IK baseline needs a start pose: give a model or a folder of training BVH files")


def _store_model(obj, bone_map, model_path):
    """Give the armature the bone map and model that Bake reads."""
    if not model_path:
        return
    from ..properties import set_bone_map

    if not any(item.bone for item in obj.neural_ik.bone_map):
        set_bone_map(obj, bone_map)
    obj.neural_ik.model_path = model_path


def _saved_settings(context, obj):
    """What evaluating an armature of the file changes on the way (model path, bone map, chosen armature)."""
    return (obj.neural_ik.model_path, [(i.role, i.bone) for i in obj.neural_ik.bone_map],
            context.scene.neural_ik.armature, context.view_layer.objects.active)


def _restore_settings(context, obj, saved):
    model_path, items, armature, active = saved
    obj.neural_ik.model_path = model_path
    if [(i.role, i.bone) for i in obj.neural_ik.bone_map] != items:
        obj.neural_ik.bone_map.clear()
        for role, bone in items:
            item = obj.neural_ik.bone_map.add()
            item.role, item.bone = role, bone
    context.scene.neural_ik.armature = armature
    context.view_layer.objects.active = active


def _remove_baked(obj):
    action = obj.animation_data.action if obj.animation_data else None
    if action is None:
        return
    baked = bpy.data.actions.get(f"{action.name}.nik")
    if baked is not None and baked.users == 0:
        bpy.data.actions.remove(baked)


# ---- the operator ----------------------------------------------------------------------------------------------

last_report = {}


class NIK_OT_evaluate(bpy.types.Operator):
    """Re-solve real motion from its own effectors with the network and with Blender's IK, and measure both"""
    bl_idname = "neural_ik.evaluate"
    bl_label = "Evaluate"
    bl_options = {"REGISTER"}

    armature: StringProperty(name="Armature", description="Armature whose actions are evaluated (empty: the chosen one)")
    actions: StringProperty(name="Actions", description="Comma-separated action names (empty: every action of the rig)")
    bvh_folder: StringProperty(name="BVH Folder", subtype="DIR_PATH",
                               description="Evaluate these BVH files instead, imported one at a time")
    files: StringProperty(name="Files", description="Comma-separated name patterns within the BVH folder (empty: all)")
    max_files: IntProperty(name="Max Files", min=0, default=0, description="Evaluate at most this many files (0: all)")
    model_path: StringProperty(name="Model", subtype="FILE_PATH", description="Checkpoint to evaluate (empty: baseline only)")
    refine_iterations: IntProperty(name="Refinement", min=0, max=50, default=2)
    baseline: BoolProperty(name="Blender IK Baseline", default=True)
    poles: BoolProperty(name="Baseline With Poles", default=True, description="Also run Blender IK with poles from the reference")
    start_pose: BoolProperty(name="Start Pose Row", default=False, description="Also measure the baseline's start pose without IK")
    mean_pose_folder: StringProperty(name="Training BVH Folder", subtype="DIR_PATH",
                                     description="Training clips whose mean pose starts Blender IK (when no model is given)")
    mean_pose_files_pattern: StringProperty(name="Training Files", description="Comma-separated patterns in that folder")
    mean_pose_files: IntProperty(name="Training Files Max", min=0, default=20)
    json_path: StringProperty(name="JSON", subtype="FILE_PATH")
    png_path: StringProperty(name="PNG", subtype="FILE_PATH")

    @classmethod
    def poll(cls, context):
        return poll_not_editing(cls, context) and poll_no_training(cls, context)

    def execute(self, context):
        global last_report
        options = {name: getattr(self, name) for name in self.__annotations__}
        frame = context.scene.frame_current
        actions_before = set(bpy.data.actions)
        try:
            report = run_evaluation(context, options)
        except (EvaluationError, OSError, ValueError) as exc:
            self.report({"ERROR"}, str(exc).strip() or type(exc).__name__)
            return {"CANCELLED"}
        finally:
            context.scene.frame_set(frame)      # playing the clips moved it; the user's frame stays theirs
            if self.armature and self.bvh_folder:   # clips imported onto the user's armature leave with the run
                for action in [a for a in bpy.data.actions if a not in actions_before]:
                    bpy.data.actions.remove(action)
        last_report = report
        text = eval_report.table(report["results"], report["methods"])
        print(text)
        frames = sum(c["frames"] for c in report["clips"])
        best = ", ".join(f"{report['methods'][m]}: inner {r['inner_mpjpe_cm']:.2f} cm, effector {r['effector_cm']['mean']:.2f} cm"
                         for m, r in report["results"].items())
        self.report({"INFO"}, f"Evaluated {len(report['clips'])} clips ({frames} frames): {best}")
        return {"FINISHED"}


classes = (NIK_OT_evaluate,)
