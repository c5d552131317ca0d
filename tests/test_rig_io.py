"""Reading rigs and actions (blender.rig_model, pose_read, pose_write) against Blender itself, on Bandai's and CMU's
skeletons (files made in the test, tests/other_skeletons.py, and the real ones where ../shared/mocap is) and on BVH
files written from the demo rig (tests/demo_bvh.py, for what any rig does): positions and orientations read without
frame_set equal Blender's evaluated pose_bone.head/matrix; FK on the extracted rotations reproduces them; extraction
changes nothing; written poses and actions read back exactly.

The bone maps of the mocap rigs are written out here by hand so these tests do not depend on auto-mapping.
"""

import hashlib
import os

import numpy as np
import pytest
from conftest import MADE_AND_REAL

from neural_ik.neural_network.skeleton.roles import ROLES

BANDAI_MAP = {"Hips": "Hips", "Spine": "Spine", "Spine1": "Chest", "NeckLower": "Neck", "Head": "Head"}
CMU_MAP = {"Hips": "CC_Base_Hip", "Spine": "CC_Base_Waist", "Spine1": "CC_Base_Spine01", "Spine2": "CC_Base_Spine02",
           "NeckLower": "CC_Base_NeckTwist01", "NeckUpper": "CC_Base_NeckTwist02", "Head": "CC_Base_Head"}
for _side, _s in (("Left", "L"), ("Right", "R")):
    BANDAI_MAP.update({f"{_side}Shoulder": f"Shoulder_{_s}", f"{_side}Arm": f"UpperArm_{_s}",
                       f"{_side}ForeArm": f"LowerArm_{_s}", f"{_side}Hand": f"Hand_{_s}",
                       f"{_side}Thigh": f"UpperLeg_{_s}", f"{_side}Shin": f"LowerLeg_{_s}",
                       f"{_side}Foot": f"Foot_{_s}", f"{_side}ToeBase": f"Toes_{_s}"})
    CMU_MAP.update({f"{_side}Shoulder": f"CC_Base_{_s}_Clavicle", f"{_side}Arm": f"CC_Base_{_s}_Upperarm",
                    f"{_side}ForeArm": f"CC_Base_{_s}_Forearm", f"{_side}Hand": f"CC_Base_{_s}_Hand",
                    f"{_side}Thigh": f"CC_Base_{_s}_Thigh", f"{_side}Shin": f"CC_Base_{_s}_Calf",
                    f"{_side}Foot": f"CC_Base_{_s}_Foot", f"{_side}ToeBase": f"CC_Base_{_s}_ToeBase"})
BANDAI_MAP = {role: BANDAI_MAP.get(role, "") for role in ROLES}
CMU_MAP = {role: CMU_MAP.get(role, "") for role in ROLES}

# files both the real libraries and the made ones (tests/other_skeletons.py) hold
BANDAI_FILES = ("dataset-1_walk_normal_001.bvh", "dataset-1_run_normal_001.bvh",
                "dataset-2_raise-up-left-hand_normal_001.bvh", "dataset-1_bow_active_001.bvh")
CMU_FILES = ("006_08.bvh", "006_01.bvh")


def gather(tmp_path, source_folder, names, subfolder="bvh"):
    """A temporary folder with links to the named mocap files (the data itself never enters the repository)."""
    folder = tmp_path / subfolder
    folder.mkdir(exist_ok=True)
    for name in names:
        os.symlink(os.path.join(source_folder, name), folder / name)
    return folder


# ---- helpers --------------------------------------------------------------------------------------------------------


def import_folder(context, folder, scale=0.01):
    from neural_ik.blender.workflows.bvh_import import import_bvh_files

    return import_bvh_files(context, str(folder), scale)


def assert_auto_map_agrees(obj, mapping):
    """The import auto-maps the rig: it must find the hand-written map."""
    from neural_ik.properties import get_bone_map

    assert get_bone_map(obj) == mapping


def use_map(obj, mapping):
    from neural_ik.properties import set_bone_map

    set_bone_map(obj, mapping)
    return mapping


