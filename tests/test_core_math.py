"""The math everything else stands on: rotations, FK and its reverse pass, against finite differences."""

import numpy as np
import pytest

from neural_ik.neural_network.geometry import kinematics, rotations
from neural_ik.neural_network.skeleton.roles import NUM_ROLES, ROLE_INDEX, ROLES
from neural_ik.neural_network.skeleton.skeleton import Skeleton


def random_skeleton(rng, missing=("Spine2", "NeckUpper")):
    names = ["" if name in missing else f"bone_{i}" for i, name in enumerate(ROLES)]
    return Skeleton(
        bone_names=names,
        offsets=rng.normal(size=(NUM_ROLES, 3)) * 0.2,
        bridges=rotations.axis_angle_to_matrix(rng.normal(size=(NUM_ROLES, 3))),
        rest_rotations=np.tile(np.eye(3), (NUM_ROLES, 1, 1)),
        rest_positions=rng.normal(size=(NUM_ROLES, 3)),
    )


def test_axis_angle_round_trip_including_zero_and_pi():
    rng = np.random.default_rng(1)
    v = rng.normal(size=(200, 3)) * 1.5
    v[0] = 0.0
    v[1] = [1e-9, 0, 0]
    v[2] = [np.pi - 1e-9, 0, 0]
    v[3] = [0, 0, -np.pi + 1e-6]
    R = rotations.axis_angle_to_matrix(v)
    assert np.allclose(R @ np.swapaxes(R, -1, -2), np.eye(3), atol=1e-12)
    back = rotations.matrix_to_axis_angle(R)
    assert np.allclose(rotations.axis_angle_to_matrix(back), R, atol=1e-12)
    assert np.all(np.linalg.norm(back, axis=-1) <= np.pi + 1e-12)


def test_quaternion_and_matrix_agree():
    rng = np.random.default_rng(2)
    q = rng.normal(size=(100, 4))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    R = rotations.quaternion_to_matrix(q)
    q2 = rotations.matrix_to_quaternion(R)
    assert np.allclose(np.abs(np.sum(q * q2, axis=-1)), 1.0, atol=1e-12)   # same rotation up to sign
    v = rotations.quaternion_to_axis_angle(q)
    assert np.allclose(rotations.axis_angle_to_matrix(v), R, atol=1e-12)


@pytest.mark.parametrize("order", sorted(rotations.EULER_AXES))
def test_euler_angles_match_mathutils_with_and_without_compat(order):
    """matrix_to_euler against Blender's own Matrix.to_euler (float32 inside, so 1e-5), on random rotations and
    gimbal-locked ones, plain and compatible with angles turns away; the tick's quaternion form equals it."""
    from mathutils import Euler, Matrix

    rng = np.random.default_rng(7)
    R = rotations.axis_angle_to_matrix(rng.normal(0, 2, (300, 3)))
    locked = rng.normal(0, 1.5, (20, 3))
    locked[:, rotations.EULER_AXES[order][1]] = np.pi / 2 * rng.choice([-1.0, 1.0], 20)   # the middle axis at 90 deg
    R = np.concatenate([R, rotations.euler_to_matrix(locked, order)])
    compat = np.array([Matrix(m.tolist()).to_euler(order) for m in R]) + rng.integers(-2, 3, (len(R), 3)) * 2 * np.pi
    compat += rng.normal(0, 0.3, compat.shape)
    plain = rotations.matrix_to_euler(R, order)
    near = rotations.matrix_to_euler(R, order, compat)
    np.testing.assert_allclose(plain, [Matrix(m.tolist()).to_euler(order) for m in R], atol=1e-5)
    np.testing.assert_allclose(near, [Matrix(m.tolist()).to_euler(order, Euler(c)) for m, c in zip(R, compat)], atol=1e-5)
    np.testing.assert_allclose(rotations.euler_to_matrix(near, order), R, atol=1e-9)
    assert np.abs(near - plain).max() > 6.0                  # compat moved angles by whole turns, as Blender does
    q = rotations.matrix_to_quaternion(R)
    np.testing.assert_allclose(rotations.quaternions_to_compatible_euler(q, order, compat), near, atol=1e-9)
    np.testing.assert_allclose(rotations.quaternions_to_compatible_euler(q[:300], order, compat[:300]), near[:300],
                               atol=1e-9)                                             # no lock: the fast form itself


