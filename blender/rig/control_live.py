"""The live tick's write for a control rig (Rigify): one solved character onto its controls, as cheaply as Blender
allows. The arithmetic is ControlRig.control_pose's (control_rig.py: the reference, and what Bake keys), split by
what each control needs:

- Most controls turn with one solved joint: the control's parent frame is the posed control of the joint above or
  below (Rigify's FK arm and leg chains, the neck) or the same joint. Its rotation is then a constant quaternion,
  the joint's local rotation (or its inverse) and another constant: linear in the solved quaternions. One NumPy
  product gives all of them, straight into the rig's rotation buffer.
- The others run in Blender's C math library (mathutils), one matrix at a time: a control whose parent frame is
  further up the chain or fixed (Rigify's torso, in the armature's frame), a control that takes a location (the
  torso, the head), and the posed controls those frames hang from - with FK over just the joints they need.

Per tick: one `foreach_set` of the rotation buffer, a `matrix_basis` set per location control (rotation, location and
unit scale in one RNA update; a location set costs two: it also clears the IK solver's cache), and an Euler or
axis-angle set per control in those modes. The input is the solved character as the run-time graph leaves it (the
roles' local quaternions, then the hips' world quaternion in armature space, and the hips' head in armature space;
live.LiveCharacter gives a control rig's graph that hips map), or a refined solve, converted to the same.
"""

import numpy as np

from ...neural_network.geometry.quaternion_math import left_matrices
from ...neural_network.geometry.rotations import matrix_to_quaternion
from ...neural_network.skeleton.roles import NUM_ROLES

HIPS = slice(4 * NUM_ROLES, 4 * NUM_ROLES + 4)      # the hips' world quaternion in the extended vector
EXTENDED = 4 * NUM_ROLES + 4
CONJUGATE = np.diag([1.0, -1.0, -1.0, -1.0])


def right_matrices(q):
    """(4,) -> (4, 4) R(q) with p * q = R(q) @ p (Hamilton product, (w, x, y, z))."""
    eye = np.eye(4)
    return np.stack([left_matrices(eye[i]) @ q for i in range(4)], axis=-1)


def _quaternion(m):
    """The unit quaternion of a (4, 4) or (3, 3) matrix's rotation (its columns normalised: scale dropped)."""
    r = np.asarray(m, np.float64)[:3, :3]
    return matrix_to_quaternion(r / np.linalg.norm(r, axis=0))


