"""Limb-mix augmentation: every limb of a mixed pose is one recorded frame's limb, its positions are FK of its
rotations, feet stay above the data's floor, contacts are kept only where a foot really is, and the trainer adds the
mixed rows as library motion without frame pairs."""

import numpy as np
import pytest
from synthetic import humanoid_skeleton, synthetic_dataset, with_moving_links

from neural_ik.neural_network.data import limb_mix
from neural_ik.neural_network.data.dataset import DatasetBuilder
from neural_ik.neural_network.geometry import kinematics, rotations
from neural_ik.neural_network.model import trainer
from neural_ik.neural_network.skeleton.roles import FOOT_ROLES, NUM_ROLES, ROLE_INDEX


@pytest.fixture(scope="module")
def data():
    return synthetic_dataset(frames_per_action=80, actions=5, seed=3, amplitude=0.6)


def source_frames(source, mixed):
    """(count,) frame whose hips each mixed row has, and (count, parts) frame each limb's rotations equal
    (-1 where no recorded frame has that limb)."""
    hips = source.hips_rotation.reshape(len(source), -1)
    base = np.array([np.flatnonzero((hips == h).all(axis=1))[0] for h in mixed.hips_rotation.reshape(len(mixed), -1)])
    parts = np.full((len(mixed), len(limb_mix.PARTS)), -1)
    mask = source.skeleton.role_mask
    for k, part in enumerate(limb_mix.PARTS):
        roles = [j for j in part if mask[j]]
        recorded = source.rotations[:, roles].reshape(len(source), -1)
        for i, row in enumerate(mixed.rotations[:, roles].reshape(len(mixed), -1)):
            hit = np.flatnonzero((recorded == row).all(axis=1))
            parts[i, k] = hit[0] if len(hit) else -1
    return base, parts


@pytest.mark.parametrize("moving", [False, True])
def test_each_limb_of_a_mixed_pose_is_a_recorded_limb_and_positions_are_its_fk(data, moving):
    source = with_moving_links(data) if moving else data
    mixed = limb_mix.mixed_dataset(source, 200, swap=0.5, seed=1)
    base, parts = source_frames(source, mixed)
    assert (parts >= 0).all()                                   # no joint rotation is invented
    assert np.array_equal(mixed.rotations[:, 0], source.rotations[base, 0])
    swapped = parts != base[:, None]
    assert 0.35 < swapped.mean() < 0.65                         # about half the limbs come from another frame
    mask = source.skeleton.role_mask
    local = rotations.axis_angle_to_matrix(mixed.rotations.astype(np.float64))
    links = [mixed.arrays[k].astype(np.float64) if moving else None for k in ("bridges", "offsets")]
    pose = kinematics.forward(source.skeleton, local, mixed.hips_rotation.astype(np.float64),
                              mixed.hips_position.astype(np.float64), *links)
    assert np.abs(pose.positions[:, mask] - mixed.positions[:, mask]).max() < 1e-5
    assert np.allclose(mixed.hips_position[:, :2], source.hips_position[base, :2])
    lift = mixed.hips_position[:, 2] - source.hips_position[base, 2]
    assert (lift >= -1e-6).all()
    feet = list(FOOT_ROLES)
    floor = np.min(source.positions[:, feet, 2] - source.ground, axis=0)
    height = mixed.positions[:, feet, 2] - mixed.ground
    assert (height >= floor - 1e-5).all()                       # no foot sinks below where the data ever put it


def stand_and_crouch(frames=40, seed=0):
    """Two actions with both feet on the ground: standing with straight legs, and crouching with bent ones."""
    rng = np.random.default_rng(seed)
    skel = humanoid_skeleton()
    builder = DatasetBuilder(skel, 30.0, source="synthetic", capacity=2 * frames)
    thighs = [ROLE_INDEX[n] for n in ("LeftThigh", "RightThigh")]
    shins = [ROLE_INDEX[n] for n in ("LeftShin", "RightShin")]
    for name, bend in (("stand_still", 0.0), ("crouch_low", 1.0)):
        aa = rng.normal(size=(frames, NUM_ROLES, 3)) * 0.02
        aa[:, ~skel.role_mask] = 0.0
        aa[:, 0] = 0.0
        aa[:, thighs, 0] += bend
        aa[:, shins, 0] -= 1.6 * bend
        local = rotations.axis_angle_to_matrix(aa)
        hips = np.tile(np.eye(3), (frames, 1, 1))
        pose = kinematics.forward(skel, local, hips, np.zeros((frames, 3)))
        hips_position = np.zeros((frames, 3))
        hips_position[:, 2] = 0.08 - pose.positions[:, list(FOOT_ROLES), 2].min(axis=1)
        pose = kinematics.forward(skel, local, hips, hips_position)
        builder.add_action(name, np.arange(1, frames + 1), 1, frames, local, pose.rotations, pose.positions, hips,
                           hips_position)
    return builder.finish()


