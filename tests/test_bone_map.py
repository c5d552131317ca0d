"""Bone map: presets on Bandai's and CMU's rigs (made in the test, and real where ../shared/mocap is), the hierarchy
fallback on a renamed rig, validation, and no input that breaks it."""

import random

import pytest
from conftest import MADE_AND_REAL
from daz_rig import daz_style_bones
from hypothesis import given, settings
from hypothesis import strategies as st

from neural_ik.neural_network.data import demo_skeleton
from neural_ik.neural_network.skeleton import bone_map
from neural_ik.neural_network.skeleton.roles import ESSENTIAL_ROLES, ROLES

DEMO_BONES = [(b.name, b.parent or None) for b in demo_skeleton.BONES]
DEMO_HEADS = {b.name: b.head for b in demo_skeleton.BONES}


def _renamed(bones, heads, seed=0):
    """The same hierarchy under neutral names bone_000 ..., in shuffled order."""
    order = list(range(len(bones)))
    random.Random(seed).shuffle(order)
    new = {name: f"bone_{order[i]:03d}" for i, (name, _) in enumerate(bones)}
    renamed = [(new[n], new[p] if p else None) for n, p in bones]
    random.Random(seed + 1).shuffle(renamed)
    return renamed, {new[n]: h for n, h in heads.items()}, new


def _import_bvh(path):
    import addon_utils
    import bpy

    addon_utils.enable("io_anim_bvh", default_set=True)
    bpy.ops.import_anim.bvh(filepath=path, global_scale=0.01)
    obj = bpy.context.active_object
    assert obj.type == "ARMATURE"
    return obj


# ---- real Blender -------------------------------------------------------------------------------------------------

def test_auto_map_operator_maps_the_demo_rig_fully(empty_scene):
    import bpy

    bpy.ops.neural_ik.create_demo_rig(seed=0)
    obj = empty_scene.neural_ik.armature
    obj.neural_ik.bone_map.clear()
    bpy.context.view_layer.objects.active = obj
    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    assert {i.role: i.bone for i in obj.neural_ik.bone_map} == {r: r for r in ROLES}
    assert obj.neural_ik.preset == "demo"


def test_renamed_demo_rig_maps_through_the_hierarchy(empty_scene):
    """Every bone renamed to bone_NNN (hierarchy kept): the operator still finds every role's bone."""
    import bpy

    bpy.ops.neural_ik.create_demo_rig(seed=0)
    obj = empty_scene.neural_ik.armature
    original = {}
    for i, bone in enumerate(list(obj.data.bones)):
        old = bone.name
        bone.name = f"bone_{i:03d}"
        original[bone.name] = old
    bpy.context.view_layer.objects.active = obj
    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    stored = {i.role: i.bone for i in obj.neural_ik.bone_map}
    assert obj.neural_ik.preset == "heuristic"
    assert {role: original[bone] for role, bone in stored.items()} == {r: r for r in ROLES}


@pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
def test_bandai_rig_maps_with_its_preset(empty_scene, libraries):
    """joint_Root above the hips, six channels on every joint, one spine bone less and one neck bone."""
    import bpy

    obj = _import_bvh(libraries.bandai.path(libraries.bandai.files[0]))
    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    stored = {i.role: i.bone for i in obj.neural_ik.bone_map}
    assert obj.neural_ik.preset == "bandai"
    assert {r for r, b in stored.items() if not b} == {"Spine2", "NeckUpper"}
    assert stored["Hips"] == "Hips" and stored["Spine1"] == "Chest" and stored["LeftThigh"] == "UpperLeg_L"
    bones = [(b.name, b.parent.name if b.parent else None) for b in obj.data.bones]
    assert bone_map.validate(stored, bones) == []


@pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
def test_cmu_rig_maps_with_its_preset(empty_scene, libraries):
    """A pelvis between the hips and the thighs, twist and share bones beside the limbs: the preset maps the limbs."""
    import bpy

    obj = _import_bvh(libraries.cmu.path(libraries.cmu.files[0]))
    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    stored = {i.role: i.bone for i in obj.neural_ik.bone_map}
    assert obj.neural_ik.preset == "cmu"
    assert all(stored.values())
    assert stored["Hips"] == "CC_Base_Hip" and stored["RightForeArm"] == "CC_Base_R_Forearm"
    assert stored["LeftThigh"] == "CC_Base_L_Thigh" and stored["NeckUpper"] == "CC_Base_NeckTwist02"
    bones = [(b.name, b.parent.name if b.parent else None) for b in obj.data.bones]
    assert bone_map.validate(stored, bones) == []


@pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
def test_bandai_rig_renamed_maps_through_the_hierarchy(empty_scene, libraries):
    """An imported rig under neutral names (rest positions from Blender) maps to the same bones as its preset."""
    obj = _import_bvh(libraries.bandai.path(libraries.bandai.files[0]))
    bones = [(b.name, b.parent.name if b.parent else None) for b in obj.data.bones]
    heads = {b.name: tuple(b.head_local) for b in obj.data.bones}
    expected = bone_map.auto_map(bones, heads).mapping
    assert expected["Hips"] == "Hips" and expected["LeftHand"] == "Hand_L"
    renamed, renamed_heads, new = _renamed(bones, heads)
    result = bone_map.auto_map(renamed, renamed_heads)
    assert result.preset == "heuristic"
    assert result.mapping == {r: new[b] if b else "" for r, b in expected.items()}
    assert result.problems == []


def test_auto_map_reports_an_error_for_an_unusable_rig(empty_scene):
    import bpy

    data = bpy.data.armatures.new("Stick")
    obj = bpy.data.objects.new("Stick", data)
    empty_scene.collection.objects.link(obj)
    bpy.context.view_layer.objects.active = obj
    bpy.ops.object.mode_set(mode="EDIT")
    bone = data.edit_bones.new("Root")
    bone.head, bone.tail = (0, 0, 0), (0, 0, 1)
    bpy.ops.object.mode_set(mode="OBJECT")
    with pytest.raises(RuntimeError, match="Missing essential"):
        bpy.ops.neural_ik.auto_map()


def test_operators_say_why_they_are_unavailable(empty_scene):
    import bpy

    assert not bpy.ops.neural_ik.auto_map.poll()
    assert not bpy.ops.neural_ik.apply_preset.poll()
    for op in (bpy.types.NEURAL_IK_OT_auto_map, bpy.types.NEURAL_IK_OT_apply_preset,
               bpy.types.NEURAL_IK_OT_create_demo_rig):
        assert op.bl_description and "REGISTER" in op.bl_options and "UNDO" in op.bl_options


def test_apply_preset_operator(empty_scene):
    import bpy

    bpy.ops.neural_ik.create_demo_rig(seed=0)
    obj = empty_scene.neural_ik.armature
    bpy.context.view_layer.objects.active = obj
    with pytest.raises(RuntimeError, match="Missing essential"):
        bpy.ops.neural_ik.apply_preset(preset="mixamo")   # the demo rig has no mixamorig: bones
    assert bpy.ops.neural_ik.apply_preset(preset="demo") == {"FINISHED"}
    assert {i.role: i.bone for i in obj.neural_ik.bone_map} == {r: r for r in ROLES}


# ---- pure Python ----------------------------------------------------------------------------------------------------

def _mixamo_bones(prefix="mixamorig:"):
    spine = ["Hips", "Spine", "Spine1", "Spine2", "Neck", "Head", "HeadTop_End"]
    bones = [(prefix + spine[0], None)] + [(prefix + b, prefix + a) for a, b in zip(spine, spine[1:])]
    for side in ("Left", "Right"):
        arm = ["Spine2", f"{side}Shoulder", f"{side}Arm", f"{side}ForeArm", f"{side}Hand", f"{side}HandIndex1"]
        leg = ["Hips", f"{side}UpLeg", f"{side}Leg", f"{side}Foot", f"{side}ToeBase", f"{side}Toe_End"]
        for chain in (arm, leg):
            bones += [(prefix + b, prefix + a) for a, b in zip(chain, chain[1:])]
    return bones


def test_mixamo_preset_with_any_prefix():
    for prefix in ("mixamorig:", "mixamorig1:"):
        result = bone_map.auto_map(_mixamo_bones(prefix))
        assert result.preset == "mixamo" and result.problems == []
        assert result.mapping["LeftThigh"] == prefix + "LeftUpLeg"
        assert result.mapping["NeckLower"] == prefix + "Neck" and result.mapping["NeckUpper"] == ""


def test_rigify_preset_skips_twist_segments():
    spine = ["DEF-spine"] + [f"DEF-spine.{i:03d}" for i in range(1, 7)]
    bones = [(spine[0], None)] + list(zip(spine[1:], spine))
    for s in ("L", "R"):
        bones += [(f"DEF-shoulder.{s}", "DEF-spine.003"), (f"DEF-upper_arm.{s}", f"DEF-shoulder.{s}"),
                  (f"DEF-upper_arm.{s}.001", f"DEF-upper_arm.{s}"), (f"DEF-forearm.{s}", f"DEF-upper_arm.{s}.001"),
                  (f"DEF-forearm.{s}.001", f"DEF-forearm.{s}"), (f"DEF-hand.{s}", f"DEF-forearm.{s}.001"),
                  (f"DEF-thigh.{s}", "DEF-spine"), (f"DEF-thigh.{s}.001", f"DEF-thigh.{s}"),
                  (f"DEF-shin.{s}", f"DEF-thigh.{s}.001"), (f"DEF-shin.{s}.001", f"DEF-shin.{s}"),
                  (f"DEF-foot.{s}", f"DEF-shin.{s}.001"), (f"DEF-toe.{s}", f"DEF-foot.{s}")]
    result = bone_map.auto_map(bones)
    assert result.preset == "rigify" and result.problems == []
    assert result.mapping["LeftForeArm"] == "DEF-forearm.L" and result.mapping["RightShin"] == "DEF-shin.R"
    assert not any(b.endswith(".001") and "spine" not in b for b in result.mapping.values())