def assign(obj, action):
    """Assign an action (and its object slot) to obj: what a user does to see it (tests only)."""
    from neural_ik.blender.rig import action_layouts

    if obj.animation_data is None:
        obj.animation_data_create()
    obj.animation_data.action = action
    slot = action_layouts.action_slot_for_any(action)
    if slot is not None:
        obj.animation_data.action_slot = slot


def state_hash(obj):
    """Hash of everything extraction must leave alone: every action's keys, handles, interpolation and range, the
    scene frame, the assigned action and slot, the current pose channels."""
    import bpy

    from neural_ik.blender.rig import action_layouts

    h = hashlib.sha256()
    for action in sorted(bpy.data.actions, key=lambda a: a.name):
        h.update(action.name.encode())
        h.update(np.array([action.frame_range[0], action.frame_range[1], action.use_fake_user, action.users]).tobytes())
        for slot in (list(action.slots) if hasattr(action, "slots") else [None]):
            for fc in action_layouts.action_fcurves(action, slot):
                h.update(f"{fc.data_path}[{fc.array_index}]".encode())
                for prop in ("co", "handle_left", "handle_right"):
                    buf = np.empty(2 * len(fc.keyframe_points), np.float32)
                    fc.keyframe_points.foreach_get(prop, buf)
                    h.update(buf.tobytes())
                h.update(str([k.interpolation for k in fc.keyframe_points]).encode())
    scene = bpy.context.scene
    h.update(f"{scene.frame_current}/{scene.frame_start}/{scene.frame_end}".encode())
    anim = obj.animation_data
    h.update(str(anim.action.name if anim and anim.action else None).encode())
    h.update(str(anim.action_slot.identifier if anim and getattr(anim, "action_slot", None) else None).encode())
    for prop, width in (("location", 3), ("rotation_quaternion", 4), ("rotation_euler", 3), ("scale", 3)):
        buf = np.empty(width * len(obj.pose.bones), np.float32)
        obj.pose.bones.foreach_get(prop, buf)
        h.update(buf.tobytes())
    h.update(str(len(bpy.data.actions)).encode())
    return h.hexdigest()


def check_against_blender(obj, dataset, frames_per_action, max_actions=4):
    """Compare dataset rows with Blender's evaluated pose after frame_set; returns (worst position error / height,
    worst orientation error in radians, worst FK error / height, checked frames)."""
    import bpy

    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.neural_network.geometry import kinematics
    from neural_ik.neural_network.geometry.rotations import angle_between, axis_angle_to_matrix

    rig = rig_model.read_rig(obj, dataset.meta["bone_map"])
    mask = rig.role_mask
    height = dataset.skeleton.height
    names = dataset.action_names
    worst_pos = worst_rot = 0.0
    checked = 0
    for a, name in enumerate(names[:max_actions]):
        rows = np.where(dataset.action == a)[0]
        assign(obj, bpy.data.actions[str(name)])
        for row in rows[np.linspace(0, len(rows) - 1, frames_per_action).astype(int)]:
            bpy.context.scene.frame_set(int(dataset.frame[row]))
            heads = pose_read.armature_pose_heads(obj, rig)
            worst_pos = max(worst_pos, float(np.max(np.abs(heads[mask] - dataset.positions[row][mask]))) / height)
            basis = np.array([np.array(obj.pose.bones[rig.bone_names[b]].matrix_basis)[:3, :3]
                              for b in rig.role_bones[mask]])
            basis /= np.linalg.norm(basis, axis=-2, keepdims=True)
            local = axis_angle_to_matrix(dataset.rotations[row][mask].astype(np.float64))
            worst_rot = max(worst_rot, float(np.max(angle_between(basis, local))))
            checked += 1
    pose = kinematics.forward_axis_angle(
        dataset.skeleton, dataset.rotations.astype(np.float64), dataset.hips_rotation.astype(np.float64),
        dataset.hips_position.astype(np.float64),
        None if not dataset.has_moving_links else dataset.bridges.astype(np.float64),
        None if not dataset.has_moving_links else dataset.offsets.astype(np.float64))
    worst_fk = float(np.max(np.abs(pose.positions[:, mask] - dataset.positions[:, mask]))) / height
    return worst_pos, worst_rot, worst_fk, checked


