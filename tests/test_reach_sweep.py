"""The reach sweep (report/reach_sweep.py): equal steps, the distance range asked for, every region around the
shoulder visited, and the loop closing on itself."""

import numpy as np
import pytest

from neural_ik.neural_network.report.reach_sweep import lap_length, sweep_path


@pytest.mark.parametrize("outward", [(-1.0, 0.0, 0.0), (1.0, 0.0, 0.0)])
def test_sweep_visits_every_region_in_equal_steps(outward):
    shoulder, arm = np.array([0.2, 0.05, 1.4]), 0.55
    steps = int(lap_length(arm) / 0.0065) + 1
    path = sweep_path(shoulder, arm, steps, 0.0065, outward=outward)
    assert path.shape == (steps, 3)
    step = np.linalg.norm(np.diff(path, axis=0), axis=-1)
    assert step.min() > 0.0064 and step.max() <= 0.0065 + 1e-12
    distance = np.linalg.norm(path - shoulder, axis=-1) / arm
    assert distance.min() == pytest.approx(0.6, abs=1e-3) and distance.max() == pytest.approx(1.05, abs=1e-3)
    assert distance[0] == pytest.approx(0.9)
    direction = (path - shoulder) / (distance[:, None] * arm)
    forward, side, up = -direction[:, 1], direction[:, 0] * outward[0], direction[:, 2]
    regions = {"front": forward > 0.9, "side": side > 0.8, "overhead": up > 0.85, "low": up < -0.85,
               "across": side < -0.6, "behind": forward < -0.6}
    for name, where in regions.items():
        assert where.any(), name
    again = sweep_path(shoulder, arm, 2 * steps, 0.0065, outward=outward)     # past a lap: the loop again, no jump
    assert np.linalg.norm(np.diff(again, axis=0), axis=-1).max() <= 0.0065 + 1e-12


def test_sweep_refuses_empty_paths():
    with pytest.raises(ValueError):
        sweep_path(np.zeros(3), 0.5, 0, 0.01)
