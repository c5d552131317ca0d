"""Retargeting through the role maps: the pure math (rest poses, rolls and axis conventions do not leak through), and
in real Blender: a file onto its own skeleton reproduces it, Bandai onto the CMU rig and the demo rig and back keeps
every bone's direction, feet stay on the ground, the hips' path scales by the leg lengths, a file of another frame
rate keeps its timing, and the target rig is untouched. The Bandai and CMU files are made in the test
(tests/other_skeletons.py) and, where ../shared/mocap is, also the real ones."""

import hashlib
import json

import numpy as np
import pytest
from conftest import MADE_AND_REAL
from daz_rig import daz_style_rig
from other_skeletons import mixamo_named_demo_rig
from synthetic import humanoid_skeleton

from neural_ik.neural_network.data import retarget
from neural_ik.neural_network.data.features import detect_contacts
from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix, chordal_mean
from neural_ik.neural_network.skeleton.roles import FOOT_ROLES, NUM_ROLES, ROLE_INDEX

CHAIN_PAIRS = [(a, b) for a, b in (
    ("Spine", "Spine1"), ("Spine1", "Spine2"), ("Spine2", "NeckLower"), ("NeckLower", "NeckUpper"),
    ("NeckUpper", "Head"), ("LeftShoulder", "LeftArm"), ("LeftArm", "LeftForeArm"), ("LeftForeArm", "LeftHand"),
    ("RightShoulder", "RightArm"), ("RightArm", "RightForeArm"), ("RightForeArm", "RightHand"),
    ("LeftThigh", "LeftShin"), ("LeftShin", "LeftFoot"), ("LeftFoot", "LeftToeBase"), ("RightThigh", "RightShin"),
    ("RightShin", "RightFoot"), ("RightFoot", "RightToeBase"))]


# ---- pure NumPy ---------------------------------------------------------------------------------------------------

def _demo_rest():
    """A humanoid skeleton's rest (character space, arbitrary bone orientations): mask, rotations, heads."""
    skel = humanoid_skeleton(missing=())
    return skel.role_mask, skel.rest_rotations, skel.rest_positions


def _random_motion(rest, frames=40, seed=0):
    """World rotations of a wobbling pose around the rest (FK through the rest links, small local turns)."""
    mask, rest_r, _ = rest
    rng = np.random.default_rng(seed)
    parents = retarget.nearest_mapped_parents(mask)
    world = np.empty((frames, NUM_ROLES, 3, 3))
    local = axis_angle_to_matrix(rng.normal(0, 0.35, (frames, NUM_ROLES, 3)))
    for j in range(NUM_ROLES):
        p = parents[j]
        base = rest_r[j] if p < 0 else world[:, p] @ (rest_r[p].T @ rest_r[j])
        world[:, j] = base @ local[:, j]
    return world


def test_bone_rolls_and_axis_conventions_do_not_leak_through():
    mask, rest_r, rest_x = _demo_rest()
    motion = _random_motion((mask, rest_r, rest_x))
    rng = np.random.default_rng(1)
    turns = axis_angle_to_matrix(rng.normal(0, 1.5, (NUM_ROLES, 3)))     # other bone rolls and axes, same joints
    other_rest = rest_r @ turns
    source = retarget.calibrate(mask, rest_r, rest_x, motion)
    target = retarget.calibrate(mask, other_rest, rest_x, motion @ turns)
    local, world, hips = retarget.retarget(source, target, motion, np.zeros((len(motion), 3)))
    assert np.allclose(world[:, mask], (motion @ turns)[:, mask], atol=1e-9)
    back = retarget.retarget(target, source, world, hips)[1]
    assert np.allclose(back[:, mask], motion[:, mask], atol=1e-9)


