"""The target prior: where the free targets go, given the pinned ones.

A user pins what they care about (a hand on a door handle, the feet on the ground) and leaves the rest *free*. The
prior is a small tanh MLP, learned from the same motion as the IK network and in the same Train run, that places the
free targets from the pinned ones; the IK network then solves the six targets as it always does.

    targets (N, 6, 4, 4) character space (root, LeftHand, RightHand, LeftFoot, RightFoot, Head: the solver's order)
    free (N, 6) bool (never all six)
    -> a frame on the ground: its origin under the pinned targets' mean, its heading the weighted mean of what each
       pinned target says about the body's heading (its rotation times the inverse of its mean rotation in the root
       frame: the FeatureSpec references the IK inputs already use)
    -> inputs (N, 60): per target its position / rig height and the first two columns of its rotation (6D), in that
       frame, zero where free; then the free mask
    -> MLP -> (N, 54): every target's position / height and 6D rotation in the frame
    -> the free targets take theirs (Gram-Schmidt makes the 6D a rotation); the pinned ones stay as given.

On a rig the trainer could mirror (augment.py), the prior also answers the mirror image of the targets (reflected
across x = 0, left and right swapped, each target's rotation carried by its role's mirror frame T_j: S R T_j) and
averages that answer, mirrored back, with its own. On the Bandai rig's 35 unseen clips this takes the prior's hips
from 6.3 to 6.1 cm (docs/results.md).

A Bake has the whole clip, so a second prior, the *clip prior* (a TargetPrior with a `window`), also reads how each
pinned target moves: its displacement to where it is WINDOW seconds before and after (18 more inputs per offset, zero
where free). Where a walk's feet are is ambiguous in one frame of the head and hands; over four seconds the head's bob
and the hands' swing say it. On the Bandai rig's 35 unseen clips the free feet of the VR case go from 17-20 cm to
13-15 cm. A Bake takes the free feet from the clip prior, a free root and head from between the two priors' answers,
and the rest from the plain one (runtime/free_targets.py clip_shares). Live ticks have no future: they use the plain
prior.

Train trains each prior as an ensemble (TrainConfig.prior_members, 2): members from other seeds, each stepping on rows
of its own, err apart, and their mean errs less. merge folds them into one MLP that answers the mean (the hidden
units side by side, block-diagonal), so the checkpoint, the ONNX graph and every caller see one prior.

Everything is relative to the pinned targets, so the prior holds wherever the character stands and whichever way it
faces. It is trained on the recorded frames (mirror images included, limb mixes left out: their hands come from
other frames) with the free sets a user picks most often drawn more often (MASK_PATTERNS). Pure NumPy; no bpy.
"""

from dataclasses import dataclass, field

import numpy as np

from ..data.augment import MIRROR_ROLES, REFLECT
from ..geometry.rotations import blend_transforms
from ..skeleton.roles import EFFECTOR_ROLES, ROLE_INDEX
from . import network

TARGETS = ("root", "left_hand", "right_hand", "left_foot", "right_foot", "head")
NUM_TARGETS = len(TARGETS)
TARGET_ROLES = (ROLE_INDEX["Hips"], *EFFECTOR_ROLES)
PER_TARGET = 9                                   # position (3) + 6D rotation (6)
NUM_PRIOR_INPUTS = NUM_TARGETS * PER_TARGET + NUM_TARGETS
NUM_PRIOR_OUTPUTS = NUM_TARGETS * PER_TARGET
WINDOW = (-2.0, -1.0, -0.5, -0.2, 0.2, 0.5, 1.0, 2.0)   # the clip prior's offsets, seconds (- before, + after)
DEFAULT_PRIOR_HIDDEN = (128, 128)
MEMBER_SEED = 15485863                           # an ensemble's member k is seeded seed + k times this
HEADING_WEIGHTS = np.array([4.0, 0.5, 0.5, 2.0, 2.0, 1.0])    # how much each pinned target says about the heading
ROTATION_WEIGHT = 0.2 ** 0.5                     # loss weight of a 6D column's miss against a position's (lengths)
LENGTH_FLOOR = 1e-4                              # placement_loss's lengths are sqrt(|r|^2 + this^2): smooth at 0
LOSS = "lengths"          # what a prior trained here learned (its meta "loss"; priors trained before have none: squares)
# Free sets drawn in training: (free targets, share of the draws); the rest are random subsets.
MASK_PATTERNS = (
    (("root", "head"), 0.30),                    # hands and feet pinned
    (("root", "left_foot", "right_foot"), 0.20),  # head and hands pinned: the VR three-point case
    (("root",), 0.12),
    (("head",), 0.04),
    (("root", "head", "left_hand"), 0.04),
    (("root", "head", "right_hand"), 0.04),
)
_UP = np.array([0.0, 0.0, 1.0])
PARTNER = [TARGET_ROLES.index(MIRROR_ROLES[role]) for role in TARGET_ROLES]   # each target's mirror: left <-> right


