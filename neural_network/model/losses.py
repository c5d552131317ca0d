"""Training losses on the network's output deltas, each with its exact gradient.

The network outputs axis-angle deltas d (N, 69) from the training set's mean local pose M:

    L_j = M_j @ exp(d_j)                       local rotation of role j
    (G, x) = FK(L, hips transform)             character-space orientations and head positions

Losses read L, G, x and d; their gradients flow back through kinematics.backward and rotations.axis_angle_vjp, so
the FK position loss (the primary signal) is exactly what a pose change does to joint positions. Positions are
measured in units of `position_unit` (a thirtieth of the rig's standing height by default, about 6 cm on a human),
so the loss weights mean the same on any rig's scale, and the FK term dominates the rotation terms: on real mocap a
larger unit (weaker FK) gave about 25% more effector error on held-out actions.

Batches carry frame pairs for the foot-slip and smoothness terms: the first half of the rows are frames, the second
half their previous frames of the same action (`pair_valid` says where such a previous frame exists).
"""

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from ..geometry import kinematics
from ..skeleton.roles import EFFECTOR_ROLES, FOOT_ROLES, INNER_ROLES, NUM_ROLES, ROLES


class ExpMap:
    """exp(d) for (N, 23, 3) axis-angles and its vector-Jacobian product, fused for training speed.

    R = cos(t) I + a [v]x + b v v^T with t = |v|, a = sin(t)/t, b = (1 - cos(t))/t^2. For a scalar f with
    G = df/dR: f depends on v through a (v . w) + b (v^T G v - t^2 tr G), w = vee(G - G^T), which gives
        df/dv = a w + b ((G + G^T) v - 2 tr(G) v) + (a1 (v . w) + b1 (v^T G v - t^2 tr G)) v
    with a1 = a'(t)/t and b1 = b'(t)/t. The scalar coefficients are computed in float64 (Taylor series below
    t = 0.05, where the closed forms cancel); the arrays stay float32. Checked against
    rotations.axis_angle_vjp and finite differences in tests/test_losses.py.
    """

    def __init__(self, v):
        self.v = v
        t2 = np.sum(np.square(v, dtype=np.float64), axis=-1)
        t = np.sqrt(t2)
        small = t < 0.05
        ts = np.where(small, 1.0, t)
        sin, cos = np.sin(ts), np.cos(ts)
        a = np.where(small, 1 - t2 / 6 + t2 * t2 / 120, sin / ts)
        b = np.where(small, 0.5 - t2 / 24 + t2 * t2 / 720, (1 - cos) / (ts * ts))
        self.t2 = t2.astype(v.dtype)
        self.a, self.b = a.astype(v.dtype), b.astype(v.dtype)
        self.a1 = np.where(small, -1 / 3 + t2 / 30 - t2 * t2 / 840, (ts * cos - sin) / ts ** 3).astype(v.dtype)
        self.b1 = np.where(small, -1 / 12 + t2 / 180 - t2 * t2 / 6720,
                           (ts * sin - 2 * (1 - cos)) / ts ** 4).astype(v.dtype)
        cos_t = (1 - b * t2).astype(v.dtype)
        x, y, z = v[..., 0], v[..., 1], v[..., 2]
        a_, b_ = self.a, self.b
        R = b_[..., None, None] * (v[..., :, None] * v[..., None, :])
        R[..., 0, 0] += cos_t
        R[..., 1, 1] += cos_t
        R[..., 2, 2] += cos_t
        R[..., 0, 1] -= a_ * z
        R[..., 1, 0] += a_ * z
        R[..., 0, 2] += a_ * y
        R[..., 2, 0] -= a_ * y
        R[..., 1, 2] -= a_ * x
        R[..., 2, 1] += a_ * x
        self.matrix = R

    def vjp(self, G):
        v = self.v
        w = np.stack([G[..., 2, 1] - G[..., 1, 2], G[..., 0, 2] - G[..., 2, 0], G[..., 1, 0] - G[..., 0, 1]], -1)
        Gv = np.einsum("...ab,...b->...a", G, v)
        GTv = np.einsum("...ba,...b->...a", G, v)
        tr = G[..., 0, 0] + G[..., 1, 1] + G[..., 2, 2]
        vw = np.sum(v * w, -1)
        vGv = np.sum(v * Gv, -1)
        radial = self.a1 * vw + self.b1 * (vGv - self.t2 * tr)
        return (self.a[..., None] * w + self.b[..., None] * (Gv + GTv - 2 * tr[..., None] * v)
                + radial[..., None] * v)