class LiveWriter:
    """The constants of the live write for one measured ControlRig (made when its measure() is done)."""

    def __init__(self, controls):
        from mathutils import Matrix, Quaternion, Vector

        self.obj = obj = controls.obj
        rig = controls.rig
        skel = rig.skeleton
        entries = controls.entries
        self.parents = parents = {int(j): int(p) for idx, par in skel.levels() for j, p in zip(idx, par)}
        bridges = {j: _quaternion(skel.bridges[j]) for j in parents}
        self.to_arm = rig.basis.T.copy()
        self.scale = rig.scale
        pose_bones = obj.pose.bones
        index = {pb.name: i for i, pb in enumerate(pose_bones)}

        # the frame each entry's rotation is taken in: R(frame) = R(world of role `frame_role`) * k (-1: armature)
        frame_role, k = [], []
        for e in entries:
            const = e.e @ e.rest_rel
            if e.kind == "constant":
                frame_role.append(-1)
                k.append(_quaternion(const))
            else:
                a = entries[e.anchor]
                d_anchor = _quaternion(a.d_inv)
                turn = _quaternion(e.e) if e.kind == "unscaled" else np.array([1.0, 0.0, 0.0, 0.0])
                rest = _quaternion(e.rest_rel) if e.kind == "unscaled" else _quaternion(const)
                frame_role.append(a.role)
                k.append(_product(d_anchor, _product(turn, rest)))

        # single-joint controls: turned = conj(k) * rel(frame role -> role) * d, rel one local factor or none
        quaternion_maps, other_maps, quaternion_rows, others, singles = [], [], [], [], set()
        for i, e in enumerate(entries):
            rel = None if e.location else self._relative(frame_role[i], e.role, bridges)
            if rel is None:
                continue
            singles.add(i)
            sandwich = left_matrices(CONJUGATE @ k[i]) @ right_matrices(_quaternion(e.d_inv))
            linear = (sandwich @ rel[0], sandwich @ rel[1])
            if e.mode == "QUATERNION":
                quaternion_maps.append(linear)
                quaternion_rows.append(index[e.control])
            else:
                others.append((pose_bones[e.control], e.mode, len(other_maps)))
                other_maps.append(linear)
        maps = quaternion_maps + other_maps           # the quaternion controls' rows first: one buffer assignment
        self.single_map = np.concatenate([m for m, _ in maps] or [np.zeros((0, EXTENDED))]).T.astype(np.float32)
        self.single_bias = np.concatenate([b for _, b in maps] or [np.zeros(0)]).astype(np.float32)
        self.single_out = np.zeros(len(self.single_bias), np.float32)
        self.quaternion_rows = np.array(quaternion_rows, np.int64)
        self.other_singles = [(bone, mode, len(quaternion_rows) + n) for bone, mode, n in others]
        self.quaternions = np.empty((len(pose_bones), 4), np.float32)
        pose_bones.foreach_get("rotation_quaternion", self.quaternions.reshape(-1))
        self.set_all = pose_bones.foreach_set

        # the mathutils part: the other entries and, transitively, the entries their parent frames hang from
        python = {i for i in range(len(entries)) if i not in singles}
        stack = list(python)
        while stack:
            e = entries[stack.pop()]
            if e.kind != "constant" and e.anchor not in python:
                python.add(e.anchor)
                stack.append(e.anchor)
        roles = set()
        for i in python:
            j = entries[i].role
            while j > 0 and j not in roles:
                roles.add(j)
                j = parents[j]
        self.fk = [(j, parents[j], Quaternion(bridges[j].tolist()), Vector((skel.offsets[j] / rig.scale).tolist()))
                   for idx, _ in skel.levels() for j in map(int, idx) if j in roles]
        anchors = {entries[i].anchor for i in python}
        self.steps = []
        for i in sorted(python):                     # entries come parents first (control_rig.ControlRig)
            e = entries[i]
            kind = ("constant", "inherit", "unscaled").index(e.kind)
            if kind == 2:
                const, turn, point = None, Quaternion(_quaternion(e.e).tolist()), Vector(e.e_point[:3].tolist())
            else:
                const, turn, point = Matrix((e.e @ e.rest_rel).tolist()), None, None
            # what the step writes: nothing (a single: the product has), matrix_basis (a location control), the
            # rotation buffer's row (a quaternion control), or its Euler or axis-angle rotation
            write = "matrix" if e.location else "none" if i in singles else "row" if e.mode == "QUATERNION" else "set"
            self.steps.append((i, e.role, Matrix(e.d_inv.tolist()), kind, e.anchor, const, turn, point,
                               Matrix(e.rest_rel.tolist()), None if e.location else Vector(e.location_now.tolist()),
                               i in anchors, write, pose_bones[e.control], index[e.control], e.mode))

    def _relative(self, frame_role, role, bridges):
        """rel = conj(world of frame_role) * world of role as (matrix (4, EXTENDED), bias (4,)) on the extended
        vector, when that is one local factor or none; None otherwise. frame_role -1 is the armature's frame, where
        only the hips are one factor (their world quaternion)."""
        matrix, bias = np.zeros((4, EXTENDED)), np.zeros(4)
        if frame_role == -1 and role == 0:
            matrix[:, HIPS] = np.eye(4)
        elif frame_role == role and role >= 0:                # the same joint: the identity
            bias[0] = 1.0
        elif frame_role >= 0 and self.parents.get(role) == frame_role:        # the joint below: bridge * q
            matrix[:, 4 * role:4 * role + 4] = left_matrices(bridges[role])
        elif frame_role >= 0 and self.parents.get(frame_role) == role:        # the joint above: conj(q) * conj(b)
            matrix[:, 4 * frame_role:4 * frame_role + 4] = right_matrices(CONJUGATE @ bridges[frame_role]) @ CONJUGATE
        else:
            return None
        return matrix, bias

    def write_solved(self, local_quaternions, hips):
        """Write one solved character given as local quaternions (23, 4) and the hips transform (4, 4), character
        space (a refined solve, or the NumPy path's)."""
        ext = np.empty(EXTENDED, np.float32)
        ext[:4 * NUM_ROLES] = np.asarray(local_quaternions, np.float32).reshape(-1)
        hips = np.asarray(hips, np.float64)
        ext[HIPS] = matrix_to_quaternion(self.to_arm @ hips[:3, :3])
        self.write(ext, self.to_arm @ hips[:3, 3] / self.scale)

    def write(self, extended, hips_location):
        """Write one solved character: extended (EXTENDED,) float32 (the roles' local quaternions, then the hips'
        world quaternion in armature space), hips_location (3,) the hips' head in armature space."""
        from mathutils import Matrix, Quaternion, Vector

        out = self.single_out
        np.matmul(extended, self.single_map, out=out)
        out += self.single_bias
        buffer = self.quaternions
        rows = self.quaternion_rows
        buffer[rows] = out[:4 * len(rows)].reshape(-1, 4)
        for bone, mode, column in self.other_singles:
            set_turned(bone, mode, Quaternion(out[4 * column:4 * column + 4].tolist()))
        sets = []
        if self.steps:
            q = extended.tolist()
            rot = {0: Quaternion(q[4 * NUM_ROLES:])}
            pos = {0: Vector(hips_location.tolist())}
            for j, p, bridge, offset in self.fk:
                rp = rot[p]
                rot[j] = rp @ bridge @ Quaternion(q[4 * j:4 * j + 4])
                pos[j] = pos[p] + rp @ offset
            loc_rot_scale = Matrix.LocRotScale
            actual = {}
            for i, role, d_inv, kind, anchor, const, turn, point, rest_rel, held, anchors, write, bone, row, mode \
                    in self.steps:
                cw = loc_rot_scale(pos[role], rot[role], None) @ d_inv
                if kind == 0:
                    frame = const
                elif kind == 1:
                    frame = actual[anchor] @ const
                else:
                    a = actual[anchor]
                    frame = loc_rot_scale(a @ point, a.to_quaternion() @ turn, None) @ rest_rel
                basis = frame.inverted() @ cw
                turned = basis.to_quaternion()
                if held is None:
                    actual[i] = cw
                elif anchors:
                    actual[i] = frame @ loc_rot_scale(held, turned, None)
                if write == "row":
                    buffer[row] = turned
                elif write == "matrix":
                    sets.append((bone, loc_rot_scale(basis.translation, turned, None)))
                elif write == "set":
                    sets.append((bone, mode, turned))
        self.set_all("rotation_quaternion", buffer.reshape(-1))
        if not sets:                     # foreach_set tags nothing; an RNA set below does
            self.obj.update_tag(refresh={"DATA"})
        for item in sets:
            if len(item) == 2:
                item[0].matrix_basis = item[1]
            else:
                set_turned(*item)


def _product(a, b):
    """a * b of two (4,) quaternions."""
    return left_matrices(a) @ b


def set_turned(bone, mode, turned):
    """Set a mathutils Quaternion on a pose bone in its rotation mode: Euler as the angles nearest the ones it
    holds (so nothing jumps by a turn), axis-angle, or the quaternion itself."""
    if mode == "QUATERNION":
        bone.rotation_quaternion = turned
    elif mode == "AXIS_ANGLE":
        axis, angle = turned.to_axis_angle()
        bone.rotation_axis_angle = (angle, *axis)
    else:
        bone.rotation_euler = turned.to_euler(mode, bone.rotation_euler)
