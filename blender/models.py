"""Models per armature: loaded from the armature's model path once and cached for this Blender session (read again
when the file changes), checked against the armature's rig; loading a file as an armature's model; ONNX export.

Raises LiveError with a message for the user.
"""

import os

import bpy

from ..neural_network.data.files import FileRefused
from ..neural_network.model.model import check_rig
from ..neural_network.runtime.model_files import load_model_file
from ..neural_network.runtime.onnx_export import export_onnx
from ..properties import get_bone_map
from .errors import LiveError
from .rig import rig_model

# Models loaded for armatures in this Blender session: {object name: (file key, Model, onnx bytes or None)}; the key
# "" marks a model given in memory (no file).
loaded_models = {}


def file_key(path):
    """What identifies a file's content on disk: (absolute path, modification time, size), so a file rewritten at
    the same path is read again; None when it cannot be read."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


def rig_of(obj):
    """The armature's RigModel through its bone map."""
    try:
        return rig_model.read_rig(obj, get_bone_map(obj))
    except rig_model.RigError as exc:
        raise LiveError(str(exc)) from None


def model_path_of(obj):
    return bpy.path.abspath(obj.neural_ik.model_path) if obj.neural_ik.model_path else ""


def model_of(obj, rig=None):
    """(Model, onnx bytes) for an armature: cached, or loaded from its model path and checked against its rig."""
    path = model_path_of(obj)
    key = file_key(path) if path else ""
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


def model_group(obj):
    """What armatures share when they drive with the same model file (their cached file key; "" for none)."""
    return loaded_models[obj.name][0] if obj.name in loaded_models else ""


def load_model(obj, filepath):
    """Load a checkpoint or ONNX file as the armature's model (refused when made for another rig); returns its path."""
    rig = rig_of(obj)
    if not filepath:
        raise LiveError("choose a model file (.npz checkpoint or .onnx)")
    path = bpy.path.abspath(filepath)
    try:
        model, data = load_model_file(path, rig.skeleton)
    except FileRefused as exc:
        raise LiveError(str(exc)) from None
    loaded_models[obj.name] = (file_key(path), model, data)
    obj.neural_ik.model_path = path
    return path


def export_model(obj, filepath):
    """Write the armature's model as ONNX (".onnx" added when missing) with its JSON sidecar; returns both paths."""
    model, _data = model_of(obj)
    if not filepath:
        raise LiveError("choose where to write the .onnx file")
    path = bpy.path.abspath(filepath)
    if not path.lower().endswith(".onnx"):
        path += ".onnx"
    try:
        return export_onnx(model, path)
    except FileRefused as exc:
        raise LiveError(str(exc)) from None
    except OSError as exc:
        raise LiveError(f"could not write {filepath}: {exc.strerror or exc}") from None


def forget_models():
    """Drop every cached model (another file is being loaded)."""
    loaded_models.clear()