def test_a_straight_leg_under_a_crouch_lifts_the_body_just_enough():
    source = stand_and_crouch(frames=40)
    crouch = np.arange(40, 80)
    parts = np.repeat(crouch[:, None], len(limb_mix.PARTS), axis=1)
    parts[:, limb_mix.LEG_PARTS[0]] = np.arange(40)             # the left leg straight, from the standing frames
    mixed = limb_mix.mix_poses(source, crouch, parts)
    feet = list(FOOT_ROLES)
    floor = np.min(source.positions[:, feet, 2] - source.ground, axis=0)
    height = mixed.positions[:, feet, 2] - mixed.ground
    lift = mixed.hips_position[:, 2] - source.hips_position[crouch, 2]
    lifted = lift > 1e-3
    assert lifted.mean() > 0.5 and (lift > -1e-6).all()         # the straight leg mostly reaches below the crouch
    assert (height >= floor - 1e-5).all()
    assert np.allclose(np.min(height[lifted] - floor, axis=1), 0.0, atol=1e-5)   # a foot on the floor, not above it
    upper = [j for part in limb_mix.PARTS[:2] + limb_mix.PARTS[4:] for j in part if source.skeleton.role_mask[j]]
    moved = mixed.positions[:, upper] - source.positions[crouch][:, upper]
    assert np.allclose(moved[..., :2], 0.0, atol=1e-5) and np.allclose(moved[..., 2], lift[:, None], atol=1e-5)


def test_without_swaps_the_mixed_rows_are_the_recorded_frames(data):
    mixed = limb_mix.mixed_dataset(data, 150, swap=0.0, seed=2)
    base, parts = source_frames(data, mixed)
    assert (parts == base[:, None]).all()
    for name in ("inputs", "hips_position", "contacts", "ground", "phase", "task"):
        assert np.allclose(mixed.arrays[name], data.arrays[name][base], atol=1e-4), name


def test_a_foot_keeps_its_contact_only_where_its_own_frame_had_it():
    source = stand_and_crouch(frames=40)
    rng = np.random.default_rng(6)
    base = rng.integers(0, 80, 300)
    parts = np.where(rng.random((300, len(limb_mix.PARTS))) < 0.5, rng.integers(0, 80, (300, len(limb_mix.PARTS))),
                     base[:, None])
    mixed = limb_mix.mix_poses(source, base, parts)
    feet = list(FOOT_ROLES)
    legs = parts[:, list(limb_mix.LEG_PARTS)]
    own_contact = source.contacts[legs, [0, 1]]
    own_height = (source.positions[:, feet, 2] - source.ground)[legs, [0, 1]]
    height = mixed.positions[:, feet, 2] - mixed.ground
    flagged = mixed.contacts > 0.5
    assert flagged.any() and (own_contact[flagged] > 0.5).all()
    tolerance = limb_mix.CONTACT_TOLERANCE * source.skeleton.height
    assert (np.abs(height - own_height)[flagged] < tolerance).all()
    dropped = (own_contact > 0.5) & ~flagged
    assert dropped.any() and (np.abs(height - own_height)[dropped] >= tolerance).all()


def test_training_adds_mixed_rows_as_library_motion_without_frame_pairs(data, tmp_path):
    plain = trainer.Trainer(data, trainer.TrainConfig(epochs=1, limb_mix=0.0), tmp_path)
    tr = trainer.Trainer(data, trainer.TrainConfig(epochs=1, limb_mix=0.5), tmp_path)
    n = len(plain.train)
    assert len(tr.train) == n + round(0.5 * n)
    assert np.array_equal(tr.val.inputs, plain.val.inputs)      # validation stays recorded motion
    mixed_rows = np.arange(n, len(tr.train))
    assert np.array_equal(tr.train.prev[mixed_rows], mixed_rows)
    assert not np.isin(tr.train.action[mixed_rows], tr.train.action[:n]).any()
    full = trainer.data_statistics(tr.train, tr.config)      # limits read from the recorded rows are those of all
    assert all(np.array_equal(full[k], tr.stats[k]) for k in full)
    together = limb_mix.with_limb_mix(data, 0.2)
    own = together.own_action_mask()
    assert own[:-1].all() and not own[-1]
    assert tr.run().stopped == "epochs"
