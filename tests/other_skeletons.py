"""Motion capture of other skeletons, made in the test: BVH files written by Blender's own exporter (io_anim_bvh) from
rigs built here, so tests of what other libraries' files do (their presets, a pelvis between the hips and the thighs,
a round trip between two skeletons, frame-rate resampling, other proportions) run on a fresh clone without
../shared/mocap. Built once per test session (conftest's `other_skeletons` fixture); tests link the files, never
edit them.

Each rig takes the demo rig's rest and motion (its actions as Blender evaluates them) under another library's bone
names, hierarchy, proportions, channels and frame rate:

- Bandai-like (`BANDAI_LIKE`): joint_Root > Hips > Spine > Chest > Neck > Head, Chest > Shoulder_L > UpperArm_L >
  LowerArm_L > Hand_L, Hips > UpperLeg_L > LowerLeg_L > Foot_L > Toes_L; six channels on every joint (every bone is
  disconnected, and the exporter writes position channels for those), Z-X-Y rotation channels, 30 fps, shorter
  legs and a longer trunk, a T-pose rest (the demo rig's is an A-pose). Bandai's files end their chains with End
  Sites of zero length; the exporter writes the bone's tail there, so the helper rewrites those OFFSET lines in the
  text (the one change made after export). One file keeps the exporter's End Sites and has its whole rest moved: as
  between some of Bandai's files, Blender's importer then gives its end bones other rest orientations.
- CMU-like (`CMU_LIKE`): CC_Base_Hip > CC_Base_Pelvis > thighs (the pelvis turned off its rest in every frame, as in
  CMU's files), twist and share bones that move, a finger and a facial bone, Z-Y-X rotation channels, six channels on
  the root only (root_transform_only), 60 fps (the demo motion sampled between its frames), longer legs.

The files are written Y-up, the BVH convention the importer assumes, so they import standing as real files do. The
pose of each file is the demo's: every bone that follows a demo bone turns with it, the hips travel the demo's path
scaled by the leg length (so the feet stay on the ground), helper bones turn on their own.
"""

import os
from dataclasses import dataclass

import numpy as np

# Blender's axes (Z up, -Y forward) to the BVH file's (Y up, +Z forward): what the importer turns back
TO_BVH = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])
DEMO_FRAMES = 40                    # demo frames 1..40 per file (at 60 fps: 79 frames over the same 1.3 s)
LEG_BONES = ("Thigh", "Shin", "Foot", "Toe")


@dataclass(frozen=True)
class Joint:
    name: str
    parent: str = None
    follows: str = None             # the demo bone whose rest and turns it takes
    at: tuple = None                # a helper: (demo bone, fraction along it) where its head sits; None: the origin
    lean: tuple = None              # a helper's own turn (radians, its rest axes): lean + sway * sin(2 pi t / 1.1 s)
    sway: tuple = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class SkeletonSpec:
    name: str
    joints: tuple
    files: tuple                    # (file stem, demo action); a third item True: another rest, the exporter's End Sites
    legs: float                     # leg length over the demo rig's
    trunk: float                    # spine, neck, head and arms over the demo rig's
    fps: int
    rotate_mode: str                # the channels' rotation order
    root_transform_only: bool       # six channels on the root only (else on every disconnected bone: all of them)
    zero_end_sites: bool
    rest_turns: tuple = ()          # (demo bone, axis, degrees): that limb turned about its head in the rest pose


def _right(name):
    """The right side's name of a left-side bone (_L_ / _L / Left)."""
    if name is None:
        return None
    for left, right in (("_L_", "_R_"), ("Left", "Right")):
        if left in name:
            return name.replace(left, right)
    return name[:-2] + "_R" if name.endswith("_L") else name


def _sided(left):
    """Joints of both sides from the left side's: the right side mirrored (its helpers sway the other way)."""
    out = []
    for joint in left:
        at = (_right(joint.at[0]), joint.at[1]) if joint.at else None
        sway = (joint.sway[0], -joint.sway[1], -joint.sway[2])
        lean = None if joint.lean is None else (joint.lean[0], -joint.lean[1], -joint.lean[2])
        out += [joint, Joint(_right(joint.name), _right(joint.parent), _right(joint.follows), at, lean, sway)]
    return tuple(out)