def test_a_t_pose_source_puts_an_a_pose_target_in_its_t_pose():
    mask, rest_r, rest_x = _demo_rest()
    a_rest_r, a_rest_x = rest_r.copy(), rest_x.copy()
    for side, sign in (("Left", 1.0), ("Right", -1.0)):      # arms 45 degrees down about the forward axis
        down = axis_angle_to_matrix(np.array([0.0, sign * np.pi / 4, 0.0]))
        arm = ROLE_INDEX[side + "Arm"]
        pivot = rest_x[arm]
        for role in ("Arm", "ForeArm", "Hand"):
            j = ROLE_INDEX[side + role]
            a_rest_r[j] = down @ rest_r[j]
            a_rest_x[j] = pivot + down @ (rest_x[j] - pivot)
    source = retarget.calibrate(mask, rest_r, rest_x)
    target = retarget.calibrate(mask, a_rest_r, a_rest_x)
    world = retarget.retarget(source, target, rest_r[None], rest_x[None, 0])[1]
    for side in ("Left", "Right"):
        arm, fore = ROLE_INDEX[side + "Arm"], ROLE_INDEX[side + "ForeArm"]
        t_pose = rest_x[fore] - rest_x[arm]
        moved = world[0, arm] @ (a_rest_r[arm].T @ (a_rest_x[fore] - a_rest_x[arm]))
        cos = np.dot(t_pose, moved) / np.linalg.norm(t_pose) / np.linalg.norm(moved)
        assert np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))) < 1e-4


SPINE_AND_NECK = ("Spine", "Spine1", "Spine2", "NeckLower", "NeckUpper")


def _angle(a, b):
    """Degrees between rotation matrices (broadcast)."""
    trace = np.trace(np.swapaxes(a, -1, -2) @ b, axis1=-2, axis2=-1)
    return np.degrees(np.arccos(np.clip((trace - 1) / 2, -1, 1)))


def test_a_rigs_own_spine_bends_stay_its_own():
    """A source whose waist sits kinked 45 degrees forward in all its motion, the bone above it turned back (CMU's
    short waist bone), carried onto a rig whose spine stands straight: the target's waist takes the source's
    departures from its typical posture (so on average it stands as its rig stands, its rest here), not the kink; the
    limbs' directions still carry over exactly, and carried back the motion is the source's again."""
    mask, rest_r, rest_x = _demo_rest()
    parents = retarget.nearest_mapped_parents(mask)
    spine, spine1 = ROLE_INDEX["Spine"], ROLE_INDEX["Spine1"]
    rng = np.random.default_rng(3)
    local = axis_angle_to_matrix(rng.normal(0, 0.2, (200, NUM_ROLES, 3)))
    kink = axis_angle_to_matrix(np.array([np.pi / 4, 0.0, 0.0]))
    local[:, spine] = kink @ local[:, spine]
    local[:, spine1] = kink.T @ local[:, spine1]
    world, heads = np.empty((200, NUM_ROLES, 3, 3)), np.empty((200, NUM_ROLES, 3))
    for j in range(NUM_ROLES):                 # FK through the rest links (character space)
        p = parents[j]
        if p < 0:
            world[:, j], heads[:, j] = rest_r[j] @ local[:, j], rest_x[j]
        else:
            world[:, j] = world[:, p] @ (rest_r[p].T @ rest_r[j]) @ local[:, j]
            heads[:, j] = heads[:, p] + world[:, p] @ (rest_r[p].T @ (rest_x[j] - rest_x[p]))
    source = retarget.calibrate(mask, rest_r, rest_x, world, heads)
    target = retarget.calibrate(mask, rest_r, rest_x)              # no clips: its rest is its typical posture
    carried, hips = retarget.retarget(source, target, world, heads[:, 0])[1:]
    relation = np.swapaxes(carried[:, 0], -1, -2) @ carried[:, spine]          # hips -> waist, carried
    typical = rest_r[0].T @ rest_r[spine]
    assert _angle(chordal_mean(relation), typical) < 3.0
    source_relation = np.swapaxes(world[:, 0], -1, -2) @ world[:, spine]
    assert _angle(chordal_mean(source_relation), typical) > 40.0
    departures = [_angle(chordal_mean(r)[None], r) for r in (relation, source_relation)]
    assert np.allclose(*departures, atol=0.5)                       # the same departures, frame by frame
    for role in ("LeftForeArm", "RightShin"):
        j = ROLE_INDEX[role]
        assert np.allclose(carried[:, j] @ target.frames[j][:, 0], world[:, j] @ source.frames[j][:, 0], atol=1e-9)
    back = retarget.retarget(target, source, carried, hips)[1]
    assert np.allclose(back[:, mask], world[:, mask], atol=1e-6)


