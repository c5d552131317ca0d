"""The evaluation: re-solve real motion from its own effectors and measure it against the motion itself.

For every clip (an action of the active armature, or each BVH file of a folder imported on the fly) and every
method (the network alone, the network refined, Blender's IK without and with poles), the solved motion and the
reference are read from Blender's EVALUATED pose (the depsgraph's armature after actions and constraints), never
from the project's own FK, so the figures say what a user would see in the viewport.

The network side goes through `bake.bake` (hips given, `<source>.nik` written) when a model is given; the Blender IK
side is `blender_ik.BaselineRig`. Results: a JSON file, a table in the console and
the operator's report, and a PNG (error over frames per clip, and a bar chart per role).

A control rig (Rigify: mapped DEF- bones driven by constraints, keys on controls) is evaluated on its deform bones as
Blender shows them; Bake keys its controls. The Blender IK baseline is skipped there, with the reason in the notes
and in the report's "skipped" (IK constraints on a copy of such a rig would replay the clip's own control keys, so
the row would score the reference against itself). The baked actions play under the switches as the user has them
(Bake keys both of Rigify's chains and no switch). Everything the run plays (actions, pose channels) is put back:
`evaluated_pose.KeptScene` around each baked action and around the whole run.
"""

import fnmatch
import os
import time

import bpy
import numpy as np

from ...neural_network.geometry.rotations import chordal_mean
from ...neural_network.model.prior import TARGETS, UprightPrior, free_mask
from ...neural_network.report import eval_report, metrics, plot_svg
from ...neural_network.skeleton.roles import EFFECTORS, ROLES
from ..errors import DataError, EvaluationError, LiveError
from ..models import model_of
from ..progress import ProgressLine, duration
from ..rig import action_layouts, evaluated_pose, rig_model
from ..rig.action_sources import action_task
from ..rig.armatures import armature_to_use
from ..rig.bone_maps import map_driven_reasons, stored_or_preset_map
from ..rig.pose_read import role_locals
from ..rig.rig_model import RigError, character_basis
from . import blender_ik
from .bake import bake
from .bvh_import import BvhFolderImport, import_bvh, import_messages, list_bvh_files, remove_imported
from .extract import scene_fps

METHOD_LABELS = {
    "network": "network alone",
    "refined": "network + refinement",
    "blender_ik": "Blender IK, no poles",
    "blender_ik_poles": "Blender IK, poles from reference",
    "start_pose": "start pose only (no IK)",
    "free": "network + refinement, free targets placed by the learned prior",
    "upright": "network + refinement, free targets placed upright over the feet",
}
FREE_METHODS = ("free", "upright")
SIX_PINNED = np.zeros(6, bool)
BASELINE_METHODS = ("blender_ik", "blender_ik_poles", "start_pose")


# ---- bone map ------------------------------------------------------------------------------------------------


def bone_map_for(obj):
    """{role: bone}: the armature's stored bone map when it has one, else the mocap preset whose bones it has."""
    mapping = stored_or_preset_map(obj)
    if mapping is None:
        raise EvaluationError(f"armature {obj.name!r} has no bone map; map its bones first (Auto Map)")
    return mapping


def role_bone_names(bone_map):
    return [bone_map.get(role, "") or "" for role in ROLES]


# ---- reading Blender's evaluated pose ---------------------------------------------------------------------------


class PoseReader:
    """Reads the mapped bones of one armature from the evaluated depsgraph, frame after frame. Local rotations are
    the bones' matrix_basis, or for a rig whose mapped bones are driven (`rig` given, rig.driven: their matrix_basis
    stays at rest) each role's evaluated rotation against its role parent, as Extract stores them."""

    def __init__(self, obj, bone_names, rig=None):
        self.obj = obj
        self.rig = rig if rig is not None and rig.driven else None
        names = list(obj.pose.bones.keys())
        self.index = np.array([names.index(b) if b in names else -1 for b in bone_names])
        self.mask = self.index >= 0
        self.count = len(names)
        self.buffer = np.empty(self.count * 16, np.float32)
        try:
            self.basis, self.scale = character_basis(obj)
        except RigError as exc:
            raise EvaluationError(str(exc)) from None
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
        if self.rig is None:
            local = basis[..., :3, :3] / np.maximum(np.linalg.norm(basis[..., :3, :3], axis=-2, keepdims=True), 1e-12)
        else:
            local = role_locals(self.rig, rot)
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
    from ...neural_network.runtime.model_files import load_model_file

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
        from ...neural_network.runtime.model_files import load_model_file

        model, _data = load_model_file(model_path)
        return mean, np.asarray(model.limit_low, np.float64), np.asarray(model.limit_high, np.float64)
    if local_rotations is None:
        return None
    delta = metrics.matrix_to_axis_angle(np.swapaxes(mean, -1, -2)[None] @ local_rotations)
    margin = np.radians(margin_deg)
    return mean, delta.min(axis=0) - margin, delta.max(axis=0) + margin