@dataclass
class LossWeights:
    """How much each term counts; 0 switches a term off (and skips its cost)."""
    fk: float = 1.0
    orientation: float = 0.5
    pose: float = 0.3
    contact: float = 0.5
    limit: float = 0.1
    slip: float = 0.2
    smooth: float = 0.0

    def to_json(self):
        return asdict(self)

    @classmethod
    def from_json(cls, data):
        return cls(**{k: float(v) for k, v in data.items() if k in cls.__dataclass_fields__})


def default_role_weights():
    """Per-role weight of the FK position loss: effectors count most, inner joints (elbows, knees, spine, neck,
    shoulders) next, since inner-joint error is the figure that separates a good pose from a merely reaching one."""
    w = np.full(NUM_ROLES, 0.5, dtype=np.float64)
    w[list(INNER_ROLES)] = 1.5
    w[list(EFFECTOR_ROLES)] = 3.0
    for name in ("LeftToeBase", "RightToeBase"):
        w[ROLES.index(name)] = 1.0
    return w


@dataclass
class LossContext:
    """Everything about the rig and the training data the losses need besides the batch itself."""
    skeleton: object
    mean_pose: np.ndarray            # (23, 3, 3)
    limit_low: np.ndarray            # (23, 3)
    limit_high: np.ndarray           # (23, 3)
    contact_height: np.ndarray       # (2,) ankle height above ground when the foot is planted (from the data)
    position_unit: float             # metres (or rig units) per loss unit
    role_weights: np.ndarray = field(default_factory=default_role_weights)

    def __post_init__(self):
        mask = self.skeleton.role_mask
        self.mean_pose = np.asarray(self.mean_pose, np.float32)
        self.limit_low = np.asarray(self.limit_low, np.float32)
        self.limit_high = np.asarray(self.limit_high, np.float32)
        self.contact_height = np.asarray(self.contact_height, np.float32)
        w = np.asarray(self.role_weights, np.float64) * mask
        w[0] = 0.0                                   # the hips are given, not predicted
        self.position_weights = (w / max(w.sum(), 1e-12)).astype(np.float32)
        self.rotation_mask = mask.copy()
        self.rotation_mask[0] = False
        self.effectors = np.array([e for e in EFFECTOR_ROLES if mask[e]], dtype=np.int64)
        self.inner = np.isin(np.arange(NUM_ROLES), list(INNER_ROLES))     # the joints no target fixes: the style
        self.scale = np.float32(1.0 / self.position_unit)
        self.fk_skeleton = replace(self.skeleton, bridges=self.skeleton.bridges @ self.mean_pose.astype(np.float64))


@dataclass
class LossResult:
    total: float
    parts: dict                      # {term: unweighted value}
    grad: np.ndarray = None          # (N, 69) dTotal/dDeltas, float32


def fk_position(ctx, pose, batch, g_pos, weight=1.0):
    """Weighted mean squared position error over mapped roles (loss units); adds weight * gradient to g_pos.

    Every term below follows the same pattern: it returns its unweighted value and accumulates its weighted gradient.
    """
    n = pose.positions.shape[0]
    diff = (pose.positions - batch["positions"]) * ctx.scale
    w = ctx.position_weights[None, :, None]
    style = batch.get("style")
    if style is not None:          # per row: how much its inner joints count (library rows teach reach, not style)
        w = w * np.where(ctx.inner[None, :, None], style[:, None, None], 1.0)
    value = float(np.sum(w * diff * diff)) / n
    g_pos += (2.0 * weight * ctx.scale / n) * w * diff
    return value


def effector_orientation(ctx, pose, batch, g_rot, weight=1.0):
    """Mean squared Frobenius distance between predicted and true effector orientations (character space)."""
    eff = ctx.effectors
    if not len(eff):
        return 0.0
    n = pose.rotations.shape[0]
    diff = pose.rotations[:, eff] - batch["global_rotations"][:, eff]
    norm = 1.0 / (n * len(eff))
    g_rot[:, eff] += (2.0 * weight * norm) * diff
    return float(np.sum(diff * diff)) * norm


def pose_rotation(ctx, local, batch, g_local, weight=1.0):
    """Mean squared Frobenius distance between predicted and true local rotations of the mapped, predicted roles
    (local: exp(d), compared with M^T L*, which measures the same as ||M exp(d) - L*||)."""
    mask = ctx.rotation_mask
    n = local.shape[0]
    norm = 1.0 / (n * max(int(mask.sum()), 1))
    diff = (local - batch["pose_targets"]) * mask[None, :, None, None]
    style = batch.get("style")     # per row: how much its rotations count (see fk_position)
    weighted = diff if style is None else diff * style[:, None, None, None]
    g_local += (2.0 * weight * norm) * weighted
    return float(np.sum(weighted * diff)) * norm


