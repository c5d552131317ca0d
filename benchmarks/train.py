"""Training speed: the NumPy trainer against a PyTorch autograd reference of the same network and losses.

Both sides train the 50-128-96-69 tanh MLP with the full loss (FK position through the chain, effector orientation,
pose, contact, joint limits, foot slip) on the same batches of frame pairs, with Adam and gradient clipping, on CPU
with the same thread count. First the two are checked to give the same loss and the same weight gradients on one
batch; then each runs timed steps, the two alternating (numpy, torch, torch, numpy, ...) so machine load hits both
alike, and the script prints NumPy's speed as a ratio to PyTorch's measured in the same process (the anchor; samples
per second beside it: absolute figures move ~2x between machines of the same kind).

    .venv/bin/python benchmarks/train.py [--dataset data.npz] [--batch 256] [--steps 100] [--repeats 4] [--threads 2]

Seconds on an idle 2-core machine by default (a minute or two when the machine is busy: PyTorch's thread pool
suffers most); `--steps 1000 --repeats 6` for a longer run.
Needs `pip install -r requirements-bench.txt` (torch, benchmark only; the extension never ships it); without torch
the script says so, skips the anchor and prints NumPy's samples per second alone.
"""

import argparse
import dataclasses
import os
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "tests"))


def parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="", help="dataset .npz (default: a synthetic one built with the FK)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=4, help="timed runs per engine, alternated; the best counts")
    return parser.parse_args()


class TorchReference:
    """The same model and losses written with torch operations and autograd."""

    def __init__(self, torch, trainer_obj):
        self.torch = torch
        t = trainer_obj
        ctx = t.loss_context
        self.ctx = ctx
        self.levels = [(torch.as_tensor(idx), [int(p) for p in par], [int(j) for j in idx])
                       for idx, par in ctx.fk_skeleton.levels()]
        self.mask = ctx.skeleton.role_mask
        from neural_ik.neural_network.skeleton.roles import FOOT_ROLES, ROLE_PARENTS
        self.role_parents = ROLE_PARENTS
        self.feet = list(FOOT_ROLES)
        f32 = torch.float32
        self.bridges = torch.as_tensor(ctx.fk_skeleton.bridges, dtype=f32)
        self.offsets = torch.as_tensor(ctx.fk_skeleton.offsets, dtype=f32)
        self.position_weights = torch.as_tensor(ctx.position_weights)
        self.rotation_mask = torch.as_tensor(ctx.rotation_mask.astype(np.float32))
        self.effectors = torch.as_tensor(ctx.effectors)
        self.limit_low = torch.as_tensor(ctx.limit_low)
        self.limit_high = torch.as_tensor(ctx.limit_high)
        self.contact_height = torch.as_tensor(ctx.contact_height)
        self.scale = float(ctx.scale)
        self.weights = [torch.tensor(w, requires_grad=True) for w in t.weights]

    def exp_map(self, v):
        torch = self.torch
        t2 = (v * v).sum(-1)
        small = t2 < 0.05 ** 2
        t = torch.sqrt(torch.clamp(t2, min=1e-12))
        a = torch.where(small, 1 - t2 / 6 + t2 * t2 / 120, torch.sin(t) / t)
        b = torch.where(small, 0.5 - t2 / 24 + t2 * t2 / 720, (1 - torch.cos(t)) / torch.clamp(t2, min=1e-12))
        x, y, z = v[..., 0], v[..., 1], v[..., 2]
        zero = torch.zeros_like(x)
        K = torch.stack([torch.stack([zero, -z, y], -1), torch.stack([z, zero, -x], -1),
                         torch.stack([-y, x, zero], -1)], -2)
        eye = torch.eye(3, dtype=v.dtype)
        return eye + a[..., None, None] * K + b[..., None, None] * (K @ K)

    def fk(self, local, hips_rotation, hips_position, bridges=None, offsets=None):
        """Per-sample bridges (already times the mean pose) and offsets when the rig has moving in-between bones."""
        torch = self.torch
        blocks = (self.bridges[None] if bridges is None else bridges) @ local
        offs = self.offsets[None] if offsets is None else offsets
        rot = [None] * len(self.mask)
        pos = [None] * len(self.mask)
        rot[0], pos[0] = hips_rotation, hips_position
        for idx_t, par, idx in self.levels:
            r_p = torch.stack([rot[p] for p in par], 1)
            x_p = torch.stack([pos[p] for p in par], 1)
            r = r_p @ blocks[:, idx_t]
            x = x_p + (r_p @ offs[:, idx_t][..., None])[..., 0]
            for k, j in enumerate(idx):
                rot[j], pos[j] = r[:, k], x[:, k]
        for j in range(1, len(self.mask)):
            if not self.mask[j]:
                rot[j], pos[j] = rot[self.role_parents[j]], pos[self.role_parents[j]]
        return torch.stack(rot, 1), torch.stack(pos, 1)

    def loss(self, x, batch, w):
        torch = self.torch
        h = x
        last = len(self.weights) // 2 - 1
        for layer in range(last + 1):
            h = h @ self.weights[2 * layer] + self.weights[2 * layer + 1]
            if layer < last:
                h = torch.tanh(h)
        n = h.shape[0]
        d = h.reshape(n, -1, 3)
        local = self.exp_map(d)
        rot, pos = self.fk(local, batch["hips_rotation"], batch["hips_position"], batch.get("bridges"), batch.get("offsets"))
        diff = (pos - batch["positions"]) * self.scale
        total = w.fk * (self.position_weights[None, :, None] * diff * diff).sum() / n
        eff = self.effectors
        de = rot[:, eff] - batch["global_rotations"][:, eff]
        total = total + w.orientation * (de * de).sum() / (n * len(eff))
        dp = (local - batch["pose_targets"]) * self.rotation_mask[None, :, None, None]
        total = total + w.pose * (dp * dp).sum() / (n * self.rotation_mask.sum())
        c = batch["contacts"]
        err = (pos[:, self.feet, 2] - batch["ground"] - self.contact_height[None]) * self.scale
        total = total + w.contact * (c * err * err).sum() / n
        m = self.rotation_mask[None, :, None]
        over = torch.clamp(d - self.limit_high, min=0) * m
        under = torch.clamp(self.limit_low - d, min=0) * m
        total = total + w.limit * ((over * over).sum() + (under * under).sum()) / n
        half = n // 2
        cc = c[:half] * c[half:] * batch["pair_valid"][:, None]
        move = (pos[:half, self.feet] - pos[half:, self.feet]) * self.scale
        total = total + w.slip * (cc[..., None] * move * move).sum() / half
        return total


