"""Rig operators: create the demo rig, auto-map the active armature's bones, apply a named bone-map preset.

Thin shells: they read bones from Blender, ask `neural_network.bone_map` for the map, store it on the armature
object and say in plain words what they found.
"""

import os

import bpy
from bpy.props import EnumProperty, IntProperty

from ..neural_network.skeleton import bone_map
from ..properties import set_bone_map

# The model shipped with the extension, trained on the demo rig's actions (read-only: never written at run time).
SHIPPED_DEMO_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "weights", "demo.npz")

PRESET_ITEMS = [
    ("demo", "Demo Rig", "Bones named exactly as the roles (the Neural IK demo rig)"),
    ("mixamo", "Mixamo", "Mixamo rigs (mixamorig:Hips, mixamorig:LeftUpLeg, ...)"),
    ("cmu", "CMU iClone", "The iClone Motion Dummy rig of the CMU BVH conversion (CC_Base_*)"),
    ("bandai", "Bandai / Unity", "Unity-style names (Hips, Chest, UpperArm_L, ...), as in the Bandai Namco dataset"),
    ("rigify", "Rigify", "The deform (DEF-) bones of a generated Rigify rig"),
]


def _active_armature(context):
    obj = context.active_object
    return obj if obj is not None and obj.type == "ARMATURE" else None


def _poll_armature(cls, context):
    if _active_armature(context) is None:
        cls.poll_message_set("Select an armature (make it the active object)")
        return False
    return True


def _rig_bones(obj):
    bones = [(b.name, b.parent.name if b.parent else None) for b in obj.data.bones]
    heads = {b.name: tuple(b.head_local) for b in obj.data.bones}
    return bones, heads


def _store_and_report(operator, context, obj, result):
    """Store the map (even a partial one, so it can be finished by hand) and report; ERROR when unusable."""
    set_bone_map(obj, result.mapping)
    obj.neural_ik.preset = result.preset
    context.scene.neural_ik.armature = obj
    mapped = sum(1 for bone in result.mapping.values() if bone)
    summary = f"{obj.name}: {result.preset} map, {mapped} of {len(result.mapping)} roles mapped"
    missing_essentials = any(p.startswith("Missing essential") for p in result.problems)
    if missing_essentials:
        operator.report({"ERROR"}, f"{summary}. " + " ".join(result.problems))
        return {"CANCELLED"}
    if result.problems:
        operator.report({"WARNING"}, f"{summary}. " + " ".join(result.problems))
    else:
        operator.report({"INFO"}, summary + ".")
    return {"FINISHED"}


class NEURAL_IK_OT_create_demo_rig(bpy.types.Operator):
    bl_idname = "neural_ik.create_demo_rig"
    bl_label = "Create Demo Rig"
    bl_description = ("Add the 54-bone demo humanoid with procedural idle, walk, run, crouch, reach, grab and jump "
                      "actions, mapped and ready to extract and train")
    bl_options = {"REGISTER", "UNDO"}

    seed: IntProperty(name="Seed", default=0, min=0, description="Seed of the procedural motion (same seed, same keys)")

    @classmethod
    def poll(cls, context):
        if context.scene is None:
            cls.poll_message_set("Needs a scene")
            return False
        if context.mode != "OBJECT":
            cls.poll_message_set("Switch to Object Mode first")
            return False
        return True

    def execute(self, context):
        from ..blender.demo_rig import build_demo

        obj, actions = build_demo(context, seed=self.seed)
        shipped = ""
        if os.path.isfile(SHIPPED_DEMO_MODEL):
            obj.neural_ik.model_path = SHIPPED_DEMO_MODEL
            shipped = " Its shipped model is loaded: Create Targets and Run IK work right away."
        self.report({"INFO"}, f"Created {obj.name}: {len(obj.data.bones)} bones, {len(actions)} actions "
                              f"(seed {self.seed}).{shipped}")
        return {"FINISHED"}


class NEURAL_IK_OT_auto_map(bpy.types.Operator):
    bl_idname = "neural_ik.auto_map"
    bl_label = "Auto Map Bones"
    bl_description = ("Find which bone of the active armature plays each Neural IK role: known rigs by name, "
                      "others through the hierarchy (legs, spine, arms, head)")
    bl_options = {"REGISTER", "UNDO"}

    @classmethod
    def poll(cls, context):
        return _poll_armature(cls, context)

    def execute(self, context):
        obj = _active_armature(context)
        bones, heads = _rig_bones(obj)
        return _store_and_report(self, context, obj, bone_map.auto_map(bones, heads))


class NEURAL_IK_OT_apply_preset(bpy.types.Operator):
    bl_idname = "neural_ik.apply_preset"
    bl_label = "Apply Bone Map Preset"
    bl_description = "Map the active armature's bones with a known rig's bone names"
    bl_options = {"REGISTER", "UNDO"}

    preset: EnumProperty(name="Preset", items=PRESET_ITEMS, default="demo", description="Rig whose bone names to use")

    @classmethod
    def poll(cls, context):
        return _poll_armature(cls, context)

    def execute(self, context):
        obj = _active_armature(context)
        bones, _heads = _rig_bones(obj)
        return _store_and_report(self, context, obj, bone_map.preset_map(self.preset, bones))


classes = (NEURAL_IK_OT_create_demo_rig, NEURAL_IK_OT_auto_map, NEURAL_IK_OT_apply_preset)
