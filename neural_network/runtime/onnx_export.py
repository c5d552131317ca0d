"""A trained Model as one ONNX file (opset 17), and the checked loading of model files for the live solver.

The graph holds everything between the 50 raw inputs and the clamped deltas, so a game engine needs nothing else:

    inputs (batch, 50) -> Sub(input_mean) -> Div(input_std) -> [MatMul, Add, Tanh]* -> MatMul, Add
                       -> Min(limit_high) -> Max(limit_low) -> deltas (batch, 69)

The deltas are axis-angle offsets per role (roles.ROLES order) from the mean local pose:
local rotation of role j = mean_pose_j @ exp(delta_j). That map, the bone names, the input layout and its
references, the units and the rig fingerprint ride along in `metadata_props` (strings; JSON where structured) and in
a JSON sidecar with the same keys. The weights are the graph's initializers, so an ONNX file loads back into a full
NumPy Model (used when onnxruntime is missing) after its inputs, outputs, metadata and weights have been checked -
before any inference session is created.
"""

import json
import os

import numpy as np

from ..data.features import INPUT_NAMES, LAYOUT_VERSION, NUM_INPUTS, FeatureSpec
from ..data.files import FileRefused, atomic_write_bytes, check_readable_file, save_json
from ..model.model import Model
from ..skeleton.roles import NUM_ROLES, ROLES
from ..skeleton.skeleton import Skeleton

OPSET = 17
FORMAT_VERSION = 1
KIND = "neural_ik.onnx"
INPUT_NAME = "inputs"
OUTPUT_NAME = "deltas"
NUM_OUTPUTS = NUM_ROLES * 3
UNITS = "metres and radians, character space (the armature's own space turned +Z up, scaled to metres)"
OUTPUT_MEANING = ("axis-angle delta per role and axis (x, y, z), roles in the listed order; "
                  "local rotation of role j (Blender's matrix_basis of its bone) = mean_pose[j] @ exp(delta[j])")


# ---- checks shared by every way a model arrives -------------------------------------------------------------

def check_model(model, name="model"):
    """Raise FileRefused unless the model's arrays have the documented shapes and hold only finite numbers."""
    w = model.weights
    if len(w) < 2 or len(w) % 2:
        raise FileRefused(f"{name} has {len(w)} weight arrays; a network needs pairs of weights and biases")
    fan_in = NUM_INPUTS
    for i in range(0, len(w), 2):
        W, b = np.asarray(w[i]), np.asarray(w[i + 1])
        if W.ndim != 2 or W.shape[0] != fan_in or b.shape != (W.shape[1],):
            raise FileRefused(f"{name}: layer {i // 2} has shapes {W.shape} and {b.shape}, which do not chain from {fan_in}")
        fan_in = W.shape[1]
    if fan_in != NUM_OUTPUTS:
        raise FileRefused(f"{name} predicts {fan_in} numbers, expected {NUM_OUTPUTS} (23 roles x 3)")
    shapes = {"input_mean": (NUM_INPUTS,), "input_std": (NUM_INPUTS,), "mean_pose": (NUM_ROLES, 3, 3),
              "limit_low": (NUM_ROLES, 3), "limit_high": (NUM_ROLES, 3)}
    for attr, shape in shapes.items():
        value = np.asarray(getattr(model, attr))
        if value.shape != shape:
            raise FileRefused(f"{name}: {attr} has shape {value.shape}, expected {shape}")
    arrays = [*w, model.input_mean, model.input_std, model.mean_pose, model.limit_low, model.limit_high]
    if not all(np.all(np.isfinite(np.asarray(a))) for a in arrays):
        raise FileRefused(f"{name} holds NaN or infinite weights; it cannot drive a rig")
    if np.any(np.asarray(model.input_std) <= 0):
        raise FileRefused(f"{name} has a zero or negative input scale")
    if np.any(np.asarray(model.limit_low) > np.asarray(model.limit_high)):
        raise FileRefused(f"{name} has joint limits whose low end lies above the high end")


def check_rig(model, skeleton, name="model"):
    """Refuse a model made for another rig (bone map and proportions, by fingerprint)."""
    if skeleton is None:
        return
    made_for, this_rig = model.skeleton.fingerprint(), skeleton.fingerprint()
    if made_for != this_rig:
        differing = [r for r, a, b in zip(ROLES, model.skeleton.bone_names, skeleton.bone_names) if a != b]
        detail = f" (bones differ for {', '.join(differing[:4])})" if differing else " (bone lengths differ)"
        raise FileRefused(f"{name} was made for another rig{detail}: fingerprint {made_for}, this rig {this_rig}")


# ---- export ------------------------------------------------------------------------------------------------