BANDAI_JOINTS = (
    Joint("joint_Root"),
    Joint("Hips", "joint_Root", "Hips"),
    Joint("Spine", "Hips", "Spine"),
    Joint("Chest", "Spine", "Spine2"),
    Joint("Neck", "Chest", "NeckLower"),
    Joint("Head", "Neck", "Head"),
) + _sided((
    Joint("Shoulder_L", "Chest", "LeftShoulder"),
    Joint("UpperArm_L", "Shoulder_L", "LeftArm"),
    Joint("LowerArm_L", "UpperArm_L", "LeftForeArm"),
    Joint("Hand_L", "LowerArm_L", "LeftHand"),
    Joint("UpperLeg_L", "Hips", "LeftThigh"),
    Joint("LowerLeg_L", "UpperLeg_L", "LeftShin"),
    Joint("Foot_L", "LowerLeg_L", "LeftFoot"),
    Joint("Toes_L", "Foot_L", "LeftToeBase"),
))

CMU_PELVIS = "CC_Base_Pelvis"
CMU_JOINTS = (
    Joint("CC_Base_Hip", None, "Hips"),
    Joint(CMU_PELVIS, "CC_Base_Hip", at=("Hips", 0.0), lean=(0.12, 0.04, -0.06), sway=(0.06, 0.05, 0.05)),
    Joint("CC_Base_Waist", "CC_Base_Hip", "Spine"),
    Joint("CC_Base_Spine01", "CC_Base_Waist", "Spine1"),
    Joint("CC_Base_Spine02", "CC_Base_Spine01", "Spine2"),
    Joint("CC_Base_NeckTwist01", "CC_Base_Spine02", "NeckLower"),
    Joint("CC_Base_NeckTwist02", "CC_Base_NeckTwist01", "NeckUpper"),
    Joint("CC_Base_Head", "CC_Base_NeckTwist02", "Head"),
    Joint("CC_Base_FacialBone", "CC_Base_Head", at=("Head", 0.3), lean=(0.0, 0.0, 0.0)),
) + _sided((
    Joint("CC_Base_L_Thigh", CMU_PELVIS, "LeftThigh"),
    Joint("CC_Base_L_ThighTwist01", "CC_Base_L_Thigh", at=("LeftThigh", 0.3), lean=(0.0, 0.1, 0.0), sway=(0, 0.1, 0)),
    Joint("CC_Base_L_Calf", "CC_Base_L_Thigh", "LeftShin"),
    Joint("CC_Base_L_CalfTwist01", "CC_Base_L_Calf", at=("LeftShin", 0.3), lean=(0.0, -0.1, 0.0), sway=(0, 0.1, 0)),
    Joint("CC_Base_L_KneeShareBone", "CC_Base_L_Calf", at=("LeftShin", 0.0), lean=(0.2, 0.0, 0.0)),
    Joint("CC_Base_L_Foot", "CC_Base_L_Calf", "LeftFoot"),
    Joint("CC_Base_L_ToeBaseShareBone", "CC_Base_L_Foot", at=("LeftToeBase", 0.0), lean=(0.0, 0.0, 0.0)),
    Joint("CC_Base_L_ToeBase", "CC_Base_L_Foot", "LeftToeBase"),
    Joint("CC_Base_L_Clavicle", "CC_Base_Spine02", "LeftShoulder"),
    Joint("CC_Base_L_Upperarm", "CC_Base_L_Clavicle", "LeftArm"),
    Joint("CC_Base_L_UpperarmTwist01", "CC_Base_L_Upperarm", at=("LeftArm", 0.3), lean=(0, 0.2, 0), sway=(0, 0.2, 0)),
    Joint("CC_Base_L_Forearm", "CC_Base_L_Upperarm", "LeftForeArm"),
    Joint("CC_Base_L_ForearmTwist01", "CC_Base_L_Forearm", at=("LeftForeArm", 0.5), lean=(0, -0.3, 0), sway=(0, 0.2, 0)),
    Joint("CC_Base_L_ElbowShareBone", "CC_Base_L_Forearm", at=("LeftForeArm", 0.0), lean=(0.1, 0.0, 0.0)),
    Joint("CC_Base_L_Hand", "CC_Base_L_Forearm", "LeftHand"),
    Joint("CC_Base_L_Mid1", "CC_Base_L_Hand", "LeftHandMiddle1"),
))

