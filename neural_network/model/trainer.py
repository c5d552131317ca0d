"""Training loop: split by action, mini-batches of frame pairs, Adam, validation in cm, early stop, checkpoints.

The trainer reads a neural_network.dataset.Dataset (held-out whole actions via its split_by_action) and writes into
an output folder:

    model.npz            the best model so far (by validation error), rewritten atomically on each improvement
    training_state.npz   the last weights and optimiser state, so an interrupted run can resume
    metrics.json         settings, best validation metrics and the history (written at the end)
    loss.svg             the loss curve (written at every epoch, so it can be watched in a browser)

It never touches bpy: a caller in a background thread passes a progress object (state.TrainingProgress or anything
with the same attributes) that the trainer writes numbers into and whose `cancel` event it checks at every step, so
Cancel takes effect within milliseconds and the best model stays on disk.
"""

import dataclasses
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..data import augment, limb_mix
from ..data.features import NUM_INPUTS
from ..data.files import FileRefused, load_npz, save_json, save_npz
from ..geometry import kinematics
from ..geometry.rotations import angle_between, axis_angle_to_matrix, chordal_mean, matrix_to_axis_angle
from ..report.plot_svg import loss_curve_svg
from ..skeleton.roles import EFFECTOR_ROLES, FOOT_ROLES, INNER_ROLES, NUM_ROLES
from . import checkpoint, losses, network, prior
from .model import Model

MODEL_FILE = "model.npz"
STATE_FILE = "training_state.npz"
METRICS_FILE = "metrics.json"
PLOT_FILE = "loss.svg"
STATE_KIND = "neural_ik.training_state"


@dataclass
class TrainConfig:
    hidden: tuple = network.DEFAULT_HIDDEN
    epochs: int = 300
    batch_size: int = 256               # rows per step: half frames, half their previous frames
    learning_rate: float = 2e-3
    final_lr_fraction: float = 0.05     # cosine decay to this fraction of the rate by the end (epochs or time)
    grad_clip: float = 1.0
    input_noise: float = 0.01           # Gaussian noise on the normalised inputs
    mirror: bool = True                 # also train on the left/right mirror image of every training frame
    limb_mix: float = 1.0               # add this share of training rows as poses mixing the limbs of random frames
                                        # (data/limb_mix.py; on unseen CMU clips network alone 3.47 -> 2.34 cm)
    limb_mix_swap: float = 0.5          # chance that each limb of a mixed pose comes from another frame
    val_fraction: float = 0.1           # share of actions held out whole
    own_share: float = 0.25             # share of each epoch's rows drawn from the rig's own clips when the dataset
                                        # also holds retargeted library motion (own rows repeat; 0: rows as they come)
    library_style: float = 0.25         # library rows: how much their inner joints' positions and the rotations count
                                        # in the FK and pose losses, where the own clips are own_validation_min or
                                        # more (they teach the style, the library reach; with fewer, the library
                                        # teaches the style too and counts fully)
    own_validation_min: int = 4         # validation comes from whole own clips when there are at least this many
                                        # (with fewer, from the last own_stretch of each: every own clip trains)
    own_stretch: float = 0.2            # share of each own clip held out for validation when they are few ...
    stretch_gap: int = 10               # ... and the frames before that stretch left out of both sides
    library: str = "auto"               # with library motion in the dataset: "always" train on it, "never" train on
                                        # the own clips alone, "auto" train both ways and keep the better on the own
                                        # clips' validation (library_choice.py)
    seed: int = 0
    patience: int = 20                  # epochs without improvement before stopping early (0: never) ...
    patience_steps: int = 4000          # ... and at least this many steps (a small dataset's epoch is a few steps)
    early_stop_from: float = 0.8        # never stop early before this fraction of the schedule (a plateau at a high
                                        # learning rate is not convergence: most of the gain comes as it decays; at
                                        # 0.5 a 10-minute CMU + Bandai run stopped at 5 minutes with the rate still at
                                        # half, network alone 4.39 cm against 3.90 for the full 10 minutes)
    time_limit: float = 0.0             # seconds, 0 for none
    started: float = 0.0                # time.time() when the time limit began (0: when training starts), so a
                                        # caller can count the data's preparation in it (Train Starter Model)
    limit_margin: float = 0.15          # radians added to the data's delta range for the joint limits
    std_floor: float = 0.05             # floor of the input standard deviation
    position_unit: float = 0.0          # loss unit of length; 0: a thirtieth of the rig's standing height
    loss_weights: losses.LossWeights = field(default_factory=losses.LossWeights)
    role_weights: tuple = None          # 23 FK weights; None: losses.default_role_weights()
    prior_hidden: tuple = prior.DEFAULT_PRIOR_HIDDEN   # the target prior's hidden layers (prior.py); () : no prior
    clip_window: tuple = prior.WINDOW   # the clip prior's offsets in seconds (Bake's free feet); () : none
    prior_members: int = 2              # each prior is this many trained apart and merged (prior.EnsembleTraining)

    def to_json(self):
        out = asdict(self)
        out["hidden"] = list(self.hidden)
        out["prior_hidden"] = list(self.prior_hidden)
        out["clip_window"] = list(self.clip_window)
        out["loss_weights"] = self.loss_weights.to_json()
        out["role_weights"] = None if self.role_weights is None else [float(w) for w in self.role_weights]
        return out

    @classmethod
    def from_json(cls, data):
        data = dict(data)
        data["hidden"] = tuple(data.get("hidden", network.DEFAULT_HIDDEN))
        data["prior_hidden"] = tuple(data.get("prior_hidden", prior.DEFAULT_PRIOR_HIDDEN))
        data["clip_window"] = tuple(data.get("clip_window", prior.WINDOW))
        data.setdefault("prior_members", 1)     # a run from before ensembles trained one of each
        data["loss_weights"] = losses.LossWeights.from_json(data.get("loss_weights", {}))
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


