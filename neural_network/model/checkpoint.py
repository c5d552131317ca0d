"""Save and load a trained Model as .npz arrays plus JSON metadata, refusing anything that does not fit.

A checkpoint holds W0, b0, W1, b1, ..., input_mean, input_std, mean_pose, limit_low, limit_high, and in its
metadata the checkpoint layout version, the input layout (FeatureSpec), the skeleton with its fingerprint, the layer
sizes and activation, and free-form training facts (loss weights, metrics, history). Loading checks every one of them
before the arrays are trusted: a model for another rig, another input layout, with the wrong shapes or with NaN
weights would otherwise produce garbage poses without complaint.
"""

import numpy as np

from ..data.features import LAYOUT_VERSION as INPUT_LAYOUT_VERSION
from ..data.features import NUM_INPUTS, FeatureSpec
from ..data.files import FileRefused, load_npz, save_npz
from ..skeleton.roles import NUM_ROLES
from ..skeleton.skeleton import Skeleton
from .model import Model
from .prior import NUM_PRIOR_OUTPUTS, NUM_TARGETS, TargetPrior, num_inputs

KIND = "neural_ik.model"
LAYOUT_VERSION = 1
NUM_OUTPUTS = NUM_ROLES * 3


def save_model(path, model):
    """Write the model atomically (a crash or Cancel leaves the previous file or the new one, never half)."""
    arrays = {}
    for i in range(0, len(model.weights), 2):
        arrays[f"W{i // 2}"] = np.asarray(model.weights[i], np.float32)
        arrays[f"b{i // 2}"] = np.asarray(model.weights[i + 1], np.float32)
    arrays.update(
        input_mean=np.asarray(model.input_mean, np.float32), input_std=np.asarray(model.input_std, np.float32),
        mean_pose=np.asarray(model.mean_pose, np.float32),
        limit_low=np.asarray(model.limit_low, np.float32), limit_high=np.asarray(model.limit_high, np.float32),
    )
    meta = dict(model.meta)
    for key, target_prior in (("prior", model.prior), ("clip_prior", model.clip_prior)):
        meta.pop(key, None)
        if target_prior is not None:
            arrays.update(prior_arrays(target_prior))
            meta[key] = prior_meta(target_prior)
    meta.update(
        kind=KIND, layout_version=LAYOUT_VERSION, input_layout_version=INPUT_LAYOUT_VERSION,
        skeleton=model.skeleton.to_json(), feature_spec=model.feature_spec.to_json(),
        layer_sizes=[int(s) for s in model.layer_sizes], activation="tanh",
        rig_fingerprint=model.skeleton.fingerprint(),
    )
    save_npz(path, arrays, meta)


