"""Starter motion: compact motion capture that ships inside the extension and retargets onto any mapped rig, so a
character with no clips of its own can still be trained (Train Starter Model). Pure NumPy.

What is stored is one source skeleton's motion in the form the retarget reads (data/retarget.py): per frame the
character-space orientation of each role's *joint frame* (the bone's orientation times its rest orientation's
transpose: the importer's rest roll of end bones, which differs between BVH files, drops out), the hips' position,
and that skeleton's Calibration in the same joint frames. Carrying it onto a rig is then `retarget.retarget` against
the rig's own calibration: the retarget Import BVH Folder › Onto Active Armature runs for a file of that skeleton
(here the skeleton's calibration is pooled over every file, not over eight).

The file (`weights/starter_motion.npz`, written by scripts/make_starter_motion.py) holds the orientations as int16
quaternions (1/32767 per component: under 0.01 degrees), the hips in float32 metres, and JSON metadata with the clip
names, descriptions, tasks, frame rate and credit. It is read with allow_pickle=False and checked before use.
"""

from dataclasses import dataclass

import numpy as np

from ..geometry.rotations import quaternion_to_matrix
from ..skeleton.roles import NUM_ROLES, TASKS
from . import retarget as core
from .files import FileRefused, load_npz, save_npz

KIND = "neural_ik.starter_motion"
LAYOUT_VERSION = 1
QUANT = 32767.0
LIFT_FRAMES = 4000          # frames (spread over every clip) that measure how far to lift the hips onto a rig


