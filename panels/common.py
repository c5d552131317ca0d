"""Helpers the sidebar panels share: drawing an operator with its properties filled (a name or property that does not
exist raises: a typo must not draw a quiet button), and reading what a dataset or model file holds without loading
its arrays.

Panels redraw many times a second, so file facts are cached by (path, modification time, size): the panel shows
the file as it is on disk, and re-reads it only when it changes.
"""

import json
import os

import bpy
import numpy as np

from ..blender.models import file_key
from ..neural_network.data.files import decode_meta
from ..neural_network.skeleton.roles import TASKS

classes = ()

OPERATOR_PREFIX = "NEURAL_IK_OT_"


def operator_idname(name):
    """'neural_ik.<name>' of a registered operator. One that is not registered is a bug (a typo, a class left out of
    registration), and Blender would only print about it and draw nothing: this raises instead."""
    if not hasattr(bpy.types, OPERATOR_PREFIX + name):
        raise AttributeError(f"bpy.ops.neural_ik.{name} is not registered")
    return f"neural_ik.{name}"


def operator(layout, name, text=None, icon="NONE", **properties):
    """Draw bpy.ops.neural_ik.<name> with the given properties (None leaves a property at its default).

    An operator that is not registered, or a property it does not declare, raises (Blender raises AttributeError
    for the property), so a typo fails the panel's draw instead of drawing a button that does something else.
    Returns the operator properties.
    """
    idname = operator_idname(name)
    props = layout.operator(idname, text=text, icon=icon) if text is not None else layout.operator(idname, icon=icon)
    for key, value in properties.items():
        if value is not None:
            setattr(props, key, value)
    return props


def absolute(path):
    """A user path ('//' relative to the .blend, '~') as an absolute file system path ('' stays '')."""
    if not path:
        return ""
    return os.path.normpath(os.path.expanduser(bpy.path.abspath(path)))


_meta_cache = {}


def read_meta(path):
    """(meta dict, None) of a Neural IK .npz or an ONNX model's JSON sidecar, or (None, reason in words).

    Only the small `meta` entry of the .npz is decompressed (np.load is lazy), never the arrays.
    """
    path = absolute(path)
    if not path:
        return None, "no file chosen"
    key = file_key(path)
    if key is None:
        return None, f"{os.path.basename(path) or path} does not exist yet"
    cached = _meta_cache.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    result = _read_meta_uncached(path)
    _meta_cache[path] = (key, result)
    return result


def _read_meta_uncached(path):
    name = os.path.basename(path)
    try:
        if path.lower().endswith(".onnx"):
            sidecar = os.path.splitext(path)[0] + ".json"
            if not os.path.isfile(sidecar):
                return None, f"{name} has no JSON sidecar"
            with open(sidecar, encoding="utf-8") as handle:
                meta = json.load(handle)
        else:
            with np.load(path, allow_pickle=False) as data:
                if "meta" not in data.files:
                    return None, f"{name} is not a Neural IK file"
                meta = decode_meta(data["meta"])
    except (OSError, ValueError, KeyError, EOFError) as exc:
        return None, f"{name} cannot be read: {exc}"
    if not isinstance(meta, dict):
        return None, f"{name} has unreadable metadata"
    return meta, None


def task_name(task):
    if isinstance(task, int) and 0 <= task < len(TASKS):
        return TASKS[task]
    return str(task)


def dataset_summary(meta):
    """Plain facts about a dataset's metadata: actions, frames, frames per task, rig, frame rate, and how many actions
    are library motion retargeted from another skeleton (the rest is the rig's own)."""
    actions = meta.get("actions") or []
    per_task = {}
    frames = 0
    for action in actions:
        samples = int(action.get("samples", 0) or 0)
        frames += samples
        name = task_name(action.get("task", "?"))
        per_task[name] = per_task.get(name, 0) + samples
    skeleton = meta.get("skeleton") or {}
    rig = skeleton.get("name") or ""
    source = meta.get("source") or ""
    if isinstance(source, list | tuple):
        source = ", ".join(str(s) for s in source[:3])
    return {
        "actions": len(actions),
        "frames": frames,
        "per_task": [(task, per_task[task]) for task in TASKS if task in per_task]
        + [(task, count) for task, count in per_task.items() if task not in TASKS],
        "rig": rig,
        "source": str(source),
        "fps": meta.get("fps"),
        "retargeted": sum(1 for a in actions if isinstance(a.get("source"), dict) and a["source"].get("retargeted")),
    }


METRIC_LABELS = (
    ("effector_cm_mean", "Effector error", "cm"),
    ("effector_cm_p95", "Effector error p95", "cm"),
    ("inner_mpjpe_cm", "Inner joints", "cm"),
    ("mpjpe_cm", "All joints", "cm"),
    ("effector_rotation_deg", "Effector rotation", "°"),
    ("contact_height_cm", "Planted foot height", "cm"),
    ("foot_slip_cm", "Foot slip", "cm"),
)


def metric_lines(metrics):
    """[(label, 'value unit')] for the metrics a checkpoint or the trainer reports, known names first."""
    lines = []
    known = set()
    for key, label, unit in METRIC_LABELS:
        value = metrics.get(key)
        if isinstance(value, int | float):
            lines.append((label, f"{value:.2f} {unit}"))
            known.add(key)
    for key, value in metrics.items():
        if key not in known and key != "frames" and isinstance(value, int | float) and not isinstance(value, bool):
            lines.append((key.replace("_", " ").capitalize(), f"{value:.3g}"))
    return lines


def format_seconds(seconds):
    if seconds is None or not np.isfinite(seconds):
        return "-"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds}s"


def format_number(value, fmt="{:.4g}"):
    try:
        if value is None or not np.isfinite(value):
            return "-"
    except TypeError:
        return "-"
    return fmt.format(value)