def load_model(path, expected_fingerprint=None):
    """Model from a checkpoint; FileRefused with a plain reason when the file is not one this code can trust.

    expected_fingerprint: the rig the model is meant to drive (Skeleton.fingerprint()); None skips that check.
    """
    name = str(path).replace("\\", "/").rsplit("/", 1)[-1]
    meta, arrays = load_npz(path, KIND, required=("W0", "b0", "input_mean", "input_std", "mean_pose", "limit_low",
                                                  "limit_high"))
    if meta.get("layout_version") != LAYOUT_VERSION:
        raise FileRefused(f"{name} has checkpoint layout {meta.get('layout_version')}, this version of Neural IK reads "
                          f"layout {LAYOUT_VERSION}: retrain the model")
    if meta.get("input_layout_version") != INPUT_LAYOUT_VERSION:
        raise FileRefused(f"{name} was trained on input layout {meta.get('input_layout_version')}, not "
                          f"{INPUT_LAYOUT_VERSION}: retrain the model")
    if meta.get("activation", "tanh") != "tanh":
        raise FileRefused(f"{name} uses activation {meta.get('activation')!r}; only tanh is supported")
    try:
        skeleton = Skeleton.from_json(meta["skeleton"])
        spec = FeatureSpec.from_json(meta["feature_spec"])
    except (KeyError, TypeError, ValueError) as exc:
        raise FileRefused(f"{name} has an unreadable skeleton or input layout: {exc}") from None
    fingerprint = skeleton.fingerprint()
    if meta.get("rig_fingerprint") != fingerprint:
        raise FileRefused(f"{name} is inconsistent: its rig fingerprint does not match its own skeleton")
    if expected_fingerprint is not None and expected_fingerprint != fingerprint:
        raise FileRefused(f"{name} was trained for another rig ({skeleton.name or 'unnamed'}, fingerprint "
                          f"{fingerprint}), not this one ({expected_fingerprint}): map the bones the same way or retrain")
    weights = _weights(name, meta, arrays)
    fixed = {"input_mean": (NUM_INPUTS,), "input_std": (NUM_INPUTS,), "mean_pose": (NUM_ROLES, 3, 3),
             "limit_low": (NUM_ROLES, 3), "limit_high": (NUM_ROLES, 3)}
    for key, shape in fixed.items():
        if arrays[key].shape != shape:
            raise FileRefused(f"{name}: {key} has shape {arrays[key].shape}, expected {shape}")
        if not np.all(np.isfinite(arrays[key])):
            raise FileRefused(f"{name}: {key} holds NaN or infinite numbers")
    if np.any(arrays["input_std"] <= 0):
        raise FileRefused(f"{name}: input_std must be positive")
    if np.any(arrays["limit_low"] > arrays["limit_high"]):
        raise FileRefused(f"{name}: a joint limit's low end is above its high end")
    target_prior = load_prior(name, meta.get("prior"), arrays) if "prior" in meta else None
    clip_prior = load_prior(name, meta.get("clip_prior"), arrays, clip=True) if "clip_prior" in meta else None
    training_meta = {k: v for k, v in meta.items() if k not in ("kind", "layout_version", "skeleton", "feature_spec",
                                                                "rig_fingerprint", "prior", "clip_prior")}
    return Model(skeleton=skeleton, feature_spec=spec, weights=weights,
                 input_mean=arrays["input_mean"].astype(np.float32), input_std=arrays["input_std"].astype(np.float32),
                 mean_pose=arrays["mean_pose"].astype(np.float32), limit_low=arrays["limit_low"].astype(np.float32),
                 limit_high=arrays["limit_high"].astype(np.float32), meta=training_meta, prior=target_prior,
                 clip_prior=clip_prior)


def _weights(name, meta, arrays):
    sizes = meta.get("layer_sizes")
    if not isinstance(sizes, list) or len(sizes) < 2 or sizes[0] != NUM_INPUTS or sizes[-1] != NUM_OUTPUTS:
        raise FileRefused(f"{name}: layer sizes {sizes} do not map {NUM_INPUTS} inputs to {NUM_OUTPUTS} outputs")
    weights = []
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        W, b = arrays.get(f"W{layer}"), arrays.get(f"b{layer}")
        if W is None or b is None:
            raise FileRefused(f"{name} lacks the weights of layer {layer}")
        if W.shape != (fan_in, fan_out) or b.shape != (fan_out,):
            raise FileRefused(f"{name}: layer {layer} has shapes {W.shape}/{b.shape}, expected ({fan_in}, {fan_out})")
        if not (np.all(np.isfinite(W)) and np.all(np.isfinite(b))):
            raise FileRefused(f"{name}: layer {layer} holds NaN or infinite weights (a diverged training run)")
        weights += [W.astype(np.float32), b.astype(np.float32)]
    if f"W{len(sizes) - 1}" in arrays:
        raise FileRefused(f"{name} holds more layers than its layer sizes say")
    return weights


# ---- the target priors (prior.py): arrays prior_W0, prior_b0, ... and a "prior" entry in the metadata; a clip
# prior's the same with clip_prior_ and "clip_prior" (its metadata also holds its window) -------------------------


def prior_prefix(clip):
    """The arrays' (and the ONNX initializers') prefix: clip_prior_ for a clip prior, else prior_."""
    return "clip_prior_" if clip else "prior_"


