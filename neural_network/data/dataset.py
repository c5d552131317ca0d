"""The training set: every frame of every usable action as the arrays of docs/architecture.md, saved as .npz.

Built by streaming: a DatasetBuilder takes one action at a time (its contacts, phase and task are computed then,
and compact per-action arrays are kept), the input references are accumulated as running sums, and the arrays are
concatenated exactly once in `finish()`. Loading checks everything a later stage relies on and refuses a file with
a plain-words reason (files.FileRefused).
"""

import os
from dataclasses import dataclass, field

import numpy as np

from ..geometry.rotations import matrix_to_axis_angle, orthonormalize
from ..skeleton.roles import EFFECTOR_ROLES, FOOT_ROLES, NUM_ROLES, ROLE_INDEX, ROLES, TASKS, task_from_name
from ..skeleton.skeleton import Skeleton
from .features import CONTACT_HEIGHT, CONTACT_SPEED, LAYOUT_VERSION, NUM_INPUTS, FeatureSpec, root_frame
from .files import FileRefused, load_npz, save_npz

KIND = "neural_ik.dataset"
DATASET_LAYOUT_VERSION = 1

# name: (shape after N, dtype); None in a shape means "per file" (checked against the skeleton/actions instead).
ROW_ARRAYS = {
    "inputs": ((NUM_INPUTS,), np.float32),
    "rotations": ((NUM_ROLES, 3), np.float32),
    "positions": ((NUM_ROLES, 3), np.float32),
    "hips_rotation": ((3, 3), np.float32),
    "hips_position": ((3,), np.float32),
    "contacts": ((2,), np.float32),
    "ground": ((2,), np.float32),
    "action": ((), np.int32),
    "frame": ((), np.int32),
    "task": ((), np.int32),
    "phase": ((), np.float32),
}
OPTIONAL_ROW_ARRAYS = {
    "bridges": ((NUM_ROLES, 3, 3), np.float32),
    "offsets": ((NUM_ROLES, 3), np.float32),
}


def task_index(name, override=None):
    """Task of an action: the override ("AUTO"/None: from the name's keywords)."""
    if override and override.upper() != "AUTO":
        key = override.lower()
        if key not in TASKS:
            raise ValueError(f"unknown task {override!r}; known tasks are {', '.join(TASKS)}")
        return TASKS.index(key)
    return task_from_name(name)