UNBOUNDED_EPOCHS = 1_000_000           # an epoch count that only says "until the time limit" (Train Starter Model)


def epoch_text(epoch, epochs):
    """'epoch 5/300', or 'epoch 5' when the run is bounded by its time limit alone."""
    return f"epoch {epoch}" if epochs >= UNBOUNDED_EPOCHS else f"epoch {epoch}/{epochs}"


class Progress:
    """What the trainer reports; state.TrainingProgress has the same attributes and is used in Blender."""

    def __init__(self):
        self.running = False
        self.epoch = self.epochs = 0
        self.train_loss = self.val_error_cm = self.val_inner_cm = self.seconds_left = float("nan")
        self.elapsed = 0.0
        self.message = ""
        self.history = []
        self.best_metrics = {}
        self.checkpoint_path = self.plot_path = ""
        self.library = ""
        self.cancel = threading.Event()


@dataclass
class TrainResult:
    model: Model
    metrics: dict                 # best validation metrics
    history: list
    stopped: str                  # "epochs", "early stop", "time limit", "cancelled"
    seconds: float
    paths: dict


# ---- data ------------------------------------------------------------------------------------------------------


def previous_rows(action, frame):
    """Row of each row's previous frame in the same action (the row itself where there is none)."""
    n = len(action)
    prev = np.arange(n) - 1
    ok = np.zeros(n, bool)
    ok[1:] = (action[1:] == action[:-1]) & (frame[1:] > frame[:-1])
    prev[~ok] = np.arange(n)[~ok]
    return prev, ok


def _optional(dataset, name):
    value = getattr(dataset, name, None)
    return None if value is None or np.size(value) == 0 else np.asarray(value, np.float32)


class TrainingArrays:
    """The dataset's rows as float32 arrays the loss reads, with targets precomputed once (local and global
    rotation matrices, unmapped positions zeroed)."""

    def __init__(self, dataset):
        skeleton = dataset.skeleton
        rows = np.arange(len(dataset))
        self.rows = rows
        self.skeleton = skeleton
        mask = skeleton.role_mask
        self.inputs = np.asarray(dataset.inputs, np.float32)[rows]
        positions = np.asarray(dataset.positions, np.float32)[rows].copy()
        positions[:, ~mask] = 0.0
        self.positions = np.nan_to_num(positions)
        self.local_rotations = axis_angle_to_matrix(np.asarray(dataset.rotations, np.float32)[rows])
        self.local_rotations[:, ~mask] = np.eye(3, dtype=np.float32)
        self.hips_rotation = np.asarray(dataset.hips_rotation, np.float32)[rows]
        self.hips_position = np.asarray(dataset.hips_position, np.float32)[rows]
        self.contacts = np.asarray(dataset.contacts, np.float32)[rows]
        self.ground = np.asarray(dataset.ground, np.float32)[rows]
        bridges, offsets = _optional(dataset, "bridges"), _optional(dataset, "offsets")
        self.bridges = None if bridges is None else bridges[rows]
        self.offsets = None if offsets is None else offsets[rows]
        action = np.asarray(dataset.action)[rows]
        frame = np.asarray(dataset.frame)[rows]
        self.action, self.frame = action, frame
        self.prev, self.has_prev = previous_rows(action, frame)
        self.global_rotations = np.empty_like(self.local_rotations)
        for start in range(0, len(rows), 4096):
            part = slice(start, start + 4096)
            pose = kinematics.forward(skeleton, self.local_rotations[part], self.hips_rotation[part],
                                      self.hips_position[part], self._per_sample("bridges", part),
                                      self._per_sample("offsets", part))
            self.global_rotations[part] = pose.rotations

    def __len__(self):
        return len(self.rows)

    def _per_sample(self, name, part):
        value = getattr(self, name)
        return None if value is None else value[part]

    def attach_mean_pose(self, mean_pose):
        """Targets relative to the mean pose M, the form losses.evaluate reads: M^T L* and bridges @ M."""
        M = np.asarray(mean_pose, np.float32)
        self.pose_targets = np.swapaxes(M, -1, -2)[None] @ self.local_rotations
        self.fk_bridges = None if self.bridges is None else self.bridges @ M[None]

    def batch(self, rows):
        out = {name: getattr(self, name)[rows] for name in (
            "positions", "pose_targets", "global_rotations", "hips_rotation", "hips_position", "contacts", "ground")}
        if self.fk_bridges is not None:
            out["bridges"] = self.fk_bridges[rows]
        if self.offsets is not None:
            out["offsets"] = self.offsets[rows]
        return out


