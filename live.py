"""The live IK tick: read the target empties, solve, write the pose. Plain classes with no UI, testable headless.

One `LiveTick` drives every armature it was given: characters that share a model are solved together in one
inference call (a Solver of K characters). Per character the tick reads six world matrices (root + five effectors),
turns them into character space, solves, writes the mapped quaternion bones with one `foreach_set` on a buffer that
holds every pose bone's current rotation (so unmapped bones keep theirs), sets the hips location, and tags the
object. It never calls `view_layer.update()`: Blender evaluates the depsgraph itself after the timer event.

`LiveCharacter.start()` saves what live mode changes (the action assignment and every pose bone's transform) and
`stop()` puts it back, so a stopped session leaves the file as it was.
"""

import time
from collections import deque

import numpy as np

from . import rig_io
from .neural_network.roles import NUM_ROLES, TASKS
from .neural_network.rotations import quaternion_to_axis_angle, quaternion_to_matrix
from .neural_network.solver import OK, Solver, describe, fast_matrix_to_quaternion
from .properties import get_bone_map

TARGET_SLOTS = ("target_root", "target_left_hand", "target_right_hand", "target_left_foot", "target_right_foot",
                "target_head")
TARGET_LABELS = ("root", "left hand", "right hand", "left foot", "right foot", "head")


class LiveStopped(Exception):
    """The session cannot go on (a deleted armature or target, ...); the message says why, in plain words."""


def targets_of(obj):
    """The six target empties of an armature (None where unset)."""
    return [getattr(obj.neural_ik, slot) for slot in TARGET_SLOTS]


def missing_targets(obj):
    return [label for label, t in zip(TARGET_LABELS, targets_of(obj)) if t is None]


class LiveCharacter:
    """One armature in a live session: its rig, its targets, and the buffers its pose is written from."""

    def __init__(self, obj, rig, model):
        self.obj = obj
        self.name = obj.name
        self.rig = rig
        self.model = model
        missing = missing_targets(obj)
        if missing:
            raise LiveStopped(f"{obj.name} has no {', '.join(missing)} target: create the targets first")
        self.targets = targets_of(obj)
        pose_bones = obj.pose.bones
        self.count = len(pose_bones)
        index = {pb.name: i for i, pb in enumerate(pose_bones)}
        quaternion_roles, quaternion_bones, self.other_bones = [], [], []
        for r in range(1, NUM_ROLES):
            b = int(rig.role_bones[r])
            if b < 0:
                continue
            name = rig.bone_names[b]
            if pose_bones[name].rotation_mode == "QUATERNION":
                quaternion_roles.append(r)
                quaternion_bones.append(index[name])
            else:
                self.other_bones.append((r, name))
        self.quaternion_roles = np.array(quaternion_roles, np.int64)
        self.quaternion_bones = np.array(quaternion_bones, np.int64)
        hips_name = rig.bone_names[int(rig.role_bones[0])]
        self.hips_bone = pose_bones[hips_name]
        self.hips_index = index[hips_name]
        self.hips_is_quaternion = self.hips_bone.rotation_mode == "QUATERNION"
        self.quaternions = np.empty((self.count, 4), np.float32)
        self.saved = None
        self.saved_action = None
        from mathutils import Matrix

        basis = np.eye(4)
        basis[:3, :3] = rig.scale * rig.basis
        self.to_character = Matrix(basis.tolist())   # armature space -> character space

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
        self.frame = self._hips_frame()

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
        """Write the six target matrices in character space into out (6, 4, 4) (mathutils products: no LAPACK)."""
        try:
            to_char = self.to_character @ self.obj.matrix_world.inverted_safe()
            for k, target in enumerate(self.targets):
                out[k] = to_char @ target.matrix_world
        except ReferenceError:
            raise LiveStopped(f"a target or the armature {self.name} was deleted: live IK stopped") from None

    def settings(self, scene):
        s = self.obj.neural_ik
        origin_z = self.obj.matrix_world.translation.z
        unit = self.rig.scale / max(self.obj.matrix_world.to_scale().z, 1e-12)
        ground = ((s.ground_left - origin_z) * unit, (s.ground_right - origin_z) * unit)
        contact = (float(s.contact_left), float(s.contact_right))
        phase = s.phase
        if s.phase_follows_time:
            length = max(scene.frame_end - scene.frame_start + 1, 1)
            phase = ((scene.frame_current - scene.frame_start) / length) % 1.0
        return ground, contact, TASKS.index(s.task.lower()), phase, s.refine_iterations

    def write(self, quaternions, hips_rotation, hips_position):
        """Write the solved rotations (23, 4) and the hips transform (character space)."""
        q = self.quaternions
        q[self.quaternion_bones] = quaternions[self.quaternion_roles]
        rot_t, frame_inv, frame_t = self.frame
        C, s = self.rig.basis, self.rig.scale
        hips_basis = rot_t @ C.T @ hips_rotation
        if self.hips_is_quaternion:
            q[self.hips_index] = fast_matrix_to_quaternion(hips_basis)
        pose_bones = self.obj.pose.bones
        pose_bones.foreach_set("rotation_quaternion", q.reshape(-1))
        self.hips_bone.location = frame_inv @ (C.T @ hips_position / s - frame_t)
        for r, name in self.other_bones:
            pb = pose_bones[name]
            m = self._local_matrix(quaternions[r])
            if pb.rotation_mode == "AXIS_ANGLE":
                aa = quaternion_to_axis_angle(quaternions[r])
                angle = float(np.linalg.norm(aa))
                pb.rotation_axis_angle = (angle, *(aa / angle if angle > 1e-12 else (0.0, 1.0, 0.0)))
            else:
                from mathutils import Matrix

                pb.rotation_euler = Matrix(m.tolist()).to_euler(pb.rotation_mode, pb.rotation_euler)
        if not self.hips_is_quaternion:
            from mathutils import Matrix

            self.hips_bone.rotation_euler = Matrix(hips_basis.tolist()).to_euler(self.hips_bone.rotation_mode)
        self.obj.update_tag()

    @staticmethod
    def _local_matrix(q):
        return quaternion_to_matrix(np.asarray(q, np.float64))