@dataclass
class Dataset:
    arrays: dict                 # name -> array, see ROW_ARRAYS/OPTIONAL_ROW_ARRAYS plus role_mask, action_names
    meta: dict                   # kind, layout_version, skeleton, feature_spec, fps, actions, units, source, ...
    skeleton: Skeleton = None
    feature_spec: FeatureSpec = None

    def __post_init__(self):
        if self.skeleton is None:
            self.skeleton = Skeleton.from_json(self.meta["skeleton"])
        if self.feature_spec is None:
            self.feature_spec = FeatureSpec.from_json(self.meta["feature_spec"])

    def __len__(self):
        return int(self.arrays["inputs"].shape[0])

    def __getattr__(self, name):
        arrays = self.__dict__.get("arrays", {})
        if name in arrays:
            return arrays[name]
        raise AttributeError(name)

    @property
    def has_moving_links(self):
        return "bridges" in self.arrays

    def summary(self):
        """Plain facts for reports: actions, frames, frames per task, rig."""
        counts = np.bincount(self.arrays["task"], minlength=len(TASKS))
        return {
            "rig": self.skeleton.name,
            "fingerprint": self.skeleton.fingerprint(),
            "actions": int(len(self.arrays["action_names"])),
            "frames": len(self),
            "frames_per_task": {t: int(c) for t, c in zip(TASKS, counts)},
            "mapped_roles": int(self.skeleton.role_mask.sum()),
            "moving_links": self.has_moving_links,
            "fps": self.meta.get("fps"),
            "own_actions": int(self.own_action_mask().sum()),
        }

    def own_action_mask(self):
        """(A,) bool per action name: True for the rig's own motion (the user's clips, and BVH files of the rig's own
        skeleton), False for library motion retargeted from another skeleton (the meta's per-action "source" written
        by extraction: {"kind": "library", "retargeted": true}) and for augmented poses ({"kind": "augmented"}).
        Mirrored copies ("<name> (mirrored)") take their original's kind."""
        sources = {a.get("name"): a.get("source") or {} for a in self.meta.get("actions", []) if isinstance(a, dict)}
        library = {name: bool(s.get("retargeted", False) or s.get("kind") == "augmented") for name, s in sources.items()}
        names = [str(n) for n in self.arrays["action_names"]]
        return np.array([not library.get(n[:-len(" (mirrored)")] if n.endswith(" (mirrored)") else n, False)
                         for n in names], dtype=bool)

    def summary_text(self):
        s = self.summary()
        tasks = ", ".join(f"{t} {c}" for t, c in s["frames_per_task"].items() if c)
        library = s["actions"] - s["own_actions"]
        kinds = f" ({s['own_actions']} of its own, {library} retargeted)" if library else ""
        return (f"{s['frames']} frames from {s['actions']} actions{kinds} of rig {s['rig']!r} "
                f"({s['mapped_roles']}/{NUM_ROLES} roles; {tasks})")

    def appended(self, other):
        """This dataset followed by the rows of `other` (same rig and inputs): other's actions numbered after this
        one's, and its per-action metadata entries added where their names are new."""
        names = np.asarray(self.arrays["action_names"], str)
        out = {}
        for name, value in self.arrays.items():
            if name == "role_mask":
                out[name] = value
            elif name == "action_names":
                out[name] = np.concatenate([names, np.asarray(other.arrays[name], str)])
            elif name == "action":
                out[name] = np.concatenate([value, np.asarray(other.arrays[name]) + len(names)]).astype(np.int32)
            else:
                out[name] = np.concatenate([value, np.asarray(other.arrays[name]).astype(np.asarray(value).dtype)])
        meta = dict(self.meta)
        actions = list(self.meta.get("actions", []))
        known = {a.get("name") for a in actions if isinstance(a, dict)}
        meta["actions"] = actions + [a for a in other.meta.get("actions", [])
                                     if isinstance(a, dict) and a.get("name") not in known]
        return Dataset(out, meta, self.skeleton, self.feature_spec)

    def subset(self, rows):
        """A Dataset of the given rows (in order), keeping every action name and the same metadata."""
        rows = np.asarray(rows, dtype=np.int64)
        arrays = {k: (v[rows] if k in ROW_ARRAYS or k in OPTIONAL_ROW_ARRAYS else v) for k, v in self.arrays.items()}
        return Dataset(arrays, dict(self.meta), self.skeleton, self.feature_spec)

    def split_by_action(self, seed=0, val_fraction=0.1, among=None):
        """(train, validation) with whole actions on one side, so validation frames are never neighbours of training
        frames. At least one action goes to each side when there are two or more; a single action is split into its
        first and last part instead. among: action indices validation may take (the user's own clips); the
        fraction is then of their frames.

        Validation is spread over several clips: with four or more actions, an action longer than a third of the
        validation budget stays in training, so one long clip (a 1900-frame dance among 300-frame walks) cannot
        become most of the validation figure."""
        names = self.arrays["action_names"]
        action = self.arrays["action"]
        present = np.unique(action)
        if len(present) < 2:
            n = len(self)
            cut = n - max(1, int(round(n * val_fraction))) if n > 1 else n
            return self.subset(np.arange(cut)), self.subset(np.arange(cut, n))
        rng = np.random.default_rng(seed)
        frames = np.bincount(action, minlength=len(names))
        target = val_fraction * len(self)
        if among is not None:
            present = np.intersect1d(present, np.asarray(among, dtype=np.int64))
            target = val_fraction * frames[present].sum()
        order = rng.permutation(present)
        val, total = [], 0
        for a in order:
            if len(present) >= 4 and frames[a] > target / 3:
                continue
            if val and total + frames[a] / 2 > target:
                break
            val.append(a)
            total += frames[a]
        if not val:   # every action is long: fall back to the first one of the permutation
            val = [order[0]]
        val = val[:len(present) - 1]
        is_val = np.isin(action, val)
        return self.subset(np.where(~is_val)[0]), self.subset(np.where(is_val)[0])

    def split_stretches(self, actions, fraction=0.2, gap=10):
        """(train, validation) for one or two own clips among a library: the last `fraction` of each of `actions`'
        frames is validation, the `gap` frames before it neither (neighbouring frames are near copies, and would
        flatter the figure); the rest of those actions and every other action train. So validation measures the
        user's own style while each of their clips still trains."""
        action = np.asarray(self.arrays["action"])
        val = np.zeros(len(action), bool)
        dropped = np.zeros(len(action), bool)
        for a in np.asarray(actions, np.int64):
            rows = np.nonzero(action == a)[0]
            count = max(1, int(round(len(rows) * fraction))) if len(rows) > 1 else 0
            if not count:
                continue
            val[rows[len(rows) - count:]] = True
            dropped[rows[max(len(rows) - count - gap, 1):len(rows) - count]] = True
        return self.subset(np.nonzero(~val & ~dropped)[0]), self.subset(np.nonzero(val)[0])

    def save(self, path):
        save_npz(path, self.arrays, self.meta)

    @classmethod
    def load(cls, path):
        meta, arrays = load_npz(path, KIND, required=list(ROW_ARRAYS) + ["role_mask", "action_names"])
        return cls.validated(meta, arrays, path)

    @classmethod
    def validated(cls, meta, arrays, path="dataset"):
        label = os.path.basename(str(path))
        if meta.get("layout_version") != DATASET_LAYOUT_VERSION:
            raise FileRefused(f"{label} has dataset layout version {meta.get('layout_version')!r}; this version of "
                              f"Neural IK reads version {DATASET_LAYOUT_VERSION}: extract the data again")
        try:
            skeleton = Skeleton.from_json(meta["skeleton"])
            spec = FeatureSpec.from_json(meta["feature_spec"])
        except (KeyError, TypeError, ValueError) as exc:
            raise FileRefused(f"{label} has an unusable rig or input description: {exc}") from None
        n = arrays["inputs"].shape[0] if arrays["inputs"].ndim else -1
        if n <= 0:
            raise FileRefused(f"{label} holds no frames")
        for name, (shape, dtype) in list(ROW_ARRAYS.items()) + list(OPTIONAL_ROW_ARRAYS.items()):
            if name not in arrays:
                continue
            a = arrays[name]
            if a.shape != (n,) + shape:
                raise FileRefused(f"{label}: array {name} has shape {a.shape}, expected {(n,) + shape}")
            if a.dtype != dtype:
                raise FileRefused(f"{label}: array {name} has type {a.dtype}, expected {np.dtype(dtype)}")
        if ("bridges" in arrays) != ("offsets" in arrays):
            raise FileRefused(f"{label} has per-frame bridges without offsets or the other way round")
        mask = arrays["role_mask"]
        if mask.shape != (NUM_ROLES,) or mask.dtype != bool:
            raise FileRefused(f"{label}: role_mask must be {NUM_ROLES} booleans")
        if not np.array_equal(mask, skeleton.role_mask):
            raise FileRefused(f"{label}: role_mask does not match the rig's bone map")
        finite = [k for k in ROW_ARRAYS if k != "positions"] + [k for k in OPTIONAL_ROW_ARRAYS if k in arrays]
        for name in finite:
            if not np.all(np.isfinite(arrays[name])):
                raise FileRefused(f"{label}: array {name} holds non-finite numbers")
        pos = arrays["positions"]
        if not np.all(np.isfinite(pos[:, mask])) or not np.all(np.isnan(pos[:, ~mask])):
            raise FileRefused(f"{label}: positions must be finite for mapped roles and NaN for unmapped ones")
        if np.any(arrays["rotations"][:, ~mask] != 0):
            raise FileRefused(f"{label}: rotations of unmapped roles must be zero")
        names = arrays["action_names"]
        if names.ndim != 1 or names.dtype.kind != "U" or len(names) == 0:
            raise FileRefused(f"{label}: action_names must be a list of names")
        if arrays["action"].min() < 0 or arrays["action"].max() >= len(names):
            raise FileRefused(f"{label}: action indices point outside action_names")
        if arrays["task"].min() < 0 or arrays["task"].max() >= len(TASKS):
            raise FileRefused(f"{label}: task indices outside 0..{len(TASKS) - 1}")
        if len(meta.get("actions", [])) != len(names):
            raise FileRefused(f"{label}: metadata lists {len(meta.get('actions', []))} actions, arrays {len(names)}")
        return cls(arrays, meta, skeleton, spec)


