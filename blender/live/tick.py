"""The live IK tick: read the target empties, solve, write the pose. Plain classes with no UI, testable headless.

One `LiveTick` drives every armature it was given: characters that share a model are solved together in one
inference call (a Solver of K characters). Per character the tick reads six world matrices (root + five effectors),
turns them into character space, solves, writes the mapped quaternion bones with one `foreach_set` on a buffer that
holds every pose bone's current rotation (so unmapped bones keep theirs) and the mapped Euler bones (a BVH import's)
with one more on the rotation_euler buffer, sets the hips location, and tags the object. It never calls
`view_layer.update()`: Blender evaluates the depsgraph itself after the timer event. With refinement on, a group of
one character refines in Blender's own math library (live/refine.py), larger groups in NumPy.

`LiveCharacter.start()` saves what live mode changes (the action assignment and every pose bone's transform) and
`stop()` puts it back, so a stopped session leaves the file as it was.
"""

import gc
import itertools
import time
from collections import deque
from operator import attrgetter

import bpy
import numpy as np

from ... import state
from ...neural_network.geometry.quaternion_math import MATRIX_TO_SQUARES, SQUARES_BIAS, squares_to_quaternions
from ...neural_network.geometry.rotations import (
    EULER_AXES,
    blender_axis_angle,
    quaternion_to_axis_angle,
    quaternions_to_compatible_euler,
)
from ...neural_network.runtime.runtime_graph import pose_columns
from ...neural_network.runtime.solver import Solver
from ...neural_network.runtime.status import OK, describe
from ...neural_network.skeleton.roles import NUM_ROLES, TASKS
from ...properties import get_bone_map
from ..errors import LiveStopped
from ..rig import control_rig, pose_read, rig_model
from .free import LiveFree
from .motion import TARGET_LABELS, TARGET_SLOTS, LiveMotion, free_flags
from .refine import MathutilsRefiner

HIPS_ROW = NUM_ROLES         # where LiveCharacter.write_other_bones puts the hips' quaternion after the roles'
_RAW_SETTINGS = attrgetter("ground_left", "ground_right", "contact_left", "contact_right", "task", "phase",
                           "phase_follows_time", "refine_iterations")


def targets_of(obj):
    """The six target empties of an armature (None where unset)."""
    return [getattr(obj.neural_ik, slot) for slot in TARGET_SLOTS]


def missing_targets(obj):
    """Labels of the pinned targets that have no empty (a free target needs none)."""
    return [label for label, t, free in zip(TARGET_LABELS, targets_of(obj), free_flags(obj)) if t is None and not free]


def playing_action(obj):
    """(action, slot) the armature plays (slot None on Blender 4.2), or None."""
    ad = obj.animation_data
    if ad is None or ad.action is None:
        return None
    return ad.action, getattr(ad, "action_slot", None)


