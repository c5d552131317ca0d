"""Loading a model file for a rig: a checkpoint (.npz) or an exported ONNX file, checked (interface, metadata, finite
weights, rig fingerprint) before any inference session exists; an ONNX file loads back into a full NumPy Model from its
initializers (used where onnxruntime is missing), with its target prior from `<name>.prior.onnx` when its metadata names
one."""

import json
import os

import numpy as np

from ..data.features import INPUT_NAMES, LAYOUT_VERSION, NUM_INPUTS, FeatureSpec
from ..data.files import FileRefused, check_readable_file
from ..model import checkpoint
from ..model.model import Model, check_model, check_rig
from ..skeleton.roles import NUM_ROLES, ROLES
from ..skeleton.skeleton import Skeleton
from .onnx_export import (
    CLIP_PRIOR_KIND,
    INPUT_NAME,
    KIND,
    NUM_OUTPUTS,
    OUTPUT_NAME,
    PRIOR_KIND,
    build_onnx,
    build_prior_onnx,
    onnx_package,
    prior_ports,
)


def _dims(value_info):
    dims = value_info.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else None for d in dims]


def _check_interface(proto, name, what, kind, ports):
    """Refuse a graph whose one input and one output are not ports' ((name, width), (name, width)), (batch, width)
    float32, or whose metadata is not of `kind`; returns (initializers by name, metadata_props as a dict)."""
    from onnx import TensorProto

    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    (input_name, input_width), (output_name, output_width) = ports
    if [i.name for i in inputs] != [input_name] or [o.name for o in graph.output] != [output_name]:
        raise FileRefused(f"{name} is not {what}: inputs {[i.name for i in inputs]}, "
                          f"outputs {[o.name for o in graph.output]}")
    for info, width in ((inputs[0], input_width), (graph.output[0], output_width)):
        if info.type.tensor_type.elem_type != TensorProto.FLOAT or len(_dims(info)) != 2 or _dims(info)[1] != width:
            raise FileRefused(f"{name}: {info.name} has shape {_dims(info)}, expected (batch, {width}) float32")
    meta = {p.key: p.value for p in proto.metadata_props}
    if meta.get("neural_ik.kind") != kind:
        raise FileRefused(f"{name} has no {what} metadata")
    return inits, meta


def model_from_onnx_proto(proto, name="ONNX file"):
    """Model from a parsed ONNX proto, after checking its interface, metadata and weights (no session is made)."""
    from onnx import numpy_helper

    graph = proto.graph
    inits, meta = _check_interface(proto, name, "a Neural IK model", KIND,
                                   ((INPUT_NAME, NUM_INPUTS), (OUTPUT_NAME, NUM_OUTPUTS)))
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


def _read_proto(path):
    """(parsed ModelProto, its bytes) of an .onnx file; FileRefused when it is missing, empty or not ONNX."""
    onnx = onnx_package("Reading an ONNX model")
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
    return proto, data


def load_onnx(path):
    """(Model, serialized bytes) from an .onnx file (with its target prior when it names one), checked before any
    session exists."""
    path = os.fspath(path)
    proto, data = _read_proto(path)
    model = model_from_onnx_proto(proto, os.path.basename(path))
    for key, attribute in (("neural_ik.prior", "prior"), ("neural_ik.clip_prior", "clip_prior")):
        section = next((p.value for p in proto.metadata_props if p.key == key), None)
        if section is not None:
            setattr(model, attribute, _load_prior_file(path, section, model, attribute == "clip_prior"))
    return model, data


def _load_prior_file(path, section, model, clip=False):
    """The TargetPrior of the model file at `path` from its "neural_ik.prior" (clip: "neural_ik.clip_prior")
    metadata and the .prior.onnx (.clip_prior.onnx) file that names, beside it; FileRefused when that file is
    missing, broken or not this model's."""
    from onnx import numpy_helper

    base = os.path.basename(path)
    what = "clip prior" if clip else "target prior"
    try:
        section = json.loads(section)
        prior_file = section["file"]
        if not isinstance(prior_file, str) or os.path.basename(prior_file) != prior_file or not prior_file:
            raise ValueError(prior_file)
        window = tuple(float(w) for w in section.get("window", ()))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise FileRefused(f"{base} has unreadable {what} metadata (no file name)") from None
    prior_path = os.path.join(os.path.dirname(path), prior_file)
    if not os.path.isfile(prior_path):
        raise FileRefused(f"{base} needs its {what} {prior_file} beside it, which is missing: copy it along "
                          "or export the model again")
    proto, _data = _read_proto(prior_path)
    inits, meta = _check_interface(proto, prior_file, f"a Neural IK {what}", CLIP_PRIOR_KIND if clip else PRIOR_KIND,
                                   prior_ports(window))
    if meta.get("neural_ik.rig_fingerprint") != model.skeleton.fingerprint():
        raise FileRefused(f"{prior_file} is the {what} of another rig's model, not {base}'s")
    arrays = {key: numpy_helper.to_array(init) for key, init in inits.items()}
    target_prior = checkpoint.load_prior(prior_file, section, arrays, clip)
    if [n.op_type for n in proto.graph.node] != [n.op_type for n in build_prior_onnx(
            target_prior, meta["neural_ik.rig_fingerprint"]).graph.node]:
        raise FileRefused(f"{prior_file}: its graph is not the network its metadata describes")
    return target_prior


def load_model_file(path, skeleton=None):
    """Model from a checkpoint (.npz) or an ONNX file, refused unless it fits `skeleton`'s rig.

    Returns (model, onnx_bytes or None); the bytes let the solver open the very graph that was checked.
    """
    path = os.fspath(path)
    check_readable_file(path)
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic.startswith(b"PK"):   # a zip: the .npz checkpoint
        model, data = checkpoint.load_model(path), None
    else:
        model, data = load_onnx(path)
    check_model(model, os.path.basename(path))
    check_rig(model, skeleton, os.path.basename(path))
    return model, data