@dataclass
class ActionBatch:
    """Consecutive actions' frames in one block of rows (rows starts[a]:starts[a + 1] are action a's): the form in
    which extraction hands frames over, so every per-frame step runs once over many actions. Character space,
    role order, float64."""
    names: list
    frame_start: np.ndarray          # (A,) each action's frame range
    frame_end: np.ndarray            # (A,)
    starts: np.ndarray               # (A + 1,) row offsets
    frames: np.ndarray               # (N,) scene frames
    local_axis_angle: np.ndarray     # (N, 23, 3) each bone's own rotation (zero where unmapped)
    positions: np.ndarray            # (N, 23, 3) heads (NaN where unmapped)
    hips_rotation: np.ndarray        # (N, 3, 3)
    hips_position: np.ndarray        # (N, 3)
    effector_rotations: np.ndarray   # (N, 5, 3, 3) orientations of the effector roles (EFFECTOR_ROLES order)
    tasks: np.ndarray                # (A,) task index per action
    moving: np.ndarray               # (A,) bool: the action needs per-frame bridges/offsets
    bridges: np.ndarray = None       # (N, 23, 3, 3), read for the rows of moving actions
    offsets: np.ndarray = None       # (N, 23, 3)

    def finite_actions(self, role_mask):
        """(A,) False for actions whose frames hold NaN or infinite values (they would poison a training set)."""
        positions = self.positions if np.all(role_mask) else self.positions[:, role_mask]
        total = (self.local_axis_angle.sum(axis=(1, 2)) + positions.sum(axis=(1, 2))      # NaN and inf survive sums
                 + self.hips_rotation.sum(axis=(1, 2)) + self.hips_position.sum(axis=1))
        return np.logical_and.reduceat(np.isfinite(total), self.starts[:-1])

    def subset(self, keep):
        """The batch with only the actions where keep (A,) is True."""
        keep = np.asarray(keep, bool)
        counts = np.diff(self.starts)
        rows = np.repeat(keep, counts)
        pick = np.where(keep)[0]
        return ActionBatch(
            names=[self.names[a] for a in pick], frame_start=self.frame_start[pick], frame_end=self.frame_end[pick],
            starts=np.concatenate([[0], np.cumsum(counts[pick])]), frames=self.frames[rows],
            local_axis_angle=self.local_axis_angle[rows], positions=self.positions[rows],
            hips_rotation=self.hips_rotation[rows], hips_position=self.hips_position[rows],
            effector_rotations=self.effector_rotations[rows], tasks=self.tasks[pick], moving=self.moving[pick],
            bridges=None if self.bridges is None else self.bridges[rows],
            offsets=None if self.offsets is None else self.offsets[rows])


