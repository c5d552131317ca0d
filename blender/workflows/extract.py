"""Training data out of Blender: the actions of an armature that move its mapped bones, every frame of them as a
Dataset (nothing in the file changes), and the dataset written where the user chose.

Raises DataError with a message for the user.
"""

import os

import bpy

from ...neural_network.data.dataset import DatasetBuilder
from ...neural_network.data.files import FileRefused
from ...neural_network.skeleton.roles import ROLES
from ..errors import DataError
from ..rig import action_layouts, pose_read, rig_model
from ..rig.action_sources import action_source, action_task
from ..rig.armatures import armature_to_use, check_armature
from ..rig.bone_maps import bone_map_of

NO_ARMATURE = "select an armature first (no armature is active or chosen in the Neural IK panel)"


def usable_actions(obj, rig):
    """([(action, its parsed channels)], [notes]) for every action in the file, by name."""
    mapped = {rig.bone_names[b] for b in rig.role_bones if b >= 0}
    if rig.driven:       # driven deform bones follow whatever bones the action keys (a control rig's controls)
        mapped = set(rig.bone_names)
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
    check_armature(obj, DataError, NO_ARMATURE)
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
    ranges = [action_layouts.action_frame_range(a) for a, _ in chosen]
    builder = DatasetBuilder(rig.skeleton, scene_fps(context.scene),
                             source=os.path.basename(bpy.data.filepath) or obj.name,
                             capacity=sum(last - first + 1 for first, last in ranges))
    add_actions(builder, rig, obj, chosen, notes)
    if not builder.actions:
        raise DataError(f"no action of {obj.name!r} could be extracted: {'; '.join(notes[-3:])}")
    return finish_dataset(builder, obj, rig, mapping, chosen, notes), notes


def scene_fps(scene):
    return scene.render.fps / (scene.render.fps_base or 1.0)


def add_actions(builder, rig, obj, chosen, notes):
    """Every frame of the actions `chosen` ([(action, channels)], usable_actions) into a DatasetBuilder; actions
    whose keys are not finite are left out and said in `notes`."""
    ranges = [action_layouts.action_frame_range(a) for a, _ in chosen]
    tasks = [action_task(a) for a, _ in chosen]
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


def finish_dataset(builder, obj, rig, mapping, chosen, notes, sources=None, spec=None):
    """The Dataset of a builder filled from `obj`: the armature, its bone map and where each action's motion comes
    from (its source note, or `sources` {name: note} for rows that are no action of the file) in the metadata;
    spec: the input references to use (DatasetBuilder.finish)."""
    extra = {"armature": obj.name, "bone_map": {r: mapping.get(r, "") for r in ROLES}}
    if rig.driven and chosen:
        extra["pose_source"] = f"evaluated ({'; '.join(rig.driven)})"
        notes.append(f"read Blender's evaluated pose frame by frame: the mapped bones are driven ({'; '.join(rig.driven)})")
    dataset = builder.finish(extra, spec)
    known = {a.name: action_source(a) for a, _ in chosen}      # library motion (BVH imports) or the user's own
    known.update(sources or {})
    for entry in dataset.meta["actions"]:
        entry["source"] = known.get(entry["name"], {"kind": "own"})
    return dataset


def write_dataset(context, filepath):
    """Extract the chosen armature's dataset and write it to `filepath` (".npz" added when missing); the scene's
    dataset path then points at it. Returns (path, Dataset, notes)."""
    path = bpy.path.abspath(filepath) if filepath else ""
    if not path:
        raise DataError("choose a file to write the dataset to")
    if not path.lower().endswith(".npz"):
        path += ".npz"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise DataError(f"cannot write {path}: folder {folder} does not exist or is not writable")
    obj = armature_to_use(context, DataError, missing=NO_ARMATURE)
    try:
        dataset, notes = extract_dataset(context, obj)
        dataset.save(path)
    except FileRefused as exc:
        raise DataError(str(exc)) from None
    except OSError as exc:
        raise DataError(f"cannot write {path}: {exc.strerror or exc}") from None
    context.scene.neural_ik.dataset_path = path
    return path, dataset, notes
