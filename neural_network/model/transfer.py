"""A trained model carried onto another rig: the starting point of Train Starter Model. Pure NumPy.

The starter network (`weights/starter_network.npz`) learned the starter motion on one rig (the demo rig). Another
rig sees the same motion through the retarget, so frame by frame the two rigs' inputs and joint rotations are tied:

- inputs: the effector positions scale with the rigs' proportions; each effector's rotation input is the same
  rotation seen through the rig's bone axes (retarget: W_t = W_s K_s K_t^T, and the input reference turns with it,
  so the axis-angle turns by a fixed rotation); the hips' axes and the ground and phase inputs are the same;
- outputs: a role's local rotation is L_t = E L_s C with fixed E, C where the role and its parent correspond, so its
  delta from the mean pose turns by the fixed rotation C (E M exp(d) C = (E M C) exp(C^T d)).

Where both rigs map the same roles these ties are linear. So the carried model keeps the hidden layers and changes
only the first and last: the first takes the new rig's normalised inputs through the affine map that best gives the
old rig's normalised inputs (least squares over the starter frames on both rigs), the last gives the new rig's deltas
through the per-role 3 x 3 map that best gives them from the old rig's (the same frames). Where the rigs differ
(a spine bone fewer, other proportions) the maps are the nearest linear ones, and training from there mends the rest.
"""

import numpy as np

from ..data.dataset import DatasetBuilder
from ..data.retarget import Calibration
from ..geometry.rotations import axis_angle_to_matrix, matrix_to_axis_angle
from ..skeleton.roles import NUM_ROLES
from .model import Model
from .trainer import TrainingArrays, data_statistics

RIDGE = 1e-6            # relative ridge of the least-squares fits (inputs that never move get no weight)


def deltas_of(local_rotations, mean_pose, mask):
    """(N, 23, 3) axis-angle deltas of local rotations (N, 23, 3, 3) from a mean pose (zero where unmapped)."""
    out = np.zeros(np.shape(local_rotations)[:2] + (3,))
    m = np.asarray(mask, bool)
    out[:, m] = matrix_to_axis_angle(np.swapaxes(np.asarray(mean_pose, np.float64)[m], -1, -2)[None]
                                     @ np.asarray(local_rotations, np.float64)[:, m])
    return out


def _fit(x, y):
    """(A, c) minimising |x A + c - y|^2 (+ a small ridge on A): x (N, a), y (N, b)."""
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    gram = xc.T @ xc
    gram += RIDGE * (np.trace(gram) / max(len(gram), 1) + 1e-12) * np.eye(len(gram))
    A = np.linalg.solve(gram, xc.T @ yc)
    return A, my - mx @ A


def carried(model, source_inputs, source_local, target):
    """The model `model` (trained on the source rig) carried onto the target rig.

    source_inputs (N, 50), source_local (N, 23, 3, 3): the source rig's inputs and local rotations of N frames;
    target: a dict of the same frames on the target rig, {"inputs", "local", "skeleton", "feature_spec",
    "input_mean", "input_std", "mean_pose", "limit_low", "limit_high"} (the statistics as the trainer makes them).
    Returns a Model for the target rig (meta: how well the maps fit)."""
    zs = (np.asarray(source_inputs, np.float64) - model.input_mean) / model.input_std
    zt = (np.asarray(target["inputs"], np.float64) - target["input_mean"]) / target["input_std"]
    G, g = _fit(zt, zs)                                     # target normalised inputs -> source normalised inputs
    weights = [np.asarray(w, np.float64) for w in model.weights]
    first, bias = weights[0], weights[1]
    weights[0], weights[1] = G @ first, bias + g @ first
    mask_s, mask_t = model.skeleton.role_mask, target["skeleton"].role_mask
    ds = deltas_of(source_local, model.mean_pose, mask_s)
    dt = deltas_of(target["local"], target["mean_pose"], mask_t)
    last, bias = weights[-2], weights[-1]
    new_last, new_bias = np.zeros((last.shape[0], 3 * NUM_ROLES)), np.zeros(3 * NUM_ROLES)
    residual = []
    for j in np.where(mask_t)[0]:
        if not mask_s[j] or j == 0:
            continue
        B, e = _fit(ds[:, j], dt[:, j])                     # source delta of role j -> target delta of role j
        cols = slice(3 * j, 3 * j + 3)
        new_last[:, cols] = last[:, cols] @ B
        new_bias[cols] = bias[cols] @ B + e
        residual.append(float(np.sqrt(np.mean((ds[:, j] @ B + e - dt[:, j]) ** 2))))
    weights[-2], weights[-1] = new_last, new_bias
    fit = {"input_residual": float(np.sqrt(np.mean((zt @ G + g - zs) ** 2))),
           "delta_residual_rad": float(np.mean(residual)) if residual else 0.0, "frames": int(len(zs))}
    return Model(skeleton=target["skeleton"], feature_spec=target["feature_spec"],
                 weights=[w.astype(np.float32) for w in weights],
                 input_mean=np.asarray(target["input_mean"], np.float32),
                 input_std=np.asarray(target["input_std"], np.float32),
                 mean_pose=np.asarray(target["mean_pose"], np.float32),
                 limit_low=np.asarray(target["limit_low"], np.float32),
                 limit_high=np.asarray(target["limit_high"], np.float32),
                 meta={"carried_from": model.skeleton.name or "the starter network", "fit": fit})


STARTER_CALIBRATION = "starter_calibration"     # the starter network's meta entry: its rig's retarget calibration


def network_calibration(network):
    """The Calibration of the rig the starter network learned on (from its meta); ValueError when it has none."""
    try:
        return Calibration.from_json(network.meta[STARTER_CALIBRATION])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the starter network holds no usable calibration of its rig ({exc})") from None


def carried_starter(network, motion, dataset, rows, config):
    """The starter network carried onto the dataset's rig: the starter motion is put on the network's own rig (its
    calibration, at the dataset's frame rate) and compared frame by frame with the dataset's rows `rows` (the same
    clips, in the same order, as StarterMotion.add_to wrote them); the target statistics are those of these rows."""
    builder = DatasetBuilder(network.skeleton, float(dataset.meta["fps"]))
    motion.add_to(builder, network_calibration(network), builder.fps)
    source = builder.finish(spec=network.feature_spec)
    target = dataset.subset(rows)
    if len(source) != len(target):
        raise ValueError(f"the starter rows do not line up ({len(source)} frames on the network's rig, "
                         f"{len(target)} on this one)")
    arrays = TrainingArrays(target)
    stats = data_statistics(arrays, config)
    return carried(network, source.inputs, axis_angle_to_matrix(np.asarray(source.rotations, np.float64)),
                   dict(stats, inputs=target.inputs, local=arrays.local_rotations, skeleton=dataset.skeleton,
                        feature_spec=dataset.feature_spec))
