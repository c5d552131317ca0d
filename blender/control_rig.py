"""Control rigs: which bone the solver writes for each role, the switches it needs, and the control pose that makes
the *evaluated deform bone* take the solved orientation.

A plain rig has no control map: the solver writes the mapped bones themselves (pose_write, live). A control rig
(Rigify, found by its bone names) keys its motion on controls and its deform (`DEF-`) bones follow them through
constraints, so writing the deform bones does nothing visible. For such a rig `control_rig(obj, rig)` gives a
ControlRig: one Entry per written control, in the order the controls' parents come first:

    control world  Cw = W_role @ D^-1           D: the control -> deform bone offset of its role (measured)
    parent frame   P  = Cw_anchor @ E           (or a constant P when nothing written moves it; measured)
    basis          B  = (P @ rest_parent^-1 @ rest_control)^-1 @ Cw

W_role is the solved world transform of the role's deform bone (armature space). `measure()` evaluates the rig twice
(as it is, and with every control turned) to find each control's anchor (the written control its parent follows)
and the constant offsets, then checks them: the control pose computed from the turned pose's own deform bones must
give back, through Blender's evaluation, the same deform heads and effector orientations. A control whose deform
bone only swings after it (Rigify's upper arm and thigh take their twist from the shoulder and the pelvis) still
puts the next joint where the solve put it, and the next control is posed against its actual parent, so hands, feet
and head land exactly. The head control also takes a location (Rigify's neck bends as one control, so the head's
joint is placed, not reached). Switches (the limbs' IK/FK, the neck and head follow) are set to FK while the solver
drives the rig and put back after.
"""

from dataclasses import dataclass, field

import bpy
import numpy as np

from ..neural_network.geometry.rotations import matrix_to_quaternion
from ..neural_network.skeleton.roles import EFFECTOR_ROLES, ROLE_INDEX
from .action_layouts import _key_curve
from .control_live import LiveWriter, set_turned
from .rig_model import rotation_property

# Rigify (generated from the human meta-rig): (control, role, writes location); {side} is L or R.
# The torso carries Spine1's frame (its pivot is Spine1's head); the lower FK spine hangs from it (spine_fk.001 turns
# the Spine about that pivot, spine_fk the pelvis); spine_fk.002 then stays at rest. Rigify's neck is one control over
# both neck bones: the head control's location puts the head's joint where the solve put it (the neck stretches to it).
RIGIFY_BODY = (("torso", "Spine1", True), ("spine_fk.001", "Spine", False), ("spine_fk", "Hips", False),
               ("spine_fk.002", "Spine1", False), ("spine_fk.003", "Spine2", False), ("neck", "NeckLower", False),
               ("head", "Head", True))
RIGIFY_LIMB = (("shoulder.{s}", "Shoulder"), ("upper_arm_fk.{s}", "Arm"), ("forearm_fk.{s}", "ForeArm"),
               ("hand_fk.{s}", "Hand"), ("thigh_fk.{s}", "Thigh"), ("shin_fk.{s}", "Shin"), ("foot_fk.{s}", "Foot"),
               ("toe_fk.{s}", "ToeBase"))
# The two-bone chains Rigify's IK squashes or stretches (its IK bones have ik_stretch): their FK controls are scaled
# to the solved bone lengths.
SCALED_ROLES = ("Arm", "ForeArm", "Thigh", "Shin")
RIGIFY_SWITCHES = (("upper_arm_parent.{s}", "IK_FK", 1.0), ("thigh_parent.{s}", "IK_FK", 1.0))
RIGIFY_BODY_SWITCHES = (("torso", "neck_follow", 1.0), ("torso", "head_follow", 1.0))   # neck and head as FK
SIDES = (("Left", "L"), ("Right", "R"))

# The check after measuring: deform heads within this fraction of the rig height, effector orientations within
# this many radians.
CHECK_POSITION = 1e-4
CHECK_ANGLE = 1e-3


class ControlRigError(ValueError):
    """The control rig cannot be driven as measured, with a message for the user."""


@dataclass
class Entry:
    control: str
    role: int
    location: bool = False
    mode: str = "QUATERNION"
    scaled: bool = False           # the control takes its role's length scale (uniform), else it keeps scale 1
    anchor: int = -1               # entry whose control the parent follows (-1: a constant parent frame)
    d_inv: np.ndarray = None       # (4, 4) deform -> control
    e: np.ndarray = None           # (4, 4) anchor control -> parent frame, or the constant parent frame
    rest_rel: np.ndarray = None    # (4, 4) rest_parent^-1 @ rest_control
    kind: str = "constant"         # the parent frame: "constant", "inherit" (anchor @ E), "unscaled" (its turn and joint)
    e_point: np.ndarray = None     # (4,) "unscaled": the parent's head in the anchor's frame
    location_now: np.ndarray = field(default_factory=lambda: np.zeros(3))


