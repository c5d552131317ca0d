"""A small synthetic motion dataset built with the project's own FK and feature code (a test fixture, not a mock).

A humanoid with human proportions, in character space (+Z up, metres), with Bandai-like gaps (no Spine2, one neck
bone) and bridges that are not identity (so rest is not a T-pose, as on BVH rigs). Each action is a smooth periodic
motion around its own base pose, with the hips travelling and turning, so consecutive rows are frame pairs.
"""

from types import SimpleNamespace

import numpy as np

from neural_ik.neural_network import features, kinematics, rotations
from neural_ik.neural_network.roles import FOOT_ROLES, NUM_ROLES, ROLE_INDEX, ROLE_PARENTS, ROLES, task_from_name
from neural_ik.neural_network.skeleton import Skeleton

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


def synthetic_dataset(frames_per_action=60, actions=6, seed=0, skeleton=None, amplitude=0.35):
    """A dataset-like object with the arrays of docs/architecture.md's Dataset, built by FK and features."""
    rng = np.random.default_rng(seed)
    skel = skeleton or humanoid_skeleton()
    mask = skel.role_mask
    rows = []
    for a in range(actions):
        t = np.arange(frames_per_action) / 30.0
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
        hips_pos = np.stack([0.5 * t * np.cos(yaw), 0.5 * t * np.sin(yaw), 1.0 + 0.03 * np.sin(4 * np.pi * freq * t)], -1)
        rows.append((a, aa, hips_rot, hips_pos, t))
    aa = np.concatenate([r[1] for r in rows])
    hips_rot = np.concatenate([r[2] for r in rows])
    hips_pos = np.concatenate([r[3] for r in rows])
    action = np.concatenate([np.full(len(r[4]), r[0], np.int32) for r in rows])
    frame = np.concatenate([np.arange(len(r[4]), dtype=np.int32) + 1 for r in rows])
    pose = kinematics.forward_axis_angle(skel, aa, hips_rot, hips_pos)
    positions = pose.positions.copy()
    positions[:, ~mask] = np.nan
    ground = np.zeros((len(aa), 2))
    contacts = np.zeros((len(aa), 2), np.float32)
    for a in range(actions):
        sel = action == a
        feet = pose.positions[sel][:, list(FOOT_ROLES)]
        contacts[sel] = features.detect_contacts(feet, 0.0, 30.0, skel.height)
    names = np.array([_ACTION_NAMES[a % len(_ACTION_NAMES)] + f"_{a}" for a in range(actions)])
    task = np.array([task_from_name(names[a]) for a in action], np.int32)
    phase = (frame % 30) / 30.0
    spec = features.references_from_data(pose.positions, pose.rotations, hips_rot)
    inputs = features.build_inputs(spec, pose.positions, pose.rotations, hips_rot, ground, contacts, contacts, phase, task)
    return SimpleNamespace(
        inputs=inputs, rotations=aa.astype(np.float32), positions=positions.astype(np.float32),
        hips_rotation=hips_rot.astype(np.float32), hips_position=hips_pos.astype(np.float32), bridges=None,
        offsets=None, contacts=contacts, ground=ground.astype(np.float32), role_mask=mask, action_names=names,
        action=action, frame=frame, task=task, phase=phase.astype(np.float32), skeleton=skel, feature_spec=spec,
    )