def test_small_angles_keep_precision():
    """atan2-based angles resolve 1e-6 rad where arccos of a float trace would floor (trap 6 of the notes)."""
    R = rotations.axis_angle_to_matrix(np.array([[1e-6, 0.0, 0.0]]))
    assert rotations.angle_between(np.eye(3)[None], R)[0] == pytest.approx(1e-6, rel=1e-6)


def test_blend_transforms_ends_at_either_transform_and_turns_on_the_shortest_path():
    rng = np.random.default_rng(3)
    a, b = np.broadcast_to(np.eye(4), (2, 50, 4, 4)).copy()
    a[:, :3, :3], b[:, :3, :3] = (rotations.axis_angle_to_matrix(rng.normal(0.0, 1.0, (50, 3))) for _ in range(2))
    a[:, :3, 3], b[:, :3, 3] = rng.normal(0.0, 1.0, (2, 50, 3))
    np.testing.assert_allclose(rotations.blend_transforms(a, b, 0.0), a, atol=1e-12)
    np.testing.assert_allclose(rotations.blend_transforms(a, b, 1.0), b, atol=1e-12)
    share = rng.random(50)
    mid = rotations.blend_transforms(a, b, share)
    np.testing.assert_allclose(mid[:, :3, 3], a[:, :3, 3] + share[:, None] * (b[:, :3, 3] - a[:, :3, 3]), atol=1e-12)
    np.testing.assert_allclose(mid[:, 3], a[:, 3], atol=0)                       # still rigid transforms
    np.testing.assert_allclose(mid[:, :3, :3] @ np.swapaxes(mid[:, :3, :3], 1, 2), np.broadcast_to(np.eye(3), (50, 3, 3)),
                               atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(mid[:, :3, :3]), 1.0, atol=1e-12)
    to_a, to_b = rotations.angle_between(a[:, :3, :3], mid[:, :3, :3]), rotations.angle_between(mid[:, :3, :3],
                                                                                                b[:, :3, :3])
    total = rotations.angle_between(a[:, :3, :3], b[:, :3, :3])
    near = total < 3.0                            # (rotations nearly a half turn apart have no one shortest path)
    np.testing.assert_allclose((to_a + to_b)[near], total[near], atol=1e-9)


def test_axis_angle_vjp_matches_finite_differences():
    rng = np.random.default_rng(3)
    v = rng.normal(size=(40, 3)) * 1.3
    v[0] = 0.0
    G = rng.normal(size=(40, 3, 3))
    analytic = rotations.axis_angle_vjp(v, G)
    eps = 1e-6
    numeric = np.zeros_like(v)
    for i in range(3):
        d = np.zeros(3)
        d[i] = eps
        numeric[:, i] = np.sum(G * (rotations.axis_angle_to_matrix(v + d) - rotations.axis_angle_to_matrix(v - d)),
                               axis=(1, 2)) / (2 * eps)
    assert np.allclose(analytic, numeric, rtol=1e-5, atol=1e-7)


def test_fk_chain_composes_like_a_skeleton():
    """A two-link check by hand: the spine's head sits at the hips plus the hips-rotated offset."""
    rng = np.random.default_rng(4)
    skel = random_skeleton(rng)
    local = rotations.axis_angle_to_matrix(rng.normal(size=(3, NUM_ROLES, 3)))
    H = rotations.axis_angle_to_matrix(rng.normal(size=(3, 3)))
    h = rng.normal(size=(3, 3))
    pose = kinematics.forward(skel, local, H, h)
    spine, spine1 = ROLE_INDEX["Spine"], ROLE_INDEX["Spine1"]
    assert np.allclose(pose.positions[:, spine], h + np.einsum("nab,b->na", H, skel.offsets[spine]))
    R_spine = H @ skel.bridges[spine] @ local[:, spine]
    assert np.allclose(pose.rotations[:, spine], R_spine)
    assert np.allclose(pose.positions[:, spine1], pose.positions[:, spine] + np.einsum("nab,b->na", R_spine,
                                                                                        skel.offsets[spine1]))
    # a role the rig lacks (Spine2) takes its parent's transform; the shoulders hang from Spine1 instead
    assert np.allclose(pose.positions[:, ROLE_INDEX["Spine2"]], pose.positions[:, spine1])
    assert skel.parents[ROLE_INDEX["LeftShoulder"]] == spine1


