"""The 50 network inputs, built the same way for extraction, training, live solving and evaluation.

Layout (LAYOUT_VERSION 1), all in the root frame: origin at the hips head, +Z up, heading (yaw) taken from the
thigh-to-thigh axis projected on the ground (stable in a deep bow, unlike the hips' own forward axis).

    0:30   5 effectors (LeftHand, RightHand, LeftFoot, RightFoot, Head) x (position 3, rotation 3)
           rotation = axis-angle of the effector's orientation relative to its reference orientation
    30:36  hips forward (3) and up (3): the hips' own axes relative to their reference, in the root frame
    36:48  per foot (left, right): height above ground, ground normal (3), contact flag, desired contact
    48:50  phase in [0, 1) and task code (task index / 5)

The references (effector and hips orientations, chordal means over the training data in the root frame) keep the
rotation inputs far from the axis-angle wrap at pi on rigs whose rest pose is not a T-pose.
"""

from dataclasses import dataclass

import numpy as np

from ..geometry.rotations import chordal_mean, matrix_to_axis_angle
from ..skeleton.roles import EFFECTOR_ROLES, FOOT_ROLES, ROLE_INDEX, TASKS

LAYOUT_VERSION = 1
NUM_INPUTS = 50
INPUT_NAMES = tuple(
    [f"{e}.{kind}.{ax}" for e in ("LeftHand", "RightHand", "LeftFoot", "RightFoot", "Head")
     for kind in ("pos", "rot") for ax in "xyz"]
    + [f"hips.{kind}.{ax}" for kind in ("forward", "up") for ax in "xyz"]
    + [f"{foot}.{name}" for foot in ("LeftFoot", "RightFoot")
       for name in ("height", "normal.x", "normal.y", "normal.z", "contact", "desired_contact")]
    + ["phase", "task"]
)
assert len(INPUT_NAMES) == NUM_INPUTS
SLICE_EFFECTORS = slice(0, 30)
SLICE_ROOT = slice(30, 36)
SLICE_GROUND = slice(36, 48)
# A foot is in contact when its ankle is this close (times the rig height) to its lowest and this slow (rig heights
# per second).
CONTACT_HEIGHT = 0.08
CONTACT_SPEED = 0.6
SLICE_MOTION = slice(48, 50)

_HIPS, _LTHIGH, _RTHIGH = ROLE_INDEX["Hips"], ROLE_INDEX["LeftThigh"], ROLE_INDEX["RightThigh"]
_UP = np.array([0.0, 0.0, 1.0])


@dataclass
class FeatureSpec:
    """Data-derived constants of the input layout; saved with datasets and models."""
    effector_reference: np.ndarray   # (5, 3, 3) reference orientation of each effector in the root frame
    hips_reference: np.ndarray       # (3, 3) reference orientation of the hips in the root frame
    # Each ankle's height above the ground when its foot is planted (the training data's median; a model's spec has
    # it, a dataset's does not): what a contact flag means without the clip's lowest ankle, as in a live tick.
    contact_height: tuple = None

    def to_json(self):
        out = {"layout_version": LAYOUT_VERSION, "input_names": list(INPUT_NAMES),
               "effector_reference": np.asarray(self.effector_reference).tolist(),
               "hips_reference": np.asarray(self.hips_reference).tolist()}
        if self.contact_height is not None:
            out["contact_height"] = [float(v) for v in self.contact_height]
        return out

    def same_frames(self, other):
        """Whether `other` reads its inputs in the same reference frames (the planted ankle heights may differ)."""
        return (np.array_equal(self.effector_reference, other.effector_reference)
                and np.array_equal(self.hips_reference, other.hips_reference))

    @classmethod
    def from_json(cls, data):
        if not isinstance(data, dict):
            raise ValueError(f"an input layout must be a JSON object, not {type(data).__name__}")
        if data.get("layout_version") != LAYOUT_VERSION:
            raise ValueError(f"input layout version {data.get('layout_version')} is not {LAYOUT_VERSION}")
        spec = cls(np.asarray(data["effector_reference"], np.float64).reshape(5, 3, 3),
                   np.asarray(data["hips_reference"], np.float64).reshape(3, 3))
        if not (np.all(np.isfinite(spec.effector_reference)) and np.all(np.isfinite(spec.hips_reference))):
            raise ValueError("input layout references hold non-finite numbers")
        if data.get("contact_height") is not None:
            try:
                heights = np.asarray(data["contact_height"], np.float64)
            except (TypeError, ValueError):
                heights = np.full(1, np.nan)
            if heights.shape != (2,) or not np.all(np.isfinite(heights)):
                raise ValueError(f"contact_height must be two finite numbers, not {data['contact_height']!r}")
            spec.contact_height = (float(heights[0]), float(heights[1]))
        return spec


