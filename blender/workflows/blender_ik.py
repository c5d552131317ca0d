"""Blender's own IK constraint set up as the baseline Neural IK is compared with (docs/blender-ik-baseline.md).

On a COPY of the armature (the reference keeps playing its action and serves as the targets):
- the hips (and every bone no solver owns: root, pelvis, twist and finger bones) follow the reference's action;
- every other mapped bone starts each frame from the mean local pose of training clips of the same skeleton;
- limb IK: an IK constraint on each forearm / shin, `use_tail=True`, the chain up to the mapped upper arm / thigh
  (2 bones, more where a twist bone sits between them: DAZ's lShldrBend > lShldrTwist > lForearmBend), target the
  reference's hand / foot bone (its head is the wrist / ankle); the hand and foot copy the reference's rotation
  world to world;
- head chain: IK on the top neck bone down to, not including, the hips, target the reference's head bone, and a
  Copy Rotation on the head;
- unmapped bones inside a limb chain (twist bones) may only twist about their own axis (`lock_ik_x/z`, as DAZ rigs'
  own IK set-ups have it), so the chain bends at the shoulder / hip and elbow / knee and poles place the elbow / knee;
- forearm / shin tails that do not sit on the hand / foot head (Blender's BVH importer on the CMU rig) are moved
  onto it on the copy;
- optional poles: one empty per limb keyed every frame at the reference elbow / knee pushed out within the limb
  plane, with a pole angle keyed per frame from the reference's upper-arm / thigh axes, wrapped to +-180 degrees
  (Blender clamps it, it does not wrap).
`remove()` deletes everything this module created.
"""

import math

import bpy
import numpy as np

from ..rig import action_layouts

TAG = "NIK Baseline"
LIMBS = (   # (root role, IK bone role, target role)
    ("LeftArm", "LeftForeArm", "LeftHand"),
    ("RightArm", "RightForeArm", "RightHand"),
    ("LeftThigh", "LeftShin", "LeftFoot"),
    ("RightThigh", "RightShin", "RightFoot"),
)
COPY_ROTATION_ROLES = ("LeftHand", "RightHand", "LeftFoot", "RightFoot", "Head")
HEAD_CHAIN_TOPS = ("NeckUpper", "NeckLower")


def _bone_of_path(data_path):
    if data_path.startswith('pose.bones["'):
        return data_path[len('pose.bones["'):].split('"]', 1)[0]
    return None


def _wrap(angle):
    return (angle + math.pi) % (2.0 * math.pi) - math.pi


def pole_frames(shoulder, elbow, wrist, upper_x, upper_z):
    """Per-frame pole positions (F, 3) and pole angles (F,) from reference joint positions (F, 3) and the world
    x / z axes (F, 3) of the chain's root bone.

    The pole sits at the elbow pushed out, within the limb plane, by the limb's length. The angle is the one for
    which Blender's pole rule (the root bone's x*cos(a) + z*sin(a), taken perpendicular to root->target, points at
    the pole) holds in the reference pose itself, wrapped to [-pi, pi]. A straight limb keeps the previous
    frame's bend direction.
    """
    axis = wrist - shoulder
    axis_n = axis / np.maximum(np.linalg.norm(axis, axis=-1, keepdims=True), 1e-9)
    bend = (elbow - shoulder) - np.sum((elbow - shoulder) * axis_n, -1, keepdims=True) * axis_n
    length = np.linalg.norm(elbow - shoulder, axis=-1) + np.linalg.norm(wrist - elbow, axis=-1)
    out = np.empty_like(bend)
    previous = None
    for f in range(len(bend)):
        size = np.linalg.norm(bend[f])
        if size > 1e-3 * max(length[f], 1e-6) or previous is None:
            candidate = bend[f] / max(size, 1e-12)
            if size <= 1e-9:   # straight in the first frame: any direction perpendicular to the limb
                candidate = np.cross(axis_n[f], upper_x[f])
                candidate /= max(np.linalg.norm(candidate), 1e-12)
            previous = candidate
        out[f] = previous
    poles = elbow + out * length[:, None]

    def perpendicular(v):
        return v - np.sum(v * axis_n, -1, keepdims=True) * axis_n

    xp, zp = perpendicular(upper_x), perpendicular(upper_z)
    side = np.cross(axis_n, out)                 # perpendicular to the pole direction within the normal plane
    a = np.arctan2(-np.sum(xp * side, -1), np.sum(zp * side, -1))
    up = xp * np.cos(a)[:, None] + zp * np.sin(a)[:, None]
    a = np.where(np.sum(up * out, -1) < 0.0, a + math.pi, a)
    return poles, np.array([_wrap(v) for v in a])