def rigify_layout(obj, bone_map):
    """(entries as (control, role index, location, scaled), switches as (bone, property, value)) for a Rigify
    rig whose deform bones are mapped, else None."""
    bones = obj.data.bones
    pose_bones = obj.pose.bones
    if not str(bone_map.get("Hips", "")).startswith("DEF-"):
        return None
    rows = list(RIGIFY_BODY)
    for side, s in SIDES:
        rows += [(c.format(s=s), side + r, False) for c, r in RIGIFY_LIMB]
    switches = [(b.format(s=s), key, value) for _, s in SIDES for b, key, value in RIGIFY_SWITCHES]
    switches += list(RIGIFY_BODY_SWITCHES)
    if any(c not in bones for c, *_ in rows) or any(b not in bones or key not in pose_bones[b] for b, key, _ in switches):
        return None
    entries = [(c, ROLE_INDEX[r], loc, r.replace("Left", "").replace("Right", "") in SCALED_ROLES)
               for c, r, loc in rows if bone_map.get(r)]
    return entries, switches


def control_map_summary(obj, bone_map):
    """One line for the Rig panel: which controls Run IK and Bake write on a Rigify rig ("" for other rigs)."""
    layout = rigify_layout(obj, bone_map)
    if layout is None:
        return ""
    entries, switches = layout
    names = [c for c, *_ in entries]
    return (f"Rigify: Run IK and Bake write {len(names)} controls ({', '.join(names[:7])}, the FK arms and legs), "
            f"with {len(switches)} switches set to FK while they drive the rig")


def control_rig(obj, rig):
    """The ControlRig of a driven rig whose controls are known (Rigify), None for a rig whose mapped bones are
    written directly. Raises ControlRigError for a driven rig with no known controls."""
    if not rig.driven:
        return None
    layout = rigify_layout(obj, rig.bone_map)
    if layout is None and all(reason.startswith("NLA") for reason in rig.driven):
        return None         # strips only change what is read: the mapped bones themselves can be written
    if layout is None:
        raise ControlRigError(f"{obj.name!r} is driven ({'; '.join(rig.driven)}) and its controls are unknown: "
                              "only Rigify's controls are found automatically")
    return ControlRig(obj, rig, *layout)


def _matrices(obj, names):
    """{name: (4, 4)} pose_bone.matrix after Blender evaluates the armature (armature space)."""
    bpy.context.view_layer.update()
    pose_bones = obj.pose.bones
    return {n: np.array(pose_bones[n].matrix, dtype=np.float64) for n in names}


def _turn(k):
    """A fixed turn of about 0.3 rad, a different axis per k (the measuring pose)."""
    axis = np.array([np.sin(1.3 * k + 0.4), np.cos(0.7 * k + 1.1), np.sin(2.1 * k + 2.0)])
    axis /= np.linalg.norm(axis)
    return np.concatenate([[np.cos(0.15)], np.sin(0.15) * axis])


def _rotation(m):
    r = m[..., :3, :3]
    return r / np.linalg.norm(r, axis=-2, keepdims=True)


def _scale(m):
    """The length scale of a bone matrix: its Y axis (the bone's length) column's norm."""
    return float(np.linalg.norm(m[:3, 1]))


def _rigid(m):
    """A bone matrix without its scale: rotation columns normalised, head kept."""
    out = np.array(m, dtype=np.float64)
    out[..., :3, :3] = _rotation(out)
    return out


def _similarity(m):
    """A bone matrix as rotation times its length scale (a stretched deform bone's other axes follow the volume)."""
    out = np.array(m, dtype=np.float64)
    out[..., :3, :3] = _rotation(out) * np.linalg.norm(out[..., :3, 1], axis=-1)[..., None, None]
    return out