def root_frame(positions, hips_rotation):
    """Root frames from (N, 23, 3) positions: origin (N, 3) at the hips, rotation (N, 3, 3) with columns x, y, z.

    x is the right-thigh-to-left-thigh direction on the ground plane; where the thighs are vertically aligned
    (degenerate), the hips' own x axis is used.
    """
    origin = positions[:, _HIPS].astype(np.float64)
    lateral = (positions[:, _LTHIGH] - positions[:, _RTHIGH]).astype(np.float64)
    lateral[:, 2] = 0.0
    length = np.linalg.norm(lateral, axis=-1, keepdims=True)
    fallback = np.asarray(hips_rotation, np.float64)[:, :, 0].copy()
    fallback[:, 2] = 0.0
    fallback /= np.maximum(np.linalg.norm(fallback, axis=-1, keepdims=True), 1e-9)
    x = np.where(length > 1e-6, lateral / np.maximum(length, 1e-12), fallback)
    z = np.broadcast_to(_UP, x.shape)
    y = np.cross(z, x)
    return origin, np.stack([x, y, z], axis=-1)


def references_from_data(positions, rotations, hips_rotation):
    """FeatureSpec whose references are the chordal mean orientations of the data in the root frame."""
    _, R_root = root_frame(positions, hips_rotation)
    Rt = np.swapaxes(R_root, -1, -2)
    eff = np.stack([chordal_mean(Rt @ rotations[:, e].astype(np.float64)) for e in EFFECTOR_ROLES])
    hips = chordal_mean(Rt @ np.asarray(hips_rotation, np.float64))
    return FeatureSpec(eff, hips)


def build_inputs(spec, positions, rotations, hips_rotation, ground_height, contact, desired_contact, phase, task,
                 ground_normal=None):
    """(N, 50) float32 inputs.

    positions (N, 23, 3) and rotations (N, 23, 3, 3): character-space heads and orientations, of which only the
    effectors and thighs are read (at run time the effectors come from the targets); hips_rotation (N, 3, 3);
    ground_height (N, 2) per foot; contact, desired_contact (N, 2) in {0, 1}; phase (N,); task (N,) indices;
    ground_normal (N, 2, 3), +Z by default.
    """
    n = positions.shape[0]
    origin, R_root = root_frame(positions, hips_rotation)
    Rt = np.swapaxes(R_root, -1, -2)
    out = np.empty((n, NUM_INPUTS), dtype=np.float64)
    for k, e in enumerate(EFFECTOR_ROLES):
        out[:, 6 * k:6 * k + 3] = np.einsum("nab,nb->na", Rt, positions[:, e] - origin)
        rel = spec.effector_reference[k].T @ (Rt @ rotations[:, e])
        out[:, 6 * k + 3:6 * k + 6] = matrix_to_axis_angle(rel)
    hips_rel = Rt @ np.asarray(hips_rotation, np.float64) @ spec.hips_reference.T
    out[:, 30:33] = hips_rel[:, :, 1]
    out[:, 33:36] = hips_rel[:, :, 2]
    normal = np.broadcast_to(_UP, (n, 2, 3)) if ground_normal is None else ground_normal
    for k, f in enumerate(FOOT_ROLES):
        base = 36 + 6 * k
        out[:, base] = positions[:, f, 2] - ground_height[:, k]
        out[:, base + 1:base + 4] = normal[:, k]
        out[:, base + 4] = contact[:, k]
        out[:, base + 5] = desired_contact[:, k]
    out[:, 48] = phase
    out[:, 49] = np.asarray(task, np.float64) / (len(TASKS) - 1)
    return out.astype(np.float32)


def foot_height_and_speed(foot_positions, ground_height, fps):
    """(N, 2) ankle height above the action's lowest ankle height over the ground, and (N, 2) ankle speed (units
    per second; the first frame takes the second's), from (N, 2, 3) ankle positions: what contact detection reads."""
    height = foot_positions[..., 2] - np.asarray(ground_height, np.float64)
    height = height - np.min(height, axis=0, keepdims=True)
    speed = np.zeros(height.shape)
    if len(foot_positions) > 1:
        step = np.linalg.norm(np.diff(foot_positions, axis=0), axis=-1) * fps
        speed[1:] = step
        speed[0] = step[0]
    return height, speed


def detect_contacts(foot_positions, ground_height, fps, rig_height):
    """(N, 2) contact flags for one action from (N, 2, 3) ankle positions: low and slow.

    ground_height is a scalar or (N, 2). A foot is in contact when its ankle is within 8% of the rig's height of
    the action's lowest ankle height above ground (so the ankle's own height above the sole does not matter) and
    it moves slower than 0.6 rig heights per second.
    """
    height, speed = foot_height_and_speed(foot_positions, ground_height, fps)
    return ((height < CONTACT_HEIGHT * rig_height) & (speed < CONTACT_SPEED * rig_height)).astype(np.float32)