@pytest.mark.parametrize("per_sample", [False, True])
def test_fk_gradient_matches_central_differences(per_sample):
    rng = np.random.default_rng(5)
    skel = random_skeleton(rng)
    n = 3
    v = rng.normal(size=(n, NUM_ROLES, 3))
    H = rotations.axis_angle_to_matrix(rng.normal(size=(n, 3)))
    h = rng.normal(size=(n, 3))
    bridges = rotations.axis_angle_to_matrix(rng.normal(size=(n, NUM_ROLES, 3))) if per_sample else None
    offsets = rng.normal(size=(n, NUM_ROLES, 3)) if per_sample else None
    g_rot = rng.normal(size=(n, NUM_ROLES, 3, 3))
    g_pos = rng.normal(size=(n, NUM_ROLES, 3))

    def loss(x):
        pose = kinematics.forward_axis_angle(skel, x, H, h, bridges, offsets)
        return np.sum(pose.rotations * g_rot) + np.sum(pose.positions * g_pos)

    pose = kinematics.forward_axis_angle(skel, v, H, h, bridges, offsets)
    analytic = kinematics.backward_axis_angle(skel, pose, v, g_rot, g_pos)
    numeric = np.zeros_like(v)
    eps = 1e-6
    for idx in np.ndindex(v.shape):
        d = np.zeros_like(v)
        d[idx] = eps
        numeric[idx] = (loss(v + d) - loss(v - d)) / (2 * eps)
    scale = np.abs(numeric).max()
    assert np.abs(analytic - numeric).max() <= 1e-5 * scale
    assert np.all(analytic[:, 0] == 0)   # the hips transform is given, not predicted


def test_skeleton_json_round_trip_and_fingerprint():
    rng = np.random.default_rng(6)
    skel = random_skeleton(rng)
    again = Skeleton.from_json(skel.to_json())
    assert again.fingerprint() == skel.fingerprint()
    assert np.array_equal(again.role_mask, skel.role_mask)
    moved = Skeleton.from_json({**skel.to_json(), "offsets": (skel.offsets * 1.1).tolist()})
    assert moved.fingerprint() != skel.fingerprint()


def test_height_is_the_standing_height_whatever_the_rest_pose():
    """Every threshold (contacts, foot lock, the absurd-target check, damping) scales with Skeleton.height. A BVH rig's
    rest pose may fold the legs up along the spine (Bandai's rest is 13 cm tall): the height comes from the bone
    lengths, so a folded rest gives the height of the same body standing."""
    from synthetic import humanoid_skeleton

    skel = humanoid_skeleton(missing=())
    skel.bridges[:] = np.eye(3)
    rest = np.tile(np.eye(3), (1, NUM_ROLES, 1, 1))
    standing = kinematics.forward(skel, rest, np.eye(3)[None], np.zeros((1, 3))).positions[0]
    feet = [ROLE_INDEX["LeftFoot"], ROLE_INDEX["RightFoot"]]
    extent = standing[ROLE_INDEX["Head"], 2] - standing[feet, 2].min()
    assert skel.height == pytest.approx(extent, rel=0.05)
    folded = rest.copy()
    for side in ("Left", "Right"):
        folded[0, ROLE_INDEX[side + "Thigh"]] = rotations.axis_angle_to_matrix(np.array([np.pi, 0.0, 0.0]))
    pose = kinematics.forward(skel, folded, np.eye(3)[None], np.zeros((1, 3)))
    before = skel.height
    skel.rest_positions, skel.rest_rotations = pose.positions[0], pose.rotations[0]
    z = skel.rest_positions[:, 2]
    assert z.max() - z.min() < 0.6 * extent          # the folded rest's extent is no measure of the body
    assert skel.height == pytest.approx(before)


def test_right_jacobian_matches_finite_differences():
    """exp(v + e d) = exp(v) exp(e J(v) d) to first order, for turns from zero to nearly half a turn."""
    from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix, matrix_to_axis_angle, right_jacobian

    rng = np.random.default_rng(5)
    v = rng.normal(size=(40, 3)) * np.array([1e-9, 0.3, 1.0, 2.5])[np.arange(40) % 4, None]
    d = rng.normal(size=(40, 3))
    eps = 1e-6
    turned = np.swapaxes(axis_angle_to_matrix(v), -1, -2) @ axis_angle_to_matrix(v + eps * d)
    np.testing.assert_allclose(matrix_to_axis_angle(turned) / eps, (right_jacobian(v) @ d[..., None])[..., 0], atol=1e-5)
