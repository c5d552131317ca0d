"""Carrying a trained model onto another rig (neural_network/model/transfer.py): where the two rigs' inputs and joint
rotations are tied exactly (inputs through an affine map, each role's local rotation turned by a fixed rotation, as
the retarget ties rigs that map the same roles), the carried model poses the new rig on unseen inputs exactly as the
old one poses its own."""

import numpy as np
from live_helpers import humanoid_skeleton, random_model

from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix
from neural_ik.neural_network.model import transfer
from neural_ik.neural_network.skeleton.roles import NUM_ROLES


def test_a_model_carried_through_exact_ties_poses_the_new_rig_as_the_old_one():
    skel = humanoid_skeleton()
    model = random_model(skel, hidden=(40, 30))
    model.limit_low[:], model.limit_high[:] = -3.5, 3.5           # no clamp: the ties are exact inside the limits
    rng = np.random.default_rng(4)
    P = np.eye(50) + rng.normal(0, 0.05, (50, 50))                # the new rig's inputs: x P + q
    q = rng.normal(0, 0.5, 50)
    C = axis_angle_to_matrix(rng.normal(0, 1.0, (NUM_ROLES, 3)))  # its local rotations: C^T L C
    x = rng.normal(0, 1, (600, 50)) * model.input_std + model.input_mean
    local = model.solve_local(x).astype(np.float64)
    x_t = x @ P + q
    target = {"inputs": x_t, "local": np.swapaxes(C, -1, -2)[None] @ local @ C[None], "skeleton": skel,
              "feature_spec": model.feature_spec, "input_mean": x_t.mean(0), "input_std": x_t.std(0),
              "mean_pose": np.swapaxes(C, -1, -2) @ model.mean_pose @ C,
              "limit_low": model.limit_low, "limit_high": model.limit_high}
    carried = transfer.carried(model, x, local, target)
    assert carried.meta["fit"]["input_residual"] < 1e-3 and carried.meta["fit"]["delta_residual_rad"] < 1e-3
    fresh = rng.normal(0, 1, (200, 50)) * model.input_std + model.input_mean       # inputs it was not fitted on
    want = np.swapaxes(C, -1, -2)[None] @ model.solve_local(fresh) @ C[None]
    got = carried.solve_local(fresh @ P + q)
    roles = skel.role_mask.copy()
    roles[0] = False                              # the hips' delta is not the network's (its limits hold it at zero)
    np.testing.assert_allclose(got[:, roles], want[:, roles], atol=2e-3)
    assert np.abs(got[:, roles] - model.solve_local(fresh)[:, roles]).max() > 0.1    # the ties did turn them