def prior_arrays(target_prior):
    prefix = prior_prefix(bool(target_prior.window))
    arrays = {}
    for i in range(0, len(target_prior.weights), 2):
        arrays[f"{prefix}W{i // 2}"] = np.asarray(target_prior.weights[i], np.float32)
        arrays[f"{prefix}b{i // 2}"] = np.asarray(target_prior.weights[i + 1], np.float32)
    return arrays


def prior_meta(target_prior):
    return {"layer_sizes": [int(s) for s in target_prior.layer_sizes], "height": float(target_prior.height),
            "references": np.asarray(target_prior.references, np.float64).reshape(-1).tolist(),
            "training": dict(target_prior.meta),
            **({} if target_prior.mirror_frames is None else
               {"mirror_frames": np.asarray(target_prior.mirror_frames, np.float64).reshape(-1).tolist()}),
            **({"window": [float(w) for w in target_prior.window]} if target_prior.window else {})}


def load_prior(name, meta, arrays, clip=False):
    """TargetPrior from a checkpoint's "prior" (clip: "clip_prior") metadata and prior_* (clip_prior_*) arrays;
    FileRefused when they do not fit."""
    prefix, what = prior_prefix(clip), "clip prior" if clip else "target prior"
    if not isinstance(meta, dict):
        raise FileRefused(f"{name}: its {what}'s metadata is not an object")
    try:
        window = tuple(float(w) for w in meta.get("window", ()))
    except (TypeError, ValueError):
        raise FileRefused(f"{name}: its {what}'s window is not a list of seconds") from None
    if not all(np.isfinite(w) and 0 < abs(w) <= 60 for w in window) or clip != bool(window):
        raise FileRefused(f"{name}: its {what}'s window {list(window)} is not usable")
    sizes = meta.get("layer_sizes")
    if (not isinstance(sizes, list) or len(sizes) < 2 or sizes[0] != num_inputs(window)
            or sizes[-1] != NUM_PRIOR_OUTPUTS):
        raise FileRefused(f"{name}: its {what}'s layer sizes {sizes} do not map {num_inputs(window)} inputs to "
                          f"{NUM_PRIOR_OUTPUTS} outputs")
    try:
        height = float(meta["height"])
        references = np.asarray(meta["references"], np.float64).reshape(NUM_TARGETS, 3, 3)
    except (KeyError, TypeError, ValueError):
        raise FileRefused(f"{name}: its {what} has no readable height or reference rotations") from None
    if not (np.isfinite(height) and height > 0 and np.all(np.isfinite(references))):
        raise FileRefused(f"{name}: its {what}'s height or reference rotations are not usable numbers")
    weights = []
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        W, b = arrays.get(f"{prefix}W{layer}"), arrays.get(f"{prefix}b{layer}")
        if W is None or b is None or W.shape != (fan_in, fan_out) or b.shape != (fan_out,):
            raise FileRefused(f"{name}: its {what}'s layer {layer} is missing or has the wrong shape")
        if not (np.all(np.isfinite(W)) and np.all(np.isfinite(b))):
            raise FileRefused(f"{name}: its {what}'s layer {layer} holds NaN or infinite weights")
        weights += [W.astype(np.float32), b.astype(np.float32)]
    training = meta.get("training") if isinstance(meta.get("training"), dict) else {}
    mirror_frames = None
    if meta.get("mirror_frames") is not None:
        try:
            mirror_frames = np.asarray(meta["mirror_frames"], np.float64).reshape(NUM_TARGETS, 3, 3)
        except (TypeError, ValueError):
            raise FileRefused(f"{name}: its {what}'s mirror frames are not 54 numbers") from None
        gram = np.swapaxes(mirror_frames, -1, -2) @ mirror_frames
        if not np.all(np.isfinite(mirror_frames)) or np.abs(gram - np.eye(3)).max() > 1e-4:
            raise FileRefused(f"{name}: its {what}'s mirror frames are not orthogonal matrices")
    return TargetPrior(weights, height, references, training, mirror_frames, window)