def segment_contacts(foot_positions, ground_height, fps, rig_height, starts):
    """features.detect_contacts for each action of a block of rows at once (rows starts[a]:starts[a + 1]):
    (N, 2) contact flags from (N, 2, 3) ankle positions."""
    height = foot_positions[..., 2] - np.asarray(ground_height, np.float64)
    counts = np.diff(starts)
    lowest = np.repeat(np.minimum.reduceat(height, starts[:-1], axis=0), counts, axis=0)
    low = height - lowest < CONTACT_HEIGHT * rig_height
    speed = np.zeros(height.shape)
    if len(height) > 1:
        speed[1:] = np.linalg.norm(np.diff(foot_positions, axis=0), axis=-1) * fps
    first = starts[:-1]
    several = counts > 1
    speed[first[several]] = speed[first[several] + 1]   # an action's first frame takes its first step's speed
    speed[first[~several]] = 0.0
    return (low & (speed < CONTACT_SPEED * rig_height)).astype(np.float32)



def _turned_forms(reference):
    """(9, 3, 3, 3) constants F with A = c F[:, 0] + s F[:, 1] + F[:, 2] for the relative rotation
    A = reference^T R_root^T R, as linear forms of R's nine entries (R_root a turn by (c, s) about +Z):
    A_ij = c (a0i R0j + a1i R1j) + s (a0i R1j - a1i R0j) + a2i R2j with a = reference."""
    a = np.asarray(reference, np.float64)
    forms = np.zeros((3, 3, 3, 3, 3))         # (row m, column j' of R) x (term) x (i, j of A)
    for i in range(3):
        for j in range(3):
            forms[0, j, 0, i, j] += a[0, i]
            forms[1, j, 0, i, j] += a[1, i]
            forms[1, j, 1, i, j] += a[0, i]
            forms[0, j, 1, i, j] -= a[1, i]
            forms[2, j, 2, i, j] += a[2, i]
    return forms.reshape(9, 3, 3, 3)