class LiveCharacter:
    """One armature in a live session: its rig, its targets, and the buffers its pose is written from.

    follow_action: a live session's character: with an action assigned, the targets come from it at the scene's
    frame (`motion`, a motion.LiveMotion), and a target without an empty follows the action; without one, all six
    empties are needed."""

    def __init__(self, obj, rig, model, follow_action=False, links=None):
        self.obj = obj
        self.name = obj.name
        self.rig = rig
        self.model = model
        playing = playing_action(obj) if follow_action else None
        missing = missing_targets(obj)
        if missing and playing is None:
            raise LiveStopped(f"{obj.name} has no {', '.join(missing)} target: create the targets first")
        self.targets = targets_of(obj)
        # what the tick reads: the armature stands in for a missing empty (the action gives that target)
        self.read_objects = [obj] + [t if t is not None else obj for t in self.targets]
        self.motion = None
        if playing is not None:
            self.motion = LiveMotion(obj, rig, *playing, [t is not None for t in self.targets], links)
        self.panel = obj.neural_ik          # taken once, like the hips bone: each tick's read confirms obj exists
        ad = obj.animation_data             # drivers and NLA strips change settings without an update callback
        self.settings_driven = ad is not None and (len(ad.drivers) > 0 or len(ad.nla_tracks) > 0)
        pose_bones = obj.pose.bones
        self.count = len(pose_bones)
        index = {pb.name: i for i, pb in enumerate(pose_bones)}
        quaternion_roles, quaternion_bones, self.other_bones = [], [], []
        eulers = {}                                       # order -> ([pose-bone index], [role; HIPS_ROW: the hips])
        for r in range(NUM_ROLES):
            b = int(rig.role_bones[r])
            if b < 0:
                continue
            name = rig.bone_names[b]
            mode = pose_bones[name].rotation_mode
            if mode in EULER_AXES:
                bones, roles = eulers.setdefault(mode, ([], []))
                bones.append(index[name])
                roles.append(HIPS_ROW if r == 0 else r)
            elif r == 0:                                  # the hips' quaternion comes with the hips' location
                continue
            elif mode == "QUATERNION":
                quaternion_roles.append(r)
                quaternion_bones.append(index[name])
            else:
                self.other_bones.append((r, name))
        self.quaternion_roles = np.array(quaternion_roles, np.int64)
        self.quaternion_bones = np.array(quaternion_bones, np.int64)
        self.euler_groups = [(order, np.array(bones, np.int64), np.array(roles, np.int64))
                             for order, (bones, roles) in eulers.items()]
        hips_name = rig.bone_names[int(rig.role_bones[0])]
        self.hips_bone = pose_bones[hips_name]
        self.hips_index = index[hips_name]
        self.hips_is_quaternion = self.hips_bone.rotation_mode == "QUATERNION"
        self.writes_quaternions = bool(quaternion_bones) or self.hips_is_quaternion
        self.has_other_bones = bool(self.euler_groups or self.other_bones or self.hips_bone.rotation_mode == "AXIS_ANGLE")
        self.quaternions = np.empty((self.count, 4), np.float32)
        self.eulers = np.empty((self.count, 3), np.float32)
        self.extended = np.zeros((HIPS_ROW + 1, 4))          # the roles' quaternions, then the hips' (Euler input)
        self.saved = None
        self.saved_action = None
        from mathutils import Matrix

        basis = np.eye(4)
        basis[:3, :3] = rig.scale * rig.basis
        self.to_character = Matrix(basis.tolist())   # armature space -> character space
        self.to_character_np = basis
        try:                                         # a control rig (Rigify): the solve is written on its controls
            self.controls = control_rig.control_rig(obj, rig)
        except control_rig.ControlRigError as exc:
            raise LiveStopped(str(exc)) from None
        # the frame the hips' outputs are in: the hips' parent as posed now (live mode keeps that pose) for the
        # hips bone's matrix_basis, or the armature's own for a control rig (control_live takes the hips' world
        # rotation and head in armature space)
        self.frame = self._hips_frame() if self.controls is None else (np.eye(3), np.eye(3), np.zeros(3))

    def pose_buffer(self, quaternions, hips_quaternion):
        """This rig's whole rotation_quaternion buffer (flat) with the solved roles and hips put in."""
        q = self.quaternions
        q[self.quaternion_bones] = quaternions[self.quaternion_roles]
        if self.hips_is_quaternion:
            q[self.hips_index] = hips_quaternion
        return q.reshape(-1)

    # -- session start / stop ------------------------------------------------------------------------------------
    def start(self):
        """Remember the pose and action, then take the action off so it cannot overwrite the live pose."""
        pose_bones = self.obj.pose.bones
        saved = {}
        for prop, width in (("rotation_quaternion", 4), ("rotation_euler", 3), ("rotation_axis_angle", 4),
                            ("location", 3), ("scale", 3)):
            buf = np.empty(self.count * width, np.float32)
            pose_bones.foreach_get(prop, buf)
            saved[prop] = buf
        self.saved = saved
        ad = self.obj.animation_data
        if ad is not None and ad.action is not None:
            self.saved_action = (ad.action, getattr(ad, "action_slot", None))
            ad.action = None
        pose_bones.foreach_get("rotation_quaternion", self.quaternions.reshape(-1))
        pose_bones.foreach_get("rotation_euler", self.eulers.reshape(-1))
        if self.controls is not None:               # switches to FK, offsets measured on the rig as it is now
            self.controls.set_switches()
            try:
                self.controls.measure()
            except control_rig.ControlRigError as exc:
                self.stop()
                raise LiveStopped(str(exc)) from None

    def stop(self):
        """Put the pose and the action back exactly as they were before start()."""
        try:
            obj = self.obj
            obj.name  # noqa: B018  (raises ReferenceError when the armature was deleted)
        except ReferenceError:
            return
        if self.saved is not None:
            for prop, buf in self.saved.items():
                obj.pose.bones.foreach_set(prop, buf)
        if self.controls is not None:
            self.controls.restore_switches()
        if self.saved_action is not None:
            action, slot = self.saved_action
            ad = obj.animation_data_create()
            try:
                ad.action = action
                if slot is not None:
                    ad.action_slot = slot
            except ReferenceError:
                pass
        self.saved_action = None
        self.saved = None
        obj.update_tag()

    def _hips_frame(self):
        """Armature-space frame the hips' matrix_basis acts in (its parent's current pose times the rest offset)."""
        rig = self.rig
        b = int(rig.role_bones[0])
        p = int(rig.parents[b])
        if p >= 0:
            parent = np.array(self.obj.pose.bones[rig.bone_names[p]].matrix, dtype=np.float64)
            frame = parent @ np.linalg.inv(rig.rest[p]) @ rig.rest[b]
        else:
            frame = rig.rest[b].copy()
        rot = frame[:3, :3] / np.linalg.norm(frame[:3, :3], axis=0)
        return rot.T, np.linalg.inv(frame[:3, :3]), frame[:3, 3]

    # -- per tick ------------------------------------------------------------------------------------------------
    def read_targets(self, out):
        """Write the six target matrices in character space into out (6, 4, 4) (one character; Bake samples with it)."""
        try:
            to_char = self.to_character @ self.obj.matrix_world.inverted_safe()
            for k, target in enumerate(self.targets):
                if target is not None:           # a free target without an empty: the prior places it
                    out[k] = to_char @ target.matrix_world
        except ReferenceError:
            raise LiveStopped(f"a target or the armature {self.name} was deleted: live IK stopped") from None

    def settings(self, scene):
        """(ground (2,) in character space, desired contact (2,), task index, phase, phase follows time, iterations)."""
        return self.convert_settings(_RAW_SETTINGS(self.obj.neural_ik), self.obj.matrix_world)

    def raw_settings(self):
        """The panel values as they are (one C-level read of the eight): compared tick to tick, converted on change."""
        return _RAW_SETTINGS(self.panel)

    def convert_settings(self, raw, world):
        """settings() from raw_settings() and the armature's world matrix (ground heights are world Z)."""
        ground_left, ground_right, contact_left, contact_right, task, phase, follows, iterations = raw
        unit = self.rig.scale / max(world.to_scale().z, 1e-12)
        origin_z = world.translation.z
        return ((ground_left - origin_z) * unit, (ground_right - origin_z) * unit, float(contact_left),
                float(contact_right), TASKS.index(task.lower()), phase, bool(follows), iterations)

    def hips_map(self):
        """(16, 10): vec(hips transform, character space) -> 7 quaternion squares of the hips' matrix_basis rotation
        (quaternion_math.MATRIX_TO_SQUARES, bias included) and the hips' location, so one product gives both (on a
        control rig, whose frame is the armature's: the hips' world rotation and head in armature space)."""
        rot_t, frame_inv, frame_t = self.frame
        C, s = self.rig.basis, self.rig.scale
        turn = rot_t @ C.T
        M = np.zeros((16, 10))
        for u in range(16):
            probe = np.zeros(16)
            probe[u] = 1.0
            probe = probe.reshape(4, 4)
            M[u, :7] = (turn @ probe[:3, :3]).reshape(9) @ MATRIX_TO_SQUARES + SQUARES_BIAS * probe[3, 3]
            M[u, 7:] = frame_inv @ (C.T @ probe[:3, 3] / s - frame_t * probe[3, 3])
        return M

    def write_other_bones(self, quaternions, hips_quaternion):
        """The mapped bones not in quaternion mode, from the roles' local quaternions (23, 4) and the hips' matrix_basis
        quaternion (4,): Euler bones (the hips too, when Euler) with one foreach_set of the whole rotation_euler
        buffer - each bone's angles the solution nearest the ones it holds, as Blender's to_euler(order, compat), so
        nothing jumps by a turn - and axis-angle bones one by one."""
        if self.euler_groups:
            extended = self.extended
            extended[:NUM_ROLES] = quaternions
            extended[HIPS_ROW] = hips_quaternion
            eulers = self.eulers
            for order, bones, roles in self.euler_groups:
                eulers[bones] = quaternions_to_compatible_euler(extended[roles], order, eulers[bones])
            self.obj.pose.bones.foreach_set("rotation_euler", eulers.reshape(-1))
        if self.other_bones:
            pose_bones = self.obj.pose.bones
            for r, name in self.other_bones:
                pose_bones[name].rotation_axis_angle = _angle_and_axis(quaternions[r])
        if self.hips_bone.rotation_mode == "AXIS_ANGLE":
            self.hips_bone.rotation_axis_angle = _angle_and_axis(hips_quaternion)


