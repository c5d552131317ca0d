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
joint is placed, not reached).

Run IK writes the FK chain and sets the switches (the limbs' IK/FK, the neck and head follow) to FK while it drives
the rig, putting them back after. Bake leaves every switch as the user has it and keys both chains
(`measure(both_chains=True)`), as Rigify's own IK/FK snapping does: the FK controls and the IK ones (hand and foot
controls, the IK chain's first control, the pole, the IK toe; the heel and spin controls at rest), so that its action
holds the solved pose whichever way each limb's IK/FK switch is set, and assigning it changes no switch. There the
neck and head follow the switches as set: a parent frame may take its rotation from one written control and its
joint from another, or blend two rotations (a follow switch between 0 and 1: measured at both ends, the blend from
the switch's own value). The IK chain's end lands where the solve puts it (the hand and foot controls carry the
hands' and feet's transforms); the middle joint lands in the solved limb's plane: with a pole, at the solved elbow
or knee; without, Blender's IK solver bends the chain in the plane its first bone starts in (it may also stretch the
two bones by about 1%, as it decides).
"""

from dataclasses import dataclass, field

import bpy
import numpy as np

from ...neural_network.geometry.rotations import axis_angle_to_matrix, matrix_to_axis_angle, matrix_to_quaternion
from ...neural_network.skeleton.roles import EFFECTOR_ROLES, ROLE_INDEX, ROLE_PARENTS, ROLES
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
# Rigify's IK chains, keyed by Bake beside the FK ones: (control, role, part, writes location). "ik": posed like an FK
# control, its offset to the deform bone measured with the switch on IK (the hand and foot controls, the IK toe);
# "base": the chain's first control (its parent damped-tracks the chain's end; its rotation sets the plane the chain
# bends in); "pole": the pole target (location only: in the solved limb's plane, beside the middle joint, the limb's
# length away, as Rigify's own snapping places it).
RIGIFY_IK = (("hand_ik.{s}", "Hand", "ik", True), ("upper_arm_ik.{s}", "Arm", "base", False),
             ("upper_arm_ik_target.{s}", "Arm", "pole", True), ("foot_ik.{s}", "Foot", "ik", True),
             ("thigh_ik.{s}", "Thigh", "base", False), ("thigh_ik_target.{s}", "Thigh", "pole", True),
             ("toe_ik.{s}", "ToeBase", "ik", False))
RIGIFY_IK_HELD = ("foot_spin_ik.{s}", "foot_heel_ik.{s}")      # between the foot control and the foot: keyed at rest
# The two-bone chains Rigify's IK squashes or stretches (its IK bones have ik_stretch): their FK controls are scaled
# to the solved bone lengths.
SCALED_ROLES = ("Arm", "ForeArm", "Thigh", "Shin")
RIGIFY_SWITCHES = (("upper_arm_parent.{s}", "IK_FK", 1.0), ("thigh_parent.{s}", "IK_FK", 1.0))
RIGIFY_BODY_SWITCHES = (("torso", "neck_follow", 1.0), ("torso", "head_follow", 1.0))   # neck and head as FK
# While Bake measures: IK stretch on (the IK chain reaches its end control whatever the pose being measured) ...
RIGIFY_STRETCH = (("upper_arm_parent.{s}", "IK_Stretch", 1.0), ("thigh_parent.{s}", "IK_Stretch", 1.0))
# ... and the switches that blend two parents' rotations, measured at both ends when the user's value is between.
RIGIFY_BLENDS = (("torso", "neck_follow"), ("torso", "head_follow"), ("upper_arm_parent.{s}", "FK_limb_follow"),
                 ("thigh_parent.{s}", "FK_limb_follow"))
SIDES = (("Left", "L"), ("Right", "R"))

# The check after measuring: deform heads within this fraction of the rig height, effector orientations within
# this many radians.
CHECK_POSITION = 1e-4
CHECK_ANGLE = 1e-3
# With the limbs on IK the feet hang from the end of Blender's IK chain, which stops short of its target by up to
# about 1e-4 of the rig height when it must stretch (the measuring pose scales the limbs): the check allows 1e-3.
CHECK_IK_POSITION = 1e-3
CHECK_IK_ANGLE = 1e-2
# A parent frame follows a model when the two measuring evaluations agree with it this closely (rotation matrix
# entries; joints as a fraction of the rig height).
FIT = 1e-4


class ControlRigError(ValueError):
    """The control rig cannot be driven as measured, with a message for the user."""


@dataclass
class Entry:
    control: str
    role: int
    location: bool = False
    mode: str = "QUATERNION"
    scaled: bool = False           # the control takes its role's length scale (uniform), else it keeps scale 1
    part: str = "fk"               # "fk" (Run IK and Bake), or Bake's IK chain: "ik", "base", "pole" (see RIGIFY_IK)
    anchor: int = -1               # entry whose control the parent follows (-1: a constant parent frame)
    d_inv: np.ndarray = None       # (4, 4) deform -> control
    e: np.ndarray = None           # (4, 4) anchor control -> parent frame, or the constant parent frame
    rest_rel: np.ndarray = None    # (4, 4) rest_parent^-1 @ rest_control
    kind: str = "constant"         # the parent frame: "constant", "inherit" (anchor @ E), "unscaled" (its turn and
    #                                joint), "follow" (the turn of one anchor or a blend of two, the joint of another)
    e_point: np.ndarray = None     # (4,) "unscaled", "follow": the parent's head in the (point) anchor's frame
    location_now: np.ndarray = field(default_factory=lambda: np.zeros(3))
    local_location: bool = True    # the bone's location is in its own rest frame (else in its parent's: Rigify's IK)
    # "follow": rotation = slerp(R(anchor) @ e, R(anchor_b) @ e_b, weight) (-1: the armature), joint from point_anchor
    anchor_b: int = -1
    e_b: np.ndarray = None         # (3, 3)
    weight: float = 0.0
    point_anchor: int = -1
    frame_scale: float = 1.0
    # "base" and "pole": the limb's middle and end roles and its plane at rest
    mid: int = -1
    end: int = -1
    normal: np.ndarray = None      # (3,) the rest plane's normal in the role's deform bone frame
    local_frame: np.ndarray = None  # "base": (3, 3) columns: toward the middle joint, the normal, their cross (control frame)
    swing_rel: np.ndarray = None   # "base": rest of its parent (which damped-tracks the chain's end) in that parent's parent
    bend: float = 1.0              # "pole": the side of the normal x (end - root) the middle joint bends to


@dataclass
class RigifyLayout:
    entries: list                  # (control, role index, location, scaled): the FK chain and the body
    switches: list                 # (bone, property, FK value): what Run IK sets
    ik: list = None                # (control, role index, part, location): the IK chain (None: not found)
    held: list = field(default_factory=list)        # controls Bake keys at rest (the IK foot's heel and spin)
    limb_switches: list = field(default_factory=list)   # (bone, property): the limbs' IK/FK switches
    stretch: list = field(default_factory=list)     # (bone, property, value) set while measuring both chains
    blends: list = field(default_factory=list)      # (bone, property) of the follow switches


def _children(role):
    return [j for j, p in enumerate(ROLE_PARENTS) if p == role]


def limb_chain(role):
    """(middle, end) role indices of the two-bone limb that starts at `role` (Arm: ForeArm, Hand)."""
    mid = _children(role)[0]
    return mid, _children(mid)[0]


def rigify_layout(obj, bone_map):
    """The RigifyLayout of a Rigify rig whose deform bones are mapped, else None."""
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

    def mapped(side, role, part):
        roles = [ROLE_INDEX[side + role]]
        roles += list(limb_chain(roles[0])) if part in ("base", "pole") else []
        return all(bone_map.get(ROLES[j]) for j in roles)

    def has(bone, key=None):
        return bone in bones and (key is None or key in pose_bones[bone])

    ik = [(c.format(s=s), ROLE_INDEX[side + r], part, loc) for side, s in SIDES for c, r, part, loc in RIGIFY_IK
          if mapped(side, r, part)]
    held = [c.format(s=s) for _, s in SIDES for c in RIGIFY_IK_HELD]
    stretch = [(b.format(s=s), key, value) for _, s in SIDES for b, key, value in RIGIFY_STRETCH]
    swings = [pose_bones[c].parent for c, _, part, _ in ik if part == "base" and c in bones]
    if (not all(has(c) for c, *_ in ik) or not all(has(c) for c in held) or not all(has(b, k) for b, k, _ in stretch)
            or not all(s is not None and s.parent is not None for s in swings)):
        ik = None
    blends = list(dict.fromkeys((b.format(s=s), key) for _, s in SIDES for b, key in RIGIFY_BLENDS))
    return RigifyLayout(entries, switches, ik, held, [(b, k) for b, k, _ in switches if k == "IK_FK"], stretch,
                        [(b, k) for b, k in blends if has(b, k)])


def control_map_summary(obj, bone_map):
    """One line for the Rig panel: which controls Run IK and Bake write on a Rigify rig ("" for other rigs)."""
    layout = rigify_layout(obj, bone_map)
    if layout is None:
        return ""
    names = [c for c, *_ in layout.entries]
    ik = f"; Bake also keys the {len(layout.ik)} IK controls and leaves the switches" if layout.ik else ""
    return (f"Rigify: Run IK and Bake write {len(names)} controls ({', '.join(names[:7])}, the FK arms and legs), "
            f"Run IK with {len(layout.switches)} switches set to FK while it drives the rig{ik}")


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
    return ControlRig(obj, rig, layout)


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


def _unit(v):
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-300)


def _frames(u, n):
    """(..., 3, 3) rotations with columns u, n made perpendicular to u, and their cross product."""
    u = _unit(u)
    n = _unit(n - np.sum(n * u, axis=-1, keepdims=True) * u)
    return np.stack([u, n, np.cross(u, n)], axis=-1)


def _slerp(a, b, w):
    """The rotation a fraction w of the way from rotation matrices a to b (shortest path, as Blender blends a
    constraint's influence)."""
    return a @ axis_angle_to_matrix(w * matrix_to_axis_angle(np.swapaxes(a, -1, -2) @ b))


def _damped_track(m, target):
    """Blender's Damped Track: bone matrices m (F, 4, 4) turned by the shortest arc that points their Y axis at the
    points `target` (F, 3); heads kept."""
    y = _unit(m[:, :3, 1])
    v = _unit(target - m[:, :3, 3])
    axis = np.cross(y, v)
    sin = np.linalg.norm(axis, axis=-1)
    angle = np.arctan2(sin, np.sum(y * v, axis=-1))
    out = np.array(m, dtype=np.float64)
    out[:, :3, :3] = axis_angle_to_matrix(axis * (angle / np.maximum(sin, 1e-300))[:, None]) @ m[:, :3, :3]
    return out


def _rest_rotation(mode):
    """(property, value) of a rotation at rest in a pose bone's rotation mode."""
    if mode == "QUATERNION":
        return "rotation_quaternion", (1.0, 0.0, 0.0, 0.0)
    if mode == "AXIS_ANGLE":
        return "rotation_axis_angle", (0.0, 0.0, 1.0, 0.0)
    return "rotation_euler", (0.0, 0.0, 0.0)


class ControlRig:
    """The written controls of one armature, their offsets and switches (see the module docstring)."""

    def __init__(self, obj, rig, layout):
        self.obj, self.rig = obj, rig
        pose_bones = obj.pose.bones
        self.entries = [Entry(c, r, loc, pose_bones[c].rotation_mode, scaled) for c, r, loc, scaled in layout.entries]
        self.ik_entries = [Entry(c, r, loc, pose_bones[c].rotation_mode, part=part) for c, r, part, loc in layout.ik or ()]
        self.has_ik = layout.ik is not None
        self.switches = list(layout.switches)
        self.held, self.limb_switches = list(layout.held), list(layout.limb_switches)
        self.stretch, self.blends = list(layout.stretch), list(layout.blends)
        self.saved_switches = None
        self.measured = False
        self.both_chains = False
        self._live = None

    @property
    def written(self):
        """The entries control_pose poses and key() keys: the FK chain (Run IK), and after measure(both_chains=True)
        the IK chain too (Bake)."""
        return self.entries + self.ik_entries if self.both_chains else self.entries

    @property
    def controls(self):
        return [e.control for e in self.written]

    def roles(self):
        """{role index: control} of the roles a control writes (the first control of a role)."""
        out = {}
        for e in self.entries:
            out.setdefault(e.role, e.control)
        return out

    # -- switches ---------------------------------------------------------------------------------------------------
    def set_switches(self):
        """Set the switches Run IK needs (remembering the values they had)."""
        pose_bones = self.obj.pose.bones
        if self.saved_switches is None:
            self.saved_switches = [(b, key, pose_bones[b][key]) for b, key, _ in self.switches]
        self._set_values(self.switches)

    def restore_switches(self):
        self._set_values(self.saved_switches or ())
        self.saved_switches = None

    def _set_values(self, values):
        """Set pose bones' custom properties [(bone, property, value)] and tag the armature."""
        pose_bones = self.obj.pose.bones
        for b, key, value in values:
            pose_bones[b][key] = value
        self.obj.update_tag()

    def _set_ik_fk(self, value):
        self._set_values([(b, key, value) for b, key in self.limb_switches])

    # -- measuring --------------------------------------------------------------------------------------------------
    def measure(self, both_chains=False):
        """Measure and check the offsets on the rig as it is now (no action overriding the pose), with the written
        controls at unit scale: evaluate it so and with every control turned and the limbs scaled (parents that
        inherit a control's scale and parents that only follow its rotation and joint differ there). Run IK sets the
        switches first (set_switches). both_chains (Bake): the IK chain too, with every switch as the user has it
        but the limbs' IK/FK (set per evaluation) and IK stretch (on while measuring; put back after, as are the
        IK foot's heel and spin, at rest while measuring). Leaves the controls so (rotations and locations as they
        were, unit scale). Raises ControlRigError when no anchor explains a control's parent or when a check fails."""
        obj, rig = self.obj, self.rig
        if both_chains and not self.has_ik:
            raise ControlRigError(f"the IK controls of {obj.name!r} are not the ones Rigify makes (hand_ik, upper_arm_ik, "
                                  "its pole and swing, foot_ik, its heel and spin, toe_ik): Bake keys both chains")
        pose_bones = obj.pose.bones
        self.both_chains = both_chains
        written = self.written
        deform = {r: rig.bone_names[rig.role_bones[r]] for r in range(len(rig.role_bones)) if rig.role_bones[r] >= 0}
        parents = {e.control: pose_bones[e.control].parent.name if pose_bones[e.control].parent else None
                   for e in written}
        frame_bones = {e.control: parents[e.control] for e in written}     # whose pose the parent model follows:
        for e in written:                                                  # the base's tracking parent's parent
            if e.part == "base":
                parent = pose_bones[parents[e.control]].parent
                frame_bones[e.control] = parent.name if parent else None
        names = set(self.controls) | set(deform.values()) | {p for p in frame_bones.values() if p}
        for e in written:
            e.local_location = obj.data.bones[e.control].use_local_location
        for e in written:            # the written controls at unit scale while the solver drives them (a bake
            pose_bones[e.control].scale = (1.0, 1.0, 1.0)     # keys theirs; live sessions put the pose back)
        kept = self._measuring_state() if both_chains else []
        try:
            saved = self._save()
            first = _matrices(obj, names)
            second = self._turned(names)
            self._restore(saved)
            ik_first = None
            if both_chains:
                self._set_ik_fk(0.0)
                ik_first = _matrices(obj, names)
                self._set_ik_fk(1.0)
            ends = []

            def at_ends():
                """(first, second) with every follow switch at 0 and at 1 (measured once, when a parent needs it)."""
                if not ends:
                    values = [(b, key, pose_bones[b][key]) for b, key in self.blends]
                    try:
                        for value in (0.0, 1.0):
                            self._set_values([(b, key, value) for b, key, _ in values])
                            ends.append((_matrices(obj, names), self._turned(names)))
                            self._restore(saved)
                    finally:
                        self._set_values(values)
                return ends

            height = rig.skeleton.height / rig.scale
            rest = {b.name: np.array(b.matrix_local, dtype=np.float64) for b in obj.data.bones
                    if b.name in names or b.name in parents.values()}
            for i, e in enumerate(written):
                measured = ik_first if e.part != "fk" else first
                e.d_inv = np.linalg.inv(_rigid(measured[deform[e.role]])) @ measured[e.control]
                e.location_now = np.array(pose_bones[e.control].location, dtype=np.float64)
                p = parents[e.control]
                e.rest_rel = np.linalg.inv(rest[p]) @ rest[e.control] if p else rest[e.control]
                if e.part == "base":
                    g = frame_bones[e.control]
                    e.swing_rel = np.linalg.inv(rest[g]) @ rest[p] if g else rest[p]
                if e.part in ("base", "pole"):
                    self._limb_rest(e, rest, deform)
                self._fit_parent(i, e, frame_bones[e.control], first, second, height, at_ends)
            self.measured = True
            self._live = None
            self._check(second, deform, names, height)
            if both_chains:
                self._set_ik_fk(0.0)
                self._check(second, deform, names, height, ik=True)
        finally:
            self._restore_state(kept)

    def _measuring_state(self):
        """Set what measuring both chains needs (IK/FK to FK, IK stretch on, the held controls at rest); returns
        what to put back."""
        pose_bones = self.obj.pose.bones
        values = [(b, key, pose_bones[b][key]) for b, key in self.limb_switches]
        values += [(b, key, pose_bones[b][key]) for b, key, _ in self.stretch]
        channels = [(b, prop, tuple(getattr(pose_bones[b], prop))) for b in self.held
                    for prop in ("location", "scale", _rest_rotation(pose_bones[b].rotation_mode)[0])]
        self._set_values([(b, key, 1.0) for b, key in self.limb_switches] + list(self.stretch))
        for b in self.held:
            self._rest(pose_bones[b])
        return [values, channels]

    def _restore_state(self, kept):
        if not kept:
            return
        values, channels = kept
        pose_bones = self.obj.pose.bones
        self._set_values(values)
        for b, prop, value in channels:
            setattr(pose_bones[b], prop, value)

    @staticmethod
    def _rest(pb):
        prop, value = _rest_rotation(pb.rotation_mode)
        setattr(pb, prop, value)
        pb.location = (0.0, 0.0, 0.0)
        pb.scale = (1.0, 1.0, 1.0)

    def _turned(self, names):
        """The matrices with every written control turned (and the limbs scaled): the second measuring pose."""
        for k, e in enumerate(self.written):
            self._turn_control(e, _turn(k), 1.0 + 0.04 * (1 + k % 3) if e.scaled else 1.0)
        return _matrices(self.obj, names)

    def _limb_rest(self, e, rest, deform):
        """The IK limb's roles and its rest plane (e.role, its middle and end joints) for a "base" or "pole" entry."""
        e.mid, e.end = limb_chain(e.role)
        a, m, w = (rest[deform[r]][:3, 3] for r in (e.role, e.mid, e.end))
        n = np.cross(m - a, w - m)
        if np.linalg.norm(n) < 1e-6 * np.linalg.norm(m - a) * np.linalg.norm(w - m):
            raise ControlRigError(f"the {deform[e.role]!r} limb is straight at rest: its IK chain has no bending plane")
        n = _unit(n)
        e.normal = _rotation(rest[deform[e.role]]).T @ n
        if e.part == "base":
            r = _rotation(rest[e.control])
            e.local_frame = _frames(r.T @ (m - a), r.T @ n)
        else:
            e.bend = float(np.sign(np.dot(np.cross(n, _unit(w - a)), m - a)) or 1.0)

    def _fit_parent(self, i, e, p, first, second, height, at_ends):
        """Find what the parent frame `p` of entry i follows (kind, anchor and offsets), from the two measuring
        evaluations."""
        written = self.written
        if p is None:
            e.anchor, e.kind, e.e = -1, "constant", np.eye(4)
            return
        candidates = [(float(_difference(first[p], second[p], height)), -1, "constant")]
        if i:                           # every earlier written control as the anchor, at once
            c1 = np.stack([first[w.control] for w in written[:i]])
            c2 = np.stack([second[w.control] for w in written[:i]])
            inherit = _difference(np.linalg.solve(c1, np.broadcast_to(first[p], c1.shape)),
                                  np.linalg.solve(c2, np.broadcast_to(second[p], c2.shape)), height)
            turn = np.swapaxes(_rotation(c1), -1, -2) @ _rotation(first[p])
            turn -= np.swapaxes(_rotation(c2), -1, -2) @ _rotation(second[p])
            point = (np.linalg.solve(c1, np.broadcast_to(first[p][:, 3:], (i, 4, 1)))
                     - np.linalg.solve(c2, np.broadcast_to(second[p][:, 3:], (i, 4, 1))))
            unscaled = np.maximum(np.maximum(np.abs(turn).max(axis=(-2, -1)), np.linalg.norm(point[..., 0], axis=-1)),
                                  abs(_scale(first[p]) - _scale(second[p])))
            candidates += [(float(v), a, kind) for kind, values in (("inherit", inherit), ("unscaled", unscaled))
                           for a, v in enumerate(values)]
        err, e.anchor, e.kind = min(candidates)
        if err > FIT and self.both_chains:
            self._fit_follow(i, e, p, first, second, height, at_ends)
            return
        if err > FIT:
            raise ControlRigError(f"the parent of control {e.control!r} follows more than one control "
                                  "(a follow or parent switch set between 0 and 1?)")
        c1 = first[written[e.anchor].control] if e.anchor >= 0 else None
        if e.kind == "constant":
            e.e = first[p]
        elif e.kind == "inherit":
            e.e = np.linalg.inv(c1) @ first[p]
        else:
            e.e = np.eye(4)
            e.e[:3, :3] = _rotation(c1).T @ _rotation(first[p]) * _scale(first[p])
            e.e_point = np.linalg.solve(c1, first[p][:, 3])

    def _fit_follow(self, i, e, p, first, second, height, at_ends):
        """A parent frame whose joint follows one written control and whose rotation follows another (Rigify's head
        with head_follow at 0: the torso's turn, the neck's end), or blends two (a follow switch between 0 and 1: the
        two rotations measured with the follow switches at 0 and at 1, the weight from the frames as they are)."""
        controls = [x.control for x in self.written[:i]]

        def control(ev, a):
            return ev[controls[a]] if a >= 0 else np.eye(4)

        def offset(ev, a):
            return _rotation(control(ev, a)).T @ _rotation(ev[p])

        def turn_error(a, f, s):
            return float(np.max(np.abs(offset(f, a) - offset(s, a))))

        anchors = range(-1, i)
        point_error, t = min((float(np.linalg.norm(np.linalg.solve(control(first, a), first[p][:, 3])
                                                   - np.linalg.solve(control(second, a), second[p][:, 3]))) / height, a)
                             for a in anchors)
        turn, r = min((turn_error(a, first, second), a) for a in anchors)
        rotations = [(r, offset(first, r))] if turn <= FIT else []
        if not rotations:
            for f, s in at_ends():
                turn, r = min((turn_error(a, f, s), a) for a in anchors)
                rotations.append((r, offset(f, r)) if turn <= FIT else None)
        if point_error > FIT or abs(_scale(first[p]) - _scale(second[p])) > FIT or None in rotations:
            raise ControlRigError(f"the parent of control {e.control!r} follows more than one control in a way "
                                  "Neural IK does not model")
        e.kind, e.point_anchor, e.frame_scale = "follow", t, _scale(first[p])
        e.e_point = np.linalg.solve(control(first, t), first[p][:, 3])
        (e.anchor, e.e), (e.anchor_b, e.e_b) = rotations[0], rotations[-1]
        e.weight = 0.0
        if len(rotations) == 2:
            pairs = [((_rotation(control(ev, e.anchor)) @ e.e, _rotation(control(ev, e.anchor_b)) @ e.e_b),
                      _rotation(ev[p])) for ev in (first, second)]
            (a, b), now = max(pairs, key=lambda pair: _angle(*pair[0]))
            e.weight = _angle(a, now) / max(_angle(a, b), 1e-12)
            if max(float(np.max(np.abs(_slerp(a, b, e.weight) - now))) for (a, b), now in pairs) > FIT:
                raise ControlRigError(f"the parent of control {e.control!r} follows two controls in a way Neural IK "
                                      "does not model")

    def _save(self):
        pose_bones = self.obj.pose.bones
        return {e.control: (tuple(getattr(pose_bones[e.control], rotation_property(e.mode))),
                            tuple(pose_bones[e.control].location), tuple(pose_bones[e.control].scale))
                for e in self.written}

    def _restore(self, saved):
        pose_bones = self.obj.pose.bones
        for e in self.written:
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

    def _check(self, turned, deform, names, height, ik=False):
        """Pose the controls from the turned pose's own deform bones and compare what Blender then shows (ik: with
        the limbs' switches on IK, the hands', feet's and head's heads and orientations)."""
        rig = self.rig
        world = np.broadcast_to(np.eye(4), (1, len(rig.role_bones), 4, 4)).copy()
        scaled = {e.role for e in self.entries if e.scaled}
        for r, name in deform.items():
            world[0, r] = _similarity(turned[name]) if r in scaled else _rigid(turned[name])
        saved = self._save()
        self.write(self.control_pose(world), 0)
        got = _matrices(self.obj, names)
        self._restore(saved)
        compared = [deform[r] for r in EFFECTOR_ROLES if r in deform] if ik else list(deform.values())
        worst_pos, worst_bone = max((np.linalg.norm(got[n][:3, 3] - turned[n][:3, 3]) / height, n) for n in compared)
        worst_rot = max(_angle(got[deform[r]], turned[deform[r]]) for r in EFFECTOR_ROLES if r in deform)
        self.check_error = (worst_pos, worst_rot)
        if worst_pos > (CHECK_IK_POSITION if ik else CHECK_POSITION) or worst_rot > (CHECK_IK_ANGLE if ik else CHECK_ANGLE):
            switches = " with the limbs' IK/FK switches on IK" if ik else ""
            raise ControlRigError(f"the controls of {self.obj.name!r} do not reproduce the deform bones as measured"
                                  f"{switches} (heads off by up to {worst_pos:.1e} of the rig height at {worst_bone!r}, "
                                  f"effectors turned by {worst_rot:.1e} rad)")

    # -- the control pose -------------------------------------------------------------------------------------------
    def control_pose(self, world):
        """Control bases for desired deform transforms `world` (F, 23, 4, 4) in armature space (rotation times a
        uniform scale: a limb squashed or stretched by Rigify's IK): a list (one per written entry) of (rotations
        (F, 3, 3) or None (a pole), locations (F, 3) or None, uniform scales (F,) or None where they stay 1)."""
        world = np.asarray(world, np.float64)
        actual = []
        out = []
        rigid = _rigid(world)
        for e in self.written:
            parent = self._parent_frame(e, actual, len(world))
            if e.part == "base":          # its parent damped-tracks the chain's end (where the end joint goes)
                parent = _damped_track(parent @ e.swing_rel, world[:, e.end, :3, 3])
            frame = parent @ e.rest_rel
            if e.part == "pole":
                now = frame.copy()
                now[:, :3, 3] = self._pole(e, world)
                actual.append(now)
                out.append((None, _location(e, parent, frame, now), None))
                continue
            if e.part == "base":          # pointing at the middle joint, turned about itself into the limb's plane
                cw = frame.copy()
                cw[:, :3, :3] = self._base_rotation(e, world)
            else:
                cw = (world if e.scaled else rigid)[:, e.role] @ e.d_inv
            basis = np.linalg.solve(frame, cw)
            rot = _rotation(basis)
            scale = np.linalg.norm(basis[:, :3, 1], axis=-1) if e.scaled else None
            scale = None if scale is None or np.all(np.abs(scale - 1.0) < 1e-5) else scale
            if e.location:
                loc = _location(e, parent, frame, cw)
                now = cw
            else:
                loc = None
                held = np.broadcast_to(np.eye(4), basis.shape).copy()
                held[:, :3, :3] = rot if scale is None else rot * scale[:, None, None]
                now = frame @ held
                now[:, :3, 3] = frame[:, :3, 3] + (frame if e.local_location else parent)[:, :3, :3] @ e.location_now
            actual.append(now)
            out.append((rot, loc, scale))
        return out

    def _parent_frame(self, e, actual, n):
        """(n, 4, 4) the parent frame of an entry from the posed controls before it (`actual`)."""
        if e.kind == "constant":
            return np.broadcast_to(e.e, (n, 4, 4))
        if e.kind == "inherit":
            return actual[e.anchor] @ e.e
        parent = np.broadcast_to(np.eye(4), (n, 4, 4)).copy()
        if e.kind == "unscaled":          # the anchor's rotation and joint, not its scale
            anchor = actual[e.anchor]
            parent[:, :3, :3] = _rotation(anchor) @ e.e[:3, :3]
            parent[:, :, 3] = anchor @ e.e_point
            return parent
        turn = (_rotation(actual[e.anchor]) if e.anchor >= 0 else np.eye(3)) @ e.e[:3, :3]
        if e.weight:
            turn = _slerp(np.broadcast_to(turn, (n, 3, 3)),
                          (_rotation(actual[e.anchor_b]) if e.anchor_b >= 0 else np.eye(3)) @ e.e_b, e.weight)
        parent[:, :3, :3] = turn * e.frame_scale
        parent[:, :, 3] = actual[e.point_anchor] @ e.e_point if e.point_anchor >= 0 else e.e_point
        return parent

    @staticmethod
    def _plane(e, world):
        """The solved limb's root, middle and end joints (F, 3) and its plane's unit normal (F, 3); where the limb is
        straight, the normal its first bone carries from the rest pose."""
        a, m, w = (world[:, r, :3, 3] for r in (e.role, e.mid, e.end))
        n = np.cross(m - a, w - m)
        bent = np.linalg.norm(n, axis=-1) > 1e-6 * np.linalg.norm(m - a, axis=-1) * np.linalg.norm(w - m, axis=-1)
        n = np.where(bent[:, None], _unit(n), _rotation(world[:, e.role]) @ e.normal)
        return a, m, w, n

    def _base_rotation(self, e, world):
        """(F, 3, 3) the IK chain's first control in armature space: its rest direction to the middle joint on the
        solved one, its rest plane's normal on the solved plane's (Blender's IK then bends the chain in that plane)."""
        a, m, _w, n = self._plane(e, world)
        return _frames(m - a, n) @ e.local_frame.T

    def _pole(self, e, world):
        """(F, 3) the pole target: beside the solved middle joint, in the limb's plane, the limb's length away from
        it (Rigify's snapping places it so)."""
        a, m, w, n = self._plane(e, world)
        bend = e.bend * _unit(np.cross(n, _unit(w - a)))
        length = np.linalg.norm(m - a, axis=-1) + np.linalg.norm(w - m, axis=-1)
        return m + bend * length[:, None]

    def write(self, pose, i):
        """Set frame i of a control_pose on the controls (rotation in each control's mode, location and scale where
        the entry writes them) and tag the armature."""
        from mathutils import Matrix

        pose_bones = self.obj.pose.bones
        for e, (rot, loc, scale) in zip(self.written, pose):
            pb = pose_bones[e.control]
            if rot is not None:
                set_turned(pb, e.mode, Matrix(rot[i].tolist()).to_quaternion())
                pb.scale = (1.0, 1.0, 1.0) if scale is None else (float(scale[i]),) * 3
            if loc is not None:
                pb.location = loc[i].tolist()
        self.obj.update_tag()

    def live_writer(self):
        """The live tick's writer of this rig as measured (control_live.LiveWriter, made once per measure)."""
        if self._live is None:
            self._live = LiveWriter(self)
        return self._live

    def key(self, container, frames, pose):
        """Key a control_pose at `frames` into an action's curve container: rotation, location and scale of every
        written control (a pole's location), and after measure(both_chains=True) the held controls at rest. No
        switch is keyed: the action leaves them as the user sets them."""
        from .pose_write import continuous_quaternions, euler_sequence

        frames = np.asarray(frames, np.float64)
        ones = np.ones(len(frames))

        def key(bone, prop, values):
            path = f'pose.bones["{bpy.utils.escape_identifier(bone)}"].{prop}'
            for k in range(values.shape[1]):
                _key_curve(container, path, k, bone, frames, values[:, k])

        for e, (rot, loc, scale) in zip(self.written, pose):
            if loc is not None:
                key(e.control, "location", loc)
            if rot is None:                # a pole: its location alone places it
                continue
            if loc is None:                # every channel the solve relies on: the action alone reproduces the pose
                key(e.control, "location", np.broadcast_to(e.location_now, (len(frames), 3)))
            key(e.control, "scale", np.repeat((ones if scale is None else scale)[:, None], 3, axis=1))
            if e.mode == "QUATERNION":
                values, prop = continuous_quaternions(matrix_to_quaternion(rot)), "rotation_quaternion"
            elif e.mode == "AXIS_ANGLE":
                from ...neural_network.geometry.rotations import blender_axis_angle

                values, prop = blender_axis_angle(matrix_to_axis_angle(rot)), "rotation_axis_angle"
            else:
                values, prop = euler_sequence(rot, e.mode), "rotation_euler"
            key(e.control, prop, values)
        for bone in self.held if self.both_chains else ():
            prop, value = _rest_rotation(self.obj.pose.bones[bone].rotation_mode)
            for channel, rest in ((prop, value), ("location", (0.0, 0.0, 0.0)), ("scale", (1.0, 1.0, 1.0))):
                key(bone, channel, np.broadcast_to(np.asarray(rest, np.float64), (len(frames), len(rest))))


def _location(e, parent, frame, world):
    """(F, 3) the location channel that puts entry e's head at `world`'s, given its parent's pose and its frame
    (parent @ rest_parent^-1 @ rest_control): in the bone's rest frame, or (Local Location off) in its parent's."""
    return np.linalg.solve((frame if e.local_location else parent)[:, :3, :3],
                           (world[:, :3, 3] - frame[:, :3, 3])[..., None])[..., 0]


def _difference(a, b, height):
    """How far two rigid transforms (or stacks of them) differ: the larger of the rotation's largest entry and the
    translation's length over `height`."""
    return np.maximum(np.abs(_rotation(a) - _rotation(b)).max(axis=(-2, -1)),
                      np.linalg.norm(a[..., :3, 3] - b[..., :3, 3], axis=-1) / height)


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