def free_mask(names):
    """(6,) bool from target names (TARGETS); ValueError on an unknown name or when all six are free."""
    mask = np.zeros(NUM_TARGETS, bool)
    for name in names:
        if name not in TARGETS:
            raise ValueError(f"unknown target {name!r} (targets: {', '.join(TARGETS)})")
        mask[TARGETS.index(name)] = True
    if mask.all():
        raise ValueError("all six targets are free: pin at least one")
    return mask


def references_of(feature_spec):
    """(6, 3, 3) each target's mean rotation in the root frame (hips, then the effectors), from a FeatureSpec."""
    return np.concatenate([np.asarray(feature_spec.hips_reference, np.float64)[None],
                           np.asarray(feature_spec.effector_reference, np.float64)])


def ground_frames(targets, free, references):
    """(origin (N, 3) on z = 0, rotation (N, 3, 3) z up) of the frame the prior works in: under the pinned targets'
    mean position, facing the weighted mean of the headings their rotations give."""
    pinned = ~np.broadcast_to(free, targets.shape[:2])
    positions = targets[:, :, :3, 3]
    counts = pinned.sum(axis=1, keepdims=True)
    origin = (positions * pinned[..., None]).sum(axis=1) / np.maximum(counts, 1)
    origin[:, 2] = 0.0
    # each target's estimate of the root frame: R_k @ reference_k^T; its x axis (R_k times reference_k's first row)
    # on the ground votes
    votes = (targets[:, :, :3, :3] @ references[:, 0, :, None])[..., 0]
    votes[..., 2] = 0.0
    weights = HEADING_WEIGHTS[None] * pinned
    x = (votes * weights[..., None]).sum(axis=1)
    length = np.linalg.norm(x, axis=-1, keepdims=True)
    x = np.where(length > 1e-9, x / np.maximum(length, 1e-12), np.array([1.0, 0.0, 0.0]))
    z = np.broadcast_to(_UP, x.shape)
    return origin, np.stack([x, np.cross(z, x), z], axis=-1)


def num_inputs(window=()):
    """How many inputs a prior with these window offsets reads: 60, and 18 per offset."""
    return NUM_PRIOR_INPUTS + 3 * NUM_TARGETS * len(window)


def prior_inputs(targets, free, references, height, window=None):
    """(N, 60 (+ 18 per offset)) float32 inputs and the frames (origin, rotation) they are in; see the module
    docstring. window: (N, L, 6, 3) the targets' positions at the clip prior's L offsets (window_rows), or None:
    each target's displacement to there, in the frame, / height, zero where free."""
    targets = np.asarray(targets, np.float64)
    free = np.broadcast_to(np.asarray(free, bool), targets.shape[:2])
    frames = ground_frames(targets, free, references)
    return inputs_of(targets, free, frames, target_outputs(targets, frames, height), height, window), frames


def inputs_of(targets, free, frames, outputs, height, window=None):
    """prior_inputs from the targets' target_outputs in their frames (a training step has those already: they are
    what it wants the prior to answer)."""
    per = outputs.reshape(len(targets), NUM_TARGETS, PER_TARGET) * ~free[..., None]
    parts = [per.reshape(len(targets), NUM_PRIOR_OUTPUTS), free]
    if window is not None:     # each move times the frame's rotation from the right: the move in the frame
        moves = (targets[:, None, :, :3, 3] - np.asarray(window, np.float64)).reshape(len(targets), -1, 3)
        moves = (moves @ frames[1]).reshape(len(targets), -1, NUM_TARGETS, 3)
        parts.append((moves / height * ~free[:, None, :, None]).reshape(len(targets), -1))
    return np.concatenate(parts, axis=1).astype(np.float32)


