"""The batched extraction maths against the plain per-action and per-matrix code it replaces (pure NumPy):
BoneChain FK vs 4x4 products of Blender's formula, the quaternion conversions vs rotations.py, segment_contacts vs
detect_contacts, training_inputs vs build_inputs, and DatasetBuilder.add_batch vs add_action one action at a time."""

import numpy as np
from synthetic import humanoid_skeleton

from neural_ik.neural_network.data.dataset import ActionBatch, DatasetBuilder, segment_contacts, training_inputs
from neural_ik.neural_network.data.features import FeatureSpec, build_inputs, detect_contacts
from neural_ik.neural_network.geometry import armature_fk, kinematics, rotations
from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES, FOOT_ROLES, NUM_ROLES


def _random_rest(rng, parents):
    """Rigid rest matrices (Bone.matrix_local) for a hierarchy."""
    rest = np.tile(np.eye(4), (len(parents), 1, 1))
    rest[:, :3, :3] = rotations.axis_angle_to_matrix(rng.normal(size=(len(parents), 3)))
    rest[:, :3, 3] = rng.normal(size=(len(parents), 3))
    return rest


def _links(rest, parents):
    return np.array([rest[b] if p < 0 else np.linalg.inv(rest[p]) @ rest[b] for b, p in enumerate(parents)])


def _reference_fk(rest, parents, basis):
    """pose_j = pose_parent @ rest_parent^-1 @ rest_j @ basis_j with plain 4x4 products, frame by frame."""
    links = _links(rest, parents)
    pose = np.empty(basis.shape)
    for b, p in enumerate(parents):
        own = links[b] @ basis[:, b]
        pose[:, b] = own if p < 0 else pose[:, p] @ own
    return pose


def test_bone_chain_forward_equals_4x4_products():
    rng = np.random.default_rng(3)
    parents = np.array([-1, 0, 1, 1, 3, 0, 5, 6, -1, 8])      # two roots, branches, depths up to 4
    rest = _random_rest(rng, parents)
    n = 37
    quats = rng.normal(size=(n, len(parents), 4))
    locations = np.zeros((n, len(parents), 3))
    locations[:, [0, 4]] = rng.normal(size=(n, 2, 3))          # two bones with a location
    basis = np.tile(np.eye(4), (n, len(parents), 1, 1))
    basis[..., :3, :3] = rotations.quaternion_to_matrix(quats)
    basis[..., :3, 3] = locations
    expected = _reference_fk(rest, parents, basis)

    chain = armature_fk.BoneChain.build(parents, _links(rest, parents), range(len(parents)))
    q = armature_fk.normalized(quats.transpose(2, 1, 0)[:, chain.bones])
    ks = np.array([k for k, b in enumerate(chain.bones) if b in (0, 4)])
    loc = locations.transpose(2, 1, 0)[:, chain.bones][:, ks]
    matrices, heads = chain.forward(q, (ks, loc))
    order = chain.bones
    assert np.allclose(np.moveaxis(matrices, (0, 1), (-2, -1)), expected[:, order][..., :3, :3].swapaxes(0, 1), atol=1e-12)
    assert np.allclose(np.moveaxis(heads, 0, -1), expected[:, order][..., :3, 3].swapaxes(0, 1), atol=1e-12)

    scale = rng.uniform(0.5, 2.0, size=(n, len(parents), 3))
    scaled = basis.copy()
    scaled[..., :3, :3] = basis[..., :3, :3] * scale[..., None, :]
    expected = _reference_fk(rest, parents, scaled)
    m = scaled[..., :3, :3].transpose(2, 3, 1, 0)[:, :, order]
    pose3, heads = chain.forward_scaled(m, locations.transpose(2, 1, 0)[:, order])
    assert np.allclose(np.moveaxis(pose3, (0, 1), (-2, -1)), expected[:, order][..., :3, :3].swapaxes(0, 1), atol=1e-12)
    assert np.allclose(np.moveaxis(heads, 0, -1), expected[:, order][..., :3, 3].swapaxes(0, 1), atol=1e-12)


def test_quaternion_conversions_equal_rotations_module():
    rng = np.random.default_rng(4)
    angles = rng.uniform(-4, 4, size=(50, 3))
    for order in ("XYZ", "XZY", "YXZ", "YZX", "ZXY", "ZYX"):
        q = armature_fk.euler_quaternions(angles.T, order)
        assert np.allclose(armature_fk.quaternion_matrices(q), np.moveaxis(rotations.euler_to_matrix(angles, order),
                                                                           (-2, -1), (0, 1)), atol=1e-12)
    values = np.concatenate([rng.uniform(-4, 4, size=(50, 1)), rng.normal(size=(50, 3))], -1)
    values[0, 1:] = 0.0                                         # zero axis: identity, as in Blender
    q = armature_fk.axis_angle_quaternions(values.T)
    unit = values[:, 1:] / np.maximum(np.linalg.norm(values[:, 1:], axis=-1, keepdims=True), 1e-12)
    assert np.allclose(armature_fk.quaternion_matrices(q),
                       np.moveaxis(rotations.axis_angle_to_matrix(unit * values[:, :1]), (-2, -1), (0, 1)), atol=1e-12)
    aa = rng.normal(size=(200, 3)) * 1.5
    aa[:3] = [[0, 0, 0], [1e-9, 0, 0], [0, np.pi - 1e-7, 0]]
    q = np.moveaxis(rotations.axis_angle_to_quaternion(aa), -1, 0) * np.where(rng.random(200) < 0.5, -1.0, 1.0)
    assert np.allclose(armature_fk.quaternion_axis_angles(q).T, rotations.quaternion_to_axis_angle(np.moveaxis(q, 0, -1)),
                       atol=1e-9)