TOLERANCE = 1e-4      # of the rig's height: the acceptance criterion


# ---- tests ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
def test_bandai_positions_and_fk_equal_blender(empty_scene, libraries, tmp_path):
    """Six channels on every joint, joint_Root above the hips, zero-length end sites."""
    import bpy

    from neural_ik.blender.workflows.extract import extract_dataset

    folder = gather(tmp_path, libraries.bandai.folder, BANDAI_FILES)
    obj, imported, skipped = import_folder(bpy.context, folder)
    assert len(imported) == len(BANDAI_FILES) and not skipped
    assert_auto_map_agrees(obj, BANDAI_MAP)
    mapping = use_map(obj, BANDAI_MAP)
    before = state_hash(obj)
    dataset, notes = extract_dataset(bpy.context, obj, mapping)
    assert state_hash(obj) == before, "extraction changed the user's actions, frame, assignment or pose"
    assert not notes
    assert len(dataset.action_names) == len(BANDAI_FILES)
    assert dataset.skeleton.role_mask.sum() == 21          # no Spine2, one neck bone
    pos, rot, fk, checked = check_against_blender(obj, dataset, frames_per_action=15)
    print(f"Bandai: {checked} frames, position error {pos:.2e} x height, rotation {rot:.2e} rad, FK {fk:.2e} x height")
    assert checked >= 50
    assert pos < TOLERANCE and fk < TOLERANCE and rot < 1e-4


@pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
def test_cmu_positions_fk_and_untouched_state(empty_scene, libraries, tmp_path):
    """A pelvis that moves between the hips and the thighs: per-frame links, FK through them equals Blender."""
    import bpy

    from neural_ik.blender.workflows.extract import extract_dataset

    folder = gather(tmp_path, libraries.cmu.folder, CMU_FILES)
    obj, imported, skipped = import_folder(bpy.context, folder)
    assert len(imported) == 2 and not skipped
    assert_auto_map_agrees(obj, CMU_MAP)
    mapping = use_map(obj, CMU_MAP)
    bpy.context.scene.frame_set(37)
    before = state_hash(obj)
    dataset, _ = extract_dataset(bpy.context, obj, mapping)
    assert state_hash(obj) == before
    assert bpy.context.scene.frame_current == 37
    assert dataset.has_moving_links, "CC_Base_Pelvis moves, so per-frame bridges/offsets are required"
    pos, rot, fk, checked = check_against_blender(obj, dataset, frames_per_action=25)
    print(f"CMU: {checked} frames, position error {pos:.2e} x height, rotation {rot:.2e} rad, FK {fk:.2e} x height")
    assert checked >= 50
    assert pos < TOLERANCE and fk < TOLERANCE and rot < 1e-4
    # the per-frame links are needed: the rest skeleton alone would be far off on this rig
    from neural_ik.neural_network.geometry import kinematics
    static = kinematics.forward_axis_angle(dataset.skeleton, dataset.rotations.astype(np.float64),
                                           dataset.hips_rotation.astype(np.float64),
                                           dataset.hips_position.astype(np.float64))
    mask = dataset.skeleton.role_mask
    assert np.max(np.abs(static.positions[:, mask] - dataset.positions[:, mask])) > 100 * TOLERANCE


def test_demo_rig_positions_and_fk_equal_blender(empty_scene):
    import bpy

    from neural_ik.blender.workflows.extract import extract_dataset

    bpy.ops.neural_ik.create_demo_rig()
    obj = bpy.context.active_object
    before = state_hash(obj)
    dataset, _ = extract_dataset(bpy.context, obj)
    assert state_hash(obj) == before
    pos, rot, fk, checked = check_against_blender(obj, dataset, frames_per_action=10, max_actions=7)
    print(f"demo: {checked} frames, position error {pos:.2e} x height, rotation {rot:.2e} rad, FK {fk:.2e} x height")
    assert checked >= 50
    assert pos < TOLERANCE and fk < TOLERANCE and rot < 1e-4


@pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
def test_retarget_keeps_world_rotations_of_every_file(empty_scene, libraries, tmp_path):
    """Each later file lands on the first file's armature with the world rotations its own import gives, although
    the importer chose different rest orientations for its zero-length end bones (trap 2)."""
    import bpy

    from neural_ik.blender.rig import pose_read, rig_model

    folder = gather(tmp_path, libraries.bandai.folder, BANDAI_FILES[:2] + ("dataset-1_bow_active_001.bvh",))
    target, imported, _ = import_folder(bpy.context, folder)
    names = sorted(os.listdir(folder))
    rig_target = rig_model.read_rig(target, BANDAI_MAP)
    differing = 0
    for name in names[1:]:
        bpy.ops.import_anim.bvh(filepath=str(folder / name), global_scale=0.01)
        own = bpy.context.active_object
        rig_own = rig_model.read_rig(own, BANDAI_MAP)
        rest_t = {b.name: np.array(b.matrix_local)[:3, :3] for b in target.data.bones}
        rest_o = {b.name: np.array(b.matrix_local)[:3, :3] for b in own.data.bones}
        differing += sum(float(np.max(np.abs(rest_t[k] - rest_o[k]))) > 1e-3 for k in rest_t)
        mine = pose_read.read_action(rig_target, target, bpy.data.actions[os.path.splitext(name)[0]])
        theirs = pose_read.read_action(rig_own, own, own.animation_data.action)
        # world rotation of the BVH joint = pose orientation @ rest orientation^T: independent of the bone's roll
        mask = rig_target.role_mask
        rest_tm = np.array([rest_t[rig_target.bone_names[b]] for b in rig_target.role_bones[mask]])
        rest_om = np.array([rest_o[rig_own.bone_names[b]] for b in rig_own.role_bones[mask]])
        world_t = mine.rotations[:, mask] @ np.swapaxes(rest_tm, -1, -2)
        world_o = theirs.rotations[:, mask] @ np.swapaxes(rest_om, -1, -2)
        assert np.max(np.abs(world_t - world_o)) < 1e-4
        assert np.max(np.abs(mine.hips_position - theirs.hips_position)) < 1e-4
    assert differing > 0, "the chosen files should include one whose end bones' rest orientation differs"


def test_write_pose_and_action_read_back(demo_bvh, empty_scene, tmp_path):
    import bpy

    from neural_ik.blender.rig import pose_read, pose_write, rig_model
    from neural_ik.neural_network.geometry.rotations import angle_between, axis_angle_to_matrix

    folder = gather(tmp_path, demo_bvh.folder, demo_bvh.files[:1])
    obj, _, _ = import_folder(bpy.context, folder)
    rig = rig_model.read_rig(obj, demo_bvh.bone_map)
    mask = rig.role_mask
    rng = np.random.default_rng(3)
    local = axis_angle_to_matrix(rng.normal(scale=0.8, size=(23, 3)))
    hips_rot = axis_angle_to_matrix(rng.normal(scale=0.5, size=3))
    hips_pos = np.array([0.1, -0.2, 0.9])
    obj.animation_data.action = None            # an assigned action would override the written pose
    untouched = {pb.name: tuple(pb.rotation_euler) for pb in obj.pose.bones
                 if pb.name not in {rig.bone_names[b] for b in rig.role_bones[mask]}}
    pose_write.write_pose(obj, rig, local, hips_rot, hips_pos)
    bpy.context.view_layer.update()
    basis = np.array([np.array(obj.pose.bones[rig.bone_names[b]].matrix_basis)[:3, :3] for b in rig.role_bones[mask]])
    assert np.max(angle_between(basis[1:], local[mask][1:])) < 1e-5
    assert np.max(angle_between(pose_read.armature_pose_rotations(obj, rig)[0], hips_rot)) < 1e-5
    assert np.max(np.abs(pose_read.armature_pose_heads(obj, rig)[0] - hips_pos)) < 1e-5
    assert untouched == {name: tuple(obj.pose.bones[name].rotation_euler) for name in untouched}

    frames = np.arange(5, 25)
    seq = axis_angle_to_matrix(rng.normal(scale=0.6, size=(len(frames), 23, 3)))
    hips_seq = axis_angle_to_matrix(rng.normal(scale=0.4, size=(len(frames), 3)))
    hips_pos_seq = rng.normal(scale=0.3, size=(len(frames), 3)) + [0, 0, 1]
    existing = bpy.data.actions[0].name
    action = pose_write.write_action(obj, rig, existing, frames, seq, hips_seq, hips_pos_seq)
    assert action.name != existing and bpy.data.actions.get(existing) is not None    # never overwrites
    sample = pose_read.read_action(rig, obj, action)
    assert list(sample.frames) == list(frames)
    assert np.max(angle_between(sample.local_rotations[:, mask][:, 1:], seq[:, mask][:, 1:])) < 1e-5
    assert np.max(angle_between(sample.hips_rotation, hips_seq)) < 1e-5
    assert np.max(np.abs(sample.hips_position - hips_pos_seq)) < 1e-5