def window_rows(count, window, dt):
    """(count, L) for frames 0..count-1 of one clip (dt seconds apart): the frame nearest each offset of `window`,
    clamped to the clip's first and last (clip_window_rows of a single run)."""
    return clip_window_rows(np.zeros(count, np.int64), np.arange(count), window, 1.0 / dt)


def clip_window_rows(action, frame, window, fps):
    """(N, L) dataset rows -> the row at each offset within the same run of an action's frames (rows of a run are
    its consecutive frames, as extraction writes them; clamped to the run's ends): the clip prior's training
    windows."""
    action, frame = np.asarray(action), np.asarray(frame)
    n = len(action)
    start = np.ones(n, bool)
    start[1:] = (action[1:] != action[:-1]) | (frame[1:] <= frame[:-1])
    run = np.cumsum(start) - 1
    firsts = np.nonzero(start)[0]
    lasts = np.append(firsts[1:], n) - 1
    steps = np.rint(np.asarray(window, np.float64) * fps).astype(np.int64)
    rows = np.arange(n)[:, None] + steps[None]
    return np.clip(rows, firsts[run][:, None], lasts[run][:, None])


def target_outputs(targets, frames, height):
    """(N, 54) every target's position / height and 6D rotation (first two columns) in the given frames: the
    prior's training target, and its inputs before the free ones are zeroed."""
    origin, R = frames
    targets = np.asarray(targets, np.float64)
    positions = (targets[:, :, :3, 3] - origin[:, None]) @ R / height      # each row times R: R^T p
    rotations = np.swapaxes(R, -1, -2)[:, None] @ targets[:, :, :3, :3]
    per = np.concatenate([positions, rotations[:, :, :, 0], rotations[:, :, :, 1]], axis=-1)
    return per.reshape(len(targets), NUM_PRIOR_OUTPUTS).astype(np.float32)


def mirror_targets(targets, mirror_frames):
    """(N, 6, 4, 4) targets -> their mirror image: positions reflected across x = 0, rotations S R T_k (mirror_frames
    (6, 3, 3): augment's T_j of each target's role), left and right swapped. Mirroring twice is the identity."""
    image = np.array(targets, np.float64)
    image[:, :, :3, 3] = targets[:, :, :3, 3] * [-1.0, 1.0, 1.0]
    image[:, :, :3, :3] = REFLECT @ targets[:, :, :3, :3] @ mirror_frames[None]
    return image[:, PARTNER]


def mirror_frames_of(mirror):
    """(6, 3, 3) the targets' roles' mirror frames from augment's Mirror, or None where the rig was not mirrored."""
    return None if mirror is None or not mirror.ok else np.asarray(mirror.frames, np.float64)[list(TARGET_ROLES)]


def rotations_from_6d(a, b):
    """(..., 3, 3) rotations from two (..., 3) columns by Gram-Schmidt (the first column keeps its direction)."""
    x = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-9)
    b = b - (b * x).sum(axis=-1, keepdims=True) * x
    y = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-9)
    return np.stack([x, y, np.cross(x, y)], axis=-1)


