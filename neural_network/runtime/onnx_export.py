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

A model with a target prior (model/prior.py) also gets `<name>.prior.onnx`: the prior's tanh MLP,

    prior_inputs (batch, 60) -> [MatMul, Add, Tanh]* -> MatMul, Add -> prior_outputs (batch, 54)

and a "neural_ik.prior" entry in the metadata and sidecar with its file name, height, reference rotations and a
plain account of how the inputs are built and the outputs used (prior.prior_inputs and TargetPrior.complete). A model
with a clip prior (a window over a clip, for baking) gets `<name>.clip_prior.onnx` and "neural_ik.clip_prior" the same
way, its inputs 18 wider per offset of its window.
"""

import json
import os

import numpy as np

from ..data.features import INPUT_NAMES, LAYOUT_VERSION, NUM_INPUTS
from ..data.files import FileRefused, atomic_write_bytes, save_json
from ..model.checkpoint import load_prior, prior_arrays, prior_meta, prior_prefix
from ..model.model import check_model
from ..model.prior import HEADING_WEIGHTS, NUM_PRIOR_OUTPUTS, TARGETS, num_inputs
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
PRIOR_KIND = "neural_ik.prior.onnx"
CLIP_PRIOR_KIND = "neural_ik.clip_prior.onnx"
PRIOR_INPUT_NAME = "prior_inputs"
PRIOR_OUTPUT_NAME = "prior_outputs"
PRIOR_FRAME = (
    "F, a rotation with columns x, y, z, at origin o: o = the mean position of the pinned targets, its z set to 0; "
    "x = the sum over pinned targets k of heading_weights[k] * (first column of R_k @ transpose(references[k])), its "
    "z set to 0, normalised ((1, 0, 0) when it vanishes); z = (0, 0, 1); y = z cross x. R_k and p_k: target k's "
    "rotation and position in character space; references: (6, 3, 3) row-major")
PRIOR_INPUT_LAYOUT = (
    "per target in the listed order, 9 numbers: transpose(F) @ (p_k - o) / height, then the first and second "
    "columns of transpose(F) @ R_k; all 9 zero for a free target. Then the free mask: 6 numbers, 1 for free, 0 for "
    "pinned (at least one pinned)")
PRIOR_OUTPUT_MEANING = (
    "per target in the listed order, 9 numbers (u, a, b) in the input's layout. A free target goes to position "
    "o + F @ (u * height) with rotation F @ [c1, c2, c1 cross c2], c1 = a / |a|, c2 = (b - (b . c1) c1) normalised; "
    "pinned targets keep their own")
PRIOR_MIRROR = (
    "where mirror_frames is given ((6, 3, 3) row-major, one per target): also build the inputs of the targets' mirror "
    "image (each target k moved to its partner's slot - the hands swap, the feet swap - with position (-x, y, z) and "
    "rotation diag(-1, 1, 1) @ R_k @ mirror_frames[k]; the free mask swapped the same way), run the prior on them, "
    "place its targets, take them back through the same mirror (it is its own inverse), and average with the plain "
    "answer: positions by their mean, rotations by the rotation nearest their mean matrix (SVD)")

PRIOR_WINDOW = (
    "a clip prior places the frames of one clip: after the free mask come 18 numbers per offset of `window` (seconds; "
    "- before, + after), per offset in that order and per target in the listed order: transpose(F) @ (p_k - q_k) / "
    "height, q_k the target's position in the clip's frame that many seconds away (the nearest frame, clamped to the "
    "clip's first and last); zero for a free target. For the mirror image, q_k comes from the mirrored clip")


def prior_ports(window=()):
    """((input name, width), (output name, width)) of a prior's graph with these window offsets."""
    return (PRIOR_INPUT_NAME, num_inputs(window)), (PRIOR_OUTPUT_NAME, NUM_PRIOR_OUTPUTS)


# ---- export ------------------------------------------------------------------------------------------------