class BaselineRig:
    """Blender IK on a copy of `reference` for one action. Build with `build()`, evaluate, then `remove()`."""

    def __init__(self, scene, reference, bone_map, mean_pose, action, use_poles=False, reference_frames=None,
                 targets=None):
        """bone_map {role: bone}; mean_pose {bone: 3x3 local rotation}; reference_frames: for poles, a dict with
        "frames" (F,), "positions" {role: (F, 3) world} and "axes" {role: (F, 3, 3) world bone orientation};
        targets: {effector role: object} to follow objects (Neural IK's target empties) instead of the reference's
        bones (the hips still follow the reference's action)."""
        self.scene, self.reference, self.bone_map = scene, reference, bone_map
        self.mean_pose, self.action, self.use_poles = mean_pose, action, use_poles
        self.reference_frames = reference_frames
        self.targets = targets or {}
        self.copy = None
        self.copy_action = None
        self.empties = []
        self.constraints = []

    # ---- building ------------------------------------------------------------------------------------------
    def build(self):
        self._make_copy()
        self._fix_limb_tails()
        self._make_action()
        self._add_constraints()
        return self

    def _make_copy(self):
        ref = self.reference
        copy = ref.copy()
        copy.data = ref.data.copy()
        copy.name = f"{ref.name} {TAG}"
        if copy.animation_data is not None:
            copy.animation_data.action = None
        for con in list(copy.constraints):
            copy.constraints.remove(con)
        self.scene.collection.objects.link(copy)
        self.copy = copy

    def _fix_limb_tails(self):
        """Move forearm / shin tails onto the hand / foot heads where they are apart (CMU rig)."""
        moves = []
        bones = self.copy.data.bones
        for _root, mid, end in LIMBS:
            mid_name, end_name = self.bone_map.get(mid, ""), self.bone_map.get(end, "")
            if mid_name in bones and end_name in bones:
                gap = (bones[mid_name].tail_local - bones[end_name].head_local).length
                if gap > 1e-4:
                    moves.append((mid_name, end_name))
        if not moves:
            return
        view_layer = bpy.context.view_layer
        previous = view_layer.objects.active
        view_layer.objects.active = self.copy
        bpy.ops.object.mode_set(mode="EDIT")
        edit = self.copy.data.edit_bones
        for mid_name, end_name in moves:
            edit[mid_name].use_connect = False
            edit[mid_name].tail = edit[end_name].head.copy()
        bpy.ops.object.mode_set(mode="OBJECT")
        view_layer.objects.active = previous

    def _solved_bones(self):
        hips = self.bone_map.get("Hips", "")
        return {bone for role, bone in self.bone_map.items() if bone and bone != hips and bone in self.copy.pose.bones}

    def _make_action(self):
        """The reference action minus the rotations of the solved bones, which sit at the mean pose instead."""
        act = self.action.copy()
        act.name = f"{self.action.name} {TAG}"
        self.copy_action = act
        action_layouts.assign_action(self.copy, act)
        bag = action_layouts.curve_container(self.copy)
        solved = self._solved_bones()
        if bag is not None:
            for fc in list(bag.fcurves):
                if _bone_of_path(fc.data_path) in solved and "rotation" in fc.data_path:
                    bag.fcurves.remove(fc)
        for name in solved:
            pb = self.copy.pose.bones[name]
            pb.rotation_mode = "QUATERNION"
            matrix = self.mean_pose.get(name)
            if matrix is not None:
                pb.rotation_quaternion = _quaternion(matrix)
            else:
                pb.rotation_quaternion = (1.0, 0.0, 0.0, 0.0)

    def _chain_length_to_hips(self, bone_name):
        hips = self.bone_map.get("Hips", "")
        count, bone = 0, self.copy.data.bones[bone_name]
        while bone is not None and bone.name != hips:
            count += 1
            bone = bone.parent
        return count if bone is not None else 0

    def _limb_chain_length(self, mid_name, root_name):
        """Bones from the forearm / shin up to the upper arm / thigh, both included: 2, or more with twist bones in
        between; 2 where the upper arm / thigh is not above it (a hand-edited map)."""
        count, bone = 1, self.copy.data.bones[mid_name].parent
        while bone is not None and bone.name != root_name:
            count, bone = count + 1, bone.parent
        return count + 1 if bone is not None else 2

    def _twist_only(self, bone_name, chain_count):
        """The unmapped bones of the chain of `chain_count` bones ending at `bone_name` may only twist (IK)."""
        mapped = set(self.bone_map.values())
        bone = self.copy.data.bones[bone_name]
        for _ in range(chain_count):
            if bone is None:
                break
            if bone.name not in mapped:
                pb = self.copy.pose.bones[bone.name]
                pb.lock_ik_x = pb.lock_ik_z = True
            bone = bone.parent

    def _add_constraints(self):
        pose, mapped = self.copy.pose.bones, self.bone_map
        for k, (root, mid, end) in enumerate(LIMBS):
            if not (mapped.get(mid) and mapped.get(end) and mapped.get(root)):
                continue
            con = pose[mapped[mid]].constraints.new("IK")
            con.name = f"{TAG} IK"
            self._aim(con, end)
            con.use_tail, con.chain_count = True, self._limb_chain_length(mapped[mid], mapped[root])
            self._twist_only(mapped[mid], con.chain_count)
            self.constraints.append(con)
            if self.use_poles:
                self._add_pole(con, root, mid, end, k)
        top = next((mapped[r] for r in HEAD_CHAIN_TOPS if mapped.get(r)), "")
        if top and mapped.get("Head"):
            con = pose[top].constraints.new("IK")
            con.name = f"{TAG} IK"
            self._aim(con, "Head")
            con.use_tail, con.chain_count = True, self._chain_length_to_hips(top)
            self.constraints.append(con)
        for role in COPY_ROTATION_ROLES:
            if mapped.get(role):
                con = pose[mapped[role]].constraints.new("COPY_ROTATION")
                con.name = f"{TAG} Rotation"
                self._aim(con, role)
                con.target_space = con.owner_space = "WORLD"
                self.constraints.append(con)

    def _aim(self, con, role):
        """Point a constraint at the role's target object, or at the reference's bone of that role."""
        if role in self.targets:
            con.target = self.targets[role]
        else:
            con.target, con.subtarget = self.reference, self.bone_map[role]

    def _add_pole(self, con, root, mid, end, index):
        data = self.reference_frames
        frames = np.asarray(data["frames"], np.float64)
        pos, axes = data["positions"], data["axes"]
        poles, angles = pole_frames(pos[root], pos[mid], pos[end], axes[root][:, :, 0], axes[root][:, :, 2])
        empty = bpy.data.objects.new(f"{TAG} pole {mid}", None)
        self.scene.collection.objects.link(empty)
        self.empties.append(empty)
        pole_action, _slot, bag = action_layouts.new_action(empty, f"{TAG} pole {mid}")
        action_layouts.assign_action(empty, pole_action)
        for axis in range(3):
            _key_curve(bag, "location", axis, frames, poles[:, axis])
        con.pole_target = empty
        con.pole_angle = float(angles[0])
        copy_bag = action_layouts.curve_container(self.copy)
        path = f'pose.bones["{self.bone_map[mid]}"].constraints["{con.name}"].pole_angle'
        _key_curve(copy_bag, path, 0, frames, angles)

    # ---- use -----------------------------------------------------------------------------------------------
    def set_constraints_enabled(self, enabled):
        for con in self.constraints:
            con.mute = not enabled
        self.copy.update_tag()

    def remove(self):
        """Delete the copy, its armature data, its action, the pole empties and their actions."""
        for empty in self.empties:
            act = empty.animation_data.action if empty.animation_data else None
            bpy.data.objects.remove(empty)
            if act is not None and act.users == 0:
                bpy.data.actions.remove(act)
        self.empties = []
        if self.copy is not None:
            data = self.copy.data
            bpy.data.objects.remove(self.copy)
            if data.users == 0:
                bpy.data.armatures.remove(data)
            self.copy = None
        if self.copy_action is not None and self.copy_action.users == 0:
            bpy.data.actions.remove(self.copy_action)
        self.copy_action = None
        self.constraints = []


def _key_curve(bag, data_path, index, frames, values):
    fc = bag.fcurves.new(data_path, index=index)
    fc.keyframe_points.add(len(frames))
    co = np.empty((len(frames), 2), np.float32)
    co[:, 0], co[:, 1] = frames, values
    fc.keyframe_points.foreach_set("co", co.ravel())
    fc.update()
    return fc


def _quaternion(matrix):
    from mathutils import Matrix

    return Matrix(np.asarray(matrix, np.float64).tolist()).to_quaternion()