@dataclass
class TargetPrior:
    """A trained prior for one rig: the MLP's weights (network.py's list), the rig height its positions are divided
    by, and the six targets' reference rotations (the IK model's FeatureSpec, so both read the body the same way)."""
    weights: list
    height: float
    references: np.ndarray                        # (6, 3, 3)
    meta: dict = field(default_factory=dict)      # training facts (validation errors per free set)
    mirror_frames: np.ndarray = None              # (6, 3, 3) the targets' roles' T_j: also answer the mirror image
    window: tuple = ()                            # a clip prior's offsets (seconds; WINDOW), () for the plain prior

    @property
    def layer_sizes(self):
        return [self.weights[0].shape[0]] + [w.shape[1] for w in self.weights[0::2]]

    def predict(self, x):
        """(N, 60) -> (N, 54)."""
        out, _cache = network.forward(self.weights, np.asarray(x, np.float32))
        return out

    def complete(self, targets, free, dt=None):
        """(N, 6, 4, 4) targets with the free ones placed by the prior (a copy; the pinned ones unchanged). free:
        (6,) or (N, 6) bool. A clip prior's N targets are the frames of one clip in order, dt seconds apart."""
        targets = np.array(targets, np.float64)
        free = np.broadcast_to(np.asarray(free, bool), targets.shape[:2])
        if not free.any():
            return targets
        targets[free] = np.eye(4)                # never read: whatever a free target held (NaN included) is gone
        rows = None
        if self.window:
            if dt is None:
                raise ValueError("a clip prior places the frames of a clip: give their time step")
            rows = window_rows(len(targets), self.window, dt)
        if self.mirror_frames is None:
            targets[free] = self.place_all(targets, free, rows)[free]
            return targets
        # its answer and the mirror image's, mirrored back, averaged (the free targets only)
        both = self.place_all(np.concatenate([targets, mirror_targets(targets, self.mirror_frames)]),
                              np.concatenate([free, free[:, PARTNER]]),
                              None if rows is None else np.concatenate([rows, rows + len(targets)]))
        own, image = both[:len(targets)][free], mirror_targets(both[len(targets):], self.mirror_frames)[free]
        targets[free] = blend_transforms(own, image, 0.5)
        return targets

    def place_all(self, targets, free, rows=None):
        """(N, 6, 4, 4) where the prior puts every target (the pinned ones too), given the pinned ones; rows: a clip
        prior's (N, L) window (window_rows: which of the N rows each offset reads)."""
        window = None
        if rows is not None:      # a frame whose target is not finite moves no other frame's window (it reads 0)
            here = targets[:, :, :3, 3]
            window = targets[rows][..., :3, 3]
            window = np.where(np.isfinite(window), window, here[:, None])
        x, (origin, R) = prior_inputs(targets, free, self.references, self.height, window)
        out = self.predict(x).astype(np.float64).reshape(len(targets), NUM_TARGETS, PER_TARGET)
        placed = np.broadcast_to(np.eye(4), targets.shape).copy()
        placed[..., :3, 3] = origin[:, None] + np.einsum("nab,nkb->nka", R, out[..., :3] * self.height)
        placed[..., :3, :3] = R[:, None] @ rotations_from_6d(out[..., 3:6], out[..., 6:9])
        return placed


def draw_free_sets(rng, n):
    """(n, 6) bool free sets for training: MASK_PATTERNS at their shares, the rest random non-empty, never-all
    subsets."""
    free = rng.random((n, NUM_TARGETS)) < 0.5
    pick = rng.random(n)
    start = 0.0
    for names, share in MASK_PATTERNS:
        rows = (pick >= start) & (pick < start + share)
        free[rows] = free_mask(names)
        start += share
    empty, full = ~free.any(axis=1), free.all(axis=1)
    free[empty, rng.integers(0, NUM_TARGETS, int(empty.sum()))] = True
    free[full, rng.integers(0, NUM_TARGETS, int(full.sum()))] = False
    return free


def placement_loss(out, want, free):
    """The prior's loss on outputs `out` against `want` ((B, 54), prior_outputs' layout) where `free` ((B, 6) bool):
    per free target the length of its position's miss plus ROTATION_WEIGHT times the lengths of its two 6D columns'
    misses, averaged over the free targets; and its gradient in `out`. Lengths, not their squares: a placement is
    judged by its mean distance, which the geometric median minimises, where squares give the mean, which a pose that
    could go two ways pulls between its answers (three seeds of the Bandai rig's prior, 35 unseen clips, root and head
    free: all joints 4.38 -> 4.25 cm, hips 5.73 -> 5.48; docs/results.md). Returns (loss (float), (B, 54) gradient)."""
    on = np.asarray(free, bool)[:, :, None, None]
    miss = (np.asarray(out, np.float64) - want).reshape(len(out), NUM_TARGETS, 3, 3) * on     # position, 6D columns
    lengths = np.sqrt((miss * miss).sum(axis=-1) + LENGTH_FLOOR * LENGTH_FLOOR)               # (B, 6, 3)
    weights = np.array([1.0, ROTATION_WEIGHT, ROTATION_WEIGHT])
    count = max(float(on.sum()), 1.0)
    loss = float(((lengths - LENGTH_FLOOR) * weights * on[..., 0]).sum() / count)
    return loss, (weights[:, None] * miss / lengths[..., None]).reshape(len(out), -1) / count


