"""The runtime solver: target transforms in, 23 local rotations out, for K characters in one inference call.

    targets (K, 6, 4, 4) character space: the root (hips) transform, then LeftHand, RightHand, LeftFoot, RightFoot,
    Head -> features.build_inputs (the same code that built the training set) -> ONNX Runtime (IO binding: input and
    output bound once to preallocated NumPy buffers that are written in place; one intra-op thread; no RunOptions)
    or the NumPy Model when onnxruntime is missing -> local = mean_pose @ exp(delta) -> optional refinement.

A task change blends over `blend_ticks` ticks: during the blend the character gets a second row with its previous
task in the same call, and the two delta sets are mixed. Targets that are not finite, not rotations, or absurdly far
never reach the network: the character keeps its last good pose and its status says so. Pure NumPy (+onnxruntime).
"""

from dataclasses import dataclass

import numpy as np

from .features import NUM_INPUTS, build_inputs
from .refine import Refiner
from .roles import EFFECTOR_ROLES, FOOT_ROLES, NUM_ROLES
from .rotations import axis_angle_to_matrix, matrix_to_quaternion

NUM_TARGETS = 6               # root, then the five effectors
OK = 0
HELD_BAD_TARGETS = 1          # non-finite, degenerate or absurd targets: the last good pose was kept
HELD_BAD_OUTPUT = 2           # the network or refinement produced non-finite numbers: the last good pose was kept
MISSED = 4                    # refined, but an effector is more than `tolerance` from its target (out of reach)
STATUS_TEXT = {OK: "ok", HELD_BAD_TARGETS: "targets are not usable (non-finite, degenerate or absurdly far): "
               "holding the last good pose", HELD_BAD_OUTPUT: "the solve gave non-finite numbers: holding the last good pose",
               MISSED: "a target is out of reach"}
ABSURD_DISTANCE = 100.0       # rig heights from the origin of character space


def describe(status):
    """Plain words for a status bit set."""
    words = [text for bit, text in STATUS_TEXT.items() if bit and status & bit]
    return "; ".join(words) if words else "ok"


class NumpyEngine:
    """The Model itself, for machines without onnxruntime (and the reference the ONNX graph is checked against)."""
    name = "numpy"

    def __init__(self, model, capacity):
        self.model = model
        self.inputs = np.zeros((capacity, NUM_INPUTS), np.float32)
        self.outputs = np.zeros((capacity, NUM_ROLES * 3), np.float32)

    def run(self, rows):
        self.outputs[:rows] = self.model.predict_clamped(self.inputs[:rows])
        return self.outputs[:rows]


class OrtEngine:
    """ONNX Runtime with IO binding: buffers bound once per row count, written in place, no per-call allocation."""
    name = "onnxruntime"

    def __init__(self, onnx_bytes, capacity):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        self.session = ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
        self.inputs = np.zeros((capacity, NUM_INPUTS), np.float32)
        self.outputs = np.zeros((capacity, NUM_ROLES * 3), np.float32)
        self.bindings = {}

    def binding(self, rows):
        io = self.bindings.get(rows)
        if io is None:
            io = self.session.io_binding()
            io.bind_cpu_input("inputs", self.inputs[:rows])
            io.bind_output("deltas", "cpu", 0, np.float32, (rows, NUM_ROLES * 3), self.outputs[:rows].ctypes.data)
            self.bindings[rows] = io
        return io

    def run(self, rows):
        self.session.run_with_iobinding(self.binding(rows))
        return self.outputs[:rows]


def make_engine(model, onnx_bytes=None, capacity=1, engine="auto"):
    """ONNX Runtime when available (and asked for), else NumPy."""
    if engine in ("auto", "onnxruntime"):
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            if engine == "onnxruntime":
                raise
        else:
            if onnx_bytes is None:
                from .onnx_export import build_onnx

                onnx_bytes = build_onnx(model).SerializeToString()
            return OrtEngine(onnx_bytes, capacity)
    return NumpyEngine(model, capacity)