class ControlRig:
    """The written controls of one armature, their offsets and switches (see the module docstring)."""

    def __init__(self, obj, rig, entries, switches):
        self.obj, self.rig = obj, rig
        pose_bones = obj.pose.bones
        self.entries = [Entry(c, r, loc, pose_bones[c].rotation_mode, scaled) for c, r, loc, scaled in entries]
        self.switches = list(switches)
        self.saved_switches = None
        self.measured = False
        self._live = None

    @property
    def controls(self):
        return [e.control for e in self.entries]

    def roles(self):
        """{role index: control} of the roles a control writes (the first control of a role)."""
        out = {}
        for e in self.entries:
            out.setdefault(e.role, e.control)
        return out

    # -- switches ---------------------------------------------------------------------------------------------------
    def set_switches(self):
        """Set the switches the solver needs (remembering the values they had)."""
        pose_bones = self.obj.pose.bones
        if self.saved_switches is None:
            self.saved_switches = [(b, key, pose_bones[b][key]) for b, key, _ in self.switches]
        for b, key, value in self.switches:
            pose_bones[b][key] = value
        self.obj.update_tag()

    def restore_switches(self):
        pose_bones = self.obj.pose.bones
        for b, key, value in self.saved_switches or ():
            pose_bones[b][key] = value
        self.saved_switches = None
        self.obj.update_tag()

    # -- measuring --------------------------------------------------------------------------------------------------
    def measure(self):
        """Measure and check the offsets on the rig as it is now (switches set, no action overriding the pose), with
        the written controls at unit scale: evaluate it so and with every control turned and the limbs scaled
        (parents that inherit a control's scale and parents that only follow its rotation and joint differ there).
        Leaves the controls so (rotations and locations as they were, unit scale). Raises ControlRigError when no
        anchor explains a control's parent or when the check fails."""
        obj, rig = self.obj, self.rig
        pose_bones = obj.pose.bones
        deform = {r: rig.bone_names[rig.role_bones[r]] for r in range(len(rig.role_bones)) if rig.role_bones[r] >= 0}
        parents = {e.control: (pose_bones[e.control].parent.name if pose_bones[e.control].parent else None)
                   for e in self.entries}
        names = set(self.controls) | set(deform.values()) | {p for p in parents.values() if p}
        for e in self.entries:            # the written controls at unit scale while the solver drives them (a bake
            pose_bones[e.control].scale = (1.0, 1.0, 1.0)     # keys theirs; live sessions put the pose back)
        saved = self._save()
        first = _matrices(obj, names)
        for k, e in enumerate(self.entries):
            self._turn_control(e, _turn(k), 1.0 + 0.04 * (1 + k % 3) if e.scaled else 1.0)
        second = _matrices(obj, names)
        self._restore(saved)
        height = rig.skeleton.height / rig.scale
        rest = {b.name: np.array(b.matrix_local, dtype=np.float64) for b in obj.data.bones
                if b.name in self.controls or b.name in parents.values()}
        for i, e in enumerate(self.entries):
            cw = first[e.control]
            e.d_inv = np.linalg.inv(_rigid(first[deform[e.role]])) @ cw
            e.location_now = np.array(pose_bones[e.control].location, dtype=np.float64)
            p = parents[e.control]
            e.rest_rel = np.linalg.inv(rest[p]) @ rest[e.control] if p else rest[e.control]
            if p is None:
                e.anchor, e.kind, e.e = -1, "constant", np.eye(4)
                continue
            best = (_difference(first[p], second[p], height), -1, "constant")
            for a in range(i):
                c1, c2 = first[self.entries[a].control], second[self.entries[a].control]
                inherit = _difference(np.linalg.inv(c1) @ first[p], np.linalg.inv(c2) @ second[p], height)
                unscaled = max(
                    float(np.max(np.abs(_rotation(c1).T @ _rotation(first[p]) - _rotation(c2).T @ _rotation(second[p])))),
                    float(np.linalg.norm(np.linalg.solve(c1, first[p][:, 3]) - np.linalg.solve(c2, second[p][:, 3]))),
                    abs(_scale(first[p]) - _scale(second[p])))
                best = min(best, (inherit, a, "inherit"), (unscaled, a, "unscaled"))
            err, e.anchor, e.kind = best
            if err > 1e-4:
                raise ControlRigError(f"the parent of control {e.control!r} follows more than one control "
                                      "(a follow or parent switch set between 0 and 1?)")
            c1 = first[self.entries[e.anchor].control] if e.anchor >= 0 else None
            if e.kind == "constant":
                e.e = first[p]
            elif e.kind == "inherit":
                e.e = np.linalg.inv(c1) @ first[p]
            else:
                e.e = np.eye(4)
                e.e[:3, :3] = _rotation(c1).T @ _rotation(first[p]) * _scale(first[p])
                e.e_point = np.linalg.solve(c1, first[p][:, 3])
        self.measured = True
        self._live = None
        self._check(second, deform, names, height)

    def _save(self):
        pose_bones = self.obj.pose.bones
        return {e.control: (tuple(getattr(pose_bones[e.control], rotation_property(e.mode))),
                            tuple(pose_bones[e.control].location), tuple(pose_bones[e.control].scale))
                for e in self.entries}

    def _restore(self, saved):
        pose_bones = self.obj.pose.bones
        for e in self.entries:
            rot, loc, scale = saved[e.control]
            setattr(pose_bones[e.control], rotation_property(e.mode), rot)
            pose_bones[e.control].location = loc
            pose_bones[e.control].scale = scale
        self.obj.update_tag()

    def _turn_control(self, e, q, scale):
        from mathutils import Quaternion

        pb = self.obj.pose.bones[e.control]
        turn = Quaternion(q.tolist())
        if e.mode == "QUATERNION":
            pb.rotation_quaternion = turn @ pb.rotation_quaternion
        elif e.mode != "AXIS_ANGLE":
            pb.rotation_euler = (turn @ pb.rotation_euler.to_quaternion()).to_euler(e.mode)
        pb.scale = tuple(scale * v for v in pb.scale)

    def _check(self, turned, deform, names, height):
        """Pose the controls from the turned pose's own deform bones and compare what Blender then shows."""
        rig = self.rig
        world = np.broadcast_to(np.eye(4), (1, len(rig.role_bones), 4, 4)).copy()
        scaled = {e.role for e in self.entries if e.scaled}
        for r, name in deform.items():
            world[0, r] = _similarity(turned[name]) if r in scaled else _rigid(turned[name])
        saved = self._save()
        self.write(self.control_pose(world), 0)
        got = _matrices(self.obj, names)
        self._restore(saved)
        worst_pos, worst_bone = max((np.linalg.norm(got[n][:3, 3] - turned[n][:3, 3]) / height, n)
                                    for n in deform.values())
        worst_rot = max(_angle(got[deform[r]], turned[deform[r]]) for r in EFFECTOR_ROLES if r in deform)
        self.check_error = (worst_pos, worst_rot)
        if worst_pos > CHECK_POSITION or worst_rot > CHECK_ANGLE:
            raise ControlRigError(f"the controls of {self.obj.name!r} do not reproduce the deform bones as measured "
                                  f"(heads off by up to {worst_pos:.1e} of the rig height at {worst_bone!r}, "
                                  f"effectors turned by "
                                  f"{worst_rot:.1e} rad)")

    # -- the control pose -------------------------------------------------------------------------------------------
    def control_pose(self, world):
        """Control bases for desired deform transforms `world` (F, 23, 4, 4) in armature space (rotation times a
        uniform scale: a limb squashed or stretched by Rigify's IK): a list (one per entry) of (rotations (F, 3, 3),
        locations (F, 3) or None, uniform scales (F,) or None where they stay 1)."""
        world = np.asarray(world, np.float64)
        actual = []
        out = []
        rigid = _rigid(world)
        for e in self.entries:
            cw = (world if e.scaled else rigid)[:, e.role] @ e.d_inv
            if e.kind == "constant":
                parent = e.e
            elif e.kind == "inherit":
                parent = actual[e.anchor] @ e.e
            else:                  # the anchor's rotation and joint, not its scale
                anchor = actual[e.anchor]
                parent = np.broadcast_to(np.eye(4), anchor.shape).copy()
                parent[:, :3, :3] = _rotation(anchor) @ e.e[:3, :3]
                parent[:, :, 3] = anchor @ e.e_point
            frame = parent @ e.rest_rel
            basis = np.linalg.solve(frame, cw)
            rot = _rotation(basis)
            scale = np.linalg.norm(basis[:, :3, 1], axis=-1) if e.scaled else None
            scale = None if scale is None or np.all(np.abs(scale - 1.0) < 1e-5) else scale
            if e.location:
                loc = basis[:, :3, 3]
                now = cw
            else:
                loc = None
                held = np.broadcast_to(np.eye(4), basis.shape).copy()
                held[:, :3, :3] = rot if scale is None else rot * scale[:, None, None]
                held[:, :3, 3] = e.location_now
                now = frame @ held
            actual.append(now)
            out.append((rot, loc, scale))
        return out

    def write(self, pose, i):
        """Set frame i of a control_pose on the controls (rotation in each control's mode, location and scale where
        the entry writes them) and tag the armature."""
        from mathutils import Matrix

        pose_bones = self.obj.pose.bones
        for e, (rot, loc, scale) in zip(self.entries, pose):
            pb = pose_bones[e.control]
            set_turned(pb, e.mode, Matrix(rot[i].tolist()).to_quaternion())
            if loc is not None:
                pb.location = loc[i].tolist()
            pb.scale = (1.0, 1.0, 1.0) if scale is None else (float(scale[i]),) * 3
        self.obj.update_tag()

    def live_writer(self):
        """The live tick's writer of this rig as measured (control_live.LiveWriter, made once per measure)."""
        if self._live is None:
            self._live = LiveWriter(self)
        return self._live

    def key(self, container, frames, pose):
        """Key a control_pose at `frames` into an action's curve container (rotation, location and scale of every
        written control), with the switches at their FK values."""
        from .pose_write import continuous_quaternions, euler_sequence

        frames = np.asarray(frames, np.float64)
        ones = np.ones(len(frames))
        for e, (rot, loc, scale) in zip(self.entries, pose):
            path = f'pose.bones["{bpy.utils.escape_identifier(e.control)}"].'
            for k in range(3):      # every channel the solve relies on: the action alone reproduces the pose
                _key_curve(container, path + "scale", k, e.control, frames, ones if scale is None else scale)
                if loc is None:
                    _key_curve(container, path + "location", k, e.control, frames, ones * e.location_now[k])
            if e.mode == "QUATERNION":
                values, prop = continuous_quaternions(matrix_to_quaternion(rot)), "rotation_quaternion"
            elif e.mode == "AXIS_ANGLE":
                from ..neural_network.geometry.rotations import blender_axis_angle, matrix_to_axis_angle

                values, prop = blender_axis_angle(matrix_to_axis_angle(rot)), "rotation_axis_angle"
            else:
                values, prop = euler_sequence(rot, e.mode), "rotation_euler"
            for k in range(values.shape[1]):
                _key_curve(container, path + prop, k, e.control, frames, values[:, k])
            if loc is not None:
                for k in range(3):
                    _key_curve(container, path + "location", k, e.control, frames, loc[:, k])
        for bone, key, value in self.switches:
            path = f'pose.bones["{bpy.utils.escape_identifier(bone)}"]["{key}"]'
            _key_curve(container, path, 0, bone, frames, np.full(len(frames), float(value)))