def test_spine_and_neck_pair_from_both_ends():
    three = np.ones(NUM_ROLES, bool)
    two = three.copy()
    two[[ROLE_INDEX["Spine2"], ROLE_INDEX["NeckUpper"]]] = False
    pairs = retarget.correspondence(two, three)           # Bandai-like source onto a CMU-like target
    assert pairs[ROLE_INDEX["Spine"]] == ROLE_INDEX["Spine"]
    assert pairs[ROLE_INDEX["Spine2"]] == ROLE_INDEX["Spine1"]   # the chest carries the chest
    assert pairs[ROLE_INDEX["Spine1"]] == -1 and pairs[ROLE_INDEX["NeckUpper"]] == -1
    assert pairs[ROLE_INDEX["LeftHand"]] == ROLE_INDEX["LeftHand"]
    back = retarget.correspondence(three, two)
    assert back[ROLE_INDEX["Spine1"]] == ROLE_INDEX["Spine2"] and back[ROLE_INDEX["Spine2"]] == -1


# ---- real Blender -------------------------------------------------------------------------------------------------

def _rig_state(obj):
    """A hash of what must not change on the target: rest, bone map, preset, and every action's keys."""
    import bpy

    from neural_ik.blender.rig import action_layouts

    h = hashlib.sha256()
    for b in obj.data.bones:
        h.update(b.name.encode())
        h.update(np.array(b.matrix_local, np.float64).tobytes())
    h.update(json.dumps({i.role: i.bone for i in obj.neural_ik.bone_map}, sort_keys=True).encode())
    h.update(obj.neural_ik.preset.encode())
    for action in sorted(bpy.data.actions, key=lambda a: a.name):
        for fc in sorted(action_layouts.all_action_fcurves(action), key=lambda f: (f.data_path, f.array_index)):
            co = np.empty(2 * len(fc.keyframe_points), np.float32)
            fc.keyframe_points.foreach_get("co", co)
            h.update(f"{action.name}{fc.data_path}{fc.array_index}".encode())
            h.update(co.tobytes())
    h.update(str(obj.animation_data.action.name if obj.animation_data and obj.animation_data.action else "").encode())
    return h.hexdigest()


def _sample(obj, action, mapping=None):
    from neural_ik.blender.rig import bone_maps, pose_read, rig_model

    rig = rig_model.read_rig(obj, mapping or bone_maps.bone_map_of(obj))
    return rig, pose_read.read_action(rig, obj, action)


def _directions(positions):
    out = {}
    for a, b in CHAIN_PAIRS:
        d = positions[:, ROLE_INDEX[b]] - positions[:, ROLE_INDEX[a]]
        if np.all(np.isfinite(d)):
            out[(a, b)] = d / np.linalg.norm(d, axis=-1, keepdims=True)
    return out


def _direction_errors(pos_a, pos_b):
    """{(parent, child): max angle in degrees} over the chain links both motions have."""
    da, db = _directions(pos_a), _directions(pos_b)
    return {k: float(np.degrees(np.arccos(np.clip(np.sum(da[k] * db[k], -1), -1, 1))).max()) for k in da if k in db}


def _import(folder, files, onto=None, retarget_all=False):
    import bpy

    from neural_ik.blender.workflows.bvh_import import BvhFolderImport

    importer = BvhFolderImport(bpy.context, str(folder), 0.01, files, "", onto)
    importer.retarget_all = retarget_all
    return importer.run(bpy.context)