class LiveTick:
    """Drives several armatures: groups them by model, one Solver (one inference call) per group."""

    def __init__(self, entries, engine="auto", history=600):
        """entries: [(armature object, Model, onnx bytes or None)]; each armature must be mapped and have targets."""
        self.groups = []
        by_model = {}
        for obj, model, onnx_bytes in entries:
            rig = rig_io.read_rig(obj, get_bone_map(obj))
            from .neural_network.onnx_export import check_rig

            check_rig(model, rig.skeleton, f"the model of {obj.name}")
            by_model.setdefault(id(model), (model, onnx_bytes, []))[2].append(LiveCharacter(obj, rig, model))
        for model, onnx_bytes, characters in by_model.values():
            solver = Solver(model, onnx_bytes, characters=len(characters), engine=engine)
            self.groups.append((solver, characters, np.zeros((len(characters), 6, 4, 4))))
        self.times = deque(maxlen=history)
        self.status = {}
        self.running = False

    @property
    def characters(self):
        return [c for _, chars, _ in self.groups for c in chars]

    def start(self):
        for character in self.characters:
            character.start()
        self.running = True

    def stop(self):
        if not self.running:
            return
        self.running = False
        for character in self.characters:
            character.stop()

    def tick(self, scene):
        """One tick for every character; raises LiveStopped when the session cannot go on."""
        began = time.perf_counter()
        for solver, characters, targets in self.groups:
            k = len(characters)
            ground = np.empty((k, 2))
            contact = np.empty((k, 2))
            task = np.empty(k, np.int64)
            phase = np.empty(k)
            iterations = 0
            for i, character in enumerate(characters):
                character.read_targets(targets[i])
                ground[i], contact[i], task[i], phase[i], its = character.settings(scene)
                iterations = max(iterations, its)
            result = solver.solve(targets, ground, contact, task, phase, refine_iterations=iterations,
                                  measure_errors=False)
            for i, character in enumerate(characters):
                if not solver.has_good[i]:   # nothing good to hold yet: leave the rig as it is
                    self.status[character.name] = int(result.status[i])
                    continue
                character.write(result.quaternions[i], result.hips_rotation[i], result.hips_position[i])
                self.status[character.name] = int(result.status[i])
        self.times.append(time.perf_counter() - began)

    def messages(self):
        return {name: describe(code) for name, code in self.status.items() if code != OK}

    def timing_us(self):
        """(mean, p99) tick time in microseconds over the recent ticks."""
        if not self.times:
            return float("nan"), float("nan")
        t = np.array(self.times) * 1e6
        return float(t.mean()), float(np.percentile(t, 99))