def _mirror(role):
    return role.replace("Left", "@").replace("Right", "Left").replace("@", "Right")


@pytest.mark.parametrize("seed", [0, 3])        # seed 0 guesses the sides right, seed 3 swaps 8 roles
def test_renamed_rig_without_positions_places_every_role_and_says_the_sides_are_guessed(seed):
    renamed, _heads, new = _renamed(DEMO_BONES, DEMO_HEADS, seed=seed)
    result = bone_map.auto_map(renamed)          # no rest positions: only the hierarchy (fingers mark the hands)
    inverse = {v: k for k, v in new.items()}
    found = {role: inverse[bone] for role, bone in result.mapping.items()}
    assert all(found[r] in (r, _mirror(r)) for r in ROLES)
    assert {r for r in ROLES if found[r] == r} >= {"Hips", "Spine", "Spine1", "Spine2", "NeckLower", "NeckUpper", "Head"}
    assert any("left from right" in p for p in result.problems)      # whichever way it guessed, it says so


def test_rig_missing_a_limb_names_the_roles_it_could_not_place():
    kept = [(n, p) for n, p in DEMO_BONES if not (n.startswith("Right") and any(w in n for w in ("Shoulder", "Arm", "Hand")))]
    renamed, heads, _new = _renamed(kept, {n: DEMO_HEADS[n] for n, _ in kept}, seed=5)
    result = bone_map.auto_map(renamed, heads)
    unplaced = [r for r in ESSENTIAL_ROLES if not result.mapping[r]]
    assert {"RightArm", "RightForeArm", "RightHand"} <= set(unplaced)
    assert any(all(r in p for r in unplaced) for p in result.problems)


def test_validate_catches_each_kind_of_mistake():
    good = {r: r for r in ROLES}
    assert bone_map.validate(good, DEMO_BONES) == []
    twice = dict(good, RightHand="LeftHand")
    assert any("used for more than one role" in p and "LeftHand" in p for p in bone_map.validate(twice, DEMO_BONES))
    missing = dict(good, LeftShin="")
    assert any("Missing essential" in p and "LeftShin" in p for p in bone_map.validate(missing, DEMO_BONES))
    outside = dict(good, LeftForeArm="RightForeArm", RightForeArm="")
    problems = bone_map.validate(outside, DEMO_BONES)
    assert any("LeftForeArm" in p and "outside its chain" in p for p in problems)
    ghost = dict(good, Head="NoSuchBone")
    assert any("NoSuchBone" in p and "not a bone" in p for p in bone_map.validate(ghost, DEMO_BONES))
    # a role that the rig lacks (a gap in the chain) is fine: the child must hang below the nearest mapped ancestor
    assert bone_map.validate(dict(good, Spine2="", NeckUpper=""), DEMO_BONES) == []


_NAMES = st.one_of(
    st.text(min_size=0, max_size=12),
    st.sampled_from(["Hips", "Spine", "Head", "LeftHand", "RightFoot", "mixamorig:Hips", "CC_Base_Hip", "Hand_L",
                     "DEF-spine", "thumb", "twist", "l_arm", "r_leg"]),
)


@st.composite
def hierarchies(draw):
    n = draw(st.integers(0, 40))
    names = [draw(_NAMES) for _ in range(n)]
    allow_cycles = draw(st.booleans())
    bones = []
    for i, name in enumerate(names):
        if allow_cycles:
            parent = draw(st.one_of(st.none(), st.sampled_from(names) if names else st.none(), st.integers(), st.text(max_size=3)))
        else:
            parent = names[draw(st.integers(0, i - 1))] if i and draw(st.booleans()) else None
        bones.append((name, parent) if draw(st.integers(0, 20)) else draw(st.sampled_from([name, (name,), None, 3])))
    positions = draw(st.one_of(
        st.none(),
        st.dictionaries(st.sampled_from(names) if names else st.just("x"),
                        st.tuples(*[st.floats(allow_nan=True, allow_infinity=True)] * 3), max_size=n),
        st.just([(0.0, 0.0, float(i)) for i in range(n)]),
    ))
    return bones, positions