@dataclass
class SolveResult:
    local: np.ndarray          # (K, 23, 3, 3) local rotations (Blender's matrix_basis rotation per role)
    quaternions: np.ndarray    # (K, 23, 4) the same as (w, x, y, z)
    hips_rotation: np.ndarray  # (K, 3, 3) from the root target, orthonormal
    hips_position: np.ndarray  # (K, 3)
    status: np.ndarray         # (K,) bit set of OK / HELD_* / MISSED
    errors: np.ndarray         # (K, 5) effector distance to target (metres) after the solve


def clean_targets(targets, height):
    """(K, 6, 4, 4) -> (rotations (K, 6, 3, 3) orthonormal, positions (K, 6, 3), usable (K,) bool).

    Column normalisation removes an empty's uniform scale; a shear or reflection, a zero axis, non-finite numbers or a
    position more than ABSURD_DISTANCE rig heights away make the whole character unusable this tick.
    """
    t = np.asarray(targets, np.float64)
    finite = np.isfinite(t).all(axis=(1, 2, 3))
    t = np.where(finite[:, None, None, None], t, np.eye(4))
    m = t[..., :3, :3]
    norms = np.linalg.norm(m, axis=-2, keepdims=True)
    ok = finite & (norms > 1e-9).all(axis=(1, 2, 3))
    rot = m / np.maximum(norms, 1e-9)
    gram = np.swapaxes(rot, -1, -2) @ rot
    ok &= (np.abs(gram - np.eye(3)).max(axis=(1, 2, 3)) < 1e-3) & (np.linalg.det(rot).min(axis=1) > 0)
    pos = t[..., :3, 3]
    ok &= np.abs(pos).max(axis=(1, 2)) < ABSURD_DISTANCE * height
    return rot, pos, ok


