"""A trained Neural IK model: input normalisation, the MLP, and the map from its outputs to bone rotations.

    inputs (N, 50) -> (x - input_mean) / input_std -> tanh MLP -> deltas (N, 69)
    deltas clamped to [limit_low, limit_high] (per role and axis, learned from the data's range plus a margin)
    local rotation of role j = mean_pose_j @ exp(delta_j)

Deltas are axis-angle offsets from the training set's mean local pose, never from rest: BVH rigs rest far from a
T-pose and their rotations from rest sit near pi, where axis-angle wraps.
"""

from dataclasses import dataclass, field

import numpy as np

from ..data.features import FeatureSpec
from ..geometry.rotations import axis_angle_to_matrix
from ..skeleton.roles import NUM_ROLES
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