def targets_of_rows(positions, global_rotations):
    """(N, 6, 4, 4) the six targets of dataset rows: the hips' and effectors' character-space transforms."""
    n = len(positions)
    targets = np.broadcast_to(np.eye(4), (n, NUM_TARGETS, 4, 4)).copy()
    targets[:, :, :3, :3] = np.asarray(global_rotations, np.float64)[:, list(TARGET_ROLES)]
    targets[:, :, :3, 3] = np.asarray(positions, np.float64)[:, list(TARGET_ROLES)]
    return targets


class PriorTraining:
    """Trains a TargetPrior beside the IK network: one Adam step per IK step, on the same rows' targets with freshly
    drawn free sets. `validate` gives the mean miss (cm, for units in metres) of the free targets per main case."""

    def __init__(self, references, height, seed=0, hidden=DEFAULT_PRIOR_HIDDEN, learning_rate=2e-3, start=None,
                 mirror_frames=None, window=()):
        self.mirror_frames = mirror_frames       # the rows hold mirror images too: the prior answers both
        self.window = tuple(float(w) for w in window)     # a clip prior's offsets (steps then take the windows)
        self.rng = np.random.default_rng(seed + 7919 + (104729 if self.window else 0))
        self.references = np.asarray(references, np.float64)
        self.height = float(height)
        sizes = [num_inputs(self.window), *hidden, NUM_PRIOR_OUTPUTS]
        if start is not None and start.layer_sizes == sizes:
            self.weights = [np.array(w, np.float32) for w in start.weights]
        else:
            self.weights = network.xavier_init(sizes, self.rng)
        self.optimizer = network.Adam(self.weights, lr=learning_rate)

    def step(self, targets, lr, window=None):
        """One Adam step on (B, 6, 4, 4) targets (a clip prior's: and their (B, L, 6, 3) window positions); returns
        the loss (placement_loss)."""
        free = draw_free_sets(self.rng, len(targets))
        frames = ground_frames(targets, free, self.references)
        want = target_outputs(targets, frames, self.height)
        x = inputs_of(targets, free, frames, want, self.height, window)
        out, cache = network.forward(self.weights, x)
        loss, grad = placement_loss(out, want, free)
        grads = network.backward(self.weights, cache, grad.astype(np.float32))
        network.clip_by_global_norm(grads, 5.0)
        self.optimizer.step(self.weights, grads, lr)
        return loss

    def prior(self, meta=None):
        return TargetPrior([w.copy() for w in self.weights], self.height, self.references.copy(),
                           {"loss": LOSS, **(meta or {})},
                           None if self.mirror_frames is None else np.array(self.mirror_frames, np.float64),
                           self.window)

    def validate(self, targets, units_to_cm=100.0, rows=None):
        return validate(self.prior(), targets, units_to_cm, rows)


class EnsembleTraining:
    """`members` PriorTrainings, each with its own start, rows and free sets; prior() merges them into one TargetPrior
    that answers their mean (merge). Answers learned apart err apart: the default Train run on the Bandai rig, 35
    unseen clips, root and head free, 4.012 -> 3.925 cm (hips 5.03 -> 4.93) with two members, where two members on
    the same rows gave 4.006 (5.03; docs/results.md). Member k is seeded seed + k * MEMBER_SEED (member 0 as a prior
    of its own, on the network's rows), and starts from its part of a merged start prior (split)."""

    def __init__(self, members, references, height, seed=0, hidden=DEFAULT_PRIOR_HIDDEN, learning_rate=2e-3,
                 start=None, mirror_frames=None, window=()):
        starts = [None] if start is None else split(start)
        self.members = [PriorTraining(references, height, seed + k * MEMBER_SEED, hidden, learning_rate,
                                      starts[k % len(starts)], mirror_frames, window) for k in range(max(members, 1))]

    def step(self, rows, lr, fetch, population):
        """One Adam step of every member: the first on `rows`, each other on as many rows of its own drawn from
        range(population), so that they err apart; fetch(rows) -> (targets (B, 6, 4, 4), a clip prior's window (B, L,
        6, 3) or None). Returns their mean loss."""
        losses = []
        for k, member in enumerate(self.members):
            targets, window = fetch(rows if k == 0 else member.rng.integers(0, population, len(rows)))
            losses.append(member.step(targets, lr, window))
        return float(np.mean(losses))

    def prior(self, meta=None):
        return merge([member.prior(meta) for member in self.members])

    def validate(self, targets, units_to_cm=100.0, rows=None):
        return validate(self.prior(), targets, units_to_cm, rows)