# ---- one clip, every method -----------------------------------------------------------------------------------


def solve_network(context, obj, action, frames, refine, free=SIX_PINNED, prior=None):
    """Bake the network's solve of `action` (hips given unless free) and return (the baked action, seconds per
    frame). free, prior: bake's (the free targets and what places them; default: all six pinned)."""
    t0 = time.perf_counter()
    try:
        baked, _summary = bake(context, obj, action.name, int(frames[0]), int(frames[-1]), int(refine), free=free,
                               prior=prior)
    except LiveError as exc:
        raise EvaluationError(f"Bake failed on {action.name}: {exc}") from None
    spent = time.perf_counter() - t0
    return baked, spent / len(frames)


def evaluate_clip(context, obj, action, bone_map, mean_pose, methods, model_path="", refine=2, on_method=None,
                  rig=None, free=SIX_PINNED):
    """{method: (Motion, seconds per frame)} plus "reference" for one clip; on_method(method) is called before each
    method runs (progress). rig: the RigModel of a rig whose mapped bones are driven (local rotations against the
    role parents), else None. free: the targets the "free" and "upright" methods leave free."""
    scene = context.scene
    names = role_bone_names(bone_map)
    frames = action_frames(action)
    out = {}
    action_layouts.assign_action(obj, action)
    reader = PoseReader(obj, names, rig)
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
        if on_method is not None and (model_path or method not in ("network", "refined") + FREE_METHODS):
            on_method(method)
        if method in ("network", "refined") + FREE_METHODS:
            if not model_path:
                continue
            loose, prior = (free, None) if method == "free" else (SIX_PINNED, None)
            if method == "upright":
                loose, prior = free, UprightPrior(model_of(obj)[0])
            baked = None
            try:
                # playing the baked action leaves what it keys on the armature (Blender keeps the last values of
                # channels an action does not key: a control rig's IK twist and poles, which the user's clips may
                # not key): the next method and the next clip's reference start from the rig as it was
                with evaluated_pose.KeptScene(scene, obj):
                    baked, seconds = solve_network(context, obj, action, frames, 0 if method == "network" else refine,
                                                   loose, prior)
                    action_layouts.assign_action(obj, baked)
                    r = PoseReader(obj, names, rig)
                    play(scene, [r], frames)
                    out[method] = (r.motion(), seconds)
            finally:
                if baked is not None:
                    bpy.data.actions.remove(baked)     # made by this run (Bake may give it a fake user)
        elif method in ("blender_ik", "blender_ik_poles", "start_pose"):
            baseline = blender_ik.BaselineRig(scene, obj, bone_map, mean_pose, action,
                                              use_poles=method == "blender_ik_poles", reference_frames=reference_frames)
            try:
                baseline.build()
                r = PoseReader(baseline.copy, names)
                if method == "start_pose":
                    baseline.set_constraints_enabled(False)
                    play(scene, [r], frames)
                    out[method] = (r.motion(), 0.0)
                    continue
                baseline.set_constraints_enabled(False)
                bare = play(scene, [PoseReader(baseline.copy, names)], frames)
                baseline.set_constraints_enabled(True)
                solved_time = play(scene, [r], frames)
                out[method] = (r.motion(), max(solved_time - bare, 0.0) / len(frames))
            finally:
                baseline.remove()
    return out



# ---- a whole run ------------------------------------------------------------------------------------------------


def _concatenate(motions):
    return metrics.Motion(np.concatenate([m.positions for m in motions]), np.concatenate([m.rotations for m in motions]),
                          np.concatenate([m.local_rotations for m in motions]))


def rig_height(motion, role_mask):
    """Median over frames of the mapped chain's vertical extent (metres), at least 0.1."""
    z = motion.positions[:, role_mask, 2]
    return float(max(np.median(np.nanmax(z, axis=1) - np.nanmin(z, axis=1)), 0.1))