def data_statistics(train, config, pose_rows=None):
    """Input normalisation, mean pose, joint limits and planted-ankle height from the training rows only. The joint
    limits are read from the first `pose_rows` rows (all by default): the limb-mix rows after them only repeat those
    rows' joint rotations, so they give the same limits at twice the cost."""
    mask = train.skeleton.role_mask
    input_mean = train.inputs.mean(axis=0, dtype=np.float64)
    input_std = np.maximum(train.inputs.std(axis=0, dtype=np.float64), config.std_floor)
    mean_pose = np.tile(np.eye(3), (NUM_ROLES, 1, 1))
    step = max(1, len(train) // 20000)
    for j in np.where(mask)[0]:
        mean_pose[j] = chordal_mean(train.local_rotations[::step, j])
    mean_pose[0] = np.eye(3)
    local = train.local_rotations[:pose_rows]
    deltas = np.zeros((len(local), NUM_ROLES, 3))
    deltas[:, mask] = matrix_to_axis_angle(np.swapaxes(mean_pose[mask], -1, -2)[None] @ local[:, mask])
    limit_low = np.where(mask[:, None], deltas.min(axis=0) - config.limit_margin, 0.0)
    limit_high = np.where(mask[:, None], deltas.max(axis=0) + config.limit_margin, 0.0)
    limit_low[0] = limit_high[0] = 0.0
    contact_height = np.zeros(2)
    for k, f in enumerate(FOOT_ROLES):
        planted = train.contacts[:, k] > 0.5
        if planted.any():
            contact_height[k] = float(np.median(train.positions[planted, f, 2] - train.ground[planted, k]))
    return dict(input_mean=input_mean.astype(np.float32), input_std=input_std.astype(np.float32),
                mean_pose=mean_pose.astype(np.float32), limit_low=limit_low.astype(np.float32),
                limit_high=limit_high.astype(np.float32), contact_height=contact_height.astype(np.float32))


def starting_statistics(model, stats, dataset, config):
    """The statistics a run that starts from `model` keeps: the model's input normalisation and mean pose (its
    weights read them), its joint limits widened to the data's. Raises ValueError when the model is for another rig,
    other inputs or other layer sizes."""
    if model.skeleton.fingerprint() != dataset.skeleton.fingerprint():
        raise ValueError("the model to start from belongs to another rig")
    if not model.feature_spec.same_frames(dataset.feature_spec):
        raise ValueError("the model to start from reads its inputs in other reference frames than the dataset")
    sizes = [NUM_INPUTS, *config.hidden, NUM_ROLES * 3]
    if [w.shape[1] for w in model.weights[::2]] != sizes[1:]:
        raise ValueError(f"the model to start from has layers {[w.shape[1] for w in model.weights[::2]][:-1]}, "
                         f"the settings ask for {list(config.hidden)}")
    return dict(input_mean=np.asarray(model.input_mean, np.float32), input_std=np.asarray(model.input_std, np.float32),
                mean_pose=np.asarray(model.mean_pose, np.float32),
                limit_low=np.minimum(stats["limit_low"], model.limit_low).astype(np.float32),
                limit_high=np.maximum(stats["limit_high"], model.limit_high).astype(np.float32))


# ---- metrics ---------------------------------------------------------------------------------------------------


def validation_metrics(model, data, units_to_cm=100.0, chunk=8192):
    """The network alone (clamped to its joint limits) on held-out rows, in cm and degrees."""
    mask = model.skeleton.role_mask
    eff = [e for e in EFFECTOR_ROLES if mask[e]]
    inner = [j for j in INNER_ROLES if mask[j]]
    mapped = [j for j in range(1, NUM_ROLES) if mask[j]]
    eff_err, joint_err, rot_err, contact_err = [], [], [], []
    for start in range(0, len(data), chunk):
        part = slice(start, start + chunk)
        local = model.solve_local(data.inputs[part])
        pose = kinematics.forward(model.skeleton, local, data.hips_rotation[part], data.hips_position[part],
                                  data._per_sample("bridges", part), data._per_sample("offsets", part))
        dist = np.linalg.norm(pose.positions.astype(np.float64) - data.positions[part], axis=-1) * units_to_cm
        eff_err.append(dist[:, eff])
        joint_err.append(dist)
        rot_err.append(np.degrees(angle_between(pose.rotations[:, eff], data.global_rotations[part][:, eff])))
        planted = data.contacts[part] > 0.5
        feet = list(FOOT_ROLES)
        dz = np.abs(pose.positions[:, feet, 2].astype(np.float64) - data.positions[part][:, feet, 2]) * units_to_cm
        contact_err.append(dz[planted])
    eff_err = np.concatenate(eff_err).reshape(-1)
    joint_err = np.concatenate(joint_err)
    rot_err = np.concatenate(rot_err).reshape(-1)
    contact_err = np.concatenate(contact_err)
    return {
        "effector_cm_mean": float(eff_err.mean()),
        "effector_cm_p95": float(np.percentile(eff_err, 95)),
        "mpjpe_cm": float(joint_err[:, mapped].mean()),
        "inner_mpjpe_cm": float(joint_err[:, inner].mean()) if inner else 0.0,
        "effector_rotation_deg": float(rot_err.mean()),
        "contact_height_cm": float(contact_err.mean()) if len(contact_err) else 0.0,
        "frames": int(len(data)),
    }


def score(metrics):
    """One number for early stopping and the best checkpoint: effector and inner-joint error together (cm)."""
    return metrics["effector_cm_mean"] + metrics["inner_mpjpe_cm"]


def _member_key(key, member, i):
    """A prior member's weight i in the training state: prior_w0 ... for the first (as before ensembles), then
    prior_m1_w0 ..."""
    return f"{key}_w{i}" if member == 0 else f"{key}_m{member}_w{i}"


def _json_rng_state(rng):
    """The generator's state with its 128-bit integers as strings (JSON numbers would lose them)."""
    state = dict(rng.bit_generator.state)
    state["state"] = {k: str(v) for k, v in state["state"].items()}
    return state


# ---- the loop --------------------------------------------------------------------------------------------------


LIBRARY_CHOICES = ("auto", "always", "never")


class Cancelled(Exception):
    """The run was cancelled while its data was being prepared: nothing was trained or written."""


def check_dataset(dataset):
    """Raise ValueError with a plain reason when the dataset cannot be trained on (cheap: before any preparation)."""
    inputs = np.asarray(dataset.inputs)
    if inputs.ndim != 2 or inputs.shape[1] != NUM_INPUTS or len(inputs) < 4:
        raise ValueError(f"the dataset needs at least 4 rows of {NUM_INPUTS} inputs, it has shape {inputs.shape}")
    if not np.all(np.isfinite(inputs)):
        raise ValueError("the dataset's inputs hold NaN or infinite numbers")


def validates_whole_own_clips(own_clips, config):
    """True when the own clips are enough (own_validation_min) to hold whole ones out for validation; with fewer,
    the last stretch of each validates, which cannot judge reach (nor let the library teach reach alone)."""
    return own_clips >= config.own_validation_min


class Trainer:
    """One training run. Building it prepares the data (split, mirror, limb mix, statistics: tens of seconds on a
    100k-frame dataset, so Blender builds it on the training thread); run() then trains. A cancel set on the progress
    object during preparation raises Cancelled between its stages."""

    def __init__(self, dataset, config, out_dir, progress=None, resume=False, on_epoch=None, start_from=None):
        """on_epoch(entry): called on the training thread after each validation with the history entry (e.g. to
        print a progress line in background mode). start_from: a Model of this rig to start from (its weights,
        input normalisation and mean pose; its joint limits widened to the data's), so a later run improves it."""
        self.config = config
        self.on_epoch = on_epoch
        self.phase = ""              # said before the progress messages (library_choice: which of its two runs)
        self.out_dir = os.fspath(out_dir)
        if not os.path.isdir(self.out_dir):
            raise FileRefused(f"output folder {self.out_dir} does not exist")
        self.progress = progress if progress is not None else Progress()
        self.dataset = dataset
        skeleton = dataset.skeleton
        check_dataset(dataset)
        own = dataset.own_action_mask()
        mixed = bool(own.any() and not own.all())
        # validation judges the user's own style: whole own clips when there are enough to spare some; with fewer (a
        # user's two clips among a library) the last stretch of each, so every own clip still trains; without a
        # library, from all clips
        if mixed and not validates_whole_own_clips(own.sum(), config):
            self.validation_note = f"own clips (the last {100 * config.own_stretch:.0f} % of each)"
            train_set, val_set = dataset.split_stretches(np.where(own)[0], config.own_stretch, config.stretch_gap)
        else:
            among, self.validation_note = (np.where(own)[0], "own clips") if mixed else (None, "all clips")
            train_set, val_set = dataset.split_by_action(seed=config.seed, val_fraction=config.val_fraction,
                                                         among=among)
        if config.library not in LIBRARY_CHOICES:
            raise ValueError(f"library must be one of {', '.join(LIBRARY_CHOICES)}, not {config.library!r}")
        self.library_note = "none in the dataset"
        if mixed:
            self.library_note = "trained on" if config.library != "never" else "left out"
            if config.library == "never":                # the own clips alone (validated as with the library)
                train_set = train_set.subset(np.nonzero(train_set.own_action_mask()[np.asarray(train_set.action)])[0])
        self.mirror_note, mirror = "off", None
        if config.mirror:      # validation stays the recorded motion only
            train_set, mirror = augment.with_mirror(train_set)
            self.mirror_note = f"skipped: {mirror.reason}" if mirror.reason else "on"
        self._stop_if_cancelled()
        recorded_rows = len(train_set)
        if config.limb_mix > 0:
            train_set = limb_mix.with_limb_mix(train_set, config.limb_mix, config.limb_mix_swap, config.seed)
        self._stop_if_cancelled()
        self.train = TrainingArrays(train_set)
        self.own_rows = train_set.own_action_mask()[self.train.action] if mixed else None
        # measured, 10 minutes each: CMU rig (8 own clips) + Bandai, library rows at 0.25: network alone 2.32 -> 2.06
        # cm, refined inner 1.71 -> 1.67 (own clips alone 1.65); the DAZ-style rig (2 own clips) at 0.25: 2.45 ->
        # 2.68 and 1.75 -> 2.03, so there it stays 1
        self.library_style = (config.library_style if mixed and validates_whole_own_clips(own.sum(), config)
                              and config.library != "never" else 1.0)
        self.sources = {"own_frames": int(own[np.asarray(dataset.action)].sum()),
                        "retargeted_frames": int((~own)[np.asarray(dataset.action)].sum()),
                        "validation": self.validation_note, "library": self.library_note}
        self.val = TrainingArrays(val_set)
        self._stop_if_cancelled()
        self.stats = data_statistics(self.train, config, recorded_rows)
        if start_from is not None:
            self.stats.update(starting_statistics(start_from, self.stats, dataset, config))
        self.train.attach_mean_pose(self.stats["mean_pose"])
        unit = config.position_unit or skeleton.height / 30.0
        self.loss_context = losses.LossContext(
            skeleton, self.stats["mean_pose"], self.stats["limit_low"], self.stats["limit_high"],
            self.stats["contact_height"], unit,
            **({} if config.role_weights is None else {"role_weights": np.asarray(config.role_weights)}))
        self.train_inputs = ((self.train.inputs - self.stats["input_mean"]) / self.stats["input_std"]).astype(np.float32)
        self.rng = np.random.default_rng(config.seed)
        sizes = [NUM_INPUTS, *config.hidden, NUM_ROLES * 3]
        self.weights = network.xavier_init(sizes, self.rng)
        if start_from is not None:
            self.weights = [np.array(w, np.float32) for w in start_from.weights]
        self.optimizer = network.Adam(self.weights, lr=config.learning_rate)
        # the target prior (prior.py) learns beside the network from the recorded rows (limb mixes come after them),
        # and so does the clip prior: a step each per step of the network's (the default Train run on the Bandai
        # proxy: 887 s, against 843 s before the priors' steps got cheaper and the clip prior took every fourth one;
        # docs/results.md)
        self.recorded_rows = recorded_rows
        self.prior = self.clip = None
        if config.prior_hidden:
            references, frames = prior.references_of(dataset.feature_spec), prior.mirror_frames_of(mirror)
            self.prior = prior.EnsembleTraining(config.prior_members, references, skeleton.height, config.seed,
                                                config.prior_hidden, config.learning_rate,
                                                None if start_from is None else start_from.prior, frames)
            self.val_targets = prior.targets_of_rows(self.val.positions, self.val.global_rotations)
            if config.clip_window:   # the clip prior: each row's window over its clip (rows of a clip run in order)
                fps = float(dataset.meta.get("fps") or 30.0)
                self.clip = prior.EnsembleTraining(config.prior_members, references, skeleton.height, config.seed,
                                                   config.prior_hidden, config.learning_rate,
                                                   None if start_from is None else start_from.clip_prior, frames,
                                                   config.clip_window)
                self.clip_rows = prior.clip_window_rows(self.train.action, self.train.frame, config.clip_window, fps)
                self.val_clip_rows = prior.clip_window_rows(self.val.action, self.val.frame, config.clip_window, fps)
        self.history = []
        self.start_epoch = 0
        self.best_score = math.inf
        self.best_metrics = {}
        self.elapsed_before = 0.0
        self.paths = {"model": os.path.join(self.out_dir, MODEL_FILE), "state": os.path.join(self.out_dir, STATE_FILE),
                      "metrics": os.path.join(self.out_dir, METRICS_FILE), "plot": os.path.join(self.out_dir, PLOT_FILE)}
        if config.started:
            self.elapsed_before = max(0.0, time.time() - config.started)
        if resume and os.path.exists(self.paths["state"]):
            self._load_state()

    def _stop_if_cancelled(self):
        if self.progress.cancel.is_set():
            raise Cancelled("cancelled while preparing the data: nothing was trained")

    # -- model assembly

    def model(self, weights=None, metrics=None):
        meta = {"training": self.config.to_json(), "metrics": metrics or {}, "history": self.history,
                "losses": self.config.loss_weights.to_json(), "validation_actions": self._val_action_names(),
                "train_frames": int(len(self.train)), "validation_frames": int(len(self.val)),
                "mirror": self.mirror_note, "sources": self.sources}
        spec = dataclasses.replace(self.dataset.feature_spec,
                                   contact_height=tuple(float(v) for v in self.stats["contact_height"]))
        return Model(skeleton=self.dataset.skeleton, feature_spec=spec,
                     weights=[w.copy() for w in (weights or self.weights)],
                     input_mean=self.stats["input_mean"], input_std=self.stats["input_std"],
                     mean_pose=self.stats["mean_pose"], limit_low=self.stats["limit_low"],
                     limit_high=self.stats["limit_high"], meta=meta,
                     prior=None if self.prior is None else self.prior.prior(),
                     clip_prior=None if self.clip is None else self.clip.prior())

    def _val_action_names(self):
        names = getattr(self.dataset, "action_names", None)
        ids = np.unique(self.val.action)
        if names is None or len(names) == 0:
            return [int(i) for i in ids]
        return [str(names[i]) for i in ids]

    # -- resumable state

    def _save_state(self, epoch):
        arrays = {f"w{i}": w for i, w in enumerate(self.weights)}
        arrays.update(self.optimizer.state_arrays())
        for key, training in (("prior", self.prior), ("clip_prior", self.clip)):   # the priors' weights resume too
            for m, member in enumerate(training.members if training is not None else ()):   # (optimisers afresh)
                arrays.update({_member_key(key, m, i): w for i, w in enumerate(member.weights)})
        meta = {"kind": STATE_KIND, "layout_version": 1, "epoch": epoch, "adam_step": self.optimizer.step_count,
                "config": self.config.to_json(), "history": self.history, "best_score": self.best_score,
                "best_metrics": self.best_metrics, "elapsed": self._elapsed(),
                "rig_fingerprint": self.dataset.skeleton.fingerprint(),
                "rng": _json_rng_state(self.rng)}
        save_npz(self.paths["state"], arrays, meta)

    def _load_state(self):
        meta, arrays = load_npz(self.paths["state"], STATE_KIND)
        if meta.get("rig_fingerprint") != self.dataset.skeleton.fingerprint():
            raise FileRefused("the saved training state belongs to another rig: use another output folder")
        if list(meta["config"].get("hidden", [])) != list(self.config.hidden):
            raise FileRefused("the saved training state has other layer sizes: use another output folder")
        for i, w in enumerate(self.weights):
            saved = arrays[f"w{i}"]
            if saved.shape != w.shape:
                raise FileRefused("the saved training state does not match the network")
            w[...] = saved
        self.optimizer.load_state(arrays, meta["adam_step"])
        for key, training in (("prior", self.prior), ("clip_prior", self.clip)):
            for m, member in enumerate(training.members if training is not None else ()):
                for i, w in enumerate(member.weights):
                    saved = arrays.get(_member_key(key, m, i))
                    if saved is not None and saved.shape == w.shape:
                        w[...] = saved
        self.start_epoch = int(meta["epoch"])
        self.history = list(meta["history"])
        self.best_score = float(meta["best_score"])
        self.best_metrics = dict(meta["best_metrics"])
        self.elapsed_before = float(meta.get("elapsed", 0.0))
        state = dict(meta["rng"])
        state["state"] = {k: int(v) for k, v in state["state"].items()}
        self.rng.bit_generator.state = state

    def _elapsed(self):
        return self.elapsed_before + (time.perf_counter() - self._t0 if hasattr(self, "_t0") else 0.0)

    # -- steps

    def train_step(self, rows, lr):
        """One Adam step on a batch of frame pairs; returns the LossResult (unweighted parts, weighted total)."""
        cur = rows
        prev = self.train.prev[cur]
        both = np.concatenate([cur, prev])
        batch = self.train.batch(both)
        batch["pair_valid"] = self.train.has_prev[cur].astype(np.float32)
        if self.library_style < 1.0:
            batch["style"] = np.where(self.own_rows[both], 1.0, self.library_style).astype(np.float32)
        x = self.train_inputs[both]
        if self.config.input_noise:
            x = x + self.rng.normal(0.0, self.config.input_noise, x.shape).astype(np.float32)
        out, cache = network.forward(self.weights, x)
        result = losses.evaluate(self.loss_context, self.config.loss_weights, out, batch)
        grads = network.backward(self.weights, cache, result.grad)
        network.clip_by_global_norm(grads, self.config.grad_clip)
        self.optimizer.step(self.weights, grads, lr)
        if self.prior is not None:
            recorded = cur[cur < self.recorded_rows]
            if len(recorded):
                self.prior.step(recorded, lr, self._prior_rows, self.recorded_rows)
                if self.clip is not None:
                    self.clip.step(recorded, lr, self._clip_prior_rows, self.recorded_rows)
        return result

    def _prior_rows(self, rows):
        """The targets of training rows (the priors' steps fetch their rows with this), and no window."""
        return prior.targets_of_rows(self.train.positions[rows], self.train.global_rotations[rows]), None

    def _clip_prior_rows(self, rows):
        """The targets of training rows and the clip prior's window over each row's clip."""
        window = self.train.positions[self.clip_rows[rows]][:, :, list(prior.TARGET_ROLES)]
        return self._prior_rows(rows)[0], window

    def _lr(self, fraction):
        c = self.config
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(max(fraction, 0.0), 1.0)))
        return c.learning_rate * (c.final_lr_fraction + (1.0 - c.final_lr_fraction) * cosine)

    def _fraction(self, epoch_float):
        c = self.config
        f = epoch_float / max(c.epochs, 1)
        if c.time_limit:
            f = max(f, self._elapsed() / c.time_limit)
        return f

    def _validate(self):
        """Validation metrics of the current weights, and the model they make."""
        model = self.model()
        metrics = validation_metrics(model, self.val)
        if self.prior is not None and len(self.val_targets):
            metrics.update(self.prior.validate(self.val_targets))
            if self.clip is not None:
                metrics.update(self.clip.validate(self.val_targets, rows=self.val_clip_rows))
        return metrics, model

    def _keep_if_best(self, metrics, model):
        """Write the model as the best checkpoint when its score beats the best so far; True when it did."""
        s = score(metrics)
        if s >= self.best_score:
            return False
        self.best_score, self.best_metrics = s, metrics
        model.meta["metrics"] = metrics
        model.meta["history"] = list(self.history)
        checkpoint.save_model(self.paths["model"], model)
        return True

    def _epoch_rows(self):
        """Row indices of one epoch: every row once, the own clips' rows repeated so they make `own_share` of the
        epoch when library motion would drown them (a dozen own clips against thousands of library frames)."""
        rows = np.arange(len(self.train))
        share = self.config.own_share
        if self.own_rows is None or not 0.0 < share < 1.0:
            return rows
        own, library = rows[self.own_rows], rows[~self.own_rows]
        wanted = int(round(share / (1.0 - share) * len(library)))
        if len(own) == 0 or wanted <= len(own):
            return rows
        repeats, extra = divmod(wanted, len(own))
        picked = np.random.default_rng(self.config.seed).choice(own, extra, replace=False)
        return np.concatenate([library, np.tile(own, repeats), picked])

    def _report(self, **values):
        for key, value in values.items():
            setattr(self.progress, key, value)

    def run(self):
        c = self.config
        p = self.progress
        self._t0 = time.perf_counter()
        half = max(c.batch_size // 2, 1)
        candidates = self._epoch_rows()
        steps = max(len(candidates) // (2 * half), 1)
        self._report(running=True, epochs=c.epochs, message="training", checkpoint_path="", plot_path="")
        stopped = "epochs"
        epoch = self.start_epoch
        since_best = 0
        while epoch < c.epochs:
            order = self.rng.permutation(candidates)
            total, parts_sum, done = 0.0, {}, 0
            for step in range(steps):
                if p.cancel.is_set():
                    stopped = "cancelled"
                    break
                if c.time_limit and self._elapsed() >= c.time_limit:
                    stopped = "time limit"
                    break
                lr = self._lr(self._fraction(epoch + step / steps))
                result = self.train_step(order[step * half:(step + 1) * half], lr)
                if not math.isfinite(result.total):
                    raise FloatingPointError("training diverged (the loss is not finite): lower the learning rate")
                total += result.total
                for k, v in result.parts.items():
                    parts_sum[k] = parts_sum.get(k, 0.0) + v
                done += 1
            if done == 0 and stopped != "epochs":
                break
            epoch += 1 if stopped == "epochs" else 0
            metrics, model = self._validate()
            entry = {"epoch": epoch if stopped == "epochs" else epoch + done / steps,
                     "train_loss": total / max(done, 1), "lr": lr, "seconds": round(self._elapsed(), 2),
                     **{f"train_{k}": v / max(done, 1) for k, v in parts_sum.items()},
                     **{f"val_{k}": v for k, v in metrics.items() if k != "frames"}}
            self.history.append(entry)
            since_best = 0 if self._keep_if_best(metrics, model) else since_best + 1
            self._save_state(epoch)
            self._write_plot()
            elapsed = self._elapsed()
            per_epoch = elapsed / max(len(self.history), 1)
            left = per_epoch * (c.epochs - epoch)
            if c.time_limit:
                left = min(left, max(c.time_limit - elapsed, 0.0))
            self._report(epoch=epoch, train_loss=entry["train_loss"], val_error_cm=metrics["effector_cm_mean"],
                         val_inner_cm=metrics["inner_mpjpe_cm"], seconds_left=left, elapsed=elapsed,
                         history=list(self.history), best_metrics=dict(self.best_metrics),
                         checkpoint_path=self.paths["model"], plot_path=self.paths["plot"],
                         message=f"{self.phase + ': ' if self.phase else ''}{epoch_text(epoch, c.epochs)}: effector "
                                 f"{metrics['effector_cm_mean']:.2f} cm, inner {metrics['inner_mpjpe_cm']:.2f} cm")
            if self.on_epoch is not None:
                self.on_epoch(entry)
            if stopped != "epochs":
                break
            if (c.patience and since_best >= c.patience and since_best * steps >= c.patience_steps
                    and self._fraction(epoch) >= c.early_stop_from):
                stopped = "early stop"
                break
        seconds = self._elapsed()
        self.start_epoch, self.elapsed_before = epoch, seconds     # where train_on carries on from
        del self._t0
        if not os.path.exists(self.paths["model"]):      # nothing validated yet (cancelled at once): keep what we have
            self._keep_if_best(*self._validate())
        best = checkpoint.load_model(self.paths["model"])
        summary = {"stopped": stopped, "seconds": round(seconds, 2), "best": self.best_metrics,
                   "settings": c.to_json(), "history": self.history, "train_frames": int(len(self.train)),
                   "validation_frames": int(len(self.val)), "validation_actions": self._val_action_names(),
                   "mirror": self.mirror_note, "rig_fingerprint": self.dataset.skeleton.fingerprint(),
                   "sources": self.sources}
        save_json(self.paths["metrics"], summary)
        self._write_plot()
        self._report(running=False, message=f"{self.phase + ' ' if self.phase else ''}finished ({stopped}): best effector "
                                            f"{self.best_metrics.get('effector_cm_mean', float('nan')):.2f} cm, inner "
                                            f"{self.best_metrics.get('inner_mpjpe_cm', float('nan')):.2f} cm",
                     best_metrics=dict(self.best_metrics), checkpoint_path=self.paths["model"])
        return TrainResult(best, dict(self.best_metrics), list(self.history), stopped, seconds, dict(self.paths))

    def train_on(self, time_limit):
        """Carry on after run() until `time_limit` seconds in all (its own and this call's): the learning rate
        rises again to where that share of the new schedule puts it and decays to its end; the best checkpoint so
        far stays unless beaten. Returns run()'s TrainResult."""
        self.config = dataclasses.replace(self.config, time_limit=time_limit)
        return self.run()

    def _write_plot(self):
        if not self.history:
            return
        x = [h["epoch"] for h in self.history]
        series = {"train loss": [h["train_loss"] for h in self.history],
                  "val effector cm": [h["val_effector_cm_mean"] for h in self.history],
                  "val inner cm": [h["val_inner_mpjpe_cm"] for h in self.history]}
        loss_curve_svg(self.paths["plot"], x, series, log_y=True)


def train(dataset, config=None, out_dir=".", progress=None, resume=False):
    """Train a model on a dataset; returns TrainResult. See Trainer (and library_choice.train, which runs it twice
    where the dataset holds library motion and config.library is "auto")."""
    return Trainer(dataset, config or TrainConfig(), out_dir, progress, resume).run()