def validate(target_prior, targets, units_to_cm=100.0, rows=None):
    """{"<free set>_cm": mean position miss of its free targets} for MASK_PATTERNS' first two sets, on (N, 6, 4, 4)
    validation targets (a clip prior's: `rows` (N, L), clip_window_rows; its keys start "clip_prior")."""
    metrics = {}
    for names, _share in MASK_PATTERNS[:2]:
        mask = free_mask(names)
        free = np.broadcast_to(mask, targets.shape[:2])
        if rows is None:
            placed = target_prior.complete(targets, mask)
        else:     # frames of several clips: place every row with its own window (no mirror image: a check)
            blank = np.array(targets, np.float64)
            blank[free] = np.eye(4)
            placed = target_prior.place_all(blank, free, rows)
        miss = np.linalg.norm(placed[:, mask, :3, 3] - targets[:, mask, :3, 3], axis=-1)
        prefix = "clip_" if target_prior.window else ""
        metrics[f"{prefix}prior_{'_'.join(names)}_cm"] = float(miss.mean() * units_to_cm)
    return metrics


def merge(priors):
    """One TargetPrior from members of the same shape whose MLP answers the mean of theirs, exactly: the first layer's
    units side by side, each hidden layer block-diagonal (a member's units see only its own), the last layer's
    weights stacked and divided by the count, its bias their mean. Loaders, the checkpoint and ONNX see a wider MLP;
    its meta says "members". One prior is returned as it is."""
    if len(priors) == 1:
        return priors[0]
    count, layers = len(priors), len(priors[0].weights) // 2
    weights = []
    for layer in range(layers):
        ws = [np.asarray(p.weights[2 * layer], np.float32) for p in priors]
        bs = [np.asarray(p.weights[2 * layer + 1], np.float32) for p in priors]
        if layer == layers - 1:
            w = np.concatenate(ws, axis=0) if layer else np.sum(ws, axis=0)
            weights += [w / count, np.mean(bs, axis=0)]
        elif layer == 0:
            weights += [np.concatenate(ws, axis=1), np.concatenate(bs)]
        else:
            block = np.zeros((sum(w.shape[0] for w in ws), sum(w.shape[1] for w in ws)), np.float32)
            for k, w in enumerate(ws):
                block[k * w.shape[0]:(k + 1) * w.shape[0], k * w.shape[1]:(k + 1) * w.shape[1]] = w
            weights += [block, np.concatenate(bs)]
    first = priors[0]
    return TargetPrior(weights, first.height, first.references.copy(), {**first.meta, "members": count},
                       first.mirror_frames, first.window)