def metadata(model, prior_file=None, clip_file=None):
    """The strings stored in metadata_props and the sidecar: everything needed to use the deltas (and, with
    prior_file and clip_file, the target prior and the clip prior written there)."""
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
    if prior_file is not None and model.prior is not None:
        info["neural_ik.prior"] = prior_section(model.prior, prior_file)
    if clip_file is not None and model.clip_prior is not None:
        info["neural_ik.clip_prior"] = prior_section(model.clip_prior, clip_file)
    return info


def prior_section(target_prior, prior_file):
    """The "neural_ik.prior" entry: where the prior's graph is and how to build its inputs and use its outputs."""
    section = {
        "file": prior_file,
        "input": {"name": PRIOR_INPUT_NAME, "shape": ["batch", num_inputs(target_prior.window)], "dtype": "float32",
                  "layout": PRIOR_INPUT_LAYOUT + ("; " + PRIOR_WINDOW if target_prior.window else "")},
        "output": {"name": PRIOR_OUTPUT_NAME, "shape": ["batch", NUM_PRIOR_OUTPUTS], "dtype": "float32",
                   "meaning": PRIOR_OUTPUT_MEANING},
        "targets": list(TARGETS),
        "frame": PRIOR_FRAME,
        "heading_weights": HEADING_WEIGHTS.tolist(),
        "activation": "tanh",
    }
    if target_prior.mirror_frames is not None:
        section["mirror"] = PRIOR_MIRROR
    section.update(prior_meta(target_prior))     # layer_sizes, height, references (54, row-major), training
    return section


def onnx_package(what):
    """The onnx package, or a plain refusal where it is missing (the extension's zip bundles it)."""
    try:
        import onnx
    except ImportError:
        raise FileRefused(f"{what} needs the onnx package, which the extension's zip bundles: install Neural IK from "
                          "its zip (or load the .npz checkpoint instead)") from None
    return onnx


def _f32(a):
    return np.ascontiguousarray(np.asarray(a, np.float32))


def _dense_layers(weights, current, nodes, inits, prefix="", output=None):
    """Append a tanh MLP's nodes and initializers ({prefix}W{k}, {prefix}b{k}) reading `current`; returns the name
    of its result (`output` when given)."""
    from onnx import helper, numpy_helper

    layers = len(weights) // 2
    for k in range(layers):
        W, b, z = f"{prefix}W{k}", f"{prefix}b{k}", f"{prefix}z{k}"
        if output is not None and k == layers - 1:
            z = output
        inits.append(numpy_helper.from_array(_f32(weights[2 * k]), W))
        inits.append(numpy_helper.from_array(_f32(weights[2 * k + 1]), b))
        nodes.append(helper.make_node("MatMul", [current, W], [f"{prefix}z{k}m"], name=f"{prefix}matmul{k}"))
        nodes.append(helper.make_node("Add", [f"{prefix}z{k}m", b], [z], name=f"{prefix}bias{k}"))
        current = z
        if k < layers - 1:
            nodes.append(helper.make_node("Tanh", [current], [f"{prefix}h{k + 1}"], name=f"{prefix}tanh{k}"))
            current = f"{prefix}h{k + 1}"
    return current


def _finish(onnx, nodes, inits, name, ports, doc, info):
    """A checked opset-17 ModelProto. ports: ((input name, width), (output name, width)), both (batch, width)
    float32; info: its metadata_props (non-strings as JSON)."""
    from onnx import TensorProto, helper

    (input_name, inputs), (output_name, outputs) = ports
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", inputs])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", outputs])],
        initializer=inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="neural_ik", producer_version=str(FORMAT_VERSION))
    proto.ir_version = 8   # readable by onnxruntime 1.14 and later
    proto.doc_string = doc
    for key, value in info.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value if isinstance(value, str) else json.dumps(value)
    onnx.checker.check_model(proto)
    return proto