def _difference(a, b, height):
    """How far two rigid transforms differ: the larger of the rotation's largest entry and the translation's
    length over `height`."""
    return max(float(np.max(np.abs(_rotation(a) - _rotation(b)))), float(np.linalg.norm(a[:3, 3] - b[:3, 3])) / height)


def _angle(a, b):
    r = _rotation(a).T @ _rotation(b)
    return float(np.arccos(np.clip((np.trace(r) - 1) / 2, -1.0, 1.0)))


def role_scales(skeleton, offsets):
    """(F, 23) length scale of each role's bone from per-frame offsets (F or 1, 23, 3): the offset of its only mapped
    child over the rest offset (1 for roles with no or several children, and within 1e-5 of 1)."""
    offsets = np.asarray(offsets, np.float64).reshape(-1, len(skeleton.bone_names), 3)
    out = np.ones(offsets.shape[:2])
    parents = skeleton.parents
    for j in range(offsets.shape[1]):
        children = np.flatnonzero(parents == j)
        rest = np.linalg.norm(skeleton.offsets[children[0]]) if len(children) == 1 else 0.0
        if rest > 1e-9:
            out[:, j] = np.linalg.norm(offsets[:, children[0]], axis=-1) / rest
    out[np.abs(out - 1.0) < 1e-5] = 1.0
    return out


def deform_worlds(rig, rotations, positions, scales=None):
    """(F, 23, 4, 4) armature-space transforms of the roles' deform bones from character-space orientations
    (F, 23, 3, 3), heads (F, 23, 3) and length scales (F, 23) (role_scales; None: 1)."""
    n = len(rotations)
    out = np.broadcast_to(np.eye(4), (n, len(rig.role_bones), 4, 4)).copy()
    out[..., :3, :3] = rig.basis.T @ np.asarray(rotations, np.float64)
    if scales is not None:
        out[..., :3, :3] *= np.asarray(scales, np.float64)[..., None, None]
    out[..., :3, 3] = np.nan_to_num(np.asarray(positions, np.float64)) @ rig.basis / rig.scale
    return out