def _angle_and_axis(quaternion):
    """A quaternion as Blender's rotation_axis_angle (angle, x, y, z)."""
    return blender_axis_angle(quaternion_to_axis_angle(np.asarray(quaternion, np.float64))).tolist()


class TargetReader:
    """Reads every character's armature and six target world matrices per tick, in as few calls as Blender allows.

    When the file holds few objects besides ours, two `bpy.data.objects.foreach_get` calls (session_uid, then
    matrix_world) read every object at once and the tick picks its own by index; the uids confirm that no object was
    added, removed or renamed (which re-sorts the list) since the indices were taken, else they are taken again (a
    deleted target then stops the session). In a file with many objects that read would cost more than it saves,
    so each object's matrix_world is read on its own.

    The uids are read into a buffer UID_SLACK entries longer than the list, its tail -1: foreach_get fills as many
    entries as there are objects, so an added object overwrites the tail and a removed one leaves the last entry
    (set to -1 before each read) unwritten - either way the bytes differ. That spares a len(bpy.data.objects), which
    walks the whole list (costly with hundreds of objects). More than UID_SLACK objects added at once make foreach_get refuse
    the short buffer (a RuntimeError, and Blender prints an "Array length mismatch" line): the indices are taken
    again then too.
    """
    SHARED_READ_LIMIT = 8        # objects read per object we need, at most, for the one-call read (measured: the
                                 # one call costs as much as reading each of 7 objects on its own at ~55 objects)
    UID_SLACK = 16

    def __init__(self, characters, solver):
        self.characters = characters
        self.objects = [o for c in characters for o in c.read_objects]
        self.k = len(characters)
        self.runtime = solver.runtime       # the run-time graph reads world matrices itself, from its own buffer
        self.matrices = self.runtime.world if self.runtime is not None else np.zeros((self.k, 7, 4, 4), np.float32)
        self.targets = np.zeros((self.k, 6, 4, 4))
        self.armature_bytes = b""
        self.moved = range(self.k)              # characters whose armature moved since the last read (all at first)
        self.to_character = np.stack([np.asarray(c.to_character_np) for c in characters])
        self.from_character = np.linalg.inv(self.to_character)
        self.character_to_world = None
        self.armature_to_character = np.zeros((self.k, 1, 4, 4))
        self.armature_finite = True      # whether the armatures' world matrices are finite (checked as they move)
        self.empties_read = False        # whether this tick read empties into an action's targets (empty_targets)
        self._index()

    def _index(self):
        objects = bpy.data.objects
        try:
            uids = [o.session_uid for o in self.objects]
        except ReferenceError:
            raise LiveStopped("a target or an armature was deleted: live IK stopped") from None
        count = len(objects)
        self.shared = count <= self.SHARED_READ_LIMIT * len(self.objects)
        if not self.shared:
            return
        self.uid_buffer = np.full(count + self.UID_SLACK, -1, np.int32)
        objects.foreach_get("session_uid", self.uid_buffer)
        where = {int(u): i for i, u in enumerate(self.uid_buffer[:count])}
        if any(u not in where for u in uids):
            raise LiveStopped("a target or an armature is no longer in the file: live IK stopped")
        self.index = np.array([where[u] for u in uids], np.int64)
        self.expected = self.uid_buffer.tobytes()    # the whole list: any add, removal or re-sort shows
        self.count = count
        self.all_matrices = np.empty(count * 16, np.float32)         # flat: foreach_get wants the exact size
        self.all_view = self.all_matrices.reshape(count, 4, 4)

    def read(self):
        """Read every world matrix (transposed, (K, 7, 4, 4)); LiveStopped when an object is gone. Returns the targets
        in character space (K, 6, 4, 4), or None when the run-time graph takes the world matrices as they are.
        Sets `moved`: the characters whose armature moved since the last read (empty, usually)."""
        self.empties_read = False
        if self.shared:
            objects = bpy.data.objects
            uids = self.uid_buffer
            uids[self.count - 1] = -1                # stays -1 when the list got shorter
            try:
                objects.foreach_get("session_uid", uids)
            except RuntimeError:                     # more than UID_SLACK objects added
                uids[:] = -1
            if uids.tobytes() != self.expected:
                self._index()
                return self.read()
            objects.foreach_get("matrix_world", self.all_matrices)
            np.take(self.all_view, self.index, axis=0, out=self.matrices.reshape(-1, 4, 4))
        else:
            self._read_each()
        m = self.matrices
        arm = m[:, 0].tobytes()
        if arm == self.armature_bytes:
            self.moved = ()
        else:                                    # an armature moved (or the first tick): its character space again
            before = np.frombuffer(self.armature_bytes, np.float32).reshape(-1, 4, 4) if self.armature_bytes else None
            self.moved = range(self.k) if before is None else np.nonzero((before != m[:, 0]).any(axis=(1, 2)))[0].tolist()
            world = np.swapaxes(m[:, 0], -1, -2).astype(np.float64)
            self.armature_finite = bool(np.isfinite(world).all())
            self.armature_to_character[:, 0] = self.to_character @ np.linalg.pinv(world)
            self.character_to_world = world @ self.from_character
            self.armature_bytes = arm
            if self.runtime is not None:
                self.runtime.set_to_character(self.armature_to_character[:, 0])
        if self.runtime is not None:
            return None
        np.matmul(self.armature_to_character, np.swapaxes(m[:, 1:], -1, -2), out=self.targets)
        return self.targets

    def empty_targets(self, i):
        """(6, 4, 4) character i's empties as read this tick, in character space."""
        if self.runtime is None:
            return self.targets[i]
        self.empties_read = True
        with np.errstate(invalid="ignore", over="ignore"):     # non-finite empties: the solver's check refuses them
            return self.armature_to_character[i, 0] @ np.swapaxes(self.matrices[i, 1:], -1, -2)

    def put_targets(self, i, targets):
        """Make (6, 4, 4) character-space `targets` character i's targets this tick (instead of its empties')."""
        if self.runtime is None:
            self.targets[i] = targets
        elif self.empties_read or not self.armature_finite:      # from what may not be finite: as empty_targets
            with np.errstate(invalid="ignore", over="ignore"):
                self._put(i, targets)
        else:           # an action's own targets (np.errstate costs 3 us a use, a tenth of the tick playing an action)
            self._put(i, targets)

    def _put(self, i, targets):
        self.matrices[i, 1:] = np.swapaxes(self.character_to_world[i] @ targets, -1, -2)

    def _read_each(self):
        flat = self.matrices.reshape(-1, 4, 4)
        try:
            for i, o in enumerate(self.objects):
                flat[i] = o.matrix_world.transposed()
        except ReferenceError:
            raise LiveStopped("a target or an armature was deleted: live IK stopped") from None