def _demo_bvh(tmp_path, action_name="walk_0"):
    """The demo rig with one action, that action exported as BVH with Blender's exporter: (rig, action, folder)."""
    import bpy

    from neural_ik.blender.rig import action_layouts

    bpy.ops.neural_ik.create_demo_rig(seed=0)
    rig = bpy.context.scene.neural_ik.armature
    names = sorted(a.name for a in bpy.data.actions)
    keep = next(n for n in names if n.startswith(action_name.split("_")[0]))
    for name in names:
        if name != keep:
            bpy.data.actions.remove(bpy.data.actions[name])
    action = bpy.data.actions[keep]
    action_layouts.assign_action(rig, action)
    first, last = action_layouts.action_frame_range(action)
    bpy.context.view_layer.objects.active = rig
    folder = tmp_path / "bvh"
    folder.mkdir()
    bpy.ops.export_anim.bvh(filepath=str(folder / "demo_clip.bvh"), frame_start=first, frame_end=last,
                            global_scale=100.0, rotate_mode="NATIVE")
    return rig, action, folder


def test_a_file_onto_its_own_skeleton_is_reproduced(empty_scene, tmp_path):
    import bpy

    from neural_ik.blender.rig import bone_maps, rig_model

    rig, action, folder = _demo_bvh(tmp_path)
    _, reference = _sample(rig, action)
    _, imported, skipped = _import(folder, "", onto=rig, retarget_all=True)
    assert skipped == [] and imported == ["demo_clip"]
    new = bpy.data.actions["demo_clip"]
    assert json.loads(new["neural_ik_source"]) == {"kind": "library", "file": "demo_clip.bvh",
                                                    "skeleton": "demo_clip", "retargeted": True}
    _, carried = _sample(rig, new)
    height = rig_model.read_rig(rig, bone_maps.bone_map_of(rig)).skeleton.height
    n = min(len(reference.positions), len(carried.positions))
    assert np.nanmax(np.abs(carried.positions[:n] - reference.positions[:n])) < 1e-4 * height


@pytest.fixture
def bandai_and_cmu(empty_scene, libraries):
    """A Bandai walk on its own armature and the CMU rig with two of its clips (made or real: `libraries`)."""
    import bpy

    bandai, _, _ = _import(libraries.bandai.folder, "dataset-1_walk_normal_001")
    bandai_action = bpy.data.actions["dataset-1_walk_normal_001"]
    cmu, _, _ = _import(libraries.cmu.folder, "005_01,006_01")
    return bandai, bandai_action, cmu, libraries


def _round_trip(source, action, target):
    """source action -> target -> source; returns (action on target, action back on source)."""
    from neural_ik.blender.workflows.retarget import Retargeter

    there = Retargeter(target).carry(source, action, "there")
    back = Retargeter(source).carry(target, there, "back")
    return there, back


@pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
@pytest.mark.parametrize("onto", ["cmu", "demo"])
def test_bandai_onto_another_rig_and_back_keeps_every_bone_direction(bandai_and_cmu, onto):
    import bpy

    bandai, action, cmu, _ = bandai_and_cmu
    if onto == "demo":
        bpy.ops.neural_ik.create_demo_rig(seed=0)
        target = bpy.context.scene.neural_ik.armature
    else:
        target = cmu
    before = _rig_state(target)
    there, back = _round_trip(bandai, action, target)
    _, original = _sample(bandai, action)
    _, there_s = _sample(target, there)
    _, back_s = _sample(bandai, back)
    errors = _direction_errors(original.positions, back_s.positions)
    assert len(errors) >= 12 and max(errors.values()) < 3.0, errors
    limbs = {k: v for k, v in _direction_errors(original.positions, there_s.positions).items() if "Spine" not in k[0]}
    assert max(limbs.values()) < 3.0, limbs                         # on the other rig too (its spine bends apart)
    feet = there_s.positions[:, list(FOOT_ROLES)]
    if onto == "demo":                                              # its ground is the armature's origin
        assert feet[..., 2].min() > -0.01
    src_contacts = detect_contacts(original.positions[:, list(FOOT_ROLES)], 0.0, 30.0, 1.7)
    dst_contacts = detect_contacts(feet, 0.0, 30.0, 1.7)
    assert src_contacts.sum() > 20 and np.mean(src_contacts == dst_contacts) > 0.9
    bpy.data.actions.remove(there)
    bpy.data.actions.remove(back)
    assert _rig_state(target) == before                             # rest, map and actions untouched


@pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
def test_import_onto_another_skeleton_leaves_the_rig_untouched(bandai_and_cmu):
    import bpy

    bandai, _, cmu, libraries = bandai_and_cmu
    bpy.data.objects.remove(bandai)
    for obj in list(bpy.data.objects):
        obj.select_set(False)
    bpy.context.view_layer.objects.active = cmu
    before = _rig_state(cmu)
    actions_before = {a.name for a in bpy.data.actions}
    bpy.ops.neural_ik.import_bvh_folder(directory=libraries.bandai.folder, global_scale=0.01, onto_active=True,
                                        files="dataset-1_bow_active_001,dataset-1_run_normal_001")
    new = sorted({a.name for a in bpy.data.actions} - actions_before)
    assert new == ["dataset-1_bow_active_001", "dataset-1_run_normal_001"]
    for name in new:
        note = json.loads(bpy.data.actions[name]["neural_ik_source"])
        assert note["kind"] == "library" and note["retargeted"] is True and note["file"] == name + ".bvh"
        frames = libraries.bandai.frames(name)          # 30 fps files on the 60 fps rig: resampled, same duration
        first, last = bpy.data.actions[name].frame_range
        assert bpy.context.scene.render.fps == 60 and abs((last - first) - 2 * (frames - 1)) <= 2
    assert [o.name for o in bpy.data.objects if o.type == "ARMATURE"] == [cmu.name]
    # the rig's own state is the same once the new actions are left out of the hash
    for name in new:
        bpy.data.actions[name].name = "zz_" + name
    after = _rig_state(cmu)
    for name in new:
        bpy.data.actions.remove(bpy.data.actions["zz_" + name])
    assert _rig_state(cmu) == before and after != before


def test_a_file_of_another_frame_rate_is_resampled_onto_the_rig(empty_scene, other_skeletons):
    """A 60 fps file (the demo rig's run on the CMU-like skeleton, tests/other_skeletons.py) imported onto the demo
    rig in its 30 fps scene: the clip keeps its duration and its timing, so frame by frame it is the demo's own run
    again (hips path, limb directions), not the run at half speed."""
    import bpy
    from other_skeletons import CMU_LIKE, DEMO_FRAMES

    stem, demo_action = CMU_LIKE.files[1]
    assert CMU_LIKE.fps == 60 and other_skeletons.cmu.frames(stem) == 2 * DEMO_FRAMES - 1
    bpy.ops.neural_ik.create_demo_rig(seed=0)
    rig = bpy.context.scene.neural_ik.armature
    assert bpy.context.scene.render.fps == 30
    bpy.ops.neural_ik.import_bvh_folder(directory=other_skeletons.cmu.folder, global_scale=0.01, onto_active=True,
                                        files=stem)
    carried = bpy.data.actions[stem]
    assert tuple(carried.frame_range) == (1.0, float(DEMO_FRAMES))
    _, own = _sample(rig, bpy.data.actions[demo_action])
    _, back = _sample(rig, carried)
    n = DEMO_FRAMES
    path = own.hips_position[:n, :2] - own.hips_position[0, :2]
    assert np.abs(path).max() > 0.5
    np.testing.assert_allclose(back.hips_position[:n, :2] - back.hips_position[0, :2], path, atol=2e-3)
    errors = _direction_errors(own.positions[:n], back.positions[:n])
    limbs = {k: v for k, v in errors.items() if k[0] not in SPINE_AND_NECK}
    print(f"\nresampled: hips path off by {np.abs(back.hips_position[:n, :2] - back.hips_position[0, :2] - path).max():.4f} m, "
          f"limb directions by {max(limbs.values()):.2f} degrees at most")
    assert len(limbs) >= 8 and max(limbs.values()) < 1.0, limbs