BANDAI_LIKE = SkeletonSpec(
    "bandai", BANDAI_JOINTS,
    (("dataset-1_bow_active_001", "crouch_shallow_01", True), ("dataset-1_run_normal_001", "run_easy_01"),
     ("dataset-1_walk_normal_001", "walk_normal_03"), ("dataset-1_walk_tired_001", "walk_normal_04"),
     ("dataset-2_raise-up-left-hand_normal_001", "reach_high_left_01")),
    legs=0.95, trunk=1.05, fps=30, rotate_mode="ZXY", root_transform_only=False, zero_end_sites=True,
    rest_turns=(("LeftArm", (0.0, 1.0, 0.0), -35.0), ("RightArm", (0.0, 1.0, 0.0), 35.0)))      # a T-pose
CMU_LIKE = SkeletonSpec(
    "cmu", CMU_JOINTS,
    (("005_01", "walk_normal_03"), ("006_01", "run_easy_01"), ("006_08", "reach_front_left_03")),
    legs=1.16, trunk=0.95, fps=60, rotate_mode="ZYX", root_transform_only=True, zero_end_sites=False)
OTHER_REST_SHIFT = np.array([0.008, 0.3, 0.0])     # Blender axes (metres): the other-rest file's whole skeleton moved


@dataclass
class BvhLibrary:
    """A folder of BVH files of one skeleton (link them, never edit them): made here (spec) or real (spec None)."""
    folder: str
    files: tuple                    # file names, sorted
    spec: SkeletonSpec = None

    @classmethod
    def of(cls, folder):
        return cls(folder, tuple(sorted(f for f in os.listdir(folder) if f.endswith(".bvh"))))

    def path(self, name):
        return os.path.join(self.folder, name if name.endswith(".bvh") else name + ".bvh")

    def frames(self, name):
        """The frame count a file declares."""
        with open(self.path(name)) as handle:
            return int(next(line for line in handle if line.startswith("Frames:")).split()[1])


@dataclass
class OtherSkeletons:
    bandai: BvhLibrary
    cmu: BvhLibrary


def export_other_skeletons(folder, seed=0):
    """Write the Bandai-like and CMU-like libraries into subfolders of `folder` from the demo rig (seed); leaves an
    empty scene behind. Returns OtherSkeletons."""
    import addon_utils
    import bpy

    addon_utils.enable("io_anim_bvh", default_set=False)
    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    bpy.ops.neural_ik.create_demo_rig(seed=seed)
    demo = bpy.context.active_object
    made = {}
    for spec in (BANDAI_LIKE, CMU_LIKE):
        out = os.path.join(str(folder), spec.name)
        os.makedirs(out, exist_ok=True)
        for stem, action, *other in spec.files:
            write_library_file(demo, spec, action, os.path.join(out, stem + ".bvh"), other_rest=bool(other))
        made[spec.name] = BvhLibrary(out, tuple(sorted(stem + ".bvh" for stem, *_ in spec.files)), spec)
    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    return OtherSkeletons(made["bandai"], made["cmu"])