def contact_height(ctx, pose, batch, g_pos, weight=1.0):
    """A foot flagged in contact has its ankle at its planted height above the ground under it."""
    n = pose.positions.shape[0]
    feet = list(FOOT_ROLES)
    c = batch["contacts"]
    err = (pose.positions[:, feet, 2] - batch["ground"] - ctx.contact_height[None]) * ctx.scale
    g_pos[:, feet, 2] += (2.0 * weight * ctx.scale / n) * c * err
    return float(np.sum(c * err * err)) / n


def joint_limits(ctx, d, g_d, weight=1.0):
    """Soft penalty: squared distance of each delta outside its learned [low, high] range (radians)."""
    n = d.shape[0]
    mask = ctx.rotation_mask[None, :, None]
    over = np.maximum(d - ctx.limit_high, 0.0) * mask
    under = np.maximum(ctx.limit_low - d, 0.0) * mask
    g_d += (2.0 * weight / n) * (over - under)
    return float(np.sum(over * over) + np.sum(under * under)) / n


def foot_slip(ctx, pose, batch, g_pos, weight=1.0):
    """A foot in contact on a frame and on its previous frame does not move between them."""
    half = pose.positions.shape[0] // 2
    feet = list(FOOT_ROLES)
    c = batch["contacts"][:half] * batch["contacts"][half:] * batch["pair_valid"][:, None]
    move = (pose.positions[:half, feet] - pose.positions[half:, feet]) * ctx.scale
    g = (2.0 * weight * ctx.scale / max(half, 1)) * c[..., None] * move
    g_pos[:half, feet] += g
    g_pos[half:, feet] -= g
    return float(np.sum(c[..., None] * move * move)) / max(half, 1)


def smoothness(ctx, d, batch, g_d, weight=1.0):
    """Consecutive frames of an action get similar deltas (optional; off by default)."""
    half = d.shape[0] // 2
    valid = batch["pair_valid"][:, None, None] * ctx.rotation_mask[None, :, None]
    step = (d[:half] - d[half:]) * valid
    norm = 1.0 / (max(half, 1) * 3 * max(int(ctx.rotation_mask.sum()), 1))
    g_d[:half] += (2.0 * weight * norm) * step
    g_d[half:] -= (2.0 * weight * norm) * step
    return float(np.sum(step * step)) * norm


def evaluate(ctx, weights, deltas, batch, need_grad=True):
    """Total weighted loss of (N, 69) deltas on a batch, its unweighted parts and dTotal/dDeltas.

    batch: positions (N, 23, 3) with unmapped rows zeroed; pose_targets (N, 23, 3, 3) = M^T L* (the true local
    rotations relative to the mean pose); global_rotations (N, 23, 3, 3) (true orientations in character space);
    hips_rotation (N, 3, 3), hips_position (N, 3), contacts and ground (N, 2), pair_valid (N/2,) float; optional
    per-sample bridges (N, 23, 3, 3) already multiplied by the mean pose (bridge_j @ M_j) and offsets (N, 23, 3).

    FK runs on exp(d) with the mean pose folded into the bridges (R_j = R_p @ (bridge_j @ M_j) @ exp(d_j)), and the
    pose loss compares exp(d) with M^T L* (equal to ||L - L*|| since M is a rotation): two fewer 3x3 products per
    joint and step than composing L first.
    """
    n = deltas.shape[0]
    d = deltas.reshape(n, NUM_ROLES, 3)
    exp = ExpMap(d)
    local = exp.matrix
    pose = kinematics.forward(ctx.fk_skeleton, local, batch["hips_rotation"], batch["hips_position"],
                              batch.get("bridges"), batch.get("offsets"))
    g_rot, g_pos = np.zeros_like(pose.rotations), np.zeros_like(pose.positions)
    g_local = np.zeros_like(local)
    g_d = np.zeros_like(d)
    terms = (
        ("fk", fk_position, (pose, batch, g_pos)),
        ("orientation", effector_orientation, (pose, batch, g_rot)),
        ("pose", pose_rotation, (local, batch, g_local)),
        ("contact", contact_height, (pose, batch, g_pos)),
        ("limit", joint_limits, (d, g_d)),
        ("slip", foot_slip, (pose, batch, g_pos)),
        ("smooth", smoothness, (d, batch, g_d)),
    )
    parts, scaled = {}, {}
    for name, fn, args in terms:
        weight = getattr(weights, name)
        if weight:
            parts[name] = fn(ctx, *args, weight=weight)
            scaled[name] = weight * parts[name]
    total = float(sum(scaled.values()))
    if not need_grad:
        return LossResult(total, parts)
    g_local += kinematics.backward(ctx.fk_skeleton, pose, g_rot, g_pos)
    g_d += exp.vjp(g_local)
    return LossResult(total, parts, g_d.reshape(n, -1).astype(np.float32, copy=False))