def _rest_lengths(obj):
    """(leg length: thigh to knee to ankle, mean of the sides; standing height: leg plus hips to head), metres, from
    the armature's rest as Blender holds it."""
    from neural_ik.blender.rig import bone_maps

    mapping = bone_maps.bone_map_of(obj)
    scale = float(np.mean(np.linalg.norm(np.array(obj.matrix_world)[:3, :3], axis=0)))

    def head(role):
        return scale * np.array(obj.data.bones[mapping[role]].head_local)

    def length(chain):
        return sum(float(np.linalg.norm(head(b) - head(a))) for a, b in zip(chain, chain[1:]))

    legs = np.mean([length((s + "Thigh", s + "Shin", s + "Foot")) for s in ("Left", "Right")])
    return float(legs), float(legs + length(("Hips", "Spine", "Spine1", "NeckLower", "Head")))


@pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
def test_the_hips_path_scales_by_the_leg_lengths(bandai_and_cmu):
    """Bandai's walk carried onto the CMU rig, whose legs are longer and whose trunk is not in the same proportion:
    the hips travel the source's ground path scaled by the ratio of the two rigs' leg lengths (measured here on their
    rests), so the steps fit the legs; not by the ratio of their heights."""
    from neural_ik.blender.workflows.retarget import Retargeter

    bandai, action, cmu, _ = bandai_and_cmu
    there = Retargeter(cmu).carry(bandai, action, "there")
    _, source = _sample(bandai, action)
    _, carried = _sample(cmu, there)
    (legs_from, height_from), (legs_to, height_to) = _rest_lengths(bandai), _rest_lengths(cmu)
    ratio = legs_to / legs_from
    print(f"\nlegs {legs_to / legs_from:.3f} x, heights {height_to / height_from:.3f} x")
    assert ratio > 1.1 and abs(height_to / height_from - ratio) > 0.03          # the test tells the two apart
    path = source.hips_position[:, :2] - source.hips_position[0, :2]
    assert np.abs(path).max() > 0.5                                            # the walk goes somewhere
    carried_path = carried.hips_position[:, :2] - carried.hips_position[0, :2]
    np.testing.assert_allclose(carried_path, ratio * path, atol=1e-4)
    rise = carried.hips_position[:, 2] - carried.hips_position[0, 2]            # up and down by the same ratio too
    np.testing.assert_allclose(rise, ratio * (source.hips_position[:, 2] - source.hips_position[0, 2]), atol=1e-4)


def test_escape_during_a_retargeted_import_keeps_the_files_done(empty_scene, tmp_path):
    import bpy
    from test_import_modal import ESC, TIMER, StandInContext

    from neural_ik.operators.data import BvhImportRunner

    _, _, folder = _demo_bvh(tmp_path)
    (folder / "demo_clip.bvh").rename(folder / "a_clip.bvh")
    (folder / "b_clip.bvh").write_bytes((folder / "a_clip.bvh").read_bytes())
    for obj in list(bpy.data.objects):
        bpy.data.objects.remove(obj)
    rig = mixamo_named_demo_rig()
    bpy.context.view_layer.objects.active = rig
    before = {a.name for a in bpy.data.actions}

    class Runner(BvhImportRunner):
        directory, global_scale, files, exclude, onto_active = str(folder), 0.01, "", "", True
        reports = []

        def report(self, levels, text):
            self.reports.append((next(iter(levels)), text))

    context, runner = StandInContext(), Runner()
    assert runner.invoke(context, None) == {"RUNNING_MODAL"}
    assert runner.modal(context, TIMER) == {"RUNNING_MODAL"}
    assert runner.modal(context, ESC) == {"FINISHED"}
    new = {a.name for a in bpy.data.actions} - before
    assert new == {"a_clip"} and json.loads(bpy.data.actions["a_clip"]["neural_ik_source"])["retargeted"] is True
    assert [o.name for o in bpy.data.objects if o.type == "ARMATURE"] == [rig.name]
    assert "kept 1 actions" in runner.reports[-1][1]