def metadata(model):
    """The strings stored in metadata_props and the sidecar: everything needed to use the deltas."""
    skeleton = model.skeleton
    bone_map = {role: bone for role, bone in zip(ROLES, skeleton.bone_names)}
    info = {
        "neural_ik.kind": KIND,
        "neural_ik.format_version": FORMAT_VERSION,
        "neural_ik.layout_version": LAYOUT_VERSION,
        "neural_ik.rig_fingerprint": skeleton.fingerprint(),
        "neural_ik.bone_map": bone_map,
        "neural_ik.roles": list(ROLES),
        "neural_ik.input_names": list(INPUT_NAMES),
        "neural_ik.input": {"name": INPUT_NAME, "shape": ["batch", NUM_INPUTS], "dtype": "float32"},
        "neural_ik.output": {"name": OUTPUT_NAME, "shape": ["batch", NUM_OUTPUTS], "dtype": "float32",
                             "meaning": OUTPUT_MEANING},
        "neural_ik.units": UNITS,
        "neural_ik.layer_sizes": [int(s) for s in model.layer_sizes],
        "neural_ik.mean_pose": np.asarray(model.mean_pose, np.float64).tolist(),
        "neural_ik.limits": {"low": np.asarray(model.limit_low, np.float64).tolist(),
                             "high": np.asarray(model.limit_high, np.float64).tolist()},
        "neural_ik.skeleton": skeleton.to_json(),
        "neural_ik.feature_spec": model.feature_spec.to_json(),
        "neural_ik.metrics": model.meta.get("metrics", {}) if isinstance(model.meta, dict) else {},
    }
    return info


def _onnx_package(what):
    """The onnx package, or a plain refusal where it is missing (the extension's zip bundles it)."""
    try:
        import onnx
    except ImportError:
        raise FileRefused(f"{what} needs the onnx package, which the extension's zip bundles: install Neural IK from "
                          "its zip (or load the .npz checkpoint instead)") from None
    return onnx


def build_onnx(model):
    """onnx.ModelProto computing Model.predict_clamped, built with onnx.helper."""
    onnx = _onnx_package("Export ONNX")
    from onnx import TensorProto, helper, numpy_helper

    check_model(model)
    f32 = lambda a: np.ascontiguousarray(np.asarray(a, np.float32))
    inits = [numpy_helper.from_array(f32(model.input_mean), "input_mean"),
             numpy_helper.from_array(f32(model.input_std), "input_std"),
             numpy_helper.from_array(f32(np.asarray(model.limit_low).reshape(-1)), "limit_low"),
             numpy_helper.from_array(f32(np.asarray(model.limit_high).reshape(-1)), "limit_high")]
    nodes = [helper.make_node("Sub", [INPUT_NAME, "input_mean"], ["centred"], name="centre"),
             helper.make_node("Div", ["centred", "input_std"], ["h0"], name="scale")]
    layers = len(model.weights) // 2
    current = "h0"
    for k in range(layers):
        inits.append(numpy_helper.from_array(f32(model.weights[2 * k]), f"W{k}"))
        inits.append(numpy_helper.from_array(f32(model.weights[2 * k + 1]), f"b{k}"))
        nodes.append(helper.make_node("MatMul", [current, f"W{k}"], [f"z{k}m"], name=f"matmul{k}"))
        nodes.append(helper.make_node("Add", [f"z{k}m", f"b{k}"], [f"z{k}"], name=f"bias{k}"))
        current = f"z{k}"
        if k < layers - 1:
            nodes.append(helper.make_node("Tanh", [current], [f"h{k + 1}"], name=f"tanh{k}"))
            current = f"h{k + 1}"
    nodes.append(helper.make_node("Min", [current, "limit_high"], ["below_high"], name="clamp_high"))
    nodes.append(helper.make_node("Max", ["below_high", "limit_low"], [OUTPUT_NAME], name="clamp_low"))
    graph = helper.make_graph(
        nodes, "neural_ik",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", NUM_INPUTS])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", NUM_OUTPUTS])],
        initializer=inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="neural_ik", producer_version=str(FORMAT_VERSION))
    proto.ir_version = 8   # readable by onnxruntime 1.14 and later
    proto.doc_string = "Neural IK: 50 target/root/ground/task inputs -> clamped axis-angle deltas from the mean pose"
    for key, value in metadata(model).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value if isinstance(value, str) else json.dumps(value)
    onnx.checker.check_model(proto)
    return proto


def sidecar_path(path):
    return os.path.splitext(os.fspath(path))[0] + ".json"


def export_onnx(model, path):
    """Write the .onnx file and its JSON sidecar atomically; returns (onnx path, sidecar path)."""
    data = build_onnx(model).SerializeToString()
    atomic_write_bytes(path, lambda handle: handle.write(data))
    side = sidecar_path(path)
    save_json(side, metadata(model))
    return os.fspath(path), side


# ---- loading -----------------------------------------------------------------------------------------------

def _dims(value_info):
    dims = value_info.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else None for d in dims]


