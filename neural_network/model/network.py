"""The multilayer perceptron the trainer optimises: tanh hidden layers, a linear output, float32 throughout.

Weights are a flat list [W0, b0, W1, b1, ...] with W of shape (in, out), the same list `Model` keeps, so a trained
network becomes a model without conversion. Forward keeps what backward needs (the layer inputs and the tanh
outputs); backward is the exact chain rule, checked against finite differences in tests/test_network.py.
"""

import numpy as np

DEFAULT_HIDDEN = (128, 96)


def xavier_init(layer_sizes, rng):
    """Glorot-uniform weights and zero biases, float32: keeps tanh units out of saturation at the start."""
    weights = []
    for fan_in, fan_out in zip(layer_sizes[:-1], layer_sizes[1:]):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        weights.append(rng.uniform(-bound, bound, size=(fan_in, fan_out)).astype(np.float32))
        weights.append(np.zeros(fan_out, dtype=np.float32))
    return weights


def forward(weights, x):
    """(N, in) -> (N, out) and the cache for backward: the input of every layer (tanh outputs after the first)."""
    cache = [x]
    h = x
    last = len(weights) // 2 - 1
    for layer in range(last + 1):
        h = h @ weights[2 * layer] + weights[2 * layer + 1]
        if layer < last:
            np.tanh(h, out=h)
            cache.append(h)
    return h, cache


def backward(weights, cache, grad_out, need_input_grad=False):
    """Gradients [dW0, db0, ...] of a scalar loss given dLoss/dOutput (N, out); optionally dLoss/dInput too."""
    grads = [None] * len(weights)
    g = grad_out
    for layer in range(len(weights) // 2 - 1, -1, -1):
        h_in = cache[layer]
        grads[2 * layer] = h_in.T @ g
        grads[2 * layer + 1] = g.sum(axis=0)
        if layer > 0 or need_input_grad:
            g = g @ weights[2 * layer].T
            if layer > 0:
                g *= 1.0 - h_in * h_in        # tanh' = 1 - tanh^2, h_in is the previous layer's tanh output
    return (grads, g) if need_input_grad else grads


def clip_by_global_norm(grads, max_norm):
    """Scale all gradients together so their joint L2 norm is at most max_norm; returns the norm before clipping."""
    norm = float(np.sqrt(sum(float(np.vdot(g, g)) for g in grads)))
    if max_norm and norm > max_norm:
        scale = np.float32(max_norm / (norm + 1e-12))
        for g in grads:
            g *= scale
    return norm


class Adam:
    """Adam (Kingma and Ba) with bias correction, updating the weight arrays in place.

    Its moments are plain arrays so a training run can be saved and resumed exactly.
    """

    def __init__(self, weights, lr=2e-3, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.m = [np.zeros_like(w) for w in weights]
        self.v = [np.zeros_like(w) for w in weights]
        self.step_count = 0

    def step(self, weights, grads, lr=None):
        lr = self.lr if lr is None else lr
        self.step_count += 1
        t = self.step_count
        scale = lr * np.sqrt(1.0 - self.beta2 ** t) / (1.0 - self.beta1 ** t)
        for w, g, m, v in zip(weights, grads, self.m, self.v):
            m *= self.beta1
            m += (1.0 - self.beta1) * g
            v *= self.beta2
            v += (1.0 - self.beta2) * (g * g)
            w -= np.float32(scale) * m / (np.sqrt(v) + np.float32(self.eps))

    def state_arrays(self):
        """{name: array} for a resumable training state."""
        out = {f"adam_m{i}": m for i, m in enumerate(self.m)}
        out.update({f"adam_v{i}": v for i, v in enumerate(self.v)})
        return out

    def load_state(self, arrays, step_count):
        for i in range(len(self.m)):
            m, v = arrays[f"adam_m{i}"], arrays[f"adam_v{i}"]
            if m.shape != self.m[i].shape or v.shape != self.v[i].shape:
                raise ValueError("optimizer state does not match the network's layer sizes")
            self.m[i][...] = m
            self.v[i][...] = v
        self.step_count = int(step_count)
