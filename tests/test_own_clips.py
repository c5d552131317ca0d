"""Training that knows the rig's own clips from retargeted library motion: the own clips make their share of every
epoch, validation comes from them when there are enough, and the metrics and the dataset summary say which is which."""

import json

import numpy as np
from synthetic import synthetic_dataset

from neural_ik.neural_network.model import trainer


def _mixed(own=5, library=20, frames=30):
    data = synthetic_dataset(frames_per_action=frames, actions=own + library, seed=3)
    for k, entry in enumerate(data.meta["actions"]):
        if k >= own:      # what extraction writes for a BVH file retargeted from another skeleton
            entry["source"] = {"kind": "library", "file": f"{entry['name']}.bvh", "skeleton": "other", "retargeted": True}
        elif k == 0:      # a BVH file of the rig's own skeleton counts as its own motion
            entry["source"] = {"kind": "library", "file": "a.bvh", "skeleton": "rig", "retargeted": False}
    return data


def test_own_clips_are_weighted_and_validate(tmp_path):
    data = _mixed()
    own = data.own_action_mask()
    assert own.tolist() == [True] * 5 + [False] * 20
    assert "(5 of its own, 20 retargeted)" in data.summary_text()
    tr = trainer.Trainer(data, trainer.TrainConfig(seed=1, val_fraction=0.3, mirror=False), tmp_path)
    names = [str(n) for n in data.arrays["action_names"]]
    assert tr.validation_note == "own clips"
    assert set(tr._val_action_names()) <= {names[k] for k in range(5)}
    rows = tr._epoch_rows()
    share = np.mean(tr.own_rows[rows])
    assert abs(share - 0.25) < 0.01                          # 4 own clips against 20 library ones: repeated
    assert np.all(np.isin(np.where(tr.own_rows)[0], rows))   # every own row is in every epoch
    tr.config.epochs = 1
    tr.run()
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["sources"] == {"own_frames": 150, "retargeted_frames": 600, "validation": "own clips"}


def test_too_few_own_clips_all_stay_in_training(tmp_path):
    """Two own clips among a library (a user's walk and run): none is spared for validation, which comes from the
    library clips, and both make the own share of every epoch."""
    data = _mixed(own=2, library=12)
    names = [str(n) for n in data.arrays["action_names"]]
    for seed in range(4):
        tr = trainer.Trainer(data, trainer.TrainConfig(seed=seed, val_fraction=0.3, mirror=False), tmp_path)
        assert tr.validation_note == "library clips"
        validated = set(tr._val_action_names())
        assert validated and not validated & {names[0], names[1]}
        assert abs(np.mean(tr.own_rows[tr._epoch_rows()]) - 0.25) < 0.01
        assert np.sum(tr.own_rows) == 60                 # both own clips' 30 frames


def test_without_library_motion_nothing_changes(tmp_path):
    data = synthetic_dataset(frames_per_action=30, actions=6, seed=3)
    tr = trainer.Trainer(data, trainer.TrainConfig(seed=1, mirror=False), tmp_path)
    assert tr.validation_note == "all clips" and tr.own_rows is None
    assert np.array_equal(tr._epoch_rows(), np.arange(len(tr.train)))
    assert data.summary_text().startswith("180 frames from 6 actions of rig")