_LEGS_ONLY_BVH = """HIERARCHY
ROOT Hips
{
  OFFSET 0 0 0
  CHANNELS 6 Xposition Yposition Zposition Zrotation Xrotation Yrotation
  JOINT Spine
  {
    OFFSET 0 10 0
    CHANNELS 3 Zrotation Xrotation Yrotation
    JOINT Head
    {
      OFFSET 0 50 0
      CHANNELS 3 Zrotation Xrotation Yrotation
      End Site
      {
        OFFSET 0 10 0
      }
    }
  }
  JOINT LeftUpLeg
  {
    OFFSET 10 0 0
    CHANNELS 3 Zrotation Xrotation Yrotation
    JOINT LeftLeg
    {
      OFFSET 0 -45 0
      CHANNELS 3 Zrotation Xrotation Yrotation
      JOINT LeftFoot
      {
        OFFSET 0 -45 0
        CHANNELS 3 Zrotation Xrotation Yrotation
        End Site
        {
          OFFSET 0 0 10
        }
      }
    }
  }
}
MOTION
Frames: 2
Frame Time: 0.033333
0 95 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
0 95 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
"""


def test_a_file_missing_an_essential_role_is_skipped_with_its_reason(empty_scene, tmp_path):
    import bpy

    folder = tmp_path / "bvh"
    folder.mkdir()
    (folder / "legs_only.bvh").write_text(_LEGS_ONLY_BVH)
    bpy.ops.neural_ik.create_demo_rig(seed=0)
    rig = bpy.context.scene.neural_ik.armature
    before = _rig_state(rig)
    with pytest.raises(RuntimeError, match="legs_only.bvh could not be retargeted onto .*essential roles.*LeftArm"):
        bpy.ops.neural_ik.import_bvh_folder(directory=str(folder), global_scale=0.01, onto_active=True)
    assert _rig_state(rig) == before and [o.name for o in bpy.data.objects if o.type == "ARMATURE"] == [rig.name]


def test_onto_a_daz_style_rig_without_clips(empty_scene, tmp_path):
    import bpy

    from neural_ik.blender.rig.bone_maps import auto_map_object

    demo, action, folder = _demo_bvh(tmp_path)
    _, reference = _sample(demo, action)
    rig = daz_style_rig()
    result = auto_map_object(rig)
    assert result.problems == [] and result.mapping["LeftThigh"] == "lThigh" and result.mapping["LeftToeBase"] == ""
    before = _rig_state(rig)
    _, imported, skipped = _import(folder, "", onto=rig)
    assert skipped == [] and imported == ["demo_clip"]
    _, carried = _sample(rig, bpy.data.actions["demo_clip"])
    errors = _direction_errors(reference.positions, carried.positions)
    limbs = {k: v for k, v in errors.items() if k[0] not in SPINE_AND_NECK}
    assert len(limbs) >= 8 and max(limbs.values()) < 1.0, errors        # every limb link both rigs have
    assert max(errors.values()) < 10.0, errors      # the spine and neck bend about their own typical posture
    # its planted ankles stand where its rest ankles stand (8 cm above its ground); none sinks below the source's
    assert abs(retarget.planted_height(carried.positions) - 0.08) < 0.005
    assert carried.positions[:, list(FOOT_ROLES), 2].min() > reference.positions[:, list(FOOT_ROLES), 2].min() - 0.02
    contacts = detect_contacts(carried.positions[:, list(FOOT_ROLES)], 0.0, 30.0, 1.6)
    assert np.mean(contacts == detect_contacts(reference.positions[:, list(FOOT_ROLES)], 0.0, 30.0, 1.6)) > 0.9
    bpy.data.actions.remove(bpy.data.actions["demo_clip"])
    assert _rig_state(rig) == before
