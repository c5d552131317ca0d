"""The runtime solver: target transforms in, 23 local rotations out, for K characters in one inference call.

    targets (K, 6, 4, 4) character space: the root (hips) transform, then LeftHand, RightHand, LeftFoot, RightFoot,
    Head -> features.build_inputs (the same code that built the training set) -> ONNX Runtime (IO binding: input and
    output bound once to preallocated NumPy buffers that are written in place; one intra-op thread; no RunOptions)
    or the NumPy Model when onnxruntime is missing -> local = mean_pose @ exp(delta) -> optional refinement.

Unmapped in-between bones off their rest pose (CMU's CC_Base_Pelvis between the Hips role and the thighs) change the
bridges/offsets FK needs (and the thigh axis the heading comes from): `links` gives them, one set for every character
(a live session: the armature's pose at start, built into the constants - run-time graph included - so a tick costs the
same) or one per character (a bake of a clip whose pelvis moves: the NumPy path, since graph constants cannot differ
per row); see resolve_links.

A task change blends over `blend_ticks` ticks: during the blend the character gets a second row with its previous
task in the same call, and the two delta sets are mixed. Targets that are not finite, not rotations, or absurdly far
never reach the network: the character keeps its last good pose and its status says so. Pure NumPy (+onnxruntime).
"""

import math
from dataclasses import replace

import numpy as np

from ..data.features import NUM_INPUTS
from ..geometry.quaternion_math import (
    SKEW,
    exp_quaternions,
    left_matrices,
    quaternions_to_matrices,
)
from ..geometry.rotations import matrix_to_quaternion
from ..ik.refine import Refiner
from ..ik.refine_memory import RefineMemory
from ..ik.swivel import ArmSwivel
from ..ik.twist import EndTwist
from ..skeleton.roles import FOOT_ROLES, NUM_ROLES, TASKS
from .engines import make_engine
from .inputs import ABSURD_DISTANCE, NUM_TARGETS, InputBuilder
from .runtime_graph import RuntimeEngine
from .status import HELD_BAD_OUTPUT, HELD_BAD_TARGETS, MISSED, OK

LINK_TOLERANCE = 1e-7        # bridges/offsets entries closer than this count as equal (rest defaults, frame to frame)


def resolve_links(skeleton, links, k):
    """(skeleton, per-character (bridges, offsets) or None) for a Solver of k characters.

    links: None (the skeleton's rest bridges/offsets hold), one set ((23, 3, 3), (23, 3)) for every character (a live
    session: in-between bones held in the armature's current pose), or one per character ((K, 23, 3, 3), (K, 23, 3):
    a bake of a clip whose in-between bones move). A set shared by everyone goes into a copy of the skeleton, so the
    constant matrices (input builder, run-time graph, refiner) are simply built from it and a tick costs the same;
    one equal to the rest's changes nothing."""
    if links is None:
        return skeleton, None
    bridges, offsets = (np.asarray(a, np.float64) for a in links)
    if bridges.shape[-3:] != (NUM_ROLES, 3, 3) or offsets.shape[-2:] != (NUM_ROLES, 3):
        raise ValueError(f"bridges/offsets must be (..., {NUM_ROLES}, 3, 3) and (..., {NUM_ROLES}, 3)")
    if bridges.ndim == 4:
        if len(bridges) != k or len(offsets) != k:
            raise ValueError(f"per-character bridges/offsets need {k} rows, got {len(bridges)} and {len(offsets)}")
        if (np.abs(bridges - bridges[:1]).max(initial=0.0) > LINK_TOLERANCE
                or np.abs(offsets - offsets[:1]).max(initial=0.0) > LINK_TOLERANCE):
            return skeleton, (bridges, offsets)
        bridges, offsets = bridges[0], offsets[0]
    if (np.abs(bridges - skeleton.bridges).max() <= LINK_TOLERANCE
            and np.abs(offsets - skeleton.offsets).max() <= LINK_TOLERANCE):
        return skeleton, None
    return replace(skeleton, bridges=bridges, offsets=offsets), None