class Solver:
    """Solves K characters of one model per call; keeps each character's last good pose and task blend."""

    def __init__(self, model, onnx_bytes=None, characters=1, engine="auto", blend_ticks=8, tolerance=1e-3):
        self.model = model
        self.skeleton = model.skeleton
        self.k = characters
        self.engine = make_engine(model, onnx_bytes, capacity=2 * characters, engine=engine)
        self.refiner = Refiner(model.skeleton, model.mean_pose, model.limit_low, model.limit_high)
        self.spec = model.feature_spec
        self.height = model.skeleton.height
        self.blend_ticks = max(1, int(blend_ticks))
        self.tolerance = tolerance
        self.mean_pose = np.asarray(model.mean_pose, np.float64)
        mask = model.skeleton.role_mask
        self.mask = mask
        start = np.where(mask[:, None, None], self.mean_pose, np.eye(3))
        self.last_local = np.broadcast_to(start, (characters, NUM_ROLES, 3, 3)).copy()
        self.has_good = np.zeros(characters, bool)   # False until a character's first usable tick
        self.last_hips = (np.broadcast_to(np.eye(3), (characters, 3, 3)).copy(), np.zeros((characters, 3)))
        self.task = np.zeros(characters, np.int64)
        self.previous_task = np.zeros(characters, np.int64)
        self.blend = np.ones(characters)
        self.started = False
        rest = model.skeleton.rest_positions
        feet = rest[list(FOOT_ROLES), 2]
        self.ankle_height = float(np.min(feet) - np.min(rest[mask, 2])) if mask.any() else 0.0
        self.previous_feet = None
        self.positions = np.zeros((characters, NUM_ROLES, 3))
        self.rotations = np.broadcast_to(np.eye(3), (characters, NUM_ROLES, 3, 3)).copy()

    @property
    def engine_name(self):
        return self.engine.name

    def set_task(self, task):
        """Start blending from each character's current task to `task` (K,) where it changes."""
        task = np.broadcast_to(np.asarray(task, np.int64), (self.k,))
        changed = task != self.task
        if not self.started:
            self.task[:] = task
            return
        self.previous_task = np.where(changed, self.task, self.previous_task)
        self.blend = np.where(changed, 0.0, self.blend)
        self.task = task.copy()

    def contacts(self, foot_positions, ground, dt):
        """Contact flags (K, 2) as in training: the ankle low above the ground and moving slowly."""
        low = foot_positions[..., 2] - ground < self.ankle_height + 0.08 * self.height
        if self.previous_feet is None or dt <= 0:
            slow = np.ones_like(low)
        else:
            slow = np.linalg.norm(foot_positions - self.previous_feet, axis=-1) / dt < 0.6 * self.height
        self.previous_feet = foot_positions.copy()
        return (low & slow).astype(np.float64)

    def solve(self, targets, ground=0.0, desired_contact=1.0, task=None, phase=0.0, refine_iterations=0, dt=1 / 60,
              contact=None):
        """One tick for K characters. targets (K, 6, 4, 4) character space; ground, desired_contact (K, 2) or
        scalars; task (K,) indices (None: unchanged); phase (K,) or scalar in [0, 1); contact (K, 2) overrides the
        contact flags detected from the feet (a bake passes the source clip's own)."""
        k = self.k
        if task is not None:
            self.set_task(task)
        self.started = True
        rot, pos, usable = clean_targets(targets, self.height)
        ground = np.broadcast_to(np.asarray(ground, np.float64), (k, 2))
        desired = np.broadcast_to(np.asarray(desired_contact, np.float64), (k, 2))
        phase = np.broadcast_to(np.asarray(phase, np.float64), (k,))
        effectors = list(EFFECTOR_ROLES)
        self.positions[:, 0], self.rotations[:, 0] = pos[:, 0], rot[:, 0]
        self.positions[:, effectors], self.rotations[:, effectors] = pos[:, 1:], rot[:, 1:]
        # the thighs are only read for the heading: they follow from the hips transform and the rest offsets
        for thigh in (15, 19):
            self.positions[:, thigh] = pos[:, 0] + rot[:, 0] @ self.skeleton.offsets[thigh]
        detected = self.contacts(pos[:, 3:5], ground, dt)
        contact = detected if contact is None else np.broadcast_to(np.asarray(contact, np.float64), (k, 2))
        blending = np.where(self.blend < 1.0)[0]
        rows = k + len(blending)
        build = lambda sel, tasks: build_inputs(self.spec, self.positions[sel], self.rotations[sel], rot[sel, 0],
                                                ground[sel], contact[sel], desired[sel], phase[sel], tasks)
        self.engine.inputs[:k] = build(slice(None), self.task)
        if len(blending):
            self.engine.inputs[k:rows] = build(blending, self.previous_task[blending])
        out = self.engine.run(rows).astype(np.float64)
        deltas = out[:k].copy()
        if len(blending):
            w = self.blend[blending, None]
            deltas[blending] = w * deltas[blending] + (1 - w) * out[k:rows]
            self.blend[blending] = np.minimum(1.0, self.blend[blending] + 1.0 / self.blend_ticks)
        local = self.mean_pose[None] @ axis_angle_to_matrix(deltas.reshape(k, NUM_ROLES, 3))
        local[:, ~self.mask] = np.eye(3)
        status = np.zeros(k, np.int64)
        if refine_iterations > 0:
            local, _pose, errors = self.refiner.refine(local, rot[:, 0], pos[:, 0], pos[:, 1:], rot[:, 1:],
                                                       iterations=refine_iterations)
        else:
            pose = self.refiner.forward(local, rot[:, 0], pos[:, 0])
            errors = np.linalg.norm(pose.positions[:, effectors] - pos[:, 1:], axis=-1)
        good = usable & np.isfinite(local).all(axis=(1, 2, 3)) & np.isfinite(errors).all(axis=1)
        status[~usable] |= HELD_BAD_TARGETS
        status[usable & ~good] |= HELD_BAD_OUTPUT
        if refine_iterations > 0:
            status[good & (errors.max(axis=1) > self.tolerance)] |= MISSED
        local = np.where(good[:, None, None, None], local, self.last_local)
        hips_rotation = np.where(good[:, None, None], rot[:, 0], self.last_hips[0])
        hips_position = np.where(good[:, None], pos[:, 0], self.last_hips[1])
        self.last_local[good] = local[good]
        self.has_good |= good
        self.last_hips[0][good], self.last_hips[1][good] = hips_rotation[good], hips_position[good]
        errors = np.where(good[:, None], errors, np.nan)
        return SolveResult(local, matrix_to_quaternion(local), hips_rotation, hips_position, status, errors)