@dataclass
class StarterMotion:
    calibration: core.Calibration   # the source skeleton's, in joint frames (rest rotations identity)
    fps: float
    names: list                     # clip names
    starts: np.ndarray              # (C + 1,) row offsets of each clip
    quaternions: np.ndarray         # (N, 23, 4) joint-frame orientations, w first (identity where unmapped)
    hips: np.ndarray                # (N, 3) hips position, character space, metres
    tasks: list                     # task name per clip (skeleton/roles.py TASKS)
    descriptions: list              # what each clip is, in words
    credit: str = ""

    def __len__(self):
        return len(self.names)

    @property
    def frame_count(self):
        return int(self.starts[-1])

    @classmethod
    def from_clips(cls, calibration, fps, clips, credit=""):
        """clips: [(name, description, task, joint-frame orientations as quaternions (F, 23, 4), hips (F, 3))]."""
        quats = [_continuous(q) for _, _, _, q, _ in clips]
        counts = [len(q) for q in quats]
        return cls(calibration, float(fps), [c[0] for c in clips], np.concatenate([[0], np.cumsum(counts)]),
                   np.concatenate(quats), np.concatenate([np.asarray(c[4], np.float64) for c in clips]),
                   [c[2] for c in clips], [c[1] for c in clips], credit)

    def save(self, path):
        cal = self.calibration
        arrays = {"quaternions": np.round(np.clip(self.quaternions, -1, 1) * QUANT).astype(np.int16),
                  "hips": self.hips.astype(np.float32), "starts": np.asarray(self.starts, np.int64),
                  "mask": np.asarray(cal.mask, bool), "frames": cal.frames.astype(np.float64),
                  "rest_positions": cal.rest_positions.astype(np.float64)}
        meta = {"kind": KIND, "layout_version": LAYOUT_VERSION, "fps": self.fps, "names": list(self.names),
                "tasks": list(self.tasks), "descriptions": list(self.descriptions), "credit": self.credit,
                "leg_length": float(cal.leg_length),
                "planted_height": None if cal.planted_height is None else float(cal.planted_height)}
        save_npz(path, arrays, meta)

    @classmethod
    def load(cls, path):
        """Read and check a starter motion file; raises FileRefused saying what is wrong."""
        meta, a = load_npz(path, KIND, required=["quaternions", "hips", "starts", "mask", "frames", "rest_positions"])
        if meta.get("layout_version") != LAYOUT_VERSION:
            raise FileRefused(f"{path} has starter motion layout {meta.get('layout_version')}, this version reads "
                              f"{LAYOUT_VERSION}")
        q, hips, starts = a["quaternions"], a["hips"], np.asarray(a["starts"], np.int64)
        names = list(meta.get("names", []))
        n = len(q)
        ok = (q.dtype == np.int16 and q.ndim == 3 and q.shape[1:] == (NUM_ROLES, 4) and hips.shape == (n, 3)
              and a["mask"].shape == (NUM_ROLES,) and a["frames"].shape == (NUM_ROLES, 3, 3)
              and a["rest_positions"].shape == (NUM_ROLES, 3) and len(starts) == len(names) + 1 and len(names) > 0
              and starts[0] == 0 and starts[-1] == n and np.all(np.diff(starts) > 0)
              and len(meta.get("tasks", [])) == len(names) and len(meta.get("descriptions", [])) == len(names))
        if not ok:
            raise FileRefused(f"{path} is not a usable starter motion file (its arrays do not fit together)")
        fps, leg = meta.get("fps"), meta.get("leg_length")
        finite = all(np.all(np.isfinite(x)) for x in (hips, a["frames"], a["rest_positions"]))
        if not (finite and isinstance(fps, (int, float)) and fps > 0 and isinstance(leg, (int, float)) and leg > 0):
            raise FileRefused(f"{path} holds non-finite or impossible numbers")
        quats = q.astype(np.float64) / QUANT
        quats /= np.maximum(np.linalg.norm(quats, axis=-1, keepdims=True), 1e-9)
        mask = np.asarray(a["mask"], bool)
        cal = core.Calibration(mask, np.asarray(a["frames"], np.float64),
                               np.broadcast_to(np.eye(3), (NUM_ROLES, 3, 3)).copy(),
                               np.asarray(a["rest_positions"], np.float64), float(leg), meta.get("planted_height"))
        return cls(cal, float(fps), names, starts, quats, np.asarray(hips, np.float64), list(meta["tasks"]),
                   list(meta["descriptions"]), str(meta.get("credit", "")))

    def clip(self, i, fps=None):
        """(joint-frame orientations (F, 23, 3, 3), hips (F, 3)) of clip i, resampled to `fps` when given (the
        clip's duration kept; orientations interpolated along the shorter arc, the hips linearly)."""
        rows = slice(int(self.starts[i]), int(self.starts[i + 1]))
        q, hips = self.quaternions[rows], self.hips[rows]
        if fps is not None and abs(fps - self.fps) > 1e-6 * self.fps:
            q, hips = resample(q, hips, self.fps, fps)
        return quaternion_to_matrix(q), hips

    def lift_onto(self, target):
        """Metres to raise the hips by so the target's planted ankles stand where its own motion puts them
        (retarget.lift, measured over frames spread across every clip)."""
        rows = np.linspace(0, self.frame_count - 1, min(LIFT_FRAMES, self.frame_count)).astype(np.int64)
        return core.lift(self.calibration, target, quaternion_to_matrix(self.quaternions[rows]), self.hips[rows])

    def retargeted(self, target, fps):
        """Each clip carried onto a rig with Calibration `target` at `fps`: yields (index, local (F, 23, 3, 3),
        world (F, 23, 3, 3), hips (F, 3)) as retarget.retarget gives them."""
        lift = self.lift_onto(target)
        for i in range(len(self)):
            rotations, hips = self.clip(i, fps)
            yield (i, *core.retarget(self.calibration, target, rotations, hips, lift_by=lift))


    def add_to(self, builder, target, fps, taken=()):
        """Every clip carried onto a rig as rows of a DatasetBuilder (its skeleton the rig's): target is the rig's
        Calibration, whose bridges and offsets (the rig's in-between bones as its retargeted clips key them) become
        per-frame links where they are not the skeleton's rest ones. Clips are named "starter <name>" (with "+"
        added while the name is in `taken`). Returns {row action name: clip index}."""
        skel = builder.skeleton
        moving = not (np.allclose(target.bridges, skel.bridges, atol=1e-6)
                      and np.allclose(target.offsets, skel.offsets, atol=1e-6))
        names = {}
        for i, local, world, hips in self.retargeted(target, fps):
            name = f"starter {self.names[i]}"
            while name in taken or name in names:
                name += "+"
            count = len(local)
            links = {}
            if moving:
                links = {"bridges": np.broadcast_to(target.bridges, (count,) + target.bridges.shape),
                         "offsets": np.broadcast_to(target.offsets, (count,) + target.offsets.shape)}
            builder.add_action(name, np.arange(1, count + 1), 1, count, local, world, core.heads(target, world, hips),
                               world[:, 0], hips, task=TASKS.index(self.tasks[i]) if self.tasks[i] in TASKS else None,
                               **links)
            names[name] = i
        return names


def _continuous(q):
    """Quaternions (F, J, 4) with w >= 0 on the first frame and no sign flips between neighbouring frames."""
    q = np.array(q, np.float64)
    q[0] *= np.where(q[0, :, :1] < 0, -1.0, 1.0)
    flips = np.where(np.sum(q[1:] * q[:-1], axis=-1, keepdims=True) < 0, -1.0, 1.0)
    q[1:] *= np.cumprod(flips, axis=0)
    return q


def resample(q, hips, fps_from, fps_to):
    """(quaternions (F', 23, 4), hips (F', 3)) at 1/fps_to steps over the same duration as q (F, 23, 4) and hips
    (F, 3) at fps_from: normalised linear blends of sign-aligned quaternions, linear hips."""
    count = max(1, int(np.floor((len(q) - 1) * fps_to / fps_from + 1e-9)) + 1)
    t = np.arange(count) * (fps_from / fps_to)
    i0 = np.minimum(np.floor(t).astype(np.int64), len(q) - 1)
    i1 = np.minimum(i0 + 1, len(q) - 1)
    w = (t - i0)[:, None, None]
    b = q[i1] * np.where(np.sum(q[i0] * q[i1], axis=-1, keepdims=True) < 0, -1.0, 1.0)
    out = (1 - w) * q[i0] + w * b
    out /= np.linalg.norm(out, axis=-1, keepdims=True)
    return out, (1 - w[:, 0]) * hips[i0] + w[:, 0] * hips[i1]
