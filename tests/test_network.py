"""The MLP's analytic backward pass against central differences, Adam, clipping, and agreement with Model."""

import numpy as np

from neural_ik.neural_network.data.features import NUM_INPUTS
from neural_ik.neural_network.model import network
from neural_ik.neural_network.model.model import Model


def numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


def test_backward_matches_central_differences_for_every_weight_and_the_input():
    rng = np.random.default_rng(0)
    weights = [w.astype(np.float64) for w in network.xavier_init([5, 7, 6, 4], rng)]
    for b in weights[1::2]:
        b[:] = rng.normal(size=b.shape) * 0.3
    x = rng.normal(size=(9, 5))
    target = rng.normal(size=(9, 4))
    loss = lambda: 0.5 * float(np.sum((network.forward(weights, x)[0] - target) ** 2))
    out, cache = network.forward(weights, x)
    grads, g_in = network.backward(weights, cache, out - target, need_input_grad=True)
    for w, g in zip(weights, grads):
        assert np.allclose(g, numeric_grad(loss, w), rtol=1e-6, atol=1e-8)
    assert np.allclose(g_in, numeric_grad(loss, x), rtol=1e-6, atol=1e-8)


def test_xavier_init_is_float32_and_bounded():
    rng = np.random.default_rng(1)
    weights = network.xavier_init([50, 128, 96, 69], rng)
    assert [w.shape for w in weights] == [(50, 128), (128,), (128, 96), (96,), (96, 69), (69,)]
    assert all(w.dtype == np.float32 for w in weights)
    assert np.abs(weights[0]).max() <= np.sqrt(6 / 178) and np.abs(weights[0]).max() > 0.8 * np.sqrt(6 / 178)
    assert not np.any(weights[1])


def test_clip_by_global_norm_scales_all_gradients_together():
    grads = [np.full((2, 2), 3.0, np.float32), np.full(3, 4.0, np.float32)]
    before = np.sqrt(4 * 9 + 3 * 16)
    norm = network.clip_by_global_norm(grads, 1.0)
    assert np.isclose(norm, before)
    assert np.isclose(np.sqrt(sum(np.sum(g * g) for g in grads)), 1.0, rtol=1e-5)
    assert np.allclose(grads[0] / grads[0][0, 0], 1.0) and np.isclose(grads[1][0] / grads[0][0, 0], 4 / 3)
    small = [np.full(2, 0.1, np.float32)]
    network.clip_by_global_norm(small, 1.0)
    assert np.allclose(small[0], 0.1)


def test_adam_fits_a_small_regression_and_its_state_round_trips():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(256, 3)).astype(np.float32)
    y = np.sin(x @ np.array([[1.0], [-0.5], [0.3]], np.float32))
    weights = network.xavier_init([3, 16, 1], rng)
    adam = network.Adam(weights, lr=1e-2)

    def mse():
        return float(np.mean((network.forward(weights, x)[0] - y) ** 2))

    start = mse()
    for _ in range(400):
        out, cache = network.forward(weights, x)
        adam.step(weights, network.backward(weights, cache, 2 * (out - y) / len(x)))
    assert mse() < start / 20
    assert all(w.dtype == np.float32 for w in weights)
    other = network.Adam([w.copy() for w in weights])
    other.load_state(adam.state_arrays(), adam.step_count)
    assert other.step_count == 400 and all(np.array_equal(a, b) for a, b in zip(other.v, adam.v))


def test_model_forward_is_the_trained_network():
    rng = np.random.default_rng(3)
    weights = network.xavier_init([NUM_INPUTS, 12, 10, 69], rng)
    mean, std = rng.normal(size=NUM_INPUTS).astype(np.float32), rng.uniform(0.5, 2, NUM_INPUTS).astype(np.float32)
    model = Model(skeleton=None, feature_spec=None, weights=weights, input_mean=mean, input_std=std,
                  mean_pose=np.tile(np.eye(3), (23, 1, 1)), limit_low=-np.ones((23, 3)), limit_high=np.ones((23, 3)))
    x = rng.normal(size=(7, NUM_INPUTS)).astype(np.float32)
    expected, _ = network.forward(weights, (x - mean) / std)
    assert np.allclose(model.predict(x), expected, atol=1e-6)
    assert model.layer_sizes == [NUM_INPUTS, 12, 10, 69]