class LiveGroup:
    """Characters that share a model (and the pose of their in-between bones): one Solver, one inference call, one
    product for all their pose buffers.

    links: the bridges/offsets of the characters' in-between bones as they stand at session start (they keep that
    pose while live: the action is off and a tick writes only the mapped bones), or None where the rest's hold. The
    Solver builds its constants (run-time graph included) from them once, so a tick costs the same either way; the
    same for hips_map, the characters' shared map of the root target to their hips' matrix_basis."""

    def __init__(self, model, onnx_bytes, characters, engine, links=None, hips_map=None):
        self.characters = characters
        self.k = k = len(characters)
        first = characters[0]
        self.uniform = all(c.count == first.count and c.hips_index == first.hips_index
                           and c.hips_is_quaternion == first.hips_is_quaternion
                           and np.array_equal(c.quaternion_bones, first.quaternion_bones)
                           and np.array_equal(c.quaternion_roles, first.quaternion_roles) for c in characters)
        # rigs with one bone layout get their whole rotation buffers straight from the run-time graph (runtime.pose)
        layout = (first.count, first.quaternion_bones, first.quaternion_roles,
                  first.hips_index if first.hips_is_quaternion else None) if self.uniform else None
        # control rigs: the solve goes to their controls (control_rig), not through the pose buffers
        self.controlled = [(i, c.controls) for i, c in enumerate(characters) if c.controls is not None]
        if self.controlled:
            layout = None
        self.layout = layout
        self.solver = Solver(model, onnx_bytes, characters=k, engine=engine, links=links, pose_layout=layout,
                             hips_map=hips_map)
        self.solver.refiner = MathutilsRefiner(self.solver.refiner)     # one character: Blender's C math, faster
        self.raw = [None] * k
        self.hips_out = np.empty((k, 1, 10))
        self.hips_q = np.empty((k, 4))
        self.cached = [None] * k
        self.iteration_counts = np.zeros(k, np.int64)
        self.iterations = 0
        self.follows_time = np.zeros(0, np.int64)
        self.slow_bones = [(i, c) for i, c in enumerate(characters) if c.has_other_bones]   # Euler, axis-angle
        self.motions = [(i, c.motion) for i, c in enumerate(characters) if c.motion is not None]
        self.panel_ground = np.zeros((k, 2))         # the settings' ground and desired contacts (motions override)
        self.panel_desired = np.ones((k, 2))
        self.motion_grounds = [None] * k             # per character: the feet's ground play() passed on (None: none)
        self.motion_contacts = [None] * k            # ... and the contact flags (Lock Feet)
        self.settings_reset = True                   # refresh_settings put the panel's values back
        self.contact = None                          # (K, 2) contact flags for the solver (NaN: detect), or None
        self.free = LiveFree(model, characters)      # free targets: the model places them (free.py)
        self.driven = [i for i, c in enumerate(characters) if c.settings_driven]
        self.undriven = [i for i, c in enumerate(characters) if not c.settings_driven]

    def start(self):
        """Write buffers from each rig's current pose (after the characters' start): the unmapped bones keep their
        rotations, and the hips' frame is its parent's pose now."""
        k = self.k
        # control rigs: their writers, made from the offsets the characters' start() measured
        self.controlled = [(i, c.controls.live_writer()) for i, c in enumerate(self.characters) if c.controls is not None]
        # per rig, the pose-bone collection's bound foreach_set and the hips pose bone, taken once: looking them up
        # again each tick (obj.pose.bones, bones[hips]) costs a lookup per character. They stay valid while the
        # armature exists, and each tick's TargetReader.read() has just confirmed that (else LiveStopped)
        # (None: a rig with no quaternion bone mapped - its rotations go through write_other_bones)
        self.writers = [(c.obj.pose.bones.foreach_set if c.writes_quaternions else None, c.hips_bone)
                        for c in self.characters]
        self.hips_maps = np.stack([c.hips_map() for c in self.characters])             # (K, 16, 10), NumPy path
        if self.uniform:
            c0 = self.characters[0]
            # every rig's whole rotation buffer, holding the current rotations: a tick overwrites only the mapped
            # bones (one gather, one scatter) - a product with a selection matrix would wake OpenBLAS's threads
            self.buffer = np.stack([c.quaternions for c in self.characters])                 # (K, bones, 4) float32
            self.rows = [self.buffer[i].reshape(-1) for i in range(k)]
            self.bones = c0.quaternion_bones
            self.roles = c0.quaternion_roles
            self.hips_index = c0.hips_index
            rt = self.solver.runtime
            if rt is not None and rt.pose_base is not None:
                base = self.buffer.copy()           # the unmapped bones' rotations; the graph adds the solved ones
                base[:, self.bones] = 0.0
                if c0.hips_is_quaternion:
                    base[:, self.hips_index] = 0.0
                rt.pose_base[:, :len(base[0])] = base
                # per binding: (foreach_set, that rig's row of the graph's pose buffer) for the rigs with quaternion
                # bones, and the hips' locations (written in a second loop: two flat loops cost less than one)
                self.pose_writes = [[(set_all, rt.results(p)["pose"][i]) for i, (set_all, _) in enumerate(self.writers)
                                     if set_all is not None] for p in (0, 1)]
                self.pose_locations = [rt.results(p)["hips_location"] for p in (0, 1)]
                self.hips_bones = [hips for _, hips in self.writers]
                # a refined tick's quaternions (K, 23, 4) go where the graph put the network's: one np.put (the roles
                # without a quaternion bone land in the buffer's spare places)
                width = rt.results(0)["pose_full"][0].size
                self.refined_places = (np.arange(k)[:, None] * width + pose_columns(self.layout)[:4 * NUM_ROLES]).ravel()

    def polled(self, rounds, driven_rounds, undriven_rounds):
        """The characters whose settings tick number `rounds` re-reads: the next slice of those with drivers or NLA
        tracks (each read every driven_rounds ticks) and of the others (every undriven_rounds ticks)."""
        which = []
        for members, every in ((self.driven, driven_rounds), (self.undriven, undriven_rounds)):
            step = -(-len(members) // every)
            first = (rounds % every) * step
            which += members[first:first + step]
        return which

    def refresh_settings(self, which, moved=()):
        """Re-read the settings of characters `which` and `moved`; pass them to the solver when any changed. The panel
        values are read raw and converted only when they (or, for the characters `moved`, the armature's world
        matrix) changed."""
        changed = not self.solver.started
        for i in moved:                          # ground heights follow the armature: convert these again
            self.raw[i] = None
        characters, raw_rows = self.characters, self.raw
        for i in itertools.chain(which, (i for i in moved if i not in which)):     # each character read once
            raw = characters[i].raw_settings()
            if raw == raw_rows[i]:
                continue
            raw_rows[i] = raw
            row = characters[i].convert_settings(raw, characters[i].obj.matrix_world)
            self.iteration_counts[i] = row[7]
            if row[:7] != self.cached[i]:
                self.cached[i] = row[:7]
                changed = True
            self.iterations = int(self.iteration_counts.max())
        if changed:
            v = np.array(self.cached, np.float64)
            self.panel_ground, self.panel_desired = v[:, 0:2].copy(), v[:, 2:4].copy()
            self.settings_reset = True                           # play() passes its own again
            self.solver.set_settings(ground=v[:, 0:2], desired_contact=v[:, 2:4], phase=v[:, 5])
            self.solver.set_task(v[:, 4].astype(np.int64))
            self.follows_time = np.nonzero(v[:, 6] > 0)[0]

    def play(self, reader, frame, which):
        """The characters with an action: their targets at scene frame `frame` replace what the reader read, their
        feet's ground and (Lock Feet) contacts go to the solver. `which`: characters whose settings to re-read."""
        grounds, contacts = self.motion_grounds, self.motion_contacts
        reset = new_contacts = self.settings_reset            # refresh_settings put the panel's values back
        for i, motion in self.motions:
            if i in which:
                motion.refresh()
            targets, ground, contact = motion.tick(frame, lambda i=i: reader.empty_targets(i), reader.character_to_world[i],
                                                   reader.armature_to_character[i, 0], i in reader.moved)
            if targets is not None:              # None: its empties, as the reader read them
                reader.put_targets(i, targets)
            if reset or ground != grounds[i]:    # one character's ground (it moves every frame on uneven ground)
                grounds[i] = ground
                self.solver.set_ground_of(i, *(ground if ground is not None else self.panel_ground[i]))
            if contact != contacts[i]:
                contacts[i], new_contacts = contact, True
        self.settings_reset = False
        if new_contacts:
            desired, flags = self.panel_desired.copy(), None
            for i, _motion in self.motions:
                if contacts[i] is not None:
                    if flags is None:
                        flags = np.full((self.k, 2), np.nan)       # NaN: detected, as without Lock Feet
                    flags[i] = desired[i] = contacts[i]
            self.solver.set_settings(desired_contact=desired)
            self.contact = flags

    def solve_and_write(self, targets, scene):
        """Solve every character of the group and write their poses (one foreach_set and one property set each)."""
        solver = self.solver
        if len(self.follows_time):
            start, length = scene.frame_start, scene.frame_end - scene.frame_start + 1
            phase = solver.settings[:, 6].copy()
            phase[self.follows_time] = ((scene.frame_current - start) / max(length, 1)) % 1.0
            solver.set_settings(phase=phase)
        if self.free.active:
            self.free.step(solver, targets, self.iterations, self.contact)
        else:
            solver.step(targets, None, None, None, None, refine_iterations=self.iterations, contact=self.contact,
                        measure_errors=False)
        if self.controlled:
            if solver.pending is not None:      # an unrefined tick through the graph: its own output buffers
                results = solver.runtime.results(solver.pending)
                for i, writer in self.controlled:
                    writer.write(results["q_ext"][i], results["hips_location"][i])
            else:
                q, hips = solver.q, solver.hips
                for i, writer in self.controlled:
                    writer.write_solved(q[i], hips[i])
            return
        rt = solver.runtime
        if solver.used_runtime and rt.pose_base is not None:
            # the graph's own buffers hold every rig's rotations (hips included): one foreach_set and one location each
            p = rt.latest
            if solver.pending is None:          # refined: the refined rotations replace the network's there
                rt.results(p)["pose_full"].put(self.refined_places, solver.q)
            for set_all, row in self.pose_writes[p]:
                set_all("rotation_quaternion", row)
            for hips, location in zip(self.hips_bones, self.pose_locations[p].tolist()):
                hips.location = location            # also tags the armature for re-evaluation
            if self.slow_bones:
                q, hips_q = solver.q, rt.hips_q
                for i, character in self.slow_bones:
                    character.write_other_bones(q[i], hips_q[i])
            return
        if solver.used_runtime:              # the graph mapped the hips too
            hips_q, locations = solver.runtime.hips_q, solver.runtime.hips_location.tolist()
        else:
            np.matmul(solver.last_hips.reshape(self.k, 1, 16), self.hips_maps, out=self.hips_out)
            hips_q = squares_to_quaternions(self.hips_out[:, 0, :7], out=self.hips_q)
            locations = self.hips_out[:, 0, 7:].tolist()
        q = solver.q
        good = None if solver.all_had_good else solver.has_good
        if self.uniform:
            self.buffer[:, self.bones] = q[:, self.roles]
            self.buffer[:, self.hips_index] = hips_q
            rows = self.rows
        else:
            rows = [c.pose_buffer(q[i], hips_q[i]) for i, c in enumerate(self.characters)]
        for i, ((set_all, hips), row, location) in enumerate(zip(self.writers, rows, locations)):
            if good is not None and not good[i]:       # nothing good to hold yet: leave the rig as it is
                continue
            if set_all is not None:
                set_all("rotation_quaternion", row)
            hips.location = location                # also tags the armature for re-evaluation
        for i, character in self.slow_bones:
            if good is None or good[i]:
                character.write_other_bones(q[i], hips_q[i])


class LiveTick:
    """Drives several armatures: groups them by model (and in-between pose and hips frame), one Solver (one inference
    call) per group.

    Per tick: one read of every target (TargetReader), the solve, and per character one `foreach_set` and one
    property set. The panel settings (ground, contact, task, phase, refinement) are re-read for every character on
    the tick after any of them was edited (their update callbacks count edits in state.live_settings: any edit in the
    panel or from Python) or the armature moved. Otherwise each tick re-reads the next slice of the characters:
    a value that changed without an update callback arrives within SETTINGS_ROUNDS ticks (0.13 s at 60 Hz) on an
    armature with drivers or NLA tracks (what writes settings that way while live: the action is off), and within
    UNDRIVEN_ROUNDS ticks (~1 s) on the others (a raw ID-property write, a driver added while live). Reading one
    character's settings costs a few property reads, hence the slices.
    """
    SETTINGS_ROUNDS = 8
    UNDRIVEN_ROUNDS = 64

    def __init__(self, entries, engine="auto", history=600):
        """entries: [(armature object, Model, onnx bytes or None)]; each armature must be mapped and have targets."""
        from ...neural_network.model.model import check_rig

        by_model = {}
        for obj, model, onnx_bytes in entries:
            rig = rig_model.read_rig(obj, get_bone_map(obj))
            check_rig(model, rig.skeleton, f"the model of {obj.name}")
            # in-between bones hold their current pose while live (a driven rig's follow its controls)
            links = pose_read.current_links(obj, rig) if not rig.driven else None
            character = LiveCharacter(obj, rig, model, follow_action=True, links=links)
            hips_map = character.hips_map()              # copies of one rig share it: a constant of their graph
            key = (id(model), None if links is None else tuple(np.round(a, 9).tobytes() for a in links),
                   np.round(hips_map, 9).tobytes(), id(character) if character.controls is not None else None)
            by_model.setdefault(key, (model, onnx_bytes, links, hips_map, []))[4].append(character)
        self.live_groups = [LiveGroup(model, data, chars, engine, links, hips_map)
                            for model, data, links, hips_map, chars in by_model.values()]
        self.groups = [(g.solver, g.characters, None) for g in self.live_groups]
        self.readers = [TargetReader(g.characters, g.solver) for g in self.live_groups]
        self.pairs = list(zip(self.live_groups, self.readers))
        self.times = deque(maxlen=history)
        self.status = {}
        self.running = False
        self.rounds = 0
        self.settings_version = None
        self.motions = [c.motion for c in self.characters if c.motion is not None]
        self.handler = self.depsgraph_updated if self.motions else None     # registered from start to stop

    @property
    def characters(self):
        return [c for g in self.live_groups for c in g.characters]

    def start(self):
        for character in self.characters:
            character.start()
        for group in self.live_groups:
            group.start()
        if self.handler is not None and self.handler not in bpy.app.handlers.depsgraph_update_post:
            bpy.app.handlers.depsgraph_update_post.append(self.handler)
        self.running = True

    def stop(self):
        if not self.running:
            return
        self.running = False
        handlers = bpy.app.handlers.depsgraph_update_post
        while self.handler is not None and self.handler in handlers:
            handlers.remove(self.handler)
        for group in self.live_groups:
            group.free.stop()
        for character in self.characters:
            character.stop()

    def depsgraph_updated(self, _scene, depsgraph):
        """depsgraph_update_post while live: a ground that changed (or went) is rebuilt on the next tick."""
        for motion in self.motions:
            motion.check(depsgraph)

    def tick(self, scene):
        """One tick for every character; raises LiveStopped when the session cannot go on.

        Python's cyclic garbage collector is held off during the tick. The tick makes only short-lived objects, but
        enough of them at once (the reach assist's lists of floats, ~1,300 at 50 characters) to start collections
        in the middle of it; those move the tick's temporaries into older generations, and every few hundred ticks
        that ends in a full collection of all Blender's tracked objects, longer than a 60 Hz frame
        (measured: 4 in 216 refined ticks of 50 characters; none with the collector held off). The tick's objects
        are freed by reference counting before the collector runs again, so nothing piles up."""
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            self._tick(scene)
        finally:
            if collecting:
                gc.enable()

    def _tick(self, scene):
        began = time.perf_counter()
        self.rounds += 1
        version = state.live_settings.value
        edited = version != self.settings_version
        self.settings_version = version
        for group, reader in self.pairs:
            targets = reader.read()
            k = group.k
            if edited or not group.solver.started:
                which = range(k)
                group.refresh_settings(which, reader.moved)
                group.free.refresh()
            else:
                which = group.polled(self.rounds, self.SETTINGS_ROUNDS, self.UNDRIVEN_ROUNDS)
                if which or reader.moved:
                    group.refresh_settings(which, reader.moved)
            if group.free.active:
                group.free.pin_grabbed(reader)
            if group.motions:
                group.play(reader, scene.frame_current, which)
            try:
                group.solve_and_write(targets, scene)
                if group.free.active:
                    group.free.show(reader)
            except ReferenceError:
                raise LiveStopped("an armature or a target was deleted: live IK stopped") from None
            status = group.solver.status
            if self.status or (group.solver.status_set and status.any()):
                for character, code in zip(group.characters, status.tolist()):
                    self.status[character.name] = code
                if not status.any():
                    self.status = {}
        self.times.append(time.perf_counter() - began)

    def messages(self):
        """{armature: the live status in words} where it is not ok (the solve's status, no ground under a foot)."""
        out = {name: describe(code) for name, code in self.status.items() if code != OK}
        for character in self.characters:
            if character.motion is not None and character.motion.note:
                name = character.name
                out[name] = f"{out[name]}; {character.motion.note}" if name in out else character.motion.note
        return out

    def timing_us(self):
        """(mean, p99) tick time in microseconds over the recent ticks."""
        if not self.times:
            return float("nan"), float("nan")
        t = np.array(self.times) * 1e6
        return float(t.mean()), float(np.percentile(t, 99))