def planted_ankle_height(model):
    """The ankle's height above the ground when its foot is planted: the model's training data's (both feet's mean),
    or, for a model saved before it was kept, the rest pose's ankle above its lowest mapped joint (0 on a rig whose
    rest pose has no toes or sole below the ankle, where a planted mocap ankle sits about 12 cm up)."""
    if model.feature_spec.contact_height is not None:
        return float(np.mean(model.feature_spec.contact_height))
    rest, mask = model.skeleton.rest_positions, model.skeleton.role_mask
    return float(np.min(rest[list(FOOT_ROLES), 2]) - np.min(rest[mask, 2])) if mask.any() else 0.0


class SolveResult:
    """One solve of K characters; owns its arrays. `local` (K, 23, 3, 3) is made from the quaternions on demand."""

    def __init__(self, quaternions, hips_rotation, hips_position, status, errors):
        self.quaternions = quaternions    # (K, 23, 4) local rotations (w, x, y, z); identity where the rig lacks the role
        self.hips_rotation = hips_rotation  # (K, 3, 3) from the root target, orthonormal
        self.hips_position = hips_position  # (K, 3)
        self.status = status              # (K,) bit set of OK / HELD_* / MISSED
        self.errors = errors              # (K, 5) effector distance to target (metres) after the solve; NaN if not measured
        self._local = None

    @property
    def local(self):
        """(K, 23, 3, 3) local rotations (Blender's matrix_basis rotation per role)."""
        if self._local is None:
            self._local = quaternions_to_matrices(self.quaternions)
        return self._local


ROTATION_TOLERANCE = 2e-3     # |c0 x c1 - c2| of a target's normalised rotation columns: orthonormal, right-handed
_AFFINE_ROW = np.array([0.0, 0.0, 0.0, 1.0])


