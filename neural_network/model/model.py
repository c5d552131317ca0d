"""A trained Neural IK model: input normalisation, the MLP, and the map from its outputs to bone rotations.

    inputs (N, 50) -> (x - input_mean) / input_std -> tanh MLP -> deltas (N, 69)
    deltas clamped to [limit_low, limit_high] (per role and axis, learned from the data's range plus a margin)
    local rotation of role j = mean_pose_j @ exp(delta_j)

Deltas are axis-angle offsets from the training set's mean local pose, never from rest: BVH rigs rest far from a
T-pose and their rotations from rest sit near pi, where axis-angle wraps.
"""

from dataclasses import dataclass, field

import numpy as np

from ..data.features import NUM_INPUTS, FeatureSpec
from ..data.files import FileRefused
from ..geometry.rotations import axis_angle_to_matrix
from ..skeleton.roles import NUM_ROLES, ROLES
from ..skeleton.skeleton import Skeleton


@dataclass
class Model:
    skeleton: Skeleton
    feature_spec: FeatureSpec
    weights: list                 # [W0, b0, W1, b1, ...]: W (in, out) float32, b (out,) float32; tanh between layers
    input_mean: np.ndarray        # (50,)
    input_std: np.ndarray         # (50,), floored so constant inputs do not blow up
    mean_pose: np.ndarray         # (23, 3, 3) mean local rotation per role
    limit_low: np.ndarray         # (23, 3) lowest allowed delta per role and axis (radians)
    limit_high: np.ndarray        # (23, 3)
    meta: dict = field(default_factory=dict)   # training settings, metrics, history; free-form JSON
    prior: object = None          # prior.TargetPrior that places free targets, or None (a model trained before it)
    clip_prior: object = None     # the same with a window over the clip (Bake's free effectors), or None

    @property
    def layer_sizes(self):
        return [self.weights[0].shape[0]] + [w.shape[1] for w in self.weights[0::2]]

    def normalize(self, inputs):
        return ((inputs - self.input_mean) / self.input_std).astype(np.float32)

    def predict(self, inputs):
        """(N, 50) raw inputs -> (N, 69) unclamped deltas."""
        h = self.normalize(np.asarray(inputs, np.float32))
        last = len(self.weights) // 2 - 1
        for i in range(0, len(self.weights), 2):
            h = h @ self.weights[i] + self.weights[i + 1]
            if i // 2 < last:
                h = np.tanh(h)
        return h

    def clamp(self, deltas):
        flat_low = self.limit_low.reshape(-1).astype(np.float32)
        flat_high = self.limit_high.reshape(-1).astype(np.float32)
        return np.clip(deltas, flat_low, flat_high)

    def predict_clamped(self, inputs):
        """(N, 50) -> (N, 69) deltas inside the learned joint limits."""
        return self.clamp(self.predict(inputs))

    def local_rotations(self, deltas):
        """(N, 69) deltas -> (N, 23, 3, 3) local rotations (Blender's matrix_basis rotation per role)."""
        d = np.asarray(deltas).reshape(-1, NUM_ROLES, 3)
        return self.mean_pose.astype(d.dtype) @ axis_angle_to_matrix(d)

    def solve_local(self, inputs):
        """(N, 50) -> (N, 23, 3, 3): the network's pose, clamped to the joint limits."""
        return self.local_rotations(self.predict_clamped(inputs))


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
    if fan_in != NUM_ROLES * 3:
        raise FileRefused(f"{name} predicts {fan_in} numbers, expected {NUM_ROLES * 3} (23 roles x 3)")
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