class Collector:
    """Accumulates clips of every method and turns them into the report."""

    def __init__(self, methods, free=SIX_PINNED):
        self.methods = methods
        self.free = free                 # the targets the free methods leave free
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
            if m in FREE_METHODS:        # what a user who pins only some targets judges: the pinned ones' miss
                pinned = [name for name, f in zip(EFFECTORS, self.free[1:]) if not f]
                r["free_targets"] = [t for t, f in zip(TARGETS, self.free) if f]
                r["pinned_effector_p95_cm"] = max((r["per_effector_p95_cm"][e] for e in pinned), default=0.0)
            results[m], frames[m] = r, f
        report = {"kind": "neural_ik.evaluation", "methods": {m: METHOD_LABELS.get(m, m) for m in self.methods},
                  "clips": [{"name": n, "frames": k} for n, k in zip(self.names, self.lengths)], "fps": self.fps,
                  "rig_height_m": height, "results": results}
        report.update(extra or {})
        return report, frames, actions


def write_chart(path, report, frames, actions):
    """Error over frames per clip and a bar chart per role, as SVG (neural_network/report/plot_svg)."""
    plot_svg.evaluation_svg(path, report, frames, actions)


NO_ARMATURE = "choose an armature to evaluate (or give a BVH folder)"


class Evaluation:
    """The evaluation as steps, one clip each (every method on it), so Blender's window can show a progress bar and
    stop on Esc: Evaluation(context, options, notes), then step() until `done`, then finish() -> the report;
    abandon() stops and puts everything back. options is a dict of the operator's settings; `notes` (a list) receives
    warnings in words (BVH files the import skipped). In background mode each method of each clip updates one
    progress line (blender.progress). Raises EvaluationError (or OSError/ValueError from writing the files)."""

    def __init__(self, context, options, notes=None):
        self.context, self.notes = context, notes
        self.frame = context.scene.frame_current
        self.actions_before = set(bpy.data.actions)
        self.user_armature_import = bool(options.get("armature") and options.get("bvh_folder"))
        self.position, self.items, self.restore = 0, [], None
        self.kept = None                     # the armature's action, pose and switches as they were (KeptScene)
        self.rig = None                      # the RigModel of an armature whose mapped bones are driven
        self.skipped = {}                    # {method: why it did not run}
        self.importer = None                 # a BVH folder imported a file per step before its clips (with a model)
        self.files_imported = 0
        self.started = time.perf_counter()
        self.line = ProgressLine() if bpy.app.background else None
        try:
            self._prepare(options)
        except DataError as exc:
            self.close()
            raise EvaluationError(str(exc)) from None
        except BaseException:
            self.close()
            raise

    @property
    def count(self):
        """Clips to evaluate (while a folder is still being imported: one per file)."""
        return self.importer.count if self.importer is not None else len(self.items)

    @property
    def done(self):
        return self.importer is None and self.position >= self.count

    @property
    def steps(self):
        """(steps done, steps in all) for a progress bar: the folder's files (when imported first), then the clips."""
        files = self.files_imported
        if self.importer is not None:
            return self.importer.position, 2 * self.importer.count
        return files + self.position, files + len(self.items)

    def status(self):
        """What the next step does, in words."""
        importer = self.importer
        if importer is not None:
            return (f"importing file {importer.position + 1} of {importer.count} "
                    f"({importer.names[importer.position]})")
        return f"clip {self.position + 1} of {self.count} ({self.name()})"

    def name(self, index=None):
        """The name of clip `index` (default: the next one)."""
        item = self.items[self.position if index is None else index]
        return os.path.basename(item)[:-4] if isinstance(item, str) else item.name

    def _prepare(self, options):
        context = self.context
        methods = []
        model_path = bpy.path.abspath(options.get("model_path", "")) if options.get("model_path") else ""
        if model_path:
            if not os.path.isfile(model_path):
                raise EvaluationError(f"model {model_path} does not exist")
            methods += ["network", "refined"] if options.get("refine_iterations", 2) > 0 else ["network"]
        try:
            free = options.get("free") or ()
            self.free = free_mask([n.strip() for n in free.split(",") if n.strip()] if isinstance(free, str) else free)
        except ValueError as exc:
            raise EvaluationError(f"free targets: {exc}") from None
        if self.free.any():
            if not model_path:
                raise EvaluationError("free targets need a model: the learned prior places them")
            methods += list(FREE_METHODS)
        if options.get("baseline", True):
            methods.append("blender_ik")
            if options.get("poles", True):
                methods.append("blender_ik_poles")
        if options.get("start_pose", False):
            methods.append("start_pose")
        if not methods:
            raise EvaluationError("nothing to evaluate: give a model or turn the Blender IK baseline on")
        self.methods, self.model_path = methods, model_path
        self.collector = Collector(tuple(methods), self.free)
        self.refine = int(options.get("refine_iterations", 2))
        self.options = options
        folder = bpy.path.abspath(options.get("bvh_folder", "")) if options.get("bvh_folder") else ""
        if folder and model_path:
            # the network needs the armature it was trained on: with an armature given (the one the model was
            # trained on) the folder's clips are added to it, else the folder goes onto a new armature (its first
            # file's) through the add-on's own importer. The clips are the actions the import added.
            onto = (armature_to_use(context, EvaluationError, options["armature"], NO_ARMATURE)
                    if options.get("armature") else None)
            self.importer = BvhFolderImport(context, folder, 0.01, options.get("files", ""), onto=onto)
            self.folder = folder
            return
        if folder:
            names = list_bvh_files(folder, options.get("files", ""), max_files=options.get("max_files", 0))
            self.items = [os.path.join(folder, n) for n in names]
            first = import_bvh(self.items[0])
            self.bone_map = bone_map_for(first)
            remove_imported(first)
            self.mean_pose = _mean_pose(options, self.bone_map, model_path, None)
            self.obj = None
            return
        self._take_armature(options)

    def _take_armature(self, options):
        """The clips are the armature's actions (`options["actions"]` picks them by name)."""
        context, model_path = self.context, self.model_path
        obj = armature_to_use(context, EvaluationError, options.get("armature", ""), NO_ARMATURE)
        self.bone_map = bone_map_for(obj)
        driven = map_driven_reasons(obj, self.bone_map)
        if driven:
            self._skip_baseline(obj, driven)
            try:
                self.rig = rig_model.read_rig(obj, self.bone_map)
            except rig_model.RigError as exc:
                raise EvaluationError(str(exc)) from None
        self.items = _actions(obj, self.bone_map, options.get("actions", ""), driven=bool(driven))
        self.mean_pose = _mean_pose(options, self.bone_map, model_path, (obj, self.items))
        self.obj = obj
        self.kept = evaluated_pose.KeptScene(context.scene, obj).__enter__()
        self.restore = _saved_settings(context, obj)
        _store_model(obj, self.bone_map, model_path)

    def _skip_baseline(self, obj, driven):
        """Leave the Blender IK rows out for an armature whose mapped bones are driven (a control rig), saying why."""
        skipped = [m for m in self.methods if m in BASELINE_METHODS]
        if not skipped:
            return
        reason = (f"Blender IK baseline skipped: the mapped bones of {obj.name!r} are driven ({'; '.join(driven)}), "
                  "so IK constraints on a copy would only replay the clip's own control keys")
        self.methods = [m for m in self.methods if m not in BASELINE_METHODS]
        if not self.methods:
            raise EvaluationError(f"nothing to evaluate: {reason}; give a model to evaluate the network")
        self.skipped = {m: reason for m in skipped}
        self.collector = Collector(tuple(self.methods), self.free)
        if self.notes is not None:
            self.notes.append(reason)

    def _import_step(self):
        """Import the folder's next file; after the last one the clips are the actions the import added."""
        importer = self.importer
        importer.step()
        if not importer.done:
            return
        self.importer = None
        self.files_imported = importer.count
        try:
            target, imported, skipped = importer.finish(self.context)
        except DataError as exc:
            raise EvaluationError(str(exc)) from None
        if self.notes is not None:
            self.notes.extend(text for level, text in import_messages(target, imported, skipped) if level == "WARNING")
        added = [bpy.data.actions[name] for name in imported]
        if not added:
            raise EvaluationError(f"nothing was imported from {self.folder}")
        self.options = dict(self.options, armature=target.name, actions=",".join(a.name for a in added))
        self._take_armature(self.options)

    def step(self):
        """Import the folder's next file (with a model and a BVH folder, first), or evaluate the next clip with every
        method."""
        if self.importer is not None:
            if self.line is not None:
                self.line.update(f"evaluating: {self.status()}", detail=f"evaluate: {self.status()}")
            self._import_step()
            return
        context, scene = self.context, self.context.scene
        name = self.name()
        clip = f"clip {self.position + 1} of {self.count} ({name})"

        def on_method(method):
            if self.line is not None:
                label = METHOD_LABELS.get(method, method)
                self.line.update(f"evaluating: {clip}, {label}", detail=f"evaluate {clip}: {label}")

        item = self.items[self.position]
        try:
            if isinstance(item, str):        # a BVH file, imported for this clip only
                obj = import_bvh(item)
                try:
                    _store_model(obj, self.bone_map, self.model_path)
                    action = obj.animation_data.action
                    results = evaluate_clip(context, obj, action, self.bone_map, self.mean_pose, self.methods,
                                            self.model_path, self.refine, on_method, free=self.free)
                    task = action_task(action)
                finally:
                    _remove_baked(obj)
                    remove_imported(obj)
            else:
                results = evaluate_clip(context, self.obj, item, self.bone_map, self.mean_pose, self.methods,
                                        self.model_path, self.refine, on_method, self.rig, self.free)
                task = action_task(item)
        except DataError as exc:
            raise EvaluationError(str(exc)) from None
        self.collector.add(name, task, results, scene_fps(scene), _mask(self.bone_map))
        self.position += 1

    def finish(self):
        """The report of every clip (JSON and PNG written when asked); everything is put back."""
        global last_report
        try:
            while not self.done:
                self.step()
            collector = self.collector
            limits = limits_from(self.mean_pose, self.bone_map, self.model_path,
                                 _concatenate(collector.motions["reference"]).local_rotations
                                 if not self.model_path else None)
            seconds = time.perf_counter() - self.started
            extra = {"model": self.model_path, "refine_iterations": self.refine, "seconds": seconds}
            if self.skipped:
                extra["skipped"] = dict(self.skipped)
            report, frames, actions = collector.report(limits, extra)
            options = self.options
            if options.get("json_path"):
                eval_report.write_json(bpy.path.abspath(options["json_path"]), report)
            if options.get("svg_path"):
                write_chart(bpy.path.abspath(options["svg_path"]), report, frames, actions)
        finally:
            self.close()
        if self.line is not None:
            self.line.done(f"evaluated {self.count} clips ({sum(collector.lengths)} frames) in {duration(seconds)}")
        last_report = report
        return report

    def abandon(self):
        """Stop (Esc, a failure): nothing is written; the scene is as it was."""
        if self.line is not None:
            self.line.done()
        self.close()

    def close(self):
        """Put back what the run changed: the armature's action, pose channels and switches (what playing the clips
        and the baked actions wrote into it), its settings, the scene's frame, and the clips imported onto the
        user's armature (a file whose import was under way is undone)."""
        if self.importer is not None:
            self.importer.abandon(self.context)
            self.importer = None
        if self.restore is not None:
            saved, kept = self.restore, self.kept
            obj = self.obj
            self.restore = self.kept = None
            try:
                kept.__exit__(None, None, None)
                _restore_settings(self.context, obj, saved)
            except ReferenceError:      # the armature (or its action) was deleted between two steps in the window
                pass
        self.context.scene.frame_set(self.frame)      # playing the clips moved it; the user's frame stays theirs
        if self.user_armature_import:                  # clips imported onto the user's armature go with the run
            for action in [a for a in bpy.data.actions if a not in self.actions_before]:
                bpy.data.actions.remove(action)
            self.user_armature_import = False