def model_from_onnx_proto(proto, name="ONNX file"):
    """Model from a parsed ONNX proto, after checking its interface, metadata and weights (no session is made)."""
    from onnx import TensorProto, numpy_helper

    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    if [i.name for i in inputs] != [INPUT_NAME] or [o.name for o in graph.output] != [OUTPUT_NAME]:
        raise FileRefused(f"{name} is not a Neural IK model: inputs {[i.name for i in inputs]}, "
                          f"outputs {[o.name for o in graph.output]}")
    for info, width in ((inputs[0], NUM_INPUTS), (graph.output[0], NUM_OUTPUTS)):
        if info.type.tensor_type.elem_type != TensorProto.FLOAT or len(_dims(info)) != 2 or _dims(info)[1] != width:
            raise FileRefused(f"{name}: {info.name} has shape {_dims(info)}, expected (batch, {width}) float32")
    meta = {p.key: p.value for p in proto.metadata_props}
    if meta.get("neural_ik.kind") != KIND:
        raise FileRefused(f"{name} has no Neural IK metadata")
    try:
        layout = json.loads(meta["neural_ik.layout_version"])
        if layout != LAYOUT_VERSION:
            raise FileRefused(f"{name} uses input layout {layout}; this version of Neural IK uses {LAYOUT_VERSION}")
        if json.loads(meta["neural_ik.input_names"]) != list(INPUT_NAMES):
            raise FileRefused(f"{name} expects other inputs than this version builds")
        if json.loads(meta["neural_ik.roles"]) != list(ROLES):
            raise FileRefused(f"{name} was made with another role list")
        skeleton = Skeleton.from_json(json.loads(meta["neural_ik.skeleton"]))
        spec = FeatureSpec.from_json(json.loads(meta["neural_ik.feature_spec"]))
        mean_pose = np.asarray(json.loads(meta["neural_ik.mean_pose"]), np.float64)
        limits = json.loads(meta["neural_ik.limits"])
        layer_sizes = json.loads(meta["neural_ik.layer_sizes"])
        fingerprint = meta["neural_ik.rig_fingerprint"]
        if not isinstance(limits, dict) or not isinstance(layer_sizes, list) or len(layer_sizes) < 2 or not all(
                isinstance(s, int) and 0 < s < 100000 for s in layer_sizes):
            raise FileRefused(f"{name} has malformed joint limits or layer sizes in its metadata")
    except FileRefused:
        raise
    except (KeyError, ValueError, TypeError) as exc:
        raise FileRefused(f"{name} has incomplete or unreadable Neural IK metadata ({exc})") from None
    if skeleton.fingerprint() != fingerprint:
        raise FileRefused(f"{name}: its skeleton does not match its rig fingerprint (edited or damaged metadata)")
    arrays = {}
    for key in ["input_mean", "input_std", "limit_low", "limit_high"] + [f"{p}{k}" for k in range(len(layer_sizes) - 1)
                                                                       for p in "Wb"]:
        if key not in inits:
            raise FileRefused(f"{name} lacks the weight {key}")
        arrays[key] = numpy_helper.to_array(inits[key]).astype(np.float32)
    weights = []
    for k in range(len(layer_sizes) - 1):
        weights += [arrays[f"W{k}"], arrays[f"b{k}"]]
    model = Model(skeleton=skeleton, feature_spec=spec, weights=weights, input_mean=arrays["input_mean"],
                  input_std=arrays["input_std"], mean_pose=mean_pose,
                  limit_low=np.asarray(limits.get("low"), np.float64), limit_high=np.asarray(limits.get("high"), np.float64),
                  meta={"source": "onnx", "metrics": json.loads(meta.get("neural_ik.metrics", "{}"))})
    if np.asarray(model.limit_low).shape == (NUM_ROLES * 3,):
        model.limit_low = model.limit_low.reshape(NUM_ROLES, 3)
        model.limit_high = model.limit_high.reshape(NUM_ROLES, 3)
    check_model(model, name)
    if [int(s) for s in model.layer_sizes] != [int(s) for s in layer_sizes]:
        raise FileRefused(f"{name}: its weights do not match its declared layer sizes {layer_sizes}")
    expected = [n.op_type for n in build_onnx(model).graph.node]
    if [n.op_type for n in graph.node] != expected:
        raise FileRefused(f"{name}: its graph is not the network its metadata describes")
    return model


def load_onnx(path):
    """(Model, serialized bytes) from an .onnx file, checked before any session exists."""
    onnx = _onnx_package("Reading an ONNX model")

    path = os.fspath(path)
    base = os.path.basename(path)
    check_readable_file(path)
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        proto = onnx.load_model_from_string(data)
    except Exception as exc:   # protobuf raises its own DecodeError, or RuntimeError on truncation
        raise FileRefused(f"{base} is not a readable ONNX file (truncated or corrupt): {type(exc).__name__}") from None
    if not proto.graph.node:
        raise FileRefused(f"{base} is not a readable ONNX file (no graph)")
    return model_from_onnx_proto(proto, base), data


def load_model_file(path, skeleton=None):
    """Model from a checkpoint (.npz) or an ONNX file, refused unless it fits `skeleton`'s rig.

    Returns (model, onnx_bytes or None); the bytes let the solver open the very graph that was checked.
    """
    path = os.fspath(path)
    check_readable_file(path)
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic.startswith(b"PK"):   # a zip: the .npz checkpoint
        from ..model import checkpoint

        model, data = checkpoint.load_model(path), None
    else:
        model, data = load_onnx(path)
    check_model(model, os.path.basename(path))
    check_rig(model, skeleton, os.path.basename(path))
    return model, data