def _axis_angle_forms(reference):
    """(9, 3 * 4) constants W: R (flattened) @ W gives, per term (c, s, 1), the linear forms of the relative
    rotation's antisymmetric part (v0, v1, v2) and trace (see _turned_forms)."""
    F = _turned_forms(reference)                                            # (9, term, i, j)
    W = np.empty((9, 3, 4))
    W[..., 0] = F[:, :, 2, 1] - F[:, :, 1, 2]
    W[..., 1] = F[:, :, 0, 2] - F[:, :, 2, 0]
    W[..., 2] = F[:, :, 1, 0] - F[:, :, 0, 1]
    W[..., 3] = F[:, :, 0, 0] + F[:, :, 1, 1] + F[:, :, 2, 2]
    return W.reshape(9, 12)


def _one_thread_product(a, b, out):
    """a (N, m) @ b (m, o) into out, in row blocks small enough that OpenBLAS keeps to the calling thread (it wakes
    its other threads above m * n * k = 262144, which costs more than such a product on a busy machine)."""
    step = max(1, 240000 // (a.shape[1] * b.shape[1]))
    for start in range(0, len(a), step):
        np.matmul(a[start:start + step], b, out=out[start:start + step])
    return out


def training_inputs(spec, positions, effector_rotations, hips_rotation, ground_height, contact, phase, task, out=None):
    """features.build_inputs for a training set (desired contact = contact), from the effector orientations alone and
    in few array operations: the root frame is a turn about +Z, so each effector's relative rotation
    reference^T R_root^T R is c X + s Y + Z with X, Y, Z linear in R; the axis-angles need only the antisymmetric
    part and the trace, so one matrix product gives all of them (the whole-matrix conversion only near a half turn).
    tests/test_dataset_batch.py checks it against build_inputs.

    positions (N, 23, 3) (only hips, thighs, effectors read), effector_rotations (N, 5, 3, 3), hips_rotation
    (N, 3, 3), ground_height and contact (N, 2), phase and task (N,). Returns (N, 50) float32 (written into `out`
    when given): every value is computed in float64 and rounded once, as it is stored.
    """
    n = len(positions)
    origin, R_root = root_frame(positions, hips_rotation)
    c, s = R_root[:, 0, 0], R_root[:, 1, 0]
    out = np.empty((n, NUM_INPUTS), np.float32) if out is None else out
    effectors = out[:, :30].reshape(n, 5, 6)
    d = positions[:, list(EFFECTOR_ROLES)] - origin[:, None]
    cc, ss = c[:, None], s[:, None]
    effectors[:, :, 0] = cc * d[..., 0] + ss * d[..., 1]
    effectors[:, :, 1] = cc * d[..., 1] - ss * d[..., 0]
    effectors[:, :, 2] = d[..., 2]
    R9 = np.reshape(effector_rotations, (n, 45)).astype(np.float64)        # (float32 @ float64 would not use BLAS)
    forms = np.empty((5, n, 12))                                          # per effector (N, term, v0 v1 v2 trace)
    for k, reference in enumerate(np.asarray(spec.effector_reference, np.float64)):
        _one_thread_product(R9[:, 9 * k:9 * k + 9], _axis_angle_forms(reference), forms[k])
    forms = forms.reshape(5, n, 3, 4).transpose(1, 0, 2, 3)               # (N, effector, term, 4)
    vt = forms[:, :, 2]
    vt += cc[..., None] * forms[:, :, 0]
    vt += ss[..., None] * forms[:, :, 1]
    v = vt[..., :3]
    trace_m1 = vt[..., 3] - 1.0                                             # 2 cos(angle); |v| = 2 sin(angle)
    two_sin = np.sqrt(v[..., 0] * v[..., 0] + v[..., 1] * v[..., 1] + v[..., 2] * v[..., 2])
    effectors[:, :, 3:] = v * (np.arctan2(two_sin, trace_m1) / np.maximum(two_sin, 1e-300))[..., None]
    near_half_turn = trace_m1 < -1.99
    if near_half_turn.any():
        rows, ks = np.nonzero(near_half_turn)
        R = np.asarray(effector_rotations, np.float64)[rows, ks]
        F = np.stack([_turned_forms(ref) for ref in np.asarray(spec.effector_reference, np.float64)])[ks]
        A = np.einsum("nm,nmtij->ntij", R.reshape(-1, 9), F)
        A = c[rows, None, None] * A[:, 0] + s[rows, None, None] * A[:, 1] + A[:, 2]
        effectors[rows, ks, 3:] = matrix_to_axis_angle(A)
    G = np.reshape(hips_rotation, (n * 3, 3)).astype(np.float64) @ np.asarray(spec.hips_reference, np.float64).T
    G = G.reshape(n, 3, 3)                                  # G[i, j] = hips row i . reference row j
    for j, col in ((1, 30), (2, 33)):                       # hips_rel = R_root^T hips reference^T, columns 1 and 2
        out[:, col] = c * G[:, 0, j] + s * G[:, 1, j]
        out[:, col + 1] = c * G[:, 1, j] - s * G[:, 0, j]
        out[:, col + 2] = G[:, 2, j]
    feet = out[:, 36:48].reshape(n, 2, 6)
    feet[:, :, 0] = positions[:, list(FOOT_ROLES), 2].astype(np.float64) - ground_height
    feet[:, :, 1:4] = (0.0, 0.0, 1.0)
    feet[:, :, 4] = contact
    feet[:, :, 5] = contact
    out[:, 48] = phase
    out[:, 49] = np.asarray(task, np.float64) / (len(TASKS) - 1)
    return out


@dataclass
class DatasetBuilder:
    """Collects actions one at a time into preallocated row buffers; `finish()` builds the inputs in place.

    Give `capacity` (the total frame count, known from the actions' ranges) and no frame is ever held twice; without
    it the buffers grow by doubling.
    """
    skeleton: Skeleton
    fps: float
    source: str = ""
    capacity: int = 0
    actions: list = field(default_factory=list)
    _buffers: dict = None
    _count: int = 0
    _ref_sums: np.ndarray = None     # (6, 3, 3) running sums of root-frame effector and hips orientations

    def _reserve(self, rows, moving):
        shapes = dict(ROW_ARRAYS)
        shapes["_effector_rotations"] = ((len(EFFECTOR_ROLES), 3, 3), np.float32)
        if moving or (self._buffers is not None and "bridges" in self._buffers):
            shapes.update(OPTIONAL_ROW_ARRAYS)
        need = self._count + rows
        have = 0 if self._buffers is None else len(self._buffers["frame"])
        size = max(need, self.capacity, 2 * have if need > have else have)
        buffers = self._buffers or {}
        for name, (shape, dtype) in shapes.items():
            old = buffers.get(name)
            if old is not None and len(old) >= need:
                continue
            new = np.empty((size,) + shape, dtype=dtype)
            if old is not None:
                new[:self._count] = old[:self._count]
            elif name == "bridges":
                new[:self._count] = self.skeleton.bridges.astype(np.float32)
            elif name == "offsets":
                new[:self._count] = self.skeleton.offsets.astype(np.float32)
            buffers[name] = new
        self._buffers = buffers

    def add_action(self, name, frames, frame_start, frame_end, local_rotations, rotations, positions, hips_rotation,
                   hips_position, bridges=None, offsets=None, task=None, ground_height=0.0):
        """One action: local_rotations and rotations (F, 23, 3, 3) in character space, positions (F, 23, 3) with NaN
        where unmapped, hips (F, 3, 3) and (F, 3); per-frame bridges/offsets (F, 23, ...) only when they move;
        task an index or None for the action name's keywords."""
        frames = np.asarray(frames)
        count = len(frames)
        if count == 0:
            raise ValueError(f"action {name!r} has no frames")
        local_aa = matrix_to_axis_angle(local_rotations)
        rotations = np.asarray(rotations, np.float64)
        self.add_batch(ActionBatch(
            names=[name], frame_start=np.array([frame_start]), frame_end=np.array([frame_end]),
            starts=np.array([0, count]), frames=frames, local_axis_angle=local_aa,
            positions=np.asarray(positions, np.float64), hips_rotation=np.asarray(hips_rotation, np.float64),
            hips_position=np.asarray(hips_position, np.float64),
            effector_rotations=rotations[:, list(EFFECTOR_ROLES)],
            tasks=np.array([task_from_name(name) if task is None else int(task)]),
            moving=np.array([bridges is not None]), bridges=bridges, offsets=offsets), ground_height)

    def add_batch(self, batch, ground_height=0.0):
        """Several actions at once (an ActionBatch): every per-frame quantity is computed over the whole batch."""
        n = len(batch.frames)
        counts = np.diff(batch.starts)
        if n == 0 or np.any(counts <= 0):
            raise ValueError(f"an action of {', '.join(batch.names)} has no frames")
        mask = self.skeleton.role_mask
        height = self.skeleton.height
        positions = batch.positions
        ground = np.full((n, 2), float(ground_height))
        contacts = segment_contacts(positions[:, list(FOOT_ROLES)], ground, self.fps, height, batch.starts)
        anchors = positions if mask[[0, ROLE_INDEX["LeftThigh"], ROLE_INDEX["RightThigh"]]].all() else np.nan_to_num(positions)
        _, R_root = root_frame(anchors, batch.hips_rotation)
        c, s = R_root[:, 0, 0], R_root[:, 1, 0]           # the root frame is a turn about +Z: Rt M = rows
        rows = np.empty((n, 9 * (len(EFFECTOR_ROLES) + 1)))  # (c M0 + s M1, -s M0 + c M1, M2)
        rows[:, :-9] = np.reshape(batch.effector_rotations, (n, -1))
        rows[:, -9:] = np.reshape(batch.hips_rotation, (n, 9))
        weights = np.empty((3, n))
        weights[0], weights[1], weights[2] = c, s, 1.0
        cm, sm, total = np.einsum("tn,nm->tm", weights, rows).reshape(3, -1, 9)   # one pass, no BLAS threads
        sums = np.empty((len(EFFECTOR_ROLES) + 1, 3, 3))
        sums[:, 0] = cm[:, 0:3] + sm[:, 3:6]
        sums[:, 1] = cm[:, 3:6] - sm[:, 0:3]
        sums[:, 2] = total[:, 6:9]
        self._ref_sums = sums if self._ref_sums is None else self._ref_sums + sums
        moving = np.asarray(batch.moving, bool)
        self._reserve(n, bool(moving.any()))
        rows = slice(self._count, self._count + n)
        b = self._buffers
        b["rotations"][rows] = batch.local_axis_angle
        b["rotations"][rows, ~mask] = 0.0
        b["positions"][rows] = positions
        b["positions"][rows, ~mask] = np.nan
        b["hips_rotation"][rows] = batch.hips_rotation
        b["hips_position"][rows] = batch.hips_position
        b["contacts"][rows] = contacts
        b["ground"][rows] = ground
        b["action"][rows] = np.repeat(np.arange(len(self.actions), len(self.actions) + len(counts)), counts)
        b["frame"][rows] = batch.frames
        tasks = np.asarray(batch.tasks, dtype=np.int64)
        b["task"][rows] = np.repeat(tasks, counts)
        first = np.repeat(np.asarray(batch.frame_start, np.float64), counts)
        length = np.repeat(np.asarray(batch.frame_end, np.float64) - batch.frame_start + 1, counts)
        b["phase"][rows] = (batch.frames - first) / length
        b["_effector_rotations"][rows] = batch.effector_rotations
        if "bridges" in b:
            b["bridges"][rows] = self.skeleton.bridges
            b["offsets"][rows] = self.skeleton.offsets
            for a in np.where(moving)[0]:
                r0, r1 = int(batch.starts[a]), int(batch.starts[a + 1])
                b["bridges"][self._count + r0:self._count + r1] = batch.bridges[r0:r1]
                b["offsets"][self._count + r0:self._count + r1] = batch.offsets[r0:r1]
        self._count += n
        for a, name in enumerate(batch.names):
            self.actions.append({"name": name, "frame_start": int(batch.frame_start[a]),
                                 "frame_end": int(batch.frame_end[a]), "task": TASKS[int(tasks[a])],
                                 "samples": int(counts[a]), "moving_links": bool(moving[a])})

    def feature_spec(self):
        mean = self._ref_sums / self._count
        return FeatureSpec(orthonormalize(mean[:5]), orthonormalize(mean[5]))

    def finish(self, extra_meta=None, spec=None):
        """The Dataset; the inputs are built once the references are known (`spec`: given ones, e.g. those of a
        model the training starts from, instead of the rows' mean orientations)."""
        if not self.actions:
            raise ValueError("no actions were added")
        spec = spec or self.feature_spec()
        n = self._count
        arrays = {name: buf[:n] for name, buf in self._buffers.items()}
        effector_rotations = arrays.pop("_effector_rotations")
        chunk = 65536     # the inputs are row-wise: build them in large chunks, straight into their rows
        for start in range(0, n, chunk):
            rows = slice(start, min(n, start + chunk))
            training_inputs(
                spec, arrays["positions"][rows], effector_rotations[rows], arrays["hips_rotation"][rows],
                arrays["ground"][rows], arrays["contacts"][rows], arrays["phase"][rows], arrays["task"][rows],
                out=arrays["inputs"][rows])
        skel = self.skeleton
        arrays["role_mask"] = skel.role_mask
        arrays["action_names"] = np.array([a["name"] for a in self.actions], dtype=str)
        meta = {
            "kind": KIND, "layout_version": DATASET_LAYOUT_VERSION, "input_layout_version": LAYOUT_VERSION,
            "skeleton": skel.to_json(), "feature_spec": spec.to_json(), "fps": float(self.fps),
            "actions": list(self.actions), "units": "m", "source": self.source,
            "rig_height": skel.height, "roles": list(ROLES),
        }
        meta.update(extra_meta or {})
        self._buffers, self.actions, self._count = None, [], 0
        return Dataset(arrays, meta, skel, spec)