def make_batches(t, batch_size, count, rng):
    half = batch_size // 2
    out = []
    for _ in range(count):
        cur = rng.integers(0, len(t.train), half)
        both = np.concatenate([cur, t.train.prev[cur]])
        batch = t.train.batch(both)
        batch["pair_valid"] = t.train.has_prev[cur].astype(np.float32)
        out.append((both, cur, batch))
    return out


def main():
    args = parse()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    from addon_loader import load_package

    try:
        import torch
    except ImportError:
        torch = None
        print("PyTorch is not installed (pip install -r requirements-bench.txt): no anchor, NumPy alone")

    load_package()
    from neural_ik.neural_network.data.dataset import Dataset
    from neural_ik.neural_network.model import losses, network, trainer

    if args.dataset:
        data = Dataset.load(args.dataset)
    else:
        from synthetic import synthetic_dataset
        data = synthetic_dataset(frames_per_action=400, actions=10)
    # the IK network alone, as the PyTorch side has it (the target prior's step, #33, is timed on its own below)
    config = trainer.TrainConfig(batch_size=args.batch, input_noise=0.0, prior_hidden=())
    t = trainer.Trainer(data, config, tempfile.mkdtemp(prefix="nik_bench_"))
    rng = np.random.default_rng(0)
    batches = make_batches(t, args.batch, 16, rng)

    def numpy_steps(n):
        for i in range(n):
            rows = batches[i % len(batches)][1]
            t.train_step(rows, config.learning_rate)

    if torch is None:
        numpy_steps(10)
        best = min(timed(numpy_steps, args.steps) for _ in range(args.repeats))
        print(f"batch {args.batch}, {args.threads} threads, {args.steps} steps, best of {args.repeats}")
        print(f"numpy  {args.steps * args.batch / best:10.0f} samples/s  (no anchor: PyTorch missing)")
        print_prior_cost(data, config, batches, numpy_steps, args)
        return 0
    torch.set_num_threads(args.threads)
    ref = TorchReference(torch, t)

    # -- same loss and gradients on one batch
    both, cur, batch = batches[0]
    x = t.train_inputs[both]
    out, cache = network.forward(t.weights, x)
    result = losses.evaluate(t.loss_context, config.loss_weights, out, batch)
    grads = network.backward(t.weights, cache, result.grad)
    tb = {k: torch.as_tensor(v) for k, v in batch.items()}
    loss_t = ref.loss(torch.as_tensor(x), tb, config.loss_weights)
    loss_t.backward()
    loss_t = loss_t.detach()
    worst = max(float(np.abs(g - w.grad.numpy()).max() / (np.abs(w.grad.numpy()).max() + 1e-12))
                for g, w in zip(grads, ref.weights))
    print(f"loss: numpy {result.total:.6f}  torch {float(loss_t):.6f}  (relative difference "
          f"{abs(result.total - float(loss_t)) / abs(float(loss_t)):.1e})")
    print(f"weight gradients: largest difference relative to each array's largest entry {worst:.1e}")
    if abs(result.total - float(loss_t)) > 1e-4 * abs(float(loss_t)) or worst > 1e-3:
        print("MISMATCH: the two implementations disagree")
        return 1

    # -- throughput: full training steps (forward, loss, backward, clip, Adam)
    opt = torch.optim.Adam(ref.weights, lr=config.learning_rate)
    torch_batches = [(torch.as_tensor(t.train_inputs[b]), {k: torch.as_tensor(v) for k, v in bt.items()})
                     for b, _c, bt in batches]

    def torch_steps(n):
        for i in range(n):
            xb, bt = torch_batches[i % len(torch_batches)]
            opt.zero_grad(set_to_none=True)
            loss = ref.loss(xb, bt, config.loss_weights)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.weights, config.grad_clip)
            opt.step()

    numpy_steps(10)
    torch_steps(10)
    seconds = {"numpy": [], "torch": []}
    for rep in range(args.repeats):     # numpy, torch, torch, numpy, ...: a load spike hits both alike
        order = (("numpy", numpy_steps), ("torch", torch_steps))
        for name, fn in order if rep % 2 == 0 else order[::-1]:
            seconds[name].append(timed(fn, args.steps))
    rates = {name: args.steps * args.batch / min(times) for name, times in seconds.items()}
    paired = [b / a for a, b in zip(seconds["numpy"], seconds["torch"])]
    print(f"batch {args.batch}, {args.threads} threads, {args.steps} steps, best of {args.repeats} alternated repeats")
    print(f"{'':38s} {'x torch':>8} {'samples/s':>10}")
    print(f"{'anchor: PyTorch ' + torch.__version__ + ' autograd':38s} {1.0:7.2f}x {rates['torch']:10.0f}")
    print(f"{'NumPy trainer (the project)':38s} {rates['numpy'] / rates['torch']:7.2f}x {rates['numpy']:10.0f}")
    print(f"per-repeat ratios numpy/torch: {', '.join(f'{r:.2f}' for r in paired)}")
    print_prior_cost(data, config, batches, numpy_steps, args)
    return 0


def print_prior_cost(data, config, batches, numpy_steps, args):
    """What the target prior's step (#33) adds to a Train step: the same steps with and without it."""
    from neural_ik.neural_network.model import trainer

    with_prior = trainer.Trainer(data, dataclasses.replace(config, prior_hidden=trainer.prior.DEFAULT_PRIOR_HIDDEN),
                                 tempfile.mkdtemp(prefix="nik_bench_"))

    def prior_steps(n):
        for i in range(n):
            with_prior.train_step(batches[i % len(batches)][1], config.learning_rate)

    prior_steps(10)
    alone = min(timed(numpy_steps, args.steps) for _ in range(args.repeats))
    both = min(timed(prior_steps, args.steps) for _ in range(args.repeats))
    print(f"a Train step with the target prior's step too (#33, what Train runs): {both / alone:.2f}x the step alone")


def timed(fn, steps):
    start = time.perf_counter()
    fn(steps)
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
