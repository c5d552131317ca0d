"""Input features (root frame invariances) and the safe file layer (atomic writes, checked loads)."""

import os

import numpy as np
import pytest

from neural_ik.neural_network.data import features, files
from neural_ik.neural_network.geometry import rotations
from neural_ik.neural_network.skeleton.roles import NUM_ROLES, ROLE_INDEX


def random_character(rng, n=16):
    positions = rng.normal(size=(n, NUM_ROLES, 3))
    positions[:, ROLE_INDEX["LeftThigh"]] = positions[:, ROLE_INDEX["Hips"]] + [0.1, 0.0, -0.05]
    positions[:, ROLE_INDEX["RightThigh"]] = positions[:, ROLE_INDEX["Hips"]] + [-0.1, 0.0, -0.05]
    rots = rotations.axis_angle_to_matrix(rng.normal(size=(n, NUM_ROLES, 3)))
    return positions, rots


def inputs_of(spec, positions, rots, n):
    return features.build_inputs(spec, positions, rots, rots[:, 0], np.zeros((n, 2)), np.ones((n, 2)),
                                 np.zeros((n, 2)), np.linspace(0, 1, n), np.full(n, 2))


def test_inputs_ignore_world_position_and_heading():
    rng = np.random.default_rng(0)
    n = 16
    positions, rots = random_character(rng, n)
    spec = features.references_from_data(positions, rots, rots[:, 0])
    base = inputs_of(spec, positions, rots, n)
    yaw = rotations.axis_angle_to_matrix(np.array([0.0, 0.0, 2.1]))
    shift = np.array([3.0, -1.0, 0.0])
    moved = inputs_of(spec, positions @ yaw.T + shift, yaw @ rots, n)
    assert base.shape == (n, features.NUM_INPUTS) and base.dtype == np.float32
    assert np.allclose(base, moved, atol=1e-5)
    # a vertical move changes the feet's height above ground, and only that
    lifted = inputs_of(spec, positions + [0.0, 0.0, 0.5], rots, n)
    changed = np.where(np.abs(lifted - base).max(axis=0) > 1e-5)[0]
    assert [features.INPUT_NAMES[i] for i in changed] == ["LeftFoot.height", "RightFoot.height"]


def test_references_centre_the_rotation_inputs():
    """With references from the data, rotation inputs of the data sit far from the axis-angle wrap at pi."""
    rng = np.random.default_rng(1)
    n = 200
    positions, rots = random_character(rng, n)
    common = rotations.axis_angle_to_matrix(np.array([0.0, 3.0, 0.0]))   # far from identity, like BVH rest poses
    jitter = rotations.axis_angle_to_matrix(rng.normal(size=(n, NUM_ROLES, 3)) * 0.2)
    rots = common @ jitter
    rots[:, 0] = np.eye(3)
    spec = features.references_from_data(positions, rots, rots[:, 0])
    x = inputs_of(spec, positions, rots, n)
    angles = np.linalg.norm(x[:, 3:6], axis=-1)
    assert angles.max() < 1.5


def test_contacts_need_low_and_slow():
    t = np.arange(60) / 30.0
    foot = np.zeros((60, 2, 3))
    foot[:, 0, 0] = t * 3.0                      # left foot slides fast
    foot[:, 1, 2] = 0.1 + 0.3 * (t > 1.0)        # right foot lifts after one second
    contact = features.detect_contacts(foot, 0.0, fps=30.0, rig_height=1.7)
    assert contact[:, 0].sum() == 0
    assert contact[:20, 1].all() and not contact[40:, 1].any()


def test_save_and_load_round_trip(tmp_path):
    path = tmp_path / "a.npz"
    files.save_npz(path, {"x": np.arange(6.0).reshape(2, 3), "names": np.array(["a", "b"])}, {"kind": "k", "v": 1})
    meta, arrays = files.load_npz(path, "k", required=("x",))
    assert meta["v"] == 1 and arrays["x"][1, 2] == 5.0 and list(arrays["names"]) == ["a", "b"]
    with pytest.raises(files.FileRefused, match="expected 'other'"):
        files.load_npz(path, "other")


@pytest.mark.parametrize("damage", ["truncate", "zero", "garbage", "folder"])
def test_load_refuses_damaged_files(tmp_path, damage):
    path = tmp_path / "a.npz"
    files.save_npz(path, {"x": np.ones(1000)}, {"kind": "k"})
    if damage == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif damage == "zero":
        path.write_bytes(b"")
    elif damage == "garbage":
        path.write_bytes(b"this is not a zip file at all" * 10)
    else:
        path.unlink()
        path.mkdir()
    with pytest.raises(files.FileRefused):
        files.load_npz(path, "k")


def test_object_arrays_are_refused_rather_than_pickled(tmp_path):
    with pytest.raises(TypeError, match="pickle"):
        files.save_npz(tmp_path / "a.npz", {"x": np.array([{"a": 1}], dtype=object)}, {"kind": "k"})


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "a.npz"
    files.save_npz(path, {"x": np.ones(3)}, {"kind": "k", "version": "old"})

    def failing_write(handle):
        handle.write(b"partial")
        raise OSError("No space left on device")

    with pytest.raises(OSError):
        files.atomic_write_bytes(path, failing_write)
    meta, _ = files.load_npz(path, "k")
    assert meta["version"] == "old"
    assert sorted(os.listdir(tmp_path)) == ["a.npz"]   # no temporary left behind


def test_written_files_follow_the_umask_and_old_unicode_metadata_still_reads(tmp_path):
    path = tmp_path / "a.npz"
    files.save_npz(path, {"x": np.ones(2)}, {"kind": "k", "text": "ünïcode"})
    assert (os.stat(path).st_mode & 0o777) == 0o666 & ~files._UMASK
    meta, _ = files.load_npz(path, "k")
    assert meta["text"] == "ünïcode"
    np.savez(tmp_path / "old.npz", meta=np.array('{"kind": "k", "v": 2}'), x=np.ones(2))
    assert files.load_npz(tmp_path / "old.npz", "k")[0]["v"] == 2