def _motion(rng, n, skel):
    aa = rng.normal(size=(n, NUM_ROLES, 3)) * 0.4
    aa[:, ~skel.role_mask] = 0.0
    local = rotations.axis_angle_to_matrix(aa)
    yaw = rng.uniform(-np.pi, np.pi) + np.linspace(0, 2, n)
    hips_rot = rotations.axis_angle_to_matrix(np.stack([0.2 * np.sin(yaw), np.zeros(n), yaw], -1))
    hips_pos = np.stack([np.cos(yaw), np.sin(yaw), 1.0 + 0.05 * np.sin(3 * yaw)], -1)
    pose = kinematics.forward(skel, local, hips_rot, hips_pos)
    positions = pose.positions.copy()
    positions[:, ~skel.role_mask] = np.nan
    return local, pose.rotations, positions, hips_rot, hips_pos


def test_training_inputs_equal_build_inputs():
    rng = np.random.default_rng(5)
    skel = humanoid_skeleton()
    _, rots, positions, hips_rot, _ = _motion(rng, 300, skel)
    rots[:40, EFFECTOR_ROLES[0]] = rotations.axis_angle_to_matrix(                  # near and at a half turn
        rng.normal(size=(40, 3)) * 1e-3 + np.array([0, 0, np.pi]))
    spec = FeatureSpec(rots[0, list(EFFECTOR_ROLES)], hips_rot[0])
    ground = rng.normal(size=(300, 2)) * 0.01
    contact = (rng.random((300, 2)) < 0.5).astype(np.float32)
    phase, task = rng.random(300), rng.integers(0, 6, 300)
    expected = build_inputs(spec, np.nan_to_num(positions), rots, hips_rot, ground, contact, contact, phase, task)
    got = training_inputs(spec, positions, rots[:, list(EFFECTOR_ROLES)], hips_rot, ground, contact, phase, task)
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.max(np.abs(got - expected)) < 2e-6


def test_segment_contacts_equal_detect_contacts_per_action():
    rng = np.random.default_rng(6)
    counts = [1, 2, 40, 17]
    starts = np.concatenate([[0], np.cumsum(counts)])
    feet = np.cumsum(rng.normal(size=(starts[-1], 2, 3)) * 0.01, axis=0)
    ground = np.zeros((starts[-1], 2))
    got = segment_contacts(feet, ground, 30.0, 1.7, starts)
    for a in range(len(counts)):
        rows = slice(starts[a], starts[a + 1])
        assert np.array_equal(got[rows], detect_contacts(feet[rows], ground[rows], 30.0, 1.7))


def test_add_batch_equals_add_action_one_by_one():
    rng = np.random.default_rng(7)
    skel = humanoid_skeleton()
    actions = []
    for a, n in enumerate((30, 1, 55)):
        local, rots, positions, hips_rot, hips_pos = _motion(rng, n, skel)
        bridges = offsets = None
        if a == 2:     # moving links for one action only
            bridges = np.broadcast_to(skel.bridges, (n, NUM_ROLES, 3, 3)).copy()
            bridges[:, 15] = rotations.axis_angle_to_matrix(rng.normal(size=(n, 3)) * 0.1) @ skel.bridges[15]
            offsets = np.broadcast_to(skel.offsets, (n, NUM_ROLES, 3)).copy()
        actions.append((f"walk_{a}", np.arange(5, 5 + n), 5, 4 + n, local, rots, positions, hips_rot, hips_pos,
                        bridges, offsets))
    one = DatasetBuilder(skel, 30.0)
    for name, frames, first, last, local, rots, positions, hips_rot, hips_pos, bridges, offsets in actions:
        one.add_action(name, frames, first, last, local, rots, positions, hips_rot, hips_pos, bridges, offsets, task=2)
    batch = DatasetBuilder(skel, 30.0)
    counts = [len(a[1]) for a in actions]
    n = sum(counts)
    bridges = np.broadcast_to(skel.bridges, (n, NUM_ROLES, 3, 3)).copy()
    offsets = np.broadcast_to(skel.offsets, (n, NUM_ROLES, 3)).copy()
    bridges[n - counts[-1]:], offsets[n - counts[-1]:] = actions[-1][9], actions[-1][10]
    batch.add_batch(ActionBatch(
        names=[a[0] for a in actions], frame_start=np.array([a[2] for a in actions]),
        frame_end=np.array([a[3] for a in actions]), starts=np.concatenate([[0], np.cumsum(counts)]),
        frames=np.concatenate([a[1] for a in actions]),
        local_axis_angle=rotations.matrix_to_axis_angle(np.concatenate([a[4] for a in actions])),
        positions=np.concatenate([a[6] for a in actions]), hips_rotation=np.concatenate([a[7] for a in actions]),
        hips_position=np.concatenate([a[8] for a in actions]),
        effector_rotations=np.concatenate([a[5][:, list(EFFECTOR_ROLES)] for a in actions]),
        tasks=np.array([2, 2, 2]), moving=np.array([False, False, True]), bridges=bridges, offsets=offsets))
    a, b = one.finish(), batch.finish()
    assert set(a.arrays) == set(b.arrays) and "bridges" in a.arrays
    for name, value in a.arrays.items():
        if value.dtype.kind == "f":
            assert np.allclose(value, b.arrays[name], atol=1e-6, equal_nan=True), name
        else:
            assert np.array_equal(value, b.arrays[name]), name
    spec_a, spec_b = a.meta.pop("feature_spec"), b.meta.pop("feature_spec")
    assert a.meta == b.meta
    for key in ("effector_reference", "hips_reference"):     # sums in another order: equal to rounding
        assert np.allclose(spec_a[key], spec_b[key], atol=1e-12)
    assert a.contacts[:, :].shape == (n, len(FOOT_ROLES))
