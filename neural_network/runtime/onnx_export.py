"""A trained Model as one ONNX file (opset 17) plus a JSON sidecar (loading it back: model_files.py).

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

from ..data.features import INPUT_NAMES, LAYOUT_VERSION, NUM_INPUTS
from ..data.files import FileRefused, atomic_write_bytes, save_json
from ..model.model import check_model
from ..skeleton.roles import NUM_ROLES, ROLES

OPSET = 17
FORMAT_VERSION = 1
KIND = "neural_ik.onnx"
INPUT_NAME = "inputs"
OUTPUT_NAME = "deltas"
NUM_OUTPUTS = NUM_ROLES * 3
UNITS = "metres and radians, character space (the armature's own space turned +Z up, scaled to metres)"
OUTPUT_MEANING = ("axis-angle delta per role and axis (x, y, z), roles in the listed order; "
                  "local rotation of role j (Blender's matrix_basis of its bone) = mean_pose[j] @ exp(delta[j])")


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


def onnx_package(what):
    """The onnx package, or a plain refusal where it is missing (the extension's zip bundles it)."""
    try:
        import onnx
    except ImportError:
        raise FileRefused(f"{what} needs the onnx package, which the extension's zip bundles: install Neural IK from "
                          "its zip (or load the .npz checkpoint instead)") from None
    return onnx


def build_onnx(model):
    """onnx.ModelProto computing Model.predict_clamped, built with onnx.helper."""
    onnx = onnx_package("Export ONNX")
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
