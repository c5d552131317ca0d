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

from .features import NUM_INPUTS
from .refine import Refiner
from .roles import EFFECTOR_ROLES, FOOT_ROLES, NUM_ROLES, TASKS
from .rotations import axis_angle_to_matrix

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


_POSITION_COLUMNS = np.array([6 * k + a for k in range(5) for a in range(3)])
_ROTATION_COLUMNS = _POSITION_COLUMNS + 3


def fast_matrix_to_quaternion(R):
    """(..., 3, 3) rotations -> (..., 4) (w, x, y, z), w >= 0: the copysign form, a handful of array operations."""
    m00, m11, m22 = R[..., 0, 0], R[..., 1, 1], R[..., 2, 2]
    q = np.empty(R.shape[:-2] + (4,))
    q[..., 0] = 1 + m00 + m11 + m22
    q[..., 1] = 1 + m00 - m11 - m22
    q[..., 2] = 1 - m00 + m11 - m22
    q[..., 3] = 1 - m00 - m11 + m22
    np.sqrt(np.maximum(q, 0.0, out=q), out=q)
    q *= 0.5
    q[..., 1] = np.copysign(q[..., 1], R[..., 2, 1] - R[..., 1, 2])
    q[..., 2] = np.copysign(q[..., 2], R[..., 0, 2] - R[..., 2, 0])
    q[..., 3] = np.copysign(q[..., 3], R[..., 1, 0] - R[..., 0, 1])
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    return q


class InputBuilder:
    """features.build_inputs specialised for run time (the thighs follow from the hips transform): the same
    numbers in a few array operations. tests/test_solver.py checks it against build_inputs."""

    def __init__(self, skeleton, spec):
        from .roles import ROLE_INDEX

        self.spec = spec
        self.lateral = skeleton.offsets[ROLE_INDEX["LeftThigh"]] - skeleton.offsets[ROLE_INDEX["RightThigh"]]
        self.reference_t = np.swapaxes(np.asarray(spec.effector_reference, np.float64), -1, -2)[None]
        self.hips_reference_t = np.asarray(spec.hips_reference, np.float64).T

    def __call__(self, out, rot, pos, ground, contact, desired, phase, task):
        """Fill out (K, 50) from targets rot (K, 6, 3, 3), pos (K, 6, 3) and the per-character settings."""
        from .rotations import matrix_to_axis_angle

        k = len(rot)
        hips_R, hips_p = rot[:, 0], pos[:, 0]
        lateral = hips_R @ self.lateral
        fallback = hips_R[:, :, 0]
        length = np.hypot(lateral[:, 0], lateral[:, 1])
        use = length > 1e-6
        fb_len = np.maximum(np.hypot(fallback[:, 0], fallback[:, 1]), 1e-9)
        cx = np.where(use, lateral[:, 0] / np.maximum(length, 1e-12), fallback[:, 0] / fb_len)
        sx = np.where(use, lateral[:, 1] / np.maximum(length, 1e-12), fallback[:, 1] / fb_len)
        Rt = np.zeros((k, 3, 3))
        Rt[:, 0, 0] = cx
        Rt[:, 0, 1] = sx
        Rt[:, 1, 0] = -sx
        Rt[:, 1, 1] = cx
        Rt[:, 2, 2] = 1.0
        rel = (Rt[:, None] @ (pos[:, 1:] - hips_p[:, None])[..., None])[..., 0]
        out[:, _POSITION_COLUMNS] = rel.reshape(k, 15)
        A = self.reference_t @ (Rt[:, None] @ rot[:, 1:])
        c = 0.5 * (A[..., 0, 0] + A[..., 1, 1] + A[..., 2, 2] - 1.0)
        if np.any(c < -0.999):            # near a half turn: the careful conversion
            aa = matrix_to_axis_angle(A)
        else:
            v = np.stack([A[..., 2, 1] - A[..., 1, 2], A[..., 0, 2] - A[..., 2, 0], A[..., 1, 0] - A[..., 0, 1]], -1)
            sin = 0.5 * np.linalg.norm(v, axis=-1)
            angle = np.arctan2(sin, c)
            aa = v * np.where(sin > 1e-9, angle / (2 * np.maximum(sin, 1e-300)), 0.5)[..., None]
        out[:, _ROTATION_COLUMNS] = aa.reshape(k, 15)
        hips_rel = Rt @ hips_R @ self.hips_reference_t
        out[:, 30:33] = hips_rel[:, :, 1]
        out[:, 33:36] = hips_rel[:, :, 2]
        out[:, [36, 42]] = pos[:, 3:5, 2] - ground
        out[:, [37, 38, 43, 44]] = 0.0
        out[:, [39, 45]] = 1.0
        out[:, [40, 46]] = contact
        out[:, [41, 47]] = desired
        out[:, 48] = phase
        out[:, 49] = np.asarray(task, np.float64) / (len(TASKS) - 1)
        return out


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
        self.build_inputs = InputBuilder(model.skeleton, model.feature_spec)
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
              contact=None, measure_errors=True):
        """One tick for K characters. targets (K, 6, 4, 4) character space; ground, desired_contact (K, 2) or
        scalars; task (K,) indices (None: unchanged); phase (K,) or scalar in [0, 1); contact (K, 2) overrides the
        contact flags detected from the feet (a bake passes the source clip's own). Without refinement the effector
        errors need one more FK pass: measure_errors=False skips it (errors are then NaN)."""
        k = self.k
        if task is not None:
            self.set_task(task)
        self.started = True
        rot, pos, usable = clean_targets(targets, self.height)
        ground = np.broadcast_to(np.asarray(ground, np.float64), (k, 2))
        desired = np.broadcast_to(np.asarray(desired_contact, np.float64), (k, 2))
        phase = np.broadcast_to(np.asarray(phase, np.float64), (k,))
        effectors = list(EFFECTOR_ROLES)
        detected = self.contacts(pos[:, 3:5], ground, dt)
        contact = detected if contact is None else np.broadcast_to(np.asarray(contact, np.float64), (k, 2))
        blending = np.where(self.blend < 1.0)[0]
        rows = k + len(blending)
        self.build_inputs(self.engine.inputs[:k], rot, pos, ground, contact, desired, phase, self.task)
        if len(blending):
            b = blending
            self.build_inputs(self.engine.inputs[k:rows], rot[b], pos[b], ground[b], contact[b], desired[b], phase[b],
                              self.previous_task[b])
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
        elif measure_errors:
            pose = self.refiner.forward(local, rot[:, 0], pos[:, 0])
            errors = np.linalg.norm(pose.positions[:, effectors] - pos[:, 1:], axis=-1)
        else:
            errors = np.full((k, 5), np.nan)
        good = usable & np.isfinite(local).all(axis=(1, 2, 3))
        if refine_iterations > 0 or measure_errors:
            good &= np.isfinite(errors).all(axis=1)
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
        return SolveResult(local, fast_matrix_to_quaternion(local), hips_rotation, hips_position, status, errors)
