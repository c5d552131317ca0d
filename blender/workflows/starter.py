"""Train Starter Model: a model for a rig that has few clips of its own, or none, from the starter motion that ships
with the extension (`weights/starter_motion.npz`, neural_network/data/starter_motion.py) retargeted onto it, plus
the rig's own clips when it has some (they stay its own: Own Clips Share and Library › Compare apply as in Train).

The starter motion is carried onto the rig in NumPy, the way Import BVH Folder › Onto Active Armature carries a file
of its skeleton (the same calibration of the rig: Retargeter), straight into dataset rows: no action is made and
nothing in the file changes. Training then runs as Train does (a thread in the UI, progress, Cancel keeps the best);
the armature's model becomes the result. A rig whose model is already one of its own (a starter model, or one
trained before) starts from that model's weights, so a later run with new clips improves it.

Raises DataError with a message for the user.
"""

import csv
import os
import tempfile
import time

import bpy
import numpy as np

from ...neural_network.data import retarget as core
from ...neural_network.data.dataset import DatasetBuilder
from ...neural_network.data.files import FileRefused
from ...neural_network.data.starter_motion import StarterMotion, resample
from ...neural_network.geometry.rotations import matrix_to_quaternion
from ...neural_network.model import checkpoint, trainer, transfer
from ...neural_network.skeleton.roles import TASKS, task_from_name
from ..errors import DataError
from ..rig.armatures import armature_to_use
from ..rig.bone_maps import bone_map_of
from . import training
from .extract import NO_ARMATURE, add_actions, finish_dataset, scene_fps, usable_actions
from .retarget import Retargeter

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STARTER_MOTION = os.path.join(PACKAGE_ROOT, "weights", "starter_motion.npz")
STARTER_NETWORK = os.path.join(PACKAGE_ROOT, "weights", "starter_network.npz")
DEFAULT_TIME_LIMIT = 300.0
PRIOR_MEMBERS = 1           # one of each prior: the time limit goes to the network (Train trains the scene's setting, 2)
CALIBRATION_STEP = 10        # every tenth frame of every file calibrates the starter motion's skeleton
STARTER_SOURCE = {"kind": "library", "file": "starter motion", "skeleton": "starter", "retargeted": True}


def build_starter_motion(folders, fps=30.0, exclude="", scale=0.01, credit="", log=None):
    """A StarterMotion from BVH folders of one skeleton (scripts/make_starter_motion.py): each file through
    Blender's BVH importer and the retarget's reading of a source skeleton (joint frames, stood up), its first frame
    (a T-pose in the CMU conversions) dropped and the rest resampled to `fps`; the skeleton calibrated from every
    CALIBRATION_STEP-th frame of every file. A `descriptions.csv` beside the files (CMU's columns) names each clip's
    motion and so its task. Imported objects are removed again and the scene keeps its frame rate. Raises
    DataError."""
    render = bpy.context.scene.render
    scene_rate = (render.fps, render.fps_base)          # the importer sets the scene to each file's rate
    try:
        clips, rig, joints, heads = _read_starter_files(folders, fps, exclude, scale, log)
    finally:
        render.fps, render.fps_base = scene_rate
    skel = rig.skeleton
    try:
        calibration = core.calibrate(skel.role_mask, np.broadcast_to(np.eye(3), skel.rest_rotations.shape),
                                     skel.rest_positions, joints, heads)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    return StarterMotion.from_clips(calibration, fps, clips, credit)


def _read_starter_files(folders, fps, exclude, scale, log):
    """(clips as StarterMotion.from_clips takes them, the files' RigModel, pooled joint-frame orientations and heads
    that calibrate their skeleton)."""
    from .bvh_import import import_bvh, list_bvh_files, remove_imported
    from .retarget import read_source_motion, source_map

    clips, pool_joints, pool_heads, skeleton, rig = [], [], [], None, None
    for folder in folders:
        words = clip_descriptions(folder)
        for name in list_bvh_files(folder, exclude=exclude):
            obj = import_bvh(os.path.join(folder, name), scale)
            try:
                key = tuple((b.name, b.parent.name if b.parent else "") for b in obj.data.bones)
                if skeleton is not None and key != skeleton:
                    raise DataError(f"{name} is of another skeleton than the files before it")
                skeleton = key
                rig, _sample, rest, rotations, heads, hips = read_source_motion(obj, source_map(obj),
                                                                                obj.animation_data.action)
            finally:
                remove_imported(obj)
            if len(rotations) < 3:
                raise DataError(f"{name} has fewer than 3 frames")
            file_fps = scene_fps(bpy.context.scene)
            joints = rotations[1:] @ np.swapaxes(rest, -1, -2)[None]
            pool_joints.append(joints[::CALIBRATION_STEP])
            pool_heads.append(heads[1::CALIBRATION_STEP])
            stem = os.path.splitext(name)[0]
            text = words.get(stem, stem)
            quats, moved = resample(matrix_to_quaternion(joints), hips[1:], file_fps, fps)
            clips.append((stem, text, TASKS[task_from_name(text)], quats, moved))
            if log is not None:
                log(f"{name}: {len(joints)} frames at {file_fps:g} fps -> {len(quats)} ({text})")
    return clips, rig, np.concatenate(pool_joints), np.concatenate(pool_heads)