def build_onnx(model, prior_file=None, clip_file=None):
    """onnx.ModelProto computing Model.predict_clamped, built with onnx.helper (prior_file, clip_file: see
    metadata)."""
    onnx = onnx_package("Export ONNX")
    from onnx import helper, numpy_helper

    check_model(model)
    inits = [numpy_helper.from_array(_f32(model.input_mean), "input_mean"),
             numpy_helper.from_array(_f32(model.input_std), "input_std"),
             numpy_helper.from_array(_f32(np.asarray(model.limit_low).reshape(-1)), "limit_low"),
             numpy_helper.from_array(_f32(np.asarray(model.limit_high).reshape(-1)), "limit_high")]
    nodes = [helper.make_node("Sub", [INPUT_NAME, "input_mean"], ["centred"], name="centre"),
             helper.make_node("Div", ["centred", "input_std"], ["h0"], name="scale")]
    current = _dense_layers(model.weights, "h0", nodes, inits)
    nodes.append(helper.make_node("Min", [current, "limit_high"], ["below_high"], name="clamp_high"))
    nodes.append(helper.make_node("Max", ["below_high", "limit_low"], [OUTPUT_NAME], name="clamp_low"))
    return _finish(onnx, nodes, inits, "neural_ik", ((INPUT_NAME, NUM_INPUTS), (OUTPUT_NAME, NUM_OUTPUTS)),
                   "Neural IK: 50 target/root/ground/task inputs -> clamped axis-angle deltas from the mean pose",
                   metadata(model, prior_file, clip_file))


def build_prior_onnx(target_prior, rig_fingerprint):
    """onnx.ModelProto computing TargetPrior.predict (initializers prior_W{k}, prior_b{k}; a clip prior's
    clip_prior_W{k}, ...), after the checkpoint's checks (layer sizes, window, height, references, finite weights)."""
    onnx = onnx_package("Export ONNX")

    clip = bool(target_prior.window)
    prefix = prior_prefix(clip)
    load_prior("the target prior", prior_meta(target_prior), prior_arrays(target_prior), clip)
    nodes, inits = [], []
    _dense_layers(target_prior.weights, PRIOR_INPUT_NAME, nodes, inits, prefix=prefix, output=PRIOR_OUTPUT_NAME)
    info = {"neural_ik.kind": CLIP_PRIOR_KIND if clip else PRIOR_KIND, "neural_ik.format_version": FORMAT_VERSION,
            "neural_ik.rig_fingerprint": rig_fingerprint}
    key = "neural_ik.clip_prior" if clip else "neural_ik.prior"
    return _finish(onnx, nodes, inits, f"neural_ik_{prefix[:-1]}", prior_ports(target_prior.window),
                   f"Neural IK {'clip' if clip else 'target'} prior: the pinned targets in a ground frame and the free "
                   f"mask{' and how the targets move over the clip' if clip else ''} -> every target in that frame "
                   f"(the sidecar's {key} says how)", info)


def sidecar_path(path):
    return os.path.splitext(os.fspath(path))[0] + ".json"


def prior_path(path, clip=False):
    return os.path.splitext(os.fspath(path))[0] + (".clip_prior.onnx" if clip else ".prior.onnx")


def export_onnx(model, path):
    """Write the .onnx file, its target prior's `<name>.prior.onnx` and clip prior's `<name>.clip_prior.onnx` when
    the model has them, and the JSON sidecar, each atomically (all built and checked before the first is written);
    returns (onnx path, sidecar path)."""
    priors = [(clip, p) for clip, p in ((False, model.prior), (True, model.clip_prior)) if p is not None]
    names = {clip: os.path.basename(prior_path(path, clip)) for clip, _p in priors}
    files = [(prior_path(path, clip), build_prior_onnx(p, model.skeleton.fingerprint())) for clip, p in priors]
    files.append((os.fspath(path), build_onnx(model, names.get(False), names.get(True))))   # last: it refers to them
    for target, proto in files:
        data = proto.SerializeToString()
        atomic_write_bytes(target, lambda handle, data=data: handle.write(data))
    side = sidecar_path(path)
    save_json(side, metadata(model, names.get(False), names.get(True)))
    return os.fspath(path), side