class Solver:
    """Solves K characters of one model per call; keeps each character's last good pose and task blend.

    Every buffer is allocated once for K characters, so a tick is a fixed, short list of whole-array calls:
    normalise and check the targets, the input builder, one inference call, q = q_mean * exp(delta) as one product
    with the mean pose's quaternion matrices, and (when asked) the refiner's closed form. `step()` leaves its results
    in `q`, `hips`, `status` and `errors`; `solve()` wraps the same in a SolveResult that owns copies.
    """

    def __init__(self, model, onnx_bytes=None, characters=1, engine="auto", blend_ticks=8, tolerance=1e-3,
                 runtime_graph=True, links=None, pose_layout=None, hips_map=None, sequence=False):
        """links: the bridges and offsets FK needs where unmapped in-between bones (CMU's CC_Base_Pelvis) are off
        their rest pose - one set for every character, or one per character (see resolve_links); None: rest.
        pose_layout: (bone count, pose-bone indices, their roles, the hips' index or None) of rigs that share one
        bone layout: the run-time graph then also gives their whole rotation_quaternion buffers (runtime.pose).
        hips_map: the characters' shared map of the root target to the hips' matrix_basis (live.LiveCharacter.hips_map),
        for the run-time graph's hips outputs. sequence: the K rows are frames of one character in order (Bake): the
        refinement's memory (refine_memory.py) runs through them one after another, as live ticks would."""
        self.model = model
        self.k = k = characters
        skeleton, per_character = resolve_links(model.skeleton, links, k)
        self.skeleton = skeleton             # the model's, or a copy holding the shared links
        self.per_character_links = per_character is not None
        self.engine = make_engine(model, onnx_bytes, capacity=2 * characters, engine=engine)
        self.build_inputs = InputBuilder(skeleton, model.feature_spec)
        self.runtime = None
        if self.engine.name == "onnxruntime" and runtime_graph and per_character is None:
            self.runtime = RuntimeEngine(model, self.build_inputs, model.skeleton.height, k, pose_layout=pose_layout,
                                         hips_map=hips_map)
        self.fallbacks = 0                   # ticks the run-time graph handed back to the careful NumPy path
        self.used_runtime = False            # whether the last step's results came from the run-time graph
        self.refiner = Refiner(skeleton, model.mean_pose, model.limit_low, model.limit_high)
        if per_character is not None:        # the graph's constants cannot differ per row: the NumPy path takes these
            self.build_inputs.set_laterals(per_character[1])
            self.refiner.set_links(*per_character)
        self.memory = RefineMemory.for_refiner(self.refiner, k, sequence)     # what refinement carries over
        self.height = model.skeleton.height
        self.blend_ticks = max(1, int(blend_ticks))
        self.tolerance = tolerance
        self.mean_pose = np.asarray(model.mean_pose, np.float64)
        mask = model.skeleton.role_mask
        self.mask = mask
        mean_q = matrix_to_quaternion(self.mean_pose)
        self.mean_left = np.where(mask[:, None, None], left_matrices(mean_q), 0.0)
        self.unmapped_bias = np.where(mask[:, None], 0.0, np.array([1.0, 0.0, 0.0, 0.0]))
        self.any_unmapped = not mask.all()
        self.swivel = ArmSwivel(skeleton, mean_q, model.limit_low, model.limit_high, self.refiner.slot_of)
        self.twist = EndTwist(skeleton, mean_q, model.limit_low, model.limit_high)
        start = np.where(mask[:, None], mean_q, np.array([1.0, 0.0, 0.0, 0.0]))
        self._last_q = np.broadcast_to(start, (k, NUM_ROLES, 4)).copy()
        self.has_good = np.zeros(k, bool)   # False until a character's first usable tick
        self.all_had_good = False
        self._last_hips = np.broadcast_to(np.eye(4), (k, 4, 4)).copy()
        self.pending = None                 # the run-time binding whose results are the latest good pose, not yet copied
        self.status_set = False             # whether status may hold bits (the graph's fast path skips clearing it)
        self.task = np.zeros(k, np.int64)
        self.previous_task = np.zeros(k, np.int64)
        self.blend = np.ones(k)
        self.blending = False               # any character mid task blend
        self.started = False
        self.ankle_height = planted_ankle_height(model)
        self.contact_lift = self.ankle_height + 0.08 * self.height     # a foot below its ground + this: in contact
        # buffers
        self.input_buffers = self.build_inputs.buffers(k)
        x = self.input_buffers[0]
        self.normalised = x[:, :96].reshape(k, NUM_TARGETS, 4, 4)     # targets with unit rotation columns (a view)
        self.settings = x[:, 96:]                                       # -ground, contact, desired, phase, task code
        self.norms = np.ones((k, NUM_TARGETS, 1, 4))
        self.check = np.empty((k, NUM_TARGETS, 10))
        self.position_scale = ROTATION_TOLERANCE / (ABSURD_DISTANCE * self.height)
        self.contact_threshold = np.empty((k, 2))
        self.previous_feet = np.zeros((k, 2, 3))
        self.have_previous_feet = False
        self.half_deltas = np.empty((k, NUM_ROLES, 3))
        self.exp = np.empty((k, NUM_ROLES, 4))
        self._q = np.empty((k, NUM_ROLES, 4))
        self.status = np.zeros(k, np.int64)
        self.no_errors = np.full((k, 5), np.nan)
        self.errors = self.no_errors
        self.effector_slots = self.refiner.chain_slots[:, 3]
        self.contact_override = False
        self.step_limit_dt = None
        self.fixed_contact = None      # the contact flags last applied to the graph's limits, when all were given
        self.set_settings(0.0, 1.0, 0.0)

    @property
    def engine_name(self):
        return self.engine.name

    @property
    def hips(self):
        """(K, 4, 4) the hips transform each character was solved with (held with its pose)."""
        return self.last_hips

    # A tick through the run-time graph without refinement leaves its results in the graph's buffers (runtime.q,
    # runtime.targets; the live tick writes the rigs from them): q, last_q and last_hips are copied from there only
    # when something reads them, or before a tick the graph hands back to the NumPy path.
    def _sync(self):
        p, self.pending = self.pending, None
        np.copyto(self._q.reshape(self.k, 4 * NUM_ROLES), self.runtime.results(p)["q"])
        np.copyto(self._last_q, self._q)
        np.copyto(self._last_hips, self.runtime.targets_of(p)[:, 0])

    @property
    def q(self):
        """(K, 23, 4) local quaternions of the last step (w, x, y, z)."""
        if self.pending is not None:
            self._sync()
        return self._q

    @property
    def last_q(self):
        if self.pending is not None:
            self._sync()
        return self._last_q

    @property
    def last_hips(self):
        if self.pending is not None:
            self._sync()
        return self._last_hips

    def set_settings(self, ground=None, desired_contact=None, phase=None):
        """Per-character settings that stay until changed: ground height (K, 2), desired contact (K, 2), phase (K,)."""
        k = self.k
        rt = self.runtime
        if ground is not None:
            ground = np.broadcast_to(np.asarray(ground, np.float64), (k, 2))
            self.settings[:, 0:2] = -ground
            self.contact_threshold[:] = ground + self.contact_lift
            if rt is not None:
                rt.settings[:, 0:2] = -ground
                rt.z_limits[:] = self.contact_threshold
                self.fixed_contact = None          # forced contact flags are applied again on the next tick
        if desired_contact is not None:
            self.settings[:, 4:6] = np.broadcast_to(np.asarray(desired_contact, np.float64), (k, 2))
            if rt is not None:
                rt.settings[:, 2:4] = self.settings[:, 4:6]
        if phase is not None:
            self.settings[:, 6] = np.broadcast_to(np.asarray(phase, np.float64), (k,))
            if rt is not None:
                rt.settings[:, 4] = self.settings[:, 6]

    def set_ground_of(self, i, left, right):
        """set_settings(ground=...) for character i alone, from two floats (a live tick's feet on a ground that
        changes every frame: a few item writes instead of a few array operations)."""
        lift = self.contact_lift
        settings, threshold = self.settings[i], self.contact_threshold[i]
        settings[0], settings[1] = -left, -right
        threshold[0], threshold[1] = left + lift, right + lift
        rt = self.runtime
        if rt is not None:
            row = rt.settings[i]
            row[0], row[1] = -left, -right
            if not self.contact_override:         # forced contact flags hold the limits (see _runtime_step)
                limits = rt.z_limits[i]
                limits[0], limits[1] = left + lift, right + lift

    def set_task(self, task):
        """Start blending from each character's current task to `task` (K,) where it changes."""
        task = np.broadcast_to(np.asarray(task, np.int64), (self.k,))
        changed = task != self.task
        if not self.started:
            self.task[:] = task
        else:
            self.previous_task = np.where(changed, self.task, self.previous_task)
            self.blend = np.where(changed, 0.0, self.blend)
            self.blending = bool(self.blend.min() < 1.0)
            self.task = task.copy()
        self.settings[:, 7] = self.task / (len(TASKS) - 1)
        if self.runtime is not None:
            self.runtime.settings[:, 5] = self.settings[:, 7]

    def contacts(self, feet, dt):
        """Contact flags as in training, into the settings: the ankle low above the ground and moving slowly."""
        low = feet[..., 2] < self.contact_threshold
        previous = self.previous_feet if self.runtime is None else self.runtime.previous_feet.reshape(self.k, 2, 3)
        if self.have_previous_feet and dt > 0:
            step = feet - previous
            low &= np.einsum("kfi,kfi->kf", step, step) < (0.6 * self.height * dt) ** 2
        self.settings[:, 2:4] = low
        previous[:] = feet
        self.have_previous_feet = True

    def _normalise_and_check(self, targets):
        """Targets (K, 6, 4, 4) -> unit rotation columns in self.normalised; None when every character is usable,
        else the (K,) usable mask (unusable characters get identity targets so the rest of the tick stays finite).

        Non-finite numbers, a shear or reflection, a zero axis, a projective bottom row or a position more than
        ABSURD_DISTANCE rig heights away make a character unusable this tick (comparisons with NaN are False)."""
        k = self.k
        square = np.einsum("ktij,ktij->ktj", targets[..., :3, :3], targets[..., :3, :3])
        np.sqrt(square, out=self.norms[..., 0, :3])
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):   # NaN/inf targets: refused just below
            t = np.divide(targets, self.norms, out=self.normalised)
        chk = self.check
        cross = ((t[..., :3, 0] @ SKEW).reshape(k, NUM_TARGETS, 3, 3) @ t[..., :3, 1:2])[..., 0]
        np.subtract(cross, t[..., :3, 2], out=chk[..., :3])
        np.multiply(t[..., :3, 3], self.position_scale, out=chk[..., 3:6])
        np.subtract(t[..., 3, :], _AFFINE_ROW, out=chk[..., 6:])
        worst = np.abs(chk, out=chk).max()
        if worst < ROTATION_TOLERANCE:
            return None
        usable = chk.max(axis=(1, 2)) < ROTATION_TOLERANCE    # NaN compares False
        t[~usable] = np.eye(4)
        return usable

    def step(self, targets, ground=0.0, desired_contact=1.0, task=None, phase=0.0, refine_iterations=0, dt=1 / 60,
             contact=None, measure_errors=True, follow=None, graph=True):
        """One tick for K characters; results in self.q, self.hips, self.status, self.errors (no copies).

        targets (K, 6, 4, 4) character space; ground, desired_contact (K, 2) or scalars, phase (K,) or a scalar:
        None keeps the last value (so a live tick passes settings only when they change); task (K,) indices (None:
        unchanged); contact (K, 2) overrides the contact flags detected from the feet (a bake passes the clip's; NaN:
        detected, for the characters of a live group whose contacts are not given). follow: (5,) or (K, 5) bool,
        effectors whose target becomes where the network put them before the refinement (free targets, free_targets.py: only
        the pinned ones are made exact); the NumPy path takes such ticks. graph=False: the NumPy path even with a
        run-time graph (whose world matrices the targets given here would not be: free_targets passes its own)."""
        k = self.k
        follow = self._follow_mask(follow)
        if task is not None:
            self.set_task(task)
        elif not self.started:
            self.settings[:, 7] = self.task / (len(TASKS) - 1)
        self.started = True
        if ground is not None or desired_contact is not None or phase is not None:
            self.set_settings(ground, desired_contact, phase)
        self.used_runtime = False
        if self.runtime is not None and not self.blending and follow is None and graph:
            if self._runtime_step(targets, refine_iterations, dt, contact, measure_errors):
                self.used_runtime = True
                return
            self.fallbacks += 1
            if targets is None:
                targets = self.world_targets()
        elif targets is None:
            targets = self.world_targets()
        usable = self._normalise_and_check(np.asarray(targets, np.float64))
        t = self.normalised
        if contact is None:
            self.contacts(t[:, 3:5, :3, 3], dt)
        else:
            given = np.broadcast_to(np.asarray(contact, np.float64), (k, 2))
            free = np.isnan(given)
            if free.any():
                self.contacts(t[:, 3:5, :3, 3], dt)
                given = np.where(free, self.settings[:, 2:4], given)
            self.settings[:, 2:4] = given
        inputs = self.engine.inputs
        self.build_inputs(self.input_buffers, inputs[:k])
        rows = k
        blending = None
        if self.blending:
            blending = np.nonzero(self.blend < 1.0)[0]
            rows = k + len(blending)
            inputs[k:rows] = inputs[blending]
            inputs[k:rows, NUM_INPUTS - 1] = self.previous_task[blending] / (len(TASKS) - 1)
        out = self.engine.run(rows)
        half = self.half_deltas
        np.multiply(out[:k].reshape(k, NUM_ROLES, 3), 0.5, out=half)
        if blending is not None:
            w = self.blend[blending, None, None]
            half[blending] = w * half[blending] + (1 - w) * 0.5 * out[k:rows].reshape(-1, NUM_ROLES, 3)
            self.blend[blending] = np.minimum(1.0, self.blend[blending] + 1.0 / self.blend_ticks)
            self.blending = bool(self.blend.min() < 1.0)
        exp_quaternions(half, self.exp)
        q = self.q
        np.matmul(self.mean_left, self.exp[..., None], out=q[..., None])
        if self.any_unmapped:
            q += self.unmapped_bias
        hips = t[:, 0]
        if follow is not None:        # free effectors: the network's placement is their target
            self._follow(q, t, follow)
        if refine_iterations > 0:
            self.memory.dt = dt
            self.errors = self._refine(q, hips, t[:, 1:, :3, 3], t[:, 1:, :3, :3], refine_iterations, follow)
            check = q.sum() + self.errors.sum()
        elif measure_errors:
            world = self.refiner.chain_forward(q, hips)
            miss = world[:, self.effector_slots][..., :3, 3] - t[:, 1:, :3, 3]
            self.errors = np.sqrt(np.einsum("kei,kei->ke", miss, miss))
            check = q.sum() + self.errors.sum()
        else:
            self.errors = self.no_errors
            check = q.sum()
        status = self.status
        status.fill(OK)
        self.status_set = True
        if usable is None and np.isfinite(check):
            np.copyto(self.last_q, q)
            np.copyto(self.last_hips, hips)
            self.has_good[:] = True
            self.all_had_good = True
            if refine_iterations > 0:
                status[self.errors.max(axis=1) > self.tolerance] |= MISSED
            return
        self._hold(usable, refine_iterations > 0 or measure_errors, refine_iterations > 0)

    def _refine(self, q, hips, positions, rotations, iterations, follow=None):
        """The refinement of q (K, 23, 4) in place, then the arms' swivel (ik/swivel.py) and the ends'
        twist (ik/twist.py: hands, feet, head; both leave the effectors exact); follow: (K, 5) the free effectors
        (Refiner.refine_quaternions). Returns the effector errors (K, 5)."""
        errors = self.refiner.refine_quaternions(q, hips, positions, rotations, iterations=iterations,
                                                 memory=self.memory, follow=follow)
        if self.swivel.active:
            lines = self.refiner.last_arm_lines       # one character in mathutils: known without a forward pass
            self.swivel.settle(q, None if lines is not None else self.refiner.chain_forward(q, hips), self.memory,
                               lines)
        if self.twist.active:
            self.twist.settle(q, self.refiner.link_bridges, self.refiner.link_offsets, self.memory)
        return errors

    def _follow_mask(self, follow):
        """(K, 5) bool from step's follow ((5,) or (K, 5)), or None when no effector follows."""
        return None if follow is None or not np.any(follow) else np.broadcast_to(np.asarray(follow, bool), (self.k, 5))

    def _follow(self, q, t, follow):
        """Effectors `follow` (K, 5) of the normalised targets t take where pose q puts them from t's hips."""
        placed = self.refiner.chain_forward(q, t[:, 0])[:, self.effector_slots]
        effectors = t[:, 1:]
        effectors[follow] = placed[follow]

    def refine_again(self, targets, refine_iterations, follow=None):
        """The last step's pose refined again toward other targets (K, 6, 4, 4), in place, with no network pass:
        free_targets moves a free root after a solve. follow: as in step (those effectors ride along with the root:
        their targets are where the pose puts them from the new root). A sequence (Bake) goes through its frames'
        memory again from the first; live characters keep theirs (the pass counts as one more tick). Characters whose
        targets are unusable or whose result is not finite keep the step's pose."""
        usable = self._normalise_and_check(np.asarray(targets, np.float64))
        t = self.normalised
        q = self.q.copy()
        hips = t[:, 0]
        follow = self._follow_mask(follow)
        if follow is not None:
            self._follow(q, t, follow)
        if self.memory.sequence:
            self.memory.reset(None)
        errors = self._refine(q, hips, t[:, 1:, :3, 3], t[:, 1:, :3, :3], refine_iterations, follow)
        good = np.isfinite(q).all(axis=(1, 2)) & np.isfinite(errors).all(axis=1)
        if usable is not None:
            good &= usable
        self.q[good] = q[good]
        self.errors = np.where(good[:, None], errors, self.errors)
        self.last_q[good] = q[good]
        self.last_hips[good] = hips[good]
        missed = good & (errors.max(axis=1) > self.tolerance)
        self.status[good & ~missed] &= ~MISSED
        self.status[missed] |= MISSED

    def refine_toward(self, result, targets, refine_iterations, dt=1 / 60):
        """`result` (a solve without refinement) refined toward other targets (K, 6, 4, 4) than its network saw, as a
        new SolveResult. A bake that fits a clip to the ground or locks its feet solves the network on the clip's own
        targets (the flat ground and the motion training saw) and refines toward the edited ones, so the pose keeps
        the clip's swivels and the edit only bends what it must. Characters with unusable targets keep the result."""
        usable = self._normalise_and_check(np.asarray(targets, np.float64))
        t = self.normalised
        q = result.quaternions.copy()
        self.memory.reset(None)          # the refinement starts afresh from the network's pose, frames in order
        self.memory.dt = dt
        errors = self._refine(q, t[:, 0], t[:, 1:, :3, 3], t[:, 1:, :3, :3], refine_iterations)
        good = np.isfinite(q).all(axis=(1, 2)) & np.isfinite(errors).all(axis=1)
        if usable is not None:
            good &= usable
        q[~good] = result.quaternions[~good]
        status = result.status.copy()
        status[~good] |= HELD_BAD_TARGETS
        status[good & (errors.max(axis=1) > self.tolerance)] |= MISSED
        hips = np.where(good[:, None, None], t[:, 0], np.eye(4))
        hips[~good, :3, :3], hips[~good, :3, 3] = result.hips_rotation[~good], result.hips_position[~good]
        return SolveResult(q, hips[:, :3, :3].copy(), hips[:, :3, 3].copy(), status,
                           np.where(good[:, None], errors, result.errors))

    def world_targets(self):
        """Character-space targets (K, 6, 4, 4) from the run-time engine's world matrices (what a live tick read)."""
        rt = self.runtime
        with np.errstate(invalid="ignore", over="ignore"):   # non-finite targets are caught by the checks after this
            return rt.to_character[:, None] @ np.swapaxes(rt.world[:, 1:].astype(np.float64), -1, -2)

    def _runtime_step(self, targets, refine_iterations, dt, contact, measure_errors):
        """The tick through the run-time graph; False (nothing kept) when its checks send it to the NumPy path."""
        rt, k = self.runtime, self.k
        if targets is not None:
            np.copyto(rt.world[:, 1:], np.swapaxes(targets, -1, -2))
        if contact is not None and contact is self.fixed_contact:
            pass                                      # the same forced flags as last tick, none detected: as they are
        elif contact is not None:                     # forced flags: limits that always or never hold
            given = np.broadcast_to(np.asarray(contact, np.float64), (k, 2))
            rt.z_limits[:] = np.where(given > 0.5, np.inf, -np.inf)
            rt.step_limits[:] = np.inf
            free = np.isnan(given)                    # NaN: detected as usual
            if free.any():
                rt.z_limits[free] = self.contact_threshold[free]
                if self.have_previous_feet and dt > 0:
                    rt.step_limits[free] = (0.6 * self.height * dt) ** 2
            self.contact_override = True
            self.step_limit_dt = None
            # flags that are all given (none NaN) hold until the caller passes another array: a live tick with Lock
            # Feet passes the same one until a contact starts or ends (LiveGroup.play)
            self.fixed_contact = None if free.any() else contact
        else:
            self.fixed_contact = None
            if self.contact_override:
                rt.z_limits[:] = self.contact_threshold
                self.contact_override = False
            if dt != self.step_limit_dt:
                rt.step_limits[:] = (0.6 * self.height * dt) ** 2 if self.have_previous_feet and dt > 0 else np.inf
                self.step_limit_dt = dt if self.have_previous_feet else None
        if not rt.run():
            if self.pending is not None:               # the last good pose is still in the other binding's buffers
                self._sync()
            return False
        self.have_previous_feet = True
        if refine_iterations <= 0 and not measure_errors:
            # finite checked targets through a finite network give finite quaternions: keep them where they are
            self.pending = rt.latest
            self.errors = self.no_errors
            if self.status_set:
                self.status.fill(OK)
                self.status_set = False
            if not self.all_had_good:
                self.has_good[:] = True
                self.all_had_good = True
            return True
        if self.pending is not None:                   # keep the previous good pose until this one is
            self._sync()
        q = self._q
        np.copyto(q.reshape(k, 4 * NUM_ROLES), rt.q)
        hips, positions, rotations = rt.latest_target_parts()
        if refine_iterations > 0:
            self.memory.dt = dt
            errors = self._refine(q, hips, positions, rotations, refine_iterations)
        else:
            miss = self.refiner.chain_forward(q, hips)[:, self.effector_slots][..., :3, 3] - positions
            errors = np.sqrt(np.einsum("kei,kei->ke", miss, miss))
        self.errors = errors
        total, worst = float(q.sum()), float(errors.max())
        if not (math.isfinite(total) and math.isfinite(worst)):     # errors are >= 0: their max finite = all finite
            return False
        np.copyto(self._last_q, q)
        np.copyto(self._last_hips, hips)
        if self.status_set:
            self.status.fill(OK)
            self.status_set = False
        if refine_iterations > 0 and worst > self.tolerance:
            self.status[errors.max(axis=1) > self.tolerance] |= MISSED
            self.status_set = True
        if not self.all_had_good:
            self.has_good[:] = True
            self.all_had_good = True
        return True

    def _hold(self, usable, errors_measured, refined):
        """Characters with unusable targets or non-finite results keep their last good pose; the others update it."""
        q, status = self.q, self.status
        usable = np.ones(self.k, bool) if usable is None else usable
        good = usable & np.isfinite(q).all(axis=(1, 2))
        if errors_measured:
            good &= np.isfinite(self.errors).all(axis=1)
        status[~usable] |= HELD_BAD_TARGETS
        status[usable & ~good] |= HELD_BAD_OUTPUT
        if refined:
            status[good & (np.nan_to_num(self.errors, nan=np.inf).max(axis=1) > self.tolerance)] |= MISSED
        q[~good] = self.last_q[~good]
        if refined and not good.all():       # what the refinement remembers of them is of no use
            self.memory.reset(None if self.memory.sequence else np.nonzero(~good)[0])
        self.last_q[good] = q[good]
        self.last_hips[good] = self.normalised[good, 0]
        self.has_good |= good
        self.errors = np.where(good[:, None], self.errors, np.nan)

    def solve(self, targets, ground=0.0, desired_contact=1.0, task=None, phase=0.0, refine_iterations=0, dt=1 / 60,
              contact=None, measure_errors=True, follow=None):
        """One tick for K characters (see step) -> SolveResult with its own copies. Without refinement the effector
        errors need one more FK pass: measure_errors=False skips it (errors are then NaN)."""
        self.step(targets, ground, desired_contact, task, phase, refine_iterations, dt, contact, measure_errors,
                  follow)
        return self.result()

    def result(self):
        """The last step's results as a SolveResult with its own copies."""
        return SolveResult(self.q.copy(), self.last_hips[:, :3, :3].copy(), self.last_hips[:, :3, 3].copy(),
                           self.status.copy(), np.array(self.errors, copy=True))