def run_evaluation(context, options, notes=None):
    """The whole evaluation at once (what the operator does headless). Returns the report dict."""
    return Evaluation(context, options, notes).finish()


def _mask(bone_map):
    return np.array([bool(bone_map.get(role)) for role in ROLES])


def _actions(obj, bone_map, names, driven=False):
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    bones = {b for b in bone_map.values() if b}
    if driven:      # driven deform bones follow whatever bones the action keys (a control rig's controls)
        bones = set(obj.pose.bones.keys())
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
        names = list_bvh_files(folder, options.get("mean_pose_files_pattern", ""), max_files=options.get("mean_pose_files", 20))
        paths = [os.path.join(folder, n) for n in names]
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
    from ...properties import set_bone_map

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


# ---- the operator's job -----------------------------------------------------------------------------------------

last_report = {}


def evaluate(context, options, notes=None):
    """run_evaluation as the Evaluate operator runs it headless. Returns the report; raises EvaluationError (or
    OSError/ValueError from writing the files)."""
    return run_evaluation(context, options, notes)


def summary(report):
    """(the results table, a one-line summary) of a report."""
    frames = sum(c["frames"] for c in report["clips"])
    best = ", ".join(f"{report['methods'][m]}: inner {r['inner_mpjpe_cm']:.2f} cm, effector {r['effector_cm']['mean']:.2f} cm"
                     for m, r in report["results"].items())
    return (eval_report.table(report["results"], report["methods"]),
            f"Evaluated {len(report['clips'])} clips ({frames} frames): {best}")