def clip_descriptions(folder):
    """{file stem: description} from a CMU-style descriptions.csv (Subject, Trial #, Motion Description)."""
    path = os.path.join(folder, "descriptions.csv")
    if not os.path.isfile(path):
        return {}
    out = {}
    with open(path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            try:
                out[f"{int(row['Subject']):03d}_{int(row['Trial #']):02d}"] = row["Motion Description"].strip()
            except (KeyError, TypeError, ValueError):
                continue
    return out


def load_starter_motion(path=""):
    """The starter motion at `path` (empty: the one that ships); DataError when it cannot be used."""
    path = path or STARTER_MOTION
    try:
        return StarterMotion.load(path)
    except (FileRefused, OSError, ValueError) as exc:
        raise DataError(f"the starter motion cannot be read: {exc}") from None


def usable_rig(context):
    """The armature Train Starter Model acts on, refused in words when it is missing or not mapped well enough to
    carry motion onto (before any work): (object, its Retargeter)."""
    obj = armature_to_use(context, DataError, missing=NO_ARMATURE)
    if not any(bone_map_of(obj).values()):
        raise DataError(f"armature {obj.name!r} has no bone map yet: run Auto Map or fill the bone map")
    return obj, Retargeter(obj)


def starter_dataset(context, obj, retargeter, motion, spec=None):
    """(Dataset, notes, the rows of the starter clips in clip order): every clip of `motion` carried onto `obj`
    (library rows), after the rig's own usable actions when it has any (own rows, read as Extract reads them);
    spec: the input references of a model the training starts from. Changes nothing in the file."""
    rig = retargeter.rig
    chosen, notes = usable_actions(obj, rig)
    builder = DatasetBuilder(rig.skeleton, scene_fps(context.scene),
                             source=f"starter motion + {os.path.basename(bpy.data.filepath) or obj.name}")
    if chosen:
        add_actions(builder, rig, obj, chosen, notes)
    rows = motion.add_to(builder, retargeter.calibration, builder.fps, {entry["name"] for entry in builder.actions})
    sources = {name: dict(STARTER_SOURCE, file=f"starter motion: {motion.names[i]} ({motion.descriptions[i]})")
               for name, i in rows.items()}
    dataset = finish_dataset(builder, obj, rig, bone_map_of(obj), chosen, notes, sources, spec)
    ids = np.nonzero(np.isin(np.asarray(dataset.action_names, str), list(rows)))[0]
    return dataset, notes, np.nonzero(np.isin(dataset.action, ids))[0]


def starting_model(obj, skeleton):
    """The armature's current model file when it is a checkpoint made for this rig (so a later run improves it), else
    None."""
    path = bpy.path.abspath(obj.neural_ik.model_path) if obj.neural_ik.model_path else ""
    if not path or not os.path.isfile(path) or not path.lower().endswith(".npz"):
        return None
    try:
        model = checkpoint.load_model(path)
    except (FileRefused, OSError, ValueError):
        return None
    return model if model.skeleton.fingerprint() == skeleton.fingerprint() else None


def output_directory(directory, obj):
    """The folder the run writes into, made when missing: `directory`, else `starter_<armature>` in the extension's
    user folder (or beside the .blend, or in the temporary folder)."""
    if directory:
        folder = bpy.path.abspath(directory)
    else:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in obj.name)
        base = training.default_output_directory(bpy.data.filepath or os.path.join(tempfile.gettempdir(), "x"))
        folder = os.path.join(base, f"starter_{safe}")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot make the output folder {folder}: {exc.strerror or exc}") from None
    return folder


def load_starter_network(path=""):
    """The starter network at `path` (empty: the one that ships), or None where there is none; DataError when it
    cannot be used."""
    path = path or STARTER_NETWORK
    if not os.path.exists(path):
        return None
    try:
        network = checkpoint.load_model(path)
        transfer.network_calibration(network)
    except (FileRefused, OSError, ValueError) as exc:
        raise DataError(f"the starter network cannot be read: {exc}") from None
    return network


def train_starter(context, directory="", time_limit=DEFAULT_TIME_LIMIT, seed=0, mode="AUTO", motion_path="",
                  network_path=""):
    """Train the active (or chosen) armature's starter model (see the module) for `time_limit` seconds in all, the
    retarget and the data's preparation included. It starts from the armature's own model when it has one for this
    rig, else from the starter network carried onto the rig (network_path: "" the shipped one, None: none, from
    scratch). Returns (message, warning or None)."""
    started = time.time()                       # the time limit counts the retarget and the data's preparation
    if training.is_running():
        raise DataError("a training run is already going on: cancel it first")
    if not time_limit or time_limit <= 0:
        raise DataError("give Train Starter Model a time limit in seconds (the default is 300)")
    obj, retargeter = usable_rig(context)
    motion = load_starter_motion(motion_path)
    start, origin = starting_model(obj, retargeter.rig.skeleton), "its current model"
    dataset, notes, rows = starter_dataset(context, obj, retargeter, motion, start.feature_spec if start else None)
    network = load_starter_network(network_path) if start is None and network_path is not None else None
    if network is not None:
        config = training.config_from_scene(context.scene.neural_ik, 1, time_limit, seed, 0, 0)
        try:
            start, origin = transfer.carried_starter(network, motion, dataset, rows, config), "the starter network"
        except ValueError as exc:
            raise DataError(f"the starter network cannot be carried onto {obj.name!r}: {exc}") from None
    folder = output_directory(directory, obj)
    message, warning = training.start_training(context, "", folder, epochs=trainer.UNBOUNDED_EPOCHS, time_limit=time_limit,
                                               seed=seed, mode=mode, dataset=dataset, armature=obj,
                                               start_from=start, started=started, prior_members=PRIOR_MEMBERS)
    own = int(dataset.own_action_mask().sum())
    said = f"starter motion: {len(motion)} clips ({motion.frame_count} frames) retargeted onto {obj.name!r}"
    said += f", with {own} clip{'' if own == 1 else 's'} of its own" if own else ", no clips of its own"
    if start is not None:
        said += f", starting from {origin}"
    return f"{said}; {message}", warning or (notes[0] if notes and not own else None)