def write_library_file(demo, spec, action_name, path, other_rest=False):
    """One BVH file of `spec`'s skeleton moving as the demo rig's action `action_name` (its frames 1..DEMO_FRAMES at
    spec.fps); the rig built for it is removed again."""
    import bpy

    from neural_ik.blender.rig import action_layouts, pose_write
    from neural_ik.blender.workflows.demo_rig import build_armature

    scene = bpy.context.scene
    times = 1.0 + np.arange((DEMO_FRAMES - 1) * spec.fps // 30 + 1) * 30.0 / spec.fps
    demo_rest, demo_pose = _demo_motion(demo, bpy.data.actions[action_name], times, spec)
    bones, turns = _rest_bones(demo, spec, OTHER_REST_SHIFT if other_rest else None)
    rig = build_armature(bpy.context, spec.name + "_like", bones)
    keys = _keys(rig, spec, demo_rest, demo_pose, turns, times)
    action, _slot, _container = action_layouts.new_action(rig, f"{spec.name}_{action_name}")
    frames = np.arange(1, len(times) + 1, dtype=np.float64)
    pose_write.key_bone_values(rig, action, frames, keys)
    action_layouts.assign_action(rig, action)
    scene.render.fps, scene.render.fps_base = spec.fps, 1.0          # the exporter writes the scene's frame time
    result = bpy.ops.export_anim.bvh(filepath=path, check_existing=False, global_scale=100.0, frame_start=1,
                                     frame_end=len(times), rotate_mode=spec.rotate_mode,
                                     root_transform_only=spec.root_transform_only)
    assert result == {"FINISHED"} and os.path.getsize(path) > 0, path
    if spec.zero_end_sites and not other_rest:
        _zero_end_sites(path)
    bpy.data.objects.remove(rig)
    bpy.data.actions.remove(action)


def _anchor(joint):
    return joint.follows or (joint.at[0] if joint.at else None)


def _placed(spec, joint, point, hips):
    """A demo rest point (Blender axes) on spec's proportions: legs scaled about the ground, the rest about the hips."""
    anchor = _anchor(joint) or ""
    if any(word in anchor for word in LEG_BONES):
        return spec.legs * point
    return spec.legs * hips + spec.trunk * (point - hips)


def _rest_bones(demo, spec, shift=None):
    """([(bone, parent, head, tail, roll, connected)], {bone: (3, 3)}) of spec's rig in the file's axes (Y up): each
    joint where its demo bone is (every bone disconnected: the exporter writes position channels for those), and the
    turn of the joints that spec.rest_turns moved in the rest pose."""
    from mathutils import Matrix

    bones = demo.data.bones
    hips = np.array(bones["Hips"].head_local)
    out, turns = [], {}
    for joint in spec.joints:
        anchor = _anchor(joint)
        if anchor is None:                          # a root joint at the origin
            head, tail = np.zeros(3), np.array([0.0, 0.0, 0.1])
        else:
            a, b = np.array(bones[anchor].head_local), np.array(bones[anchor].tail_local)
            if joint.follows:
                head, tail = a, b
            else:
                head = a + joint.at[1] * (b - a)
                tail = head + 0.25 * (b - a)
            head, tail = _placed(spec, joint, head, hips), _placed(spec, joint, tail, hips)
            for limb, axis, degrees in spec.rest_turns:
                if anchor == limb or limb in [p.name for p in bones[anchor].parent_recursive]:
                    pivot = _placed(spec, joint, np.array(bones[limb].head_local), hips)
                    turn = np.array(Matrix.Rotation(np.radians(degrees), 3, axis))
                    head, tail = pivot + turn @ (head - pivot), pivot + turn @ (tail - pivot)
                    turns[joint.name] = TO_BVH @ turn @ TO_BVH.T
            if shift is not None:
                head, tail = head + shift, tail + shift
        out.append((joint.name, joint.parent, tuple(TO_BVH @ head), tuple(TO_BVH @ tail), 0.0, False))
    return out, turns


def _demo_motion(demo, action, times, spec):
    """(rest {bone: (4, 4)}, pose {bone: (T, 4, 4)}) of the demo bones spec follows, armature space, Blender's
    evaluated pose at `times` (frames, fractions between them at other rates)."""
    import bpy

    from neural_ik.blender.rig import action_layouts

    scene = bpy.context.scene
    followed = sorted({j.follows for j in spec.joints if j.follows})
    action_layouts.assign_action(demo, action)
    pose = {bone: np.empty((len(times), 4, 4)) for bone in followed}
    for i, t in enumerate(times):
        scene.frame_set(int(np.floor(t)), subframe=float(t - np.floor(t)))
        for bone in followed:
            pose[bone][i] = np.array(demo.pose.bones[bone].matrix)
    rest = {bone: np.array(demo.data.bones[bone].matrix_local) for bone in followed}
    return rest, pose


def _keys(rig, spec, demo_rest, demo_pose, turns, times):
    """{bone: {"rotation_quaternion": (T, 4), "location": (T, 3)}}: the matrix_basis that pose rig as the demo rig.

    A bone that follows a demo bone turns rigidly with it (its world orientation G @ turn^T @ rest, G the demo bone's
    motion in the file's axes, turn its rest-pose turn); the hips' head travels the demo's path scaled by spec.legs;
    a helper turns by its own lean and sway.
    Blender's pose of a bone is parent pose @ parent rest^-1 @ rest @ basis, so the basis follows parent by parent."""
    from mathutils import Euler, Matrix

    to_bvh = np.eye(4)
    to_bvh[:3, :3] = TO_BVH
    rest = {b.name: np.array(b.matrix_local) for b in rig.data.bones}
    count = len(times)
    seconds = (np.asarray(times) - 1.0) / 30.0
    world, keys = {}, {}
    for joint in spec.joints:
        M = rest[joint.name]
        if joint.parent:
            A = world[joint.parent] @ np.linalg.inv(rest[joint.parent]) @ M
        else:
            A = np.broadcast_to(M, (count, 4, 4))
        B = np.broadcast_to(np.eye(4), (count, 4, 4)).copy()
        if joint.follows:
            d = joint.follows
            G = to_bvh @ demo_pose[d] @ np.linalg.inv(demo_rest[d]) @ to_bvh.T
            turn = turns.get(joint.name, np.eye(3))
            B[:, :3, :3] = np.swapaxes(A[:, :3, :3], -1, -2) @ G[:, :3, :3] @ turn.T @ M[:3, :3]
            if d == "Hips":
                head = spec.legs * demo_pose[d][:, :3, 3] @ TO_BVH.T
                B[:, :3, 3] = np.einsum("tji,tj->ti", A[:, :3, :3], head - A[:, :3, 3])
        elif joint.lean is not None:
            angles = np.asarray(joint.lean) + np.asarray(joint.sway) * np.sin(2 * np.pi * seconds / 1.1)[:, None]
            B[:, :3, :3] = [np.array(Euler(a).to_matrix()) for a in angles]
        world[joint.name] = A @ B
        quats, previous = [], None
        for m in B[:, :3, :3]:
            q = Matrix(m.tolist()).to_quaternion()
            if previous is not None:
                q.make_compatible(previous)
            quats.append(tuple(q))
            previous = q
        keys[joint.name] = {"rotation_quaternion": np.array(quats), "location": B[:, :3, 3]}
    return keys


def _zero_end_sites(path):
    """Rewrite every End Site's OFFSET as 0 0 0 (chains that end in a zero-length site, as Bandai's files do)."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    for i, line in enumerate(lines):
        if line.strip() == "End Site":
            offset = i + 2
            assert lines[offset].strip().startswith("OFFSET"), lines[offset]
            lines[offset] = lines[offset][:len(lines[offset]) - len(lines[offset].lstrip())] + "OFFSET 0.000000 0.000000 0.000000"
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write("\n".join(lines))


def mixamo_named_demo_rig(seed=1):
    """A second demo rig whose mapped bones carry Mixamo names: another skeleton (other hierarchy) for the importer."""
    import bpy

    bpy.ops.neural_ik.create_demo_rig(seed=seed)
    rig = bpy.context.scene.neural_ik.armature
    for role in ("Hips", "Spine", "Spine1", "Spine2", "Head", "LeftShoulder", "LeftArm", "LeftForeArm", "LeftHand",
                 "RightShoulder", "RightArm", "RightForeArm", "RightHand"):
        rig.data.bones[role].name = "mixamorig:" + role
    for role, name in (("Thigh", "UpLeg"), ("Shin", "Leg"), ("Foot", "Foot"), ("ToeBase", "ToeBase")):
        for side in ("Left", "Right"):
            rig.data.bones[side + role].name = f"mixamorig:{side}{name}"
    from neural_ik.blender.rig.bone_maps import auto_map_object

    assert auto_map_object(rig).preset == "mixamo"
    return rig
