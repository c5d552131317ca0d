"""A small synthetic motion dataset built with the project's own FK and feature code (a test fixture, not a mock).

A humanoid with human proportions, in character space (+Z up, metres), with Bandai-like gaps (no Spine2, one neck
bone) and bridges that are not identity (so rest is not a T-pose, as on BVH rigs). Each action is a smooth periodic
motion around its own base pose, with the hips travelling and turning, so consecutive rows are frame pairs.
"""

import numpy as np

from neural_ik.neural_network.data.dataset import DatasetBuilder, training_inputs
from neural_ik.neural_network.geometry import kinematics, rotations
from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES, NUM_ROLES, ROLE_INDEX, ROLE_PARENTS, ROLES
from neural_ik.neural_network.skeleton.skeleton import Skeleton

_OFFSETS = {   # head of each role in its parent's frame at rest (metres; x left, y forward, z up)
    "Spine": (0, 0, 0.10), "Spine1": (0, 0, 0.12), "Spine2": (0, 0, 0.12), "NeckLower": (0, 0, 0.22),
    "NeckUpper": (0, 0, 0.05), "Head": (0, 0, 0.08),
    "LeftShoulder": (0.03, 0, 0.18), "LeftArm": (0.15, 0, 0), "LeftForeArm": (0.28, 0, 0), "LeftHand": (0.25, 0, 0),
    "RightShoulder": (-0.03, 0, 0.18), "RightArm": (-0.15, 0, 0), "RightForeArm": (-0.28, 0, 0),
    "RightHand": (-0.25, 0, 0),
    "LeftThigh": (0.09, 0, -0.05), "LeftShin": (0, 0, -0.42), "LeftFoot": (0, 0, -0.41), "LeftToeBase": (0, 0.13, -0.07),
    "RightThigh": (-0.09, 0, -0.05), "RightShin": (0, 0, -0.42), "RightFoot": (0, 0, -0.41),
    "RightToeBase": (0, 0.13, -0.07),
}
_ACTION_NAMES = ("walk_a", "walk_b", "wave_right", "reach_left", "crouch_low", "idle_breath", "run_fast", "jump_up")


def humanoid_skeleton(missing=("Spine2", "NeckUpper"), seed=0):
    rng = np.random.default_rng(seed)
    mask = np.array([name not in missing for name in ROLES])
    names = [f"bone_{name}" if mask[i] else "" for i, name in enumerate(ROLES)]
    offsets = np.zeros((NUM_ROLES, 3))
    for name, off in _OFFSETS.items():
        offsets[ROLE_INDEX[name]] = off
    # An unmapped role's offset is carried by its children (FK links a child to its nearest mapped ancestor).
    for j in np.where(~mask)[0]:
        for k in range(NUM_ROLES):
            if ROLE_PARENTS[k] == j:
                offsets[k] += offsets[j]
        offsets[j] = 0.0
    bridges = rotations.axis_angle_to_matrix(rng.normal(size=(NUM_ROLES, 3)) * 0.3)
    bridges[~mask] = np.eye(3)
    skel = Skeleton(names, offsets, bridges, np.tile(np.eye(3), (NUM_ROLES, 1, 1)), np.zeros((NUM_ROLES, 3)),
                    name="synthetic")
    rest = kinematics.forward(skel, np.tile(np.eye(3), (1, NUM_ROLES, 1, 1)), np.eye(3)[None], np.array([[0, 0, 1.0]]))
    skel.rest_rotations = rest.rotations[0]
    skel.rest_positions = rest.positions[0]
    return skel


def synthetic_dataset(frames_per_action=60, actions=6, seed=0, skeleton=None, amplitude=0.35, fps=30.0):
    """A real dataset.Dataset built by DatasetBuilder from FK of smooth random motions (one per action)."""
    rng = np.random.default_rng(seed)
    skel = skeleton or humanoid_skeleton()
    mask = skel.role_mask
    builder = DatasetBuilder(skel, fps, source="synthetic", capacity=frames_per_action * actions)
    for a in range(actions):
        t = np.arange(frames_per_action) / fps
        base = rng.normal(size=(NUM_ROLES, 3)) * 0.25
        amp = rng.normal(size=(NUM_ROLES, 3)) * amplitude
        phase = rng.uniform(0, 2 * np.pi, size=(NUM_ROLES, 3))
        freq = rng.uniform(0.5, 1.5)
        aa = base[None] + amp[None] * np.sin(2 * np.pi * freq * t[:, None, None] + phase[None])
        aa[:, ~mask] = 0.0
        aa[:, 0] = 0.0
        yaw = rng.uniform(-np.pi, np.pi) + 0.4 * t
        tilt = 0.1 * np.sin(2 * np.pi * freq * t)
        hips_rot = rotations.axis_angle_to_matrix(np.stack([tilt, np.zeros_like(t), yaw], -1))
        hips_pos = np.stack([0.5 * t * np.cos(yaw), 0.5 * t * np.sin(yaw),
                             1.0 + 0.03 * np.sin(4 * np.pi * freq * t)], -1)
        local = rotations.axis_angle_to_matrix(aa)
        pose = kinematics.forward(skel, local, hips_rot, hips_pos)
        frames = np.arange(1, frames_per_action + 1)
        name = _ACTION_NAMES[a % len(_ACTION_NAMES)] + f"_{a}"
        builder.add_action(name, frames, 1, frames_per_action, local, pose.rotations, pose.positions, hips_rot, hips_pos)
    return builder.finish()


def with_moving_links(data, seed=5):
    """The dataset with per-frame links that move (as CMU's pelvis does), positions recomputed by FK through them."""
    rng = np.random.default_rng(seed)
    skel = data.skeleton
    n = len(data)
    wobble = rotations.axis_angle_to_matrix(rng.normal(size=(n, 23, 3)) * 0.05)
    bridges = (skel.bridges[None] @ wobble).astype(np.float32)
    offsets = (skel.offsets[None] * (1.0 + 0.05 * rng.normal(size=(n, 23, 1)))).astype(np.float32)
    local = rotations.axis_angle_to_matrix(data.rotations.astype(np.float64))
    pose = kinematics.forward(skel, local, data.hips_rotation.astype(np.float64), data.hips_position.astype(np.float64),
                              bridges.astype(np.float64), offsets.astype(np.float64))
    arrays = dict(data.arrays, bridges=bridges, offsets=offsets)
    positions = pose.positions.astype(np.float32)
    positions[:, ~skel.role_mask] = np.nan
    arrays["positions"] = positions
    arrays["inputs"] = training_inputs(data.feature_spec, pose.positions, pose.rotations[:, list(EFFECTOR_ROLES)],
                                       data.hips_rotation, data.ground, data.contacts, data.phase, data.task)
    return type(data)(arrays, dict(data.meta), skel, data.feature_spec)