def split(target_prior):
    """The members a merged prior was made of (merge; one prior: itself). Each gets the merged last layer's bias, so
    their mean answer is the merged one's."""
    count = int(target_prior.meta.get("members", 1))
    if count == 1:
        return [target_prior]
    layers = len(target_prior.weights) // 2
    meta = {k: v for k, v in target_prior.meta.items() if k != "members"}
    members = []
    for k in range(count):
        weights = []
        for layer in range(layers):
            w, b = target_prior.weights[2 * layer], target_prior.weights[2 * layer + 1]
            rows = slice(None) if layer == 0 else slice(k * w.shape[0] // count, (k + 1) * w.shape[0] // count)
            cols = slice(None) if layer == layers - 1 else slice(k * w.shape[1] // count, (k + 1) * w.shape[1] // count)
            weights += [w[rows, cols] * (count if layer == layers - 1 and layer else 1), b[cols]]
        members.append(TargetPrior([np.array(w, np.float32) for w in weights], target_prior.height,
                                   target_prior.references.copy(), dict(meta), target_prior.mirror_frames,
                                   target_prior.window))
    return members


def train_prior(train_targets, val_targets, references, height, seconds, seed=0, hidden=DEFAULT_PRIOR_HIDDEN,
                learning_rate=2e-3, batch=128, say=print, mirror_frames=None, window=(), train_rows=None,
                val_rows=None, members=1):
    """A TargetPrior (of `members` merged) trained alone for `seconds` on (N, 6, 4, 4) targets (a model trained before
    priors existed gets one this way: scripts/add_prior.py); the learning rate decays on a cosine to 5 %. A clip prior
    (window: its offsets) also needs each set's (N, L) clip_window_rows. Returns the prior, its validation metrics in
    its meta."""
    import time

    training = EnsembleTraining(members, references, height, seed, hidden, learning_rate, mirror_frames=mirror_frames,
                                window=window)
    rng = np.random.default_rng(seed)

    def fetch(rows):
        return train_targets[rows], None if train_rows is None else train_targets[train_rows[rows]][..., :3, 3]

    began = time.perf_counter()
    fraction = 0.0
    while fraction < 1.0:
        order = rng.permutation(len(train_targets))
        for start in range(0, len(order) - batch + 1, batch):
            fraction = (time.perf_counter() - began) / seconds
            if fraction >= 1.0:
                break
            lr = learning_rate * (0.05 + 0.95 * 0.5 * (1.0 + np.cos(np.pi * fraction)))
            training.step(order[start:start + batch], lr, fetch, len(train_targets))
        say(f"prior: {time.perf_counter() - began:.0f} s, {training.validate(val_targets, rows=val_rows)}")
    metrics = training.validate(val_targets, rows=val_rows)
    return training.prior({"seconds": seconds, "frames": int(len(train_targets)), **metrics})


class UprightPrior:
    """The baseline a learned prior is measured against: a body held upright over the feet. A free root stands
    above the pinned feet's midpoint (else the other pinned targets'), its legs at STANDING of their length, facing
    the pinned targets' heading (ground_frames); a free effector is where the model's mean pose puts it from that
    root. Same `complete` as TargetPrior."""

    STANDING = 0.95

    def __init__(self, model):
        from ..geometry import kinematics

        skeleton = model.skeleton
        pose = kinematics.forward(skeleton, np.asarray(model.mean_pose, np.float64)[None], np.eye(3)[None],
                                  np.zeros((1, 3)))
        roles = list(TARGET_ROLES)
        self.offsets = pose.positions[0, roles]                   # in the hips' frame (identity hips)
        self.rotations = pose.rotations[0, roles]
        self.references = references_of(model.feature_spec)
        legs = [ROLE_INDEX[r] for r in ("LeftThigh", "LeftShin", "LeftFoot")]
        p = pose.positions[0]
        leg = np.linalg.norm(p[legs[1]] - p[legs[0]]) + np.linalg.norm(p[legs[2]] - p[legs[1]])
        self.hips_above_ankles = self.STANDING * leg - float(p[legs[0], 2])      # thigh joint below the hips

    def complete(self, targets, free):
        targets = np.array(targets, np.float64)
        free = np.broadcast_to(np.asarray(free, bool), targets.shape[:2])
        if not free.any():
            return targets
        targets[free] = np.eye(4)
        origin, R = ground_frames(targets, free, self.references)
        feet = ~free[:, 3:5]
        ground = np.where(feet.any(axis=1), (targets[:, 3:5, 2, 3] * feet).sum(1) / np.maximum(feet.sum(1), 1), 0.0)
        feet_xy = (targets[:, 3:5, :2, 3] * feet[..., None]).sum(1) / np.maximum(feet.sum(1), 1)[:, None]
        root = np.broadcast_to(np.eye(4), (len(targets), 4, 4)).copy()
        root[:, :3, :3] = R @ self.references[0]
        root[:, :2, 3] = np.where(feet.any(axis=1)[:, None], feet_xy, origin[:, :2])
        root[:, 2, 3] = ground + self.hips_above_ankles
        placed = np.broadcast_to(np.eye(4), targets.shape).copy()
        placed[:, :, :3, :3] = root[:, None, :3, :3] @ self.rotations[None]
        placed[:, :, :3, 3] = root[:, None, :3, 3] + np.einsum("kab,mb->kma", root[:, :3, :3], self.offsets)
        placed[:, 0] = root
        out = targets.copy()
        out[free] = placed[free]
        return out