def test_read_rig_refuses_bad_maps(demo_bvh, empty_scene, tmp_path):
    import bpy

    from neural_ik.blender.rig import rig_model

    folder = gather(tmp_path, demo_bvh.folder, demo_bvh.files[:1])
    obj, _, _ = import_folder(bpy.context, folder)
    good = demo_bvh.bone_map
    with pytest.raises(rig_model.RigError, match="'Nope'.*not in armature"):
        rig_model.read_rig(obj, dict(good, LeftHand="Nope"))
    with pytest.raises(rig_model.RigError, match="mapped to both"):
        rig_model.read_rig(obj, dict(good, RightHand="LeftHand"))
    with pytest.raises(rig_model.RigError, match="lacks the essential roles LeftFoot"):
        rig_model.read_rig(obj, dict(good, LeftFoot=""))
    with pytest.raises(rig_model.RigError, match="is not below"):
        rig_model.read_rig(obj, dict(good, LeftShin="RightShin", RightShin="LeftShin"))


def test_sparse_keys_modifiers_and_muted_curves_read_as_blender_evaluates(empty_scene):
    """Curves whose keys are not on every frame, a curve with a modifier and a muted curve take the sampled path or
    are skipped exactly as Blender evaluates them (the fast path only reads keys that sit on every frame)."""
    import bpy

    from neural_ik.blender.rig import action_layouts, pose_read, rig_model
    from neural_ik.blender.rig.bone_maps import bone_map_of

    bpy.ops.neural_ik.create_demo_rig()
    obj = bpy.context.active_object
    rig = rig_model.read_rig(obj, bone_map_of(obj))
    action = bpy.data.actions[0].copy()
    curves = action_layouts.action_fcurves(action, action_layouts.action_slot_for_any(action))
    rotations = [fc for fc in curves if fc.data_path.endswith("rotation_quaternion")]
    for fc in rotations[:12]:                     # three bones keyed every third frame, Bezier in between
        points = fc.keyframe_points
        for k in range(len(points) - 1, -1, -1):
            if k % 3:
                points.remove(points[k], fast=True)
        fc.update()
    rotations[20].modifiers.new("NOISE").strength = 0.3
    rotations[30].mute = True
    before = state_hash(obj)
    sample = pose_read.read_action(rig, obj, action)
    assert state_hash(obj) == before
    assign(obj, action)
    mask = rig.role_mask
    height = rig.skeleton.height
    worst = 0.0
    for row in range(0, len(sample.frames), 7):
        bpy.context.scene.frame_set(int(sample.frames[row]))
        heads = pose_read.armature_pose_heads(obj, rig)
        worst = max(worst, float(np.max(np.abs(heads[mask] - sample.positions[row][mask]))) / height)
    assert worst < TOLERANCE
