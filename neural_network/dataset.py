"""The training set: every frame of every usable action as the arrays of docs/architecture.md, saved as .npz.

Built by streaming: a DatasetBuilder takes one action at a time (its contacts, phase and task are computed then,
and compact per-action arrays are kept), the input references are accumulated as running sums, and the arrays are
concatenated exactly once in `finish()`. Loading checks everything a later stage relies on and refuses a file with
a plain-words reason (files.FileRefused).
"""

import os
from dataclasses import dataclass, field

import numpy as np

from .features import LAYOUT_VERSION, NUM_INPUTS, FeatureSpec, build_inputs, detect_contacts, root_frame
from .files import FileRefused, load_npz, save_npz
from .roles import EFFECTOR_ROLES, FOOT_ROLES, NUM_ROLES, ROLE_INDEX, ROLES, TASKS, task_from_name
from .rotations import matrix_to_axis_angle, orthonormalize
from .skeleton import Skeleton

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
_CHAINS = (("LeftThigh", "LeftShin", "LeftFoot"), ("Spine", "Spine1", "Spine2", "NeckLower", "NeckUpper", "Head"))


def standing_height(skeleton):
    """Pose-independent rig height in metres: leg chain plus spine chain lengths (rest poses of BVH rigs are not
    standing poses, so the rest pose's vertical extent is no measure). At least 0.1."""
    mask = skeleton.role_mask
    total = 0.0
    for chain in _CHAINS:
        total += sum(float(np.linalg.norm(skeleton.offsets[ROLE_INDEX[r]])) for r in chain if mask[ROLE_INDEX[r]])
    return max(total, 0.1)


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
        }

    def summary_text(self):
        s = self.summary()
        tasks = ", ".join(f"{t} {c}" for t, c in s["frames_per_task"].items() if c)
        return (f"{s['frames']} frames from {s['actions']} actions of rig {s['rig']!r} "
                f"({s['mapped_roles']}/{NUM_ROLES} roles; {tasks})")

    def subset(self, rows):
        """A Dataset of the given rows (in order), keeping every action name and the same metadata."""
        rows = np.asarray(rows, dtype=np.int64)
        arrays = {k: (v[rows] if k in ROW_ARRAYS or k in OPTIONAL_ROW_ARRAYS else v) for k, v in self.arrays.items()}
        return Dataset(arrays, dict(self.meta), self.skeleton, self.feature_spec)

    def split_by_action(self, seed=0, val_fraction=0.1):
        """(train, validation) with whole actions on one side, so validation frames are never neighbours of training
        frames. At least one action goes to each side when there are two or more; a single action is split into its
        first and last part instead."""
        names = self.arrays["action_names"]
        action = self.arrays["action"]
        present = np.unique(action)
        if len(present) < 2:
            n = len(self)
            cut = n - max(1, int(round(n * val_fraction))) if n > 1 else n
            return self.subset(np.arange(cut)), self.subset(np.arange(cut, n))
        rng = np.random.default_rng(seed)
        order = rng.permutation(present)
        frames = np.bincount(action, minlength=len(names))
        target = val_fraction * len(self)
        val, total = [], 0
        for a in order:
            if val and total + frames[a] / 2 > target:
                break
            val.append(a)
            total += frames[a]
        val = val[:len(present) - 1]
        is_val = np.isin(action, val)
        return self.subset(np.where(~is_val)[0]), self.subset(np.where(is_val)[0])

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
        mask = self.skeleton.role_mask
        positions = np.array(positions, np.float64)
        positions[:, ~mask] = np.nan
        rotations = np.asarray(rotations, np.float64)
        hips_rotation = np.asarray(hips_rotation, np.float64)
        ground = np.full((count, 2), float(ground_height))
        contacts = detect_contacts(positions[:, list(FOOT_ROLES)], ground, self.fps, standing_height(self.skeleton))
        task = task_from_name(name) if task is None else int(task)
        _, R_root = root_frame(np.nan_to_num(positions), hips_rotation)
        Rt = np.swapaxes(R_root, -1, -2)
        sums = np.stack([np.sum(Rt @ rotations[:, e], axis=0) for e in EFFECTOR_ROLES] + [np.sum(Rt @ hips_rotation, 0)])
        self._ref_sums = sums if self._ref_sums is None else self._ref_sums + sums
        local_aa = matrix_to_axis_angle(local_rotations)
        local_aa[:, ~mask] = 0.0
        self._reserve(count, bridges is not None)
        rows = slice(self._count, self._count + count)
        b = self._buffers
        b["rotations"][rows] = local_aa
        b["positions"][rows] = positions
        b["hips_rotation"][rows] = hips_rotation
        b["hips_position"][rows] = hips_position
        b["contacts"][rows] = contacts
        b["ground"][rows] = ground
        b["action"][rows] = len(self.actions)
        b["frame"][rows] = frames
        b["task"][rows] = task
        b["phase"][rows] = (frames - frame_start) / float(frame_end - frame_start + 1)
        b["_effector_rotations"][rows] = rotations[:, list(EFFECTOR_ROLES)]
        if "bridges" in b:
            b["bridges"][rows] = self.skeleton.bridges if bridges is None else bridges
            b["offsets"][rows] = self.skeleton.offsets if offsets is None else offsets
        self._count += count
        self.actions.append({"name": name, "frame_start": int(frame_start), "frame_end": int(frame_end),
                             "task": TASKS[task], "samples": count, "moving_links": bridges is not None})

    def feature_spec(self):
        mean = self._ref_sums / self._count
        return FeatureSpec(orthonormalize(mean[:5]), orthonormalize(mean[5]))

    def finish(self, extra_meta=None):
        """The Dataset; the inputs are built once the references are known."""
        if not self.actions:
            raise ValueError("no actions were added")
        spec = self.feature_spec()
        n = self._count
        arrays = {name: buf[:n] for name, buf in self._buffers.items()}
        effector_rotations = arrays.pop("_effector_rotations")
        chunk = 65536     # the inputs are row-wise: build them in large chunks, straight into their rows
        for start in range(0, n, chunk):
            rows = slice(start, min(n, start + chunk))
            count = rows.stop - rows.start
            rotations = np.broadcast_to(np.eye(3), (count, NUM_ROLES, 3, 3)).copy()
            rotations[:, list(EFFECTOR_ROLES)] = effector_rotations[rows]
            arrays["inputs"][rows] = build_inputs(
                spec, np.nan_to_num(arrays["positions"][rows].astype(np.float64)), rotations,
                arrays["hips_rotation"][rows].astype(np.float64), arrays["ground"][rows], arrays["contacts"][rows],
                arrays["contacts"][rows], arrays["phase"][rows], arrays["task"][rows])
        skel = self.skeleton
        arrays["role_mask"] = skel.role_mask
        arrays["action_names"] = np.array([a["name"] for a in self.actions], dtype=str)
        meta = {
            "kind": KIND, "layout_version": DATASET_LAYOUT_VERSION, "input_layout_version": LAYOUT_VERSION,
            "skeleton": skel.to_json(), "feature_spec": spec.to_json(), "fps": float(self.fps),
            "actions": list(self.actions), "units": "m", "source": self.source,
            "rig_height": standing_height(skel), "roles": list(ROLES),
        }
        meta.update(extra_meta or {})
        self._buffers, self.actions, self._count = None, [], 0
        return Dataset(arrays, meta, skel, spec)
