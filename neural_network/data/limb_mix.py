"""Limb-mix augmentation: new training poses made of the limbs of different recorded frames.

A recorded clip ties its limbs together: in a walk the arms swing against the legs, and a network trained on walks
learns that tie as if it were part of the body. Shown an unseen combination (a leg kicked above the hips while the
arms do something new), it then misplaces every effector, not only the unusual one. Each mixed pose takes one
frame's hips (position and orientation) and, for every limb, the local rotations of that frame or, with
probability `swap`, of another random frame:

    left arm, right arm       Shoulder, Arm, ForeArm, Hand (relative to Spine2)
    left leg, right leg       Thigh, Shin, Foot, ToeBase (relative to the hips)
    spine and head            Spine, Spine1, Spine2, NeckLower, NeckUpper, Head

Every joint keeps a rotation the rig really made, so joint limits and the mean pose do not move; only the
combinations are new. Positions and orientations come from FK through the rig's links (a frame's own moving links
travel with its joints), and the inputs are rebuilt from them as for any frame.

The floor stays a floor: a pose whose foot would sink below the lowest height that foot reaches in the data is
lifted (the whole body, so nothing in the root frame changes). A foot keeps its contact flag only if it is where
its own frame had it (within `CONTACT_TOLERANCE` of the rig's height above the ground). Mixed frames form one action
with no frame pairs, so foot slip and smoothness never compare two of them; extraction would never mark them as the
user's own motion (dataset.own_action_mask reads their "augmented" source).
"""

import numpy as np

from ..geometry import kinematics
from ..geometry.rotations import axis_angle_to_matrix
from ..skeleton.roles import EFFECTOR_ROLES, FOOT_ROLES, ROLE_INDEX
from .dataset import Dataset, training_inputs

MIX_ACTION = "limb mix"
CONTACT_TOLERANCE = 0.02      # of the rig's standing height
PARTS = tuple(tuple(ROLE_INDEX[name] for name in part) for part in (
    ("LeftShoulder", "LeftArm", "LeftForeArm", "LeftHand"),
    ("RightShoulder", "RightArm", "RightForeArm", "RightHand"),
    ("LeftThigh", "LeftShin", "LeftFoot", "LeftToeBase"),
    ("RightThigh", "RightShin", "RightFoot", "RightToeBase"),
    ("Spine", "Spine1", "Spine2", "NeckLower", "NeckUpper", "Head"),
))
LEG_PARTS = (2, 3)            # PARTS index of the leg holding FOOT_ROLES[k]


def mixed_dataset(dataset, count, swap=0.5, seed=0):
    """A Dataset of `count` mixed poses drawn from the dataset's frames (one action, MIX_ACTION)."""
    rng = np.random.default_rng(seed)
    n = len(dataset)
    base = rng.integers(0, n, count)
    swapped = rng.random((count, len(PARTS))) < swap
    source = np.where(swapped, rng.integers(0, n, (count, len(PARTS))), base[:, None])
    return mix_poses(dataset, base, source)


def mix_poses(dataset, base, source):
    """A Dataset of poses with the hips (and phase, task, ground) of frames `base` (count,) and the limbs of frames
    `source` (count, len(PARTS))."""
    arrays = dataset.arrays
    skeleton = dataset.skeleton
    mask = skeleton.role_mask
    count = len(base)
    frame_of = np.repeat(base[:, None], len(mask), axis=1)             # (count, 23): the frame each role comes from
    for k, part in enumerate(PARTS):
        frame_of[:, list(part)] = source[:, k:k + 1]
    roles = np.arange(len(mask))[None]
    local = axis_angle_to_matrix(np.asarray(arrays["rotations"], np.float64)[frame_of, roles])
    local[:, ~mask] = np.eye(3)
    links = {name: None if name not in arrays else np.asarray(arrays[name], np.float64)[frame_of, roles]
             for name in ("bridges", "offsets")}
    hips = np.asarray(arrays["hips_rotation"], np.float64)[base]
    hips_position = np.asarray(arrays["hips_position"], np.float64)[base].copy()
    pose = kinematics.forward(skeleton, local, hips, hips_position, links["bridges"], links["offsets"])
    positions = pose.positions.copy()

    feet = list(FOOT_ROLES)
    recorded = np.asarray(arrays["positions"], np.float64)[:, feet, 2] - np.asarray(arrays["ground"], np.float64)
    floor = np.nanmin(recorded, axis=0)                                 # (2,) lowest height of each foot in the data
    ground = np.asarray(arrays["ground"], np.float64)[base]
    lift = np.maximum(np.max(floor[None] - (positions[:, feet, 2] - ground), axis=1), 0.0)
    positions[..., 2] += lift[:, None]
    hips_position[:, 2] += lift
    height = positions[:, feet, 2] - ground
    leg_frame = source[:, list(LEG_PARTS)]                              # (count, 2): the frame each foot comes from
    own_height = recorded[leg_frame, [0, 1]]
    contacts = np.asarray(arrays["contacts"], np.float64)[leg_frame, [0, 1]]
    contacts *= np.abs(height - own_height) < CONTACT_TOLERANCE * skeleton.height

    positions[:, ~mask] = np.nan
    phase, task = np.asarray(arrays["phase"])[base], np.asarray(arrays["task"])[base]
    inputs = training_inputs(dataset.feature_spec, np.nan_to_num(positions), pose.rotations[:, list(EFFECTOR_ROLES)],
                             hips, ground, contacts, phase, task)
    out = {name: np.asarray(value)[base] for name, value in arrays.items()
           if name not in ("action_names", "role_mask")}
    out.update(inputs=inputs, rotations=np.asarray(arrays["rotations"])[frame_of, roles],
               positions=positions.astype(np.float32), hips_position=hips_position.astype(np.float32),
               contacts=contacts.astype(np.float32), ground=ground.astype(np.float32),
               action=np.zeros(count, np.int32), frame=np.zeros(count, np.int32),
               action_names=np.array([MIX_ACTION]), role_mask=arrays["role_mask"])
    for name, value in links.items():
        if value is not None:
            out[name] = value.astype(np.float32)
    meta = dict(dataset.meta)
    meta["actions"] = [{"name": MIX_ACTION, "source": {"kind": "augmented"}}]
    return Dataset(out, meta, skeleton, dataset.feature_spec)


def with_limb_mix(dataset, share, swap=0.5, seed=0):
    """The dataset followed by round(share * len) mixed poses (their action numbered after the dataset's)."""
    count = int(round(share * len(dataset)))
    if count < 1:
        return dataset
    return dataset.appended(mixed_dataset(dataset, count, swap, seed))