@settings(max_examples=300, deadline=None)
@given(hierarchies(), st.dictionaries(st.sampled_from(ROLES + ("Nope",)), st.one_of(st.text(max_size=6), st.none(), st.integers())))
def test_auto_map_and_validate_never_raise(case, mapping):
    bones, positions = case
    result = bone_map.auto_map(bones, positions)
    names = ({b[0] for b in bones if isinstance(b, tuple) and len(b) == 2 and isinstance(b[0], str)}
             | {b for b in bones if isinstance(b, str)})            # a bare name is a bone without a parent
    assert set(result.mapping) == set(ROLES)
    assert all(isinstance(b, str) and (b == "" or b in names) for b in result.mapping.values())
    assert result.preset in bone_map.PRESET_NAMES
    assert not any("internal error" in p for p in result.problems)
    if not all(result.mapping[r] for r in ESSENTIAL_ROLES):
        assert result.problems                     # a map, or the reasons it is not one
    for candidate in (mapping, result.mapping, None, "junk"):
        problems = bone_map.validate(candidate, bones)
        assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
        assert not any("internal error" in p for p in problems)


# ---- legs that start with a short hip bone (names win over the place in the chain) ---------------------------------

def test_auto_map_names_win_over_a_short_hip_bone():
    bones, heads = daz_style_bones()
    for positions in (heads, None):
        result = bone_map.auto_map(bones, positions)
        m = result.mapping
        assert result.problems == []
        for side, s in (("Left", "l"), ("Right", "r")):
            assert (m[f"{side}Thigh"], m[f"{side}Shin"], m[f"{side}Foot"], m[f"{side}ToeBase"]) == \
                (f"{s}Thigh", f"{s}Shin", f"{s}Foot", "")
            assert (m[f"{side}Shoulder"], m[f"{side}Arm"], m[f"{side}ForeArm"], m[f"{side}Hand"]) == \
                (f"{s}Collar", f"{s}ShldrBend", f"{s}ForearmBend", f"{s}Hand")


def test_auto_map_reads_the_cmu_bvh_skeleton():
    bones = [("Hips", None), ("LowerBack", "Hips"), ("Spine", "LowerBack"), ("Spine1", "Spine"), ("Neck", "Spine1"),
             ("Neck1", "Neck"), ("Head", "Neck1")]
    for side, s in (("Left", "L"), ("Right", "R")):
        bones += [(f"{s}HipJoint", "Hips"), (f"{side}UpLeg", f"{s}HipJoint"), (f"{side}Leg", f"{side}UpLeg"),
                  (f"{side}Foot", f"{side}Leg"), (f"{side}ToeBase", f"{side}Foot"), (f"{side}Shoulder", "Spine1"),
                  (f"{side}Arm", f"{side}Shoulder"), (f"{side}ForeArm", f"{side}Arm"), (f"{side}Hand", f"{side}ForeArm")]
    result = bone_map.auto_map(bones)
    assert result.problems == []
    m = result.mapping
    assert [m[r] for r in ("Hips", "Spine", "Spine1", "Spine2", "NeckLower", "NeckUpper", "Head")] == \
        ["Hips", "LowerBack", "Spine", "Spine1", "Neck", "Neck1", "Head"]
    for side in ("Left", "Right"):
        assert [m[side + r] for r in ("Thigh", "Shin", "Foot", "ToeBase", "Shoulder", "Arm", "ForeArm", "Hand")] == \
            [f"{side}UpLeg", f"{side}Leg", f"{side}Foot", f"{side}ToeBase", f"{side}Shoulder", f"{side}Arm",
             f"{side}ForeArm", f"{side}Hand"]
    # the same skeleton renamed so no preset matches: the hierarchy reader still skips the hip joint
    renamed = [(n.replace("LowerBack", "Waist"), p.replace("LowerBack", "Waist") if p else None) for n, p in bones]
    m = bone_map.auto_map(renamed).mapping
    assert (m["LeftThigh"], m["LeftShin"], m["LeftFoot"], m["LeftToeBase"]) == ("LeftUpLeg", "LeftLeg", "LeftFoot",
                                                                                 "LeftToeBase")


def test_a_map_one_bone_off_is_reported():
    bones, _ = daz_style_bones()
    mapping = bone_map.auto_map(bones).mapping
    shifted = dict(mapping, LeftThigh="lButtock", LeftShin="lThigh", LeftFoot="lShin", LeftToeBase="lFoot")
    problems = " ".join(bone_map.validate(shifted, bones))
    assert "LeftThigh is mapped to 'lButtock', whose name says a hip bone" in problems
    assert "LeftShin is mapped to 'lThigh', whose name says LeftThigh" in problems
    assert "LeftToeBase is mapped to 'lFoot', whose name says LeftFoot" in problems
    swapped = dict(mapping, LeftHand="rHand", RightHand="lHand")
    assert "whose name says the other side" in " ".join(bone_map.validate(swapped, bones))
