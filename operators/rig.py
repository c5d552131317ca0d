"""Rig operators: create the demo rig, auto-map the active armature's bones, apply a named bone-map preset.

Thin shells: blender.bone_maps reads the bones and asks the core's `bone_map` for the map; the operators store it
on the armature object and say in plain words what they found.
"""

import os

import bpy
from bpy.props import EnumProperty, IntProperty

from ..blender.rig.armatures import chosen_armature
from ..blender.rig.bone_maps import auto_map, driven_map_problems, preset_map, store_map
from .common import poll_armature

# The model shipped with the extension, trained on the demo rig's actions (read-only: never written at run time).
SHIPPED_DEMO_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "weights", "demo.npz")

PRESET_ITEMS = [
    ("demo", "Demo Rig", "Bones named exactly as the roles (the Neural IK demo rig)"),
    ("mixamo", "Mixamo", "Mixamo rigs (mixamorig:Hips, mixamorig:LeftUpLeg, ...)"),
    ("cmu", "CMU iClone", "The iClone Motion Dummy rig of the CMU BVH conversion (CC_Base_*)"),
    ("bandai", "Bandai / Unity", "Unity-style names (Hips, Chest, UpperArm_L, ...), as in the Bandai Namco dataset"),
    ("rigify", "Rigify", "The deform (DEF-) bones of a generated Rigify rig"),
]


def _store_and_report(operator, context, obj, result):
    """Store the map (even a partial one, so it can be finished by hand) and report; ERROR when unusable."""
    store_map(obj, result)
    context.scene.neural_ik.armature = obj
    mapped = sum(1 for bone in result.mapping.values() if bone)
    problems, note = driven_map_problems(obj, result.mapping, result.problems)
    summary = f"{obj.name}: {result.preset} map, {mapped} of {len(result.mapping)} roles mapped" + (
        f"; {note}" if note else "")
    missing_essentials = any(p.startswith("Missing essential") for p in problems)
    if missing_essentials:
        operator.report({"ERROR"}, f"{summary}. " + " ".join(problems))
        return {"CANCELLED"}
    if problems:
        operator.report({"WARNING"}, f"{summary}. " + " ".join(problems))
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
    reach_clips: IntProperty(name="Reach Clips", default=0, min=0, max=500,
                             description="Also add this many clips of hands reaching all around the body (front, side, "
                                         "overhead, low, across, behind), as the shipped model learns from")

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
        from ..blender.workflows.demo_rig import build_demo

        obj, actions = build_demo(context, seed=self.seed, reach_clips=self.reach_clips)
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
        return poll_armature(cls, context)

    def execute(self, context):
        obj = chosen_armature(context)
        return _store_and_report(self, context, obj, auto_map(obj))


class NEURAL_IK_OT_apply_preset(bpy.types.Operator):
    bl_idname = "neural_ik.apply_preset"
    bl_label = "Apply Bone Map Preset"
    bl_description = "Map the active armature's bones with a known rig's bone names"
    bl_options = {"REGISTER", "UNDO"}

    preset: EnumProperty(name="Preset", items=PRESET_ITEMS, default="demo", description="Rig whose bone names to use")

    @classmethod
    def poll(cls, context):
        return poll_armature(cls, context)

    def execute(self, context):
        obj = chosen_armature(context)
        return _store_and_report(self, context, obj, preset_map(obj, self.preset))


classes = (NEURAL_IK_OT_create_demo_rig, NEURAL_IK_OT_auto_map, NEURAL_IK_OT_apply_preset)
