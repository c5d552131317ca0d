"""The bone-map list, the preset menu, and the "Neural IK" menu that makes every operator findable with F3.

Blender's F3 search finds operators through menus, so every registered Neural IK operator is listed in a menu that
hangs under the 3D viewport's Object and Pose menus.
"""

import bpy

from ..neural_network.skeleton.roles import ESSENTIAL_ROLES
from .common import operator_idname


def role_status(item, armature):
    """(icon, words) for one bone-map entry: mapped and present, a bone that does not exist, or no bone."""
    essential = item.role in ESSENTIAL_ROLES
    if item.bone:
        if armature is not None and armature.type == "ARMATURE" and item.bone in armature.data.bones:
            return "CHECKMARK", "mapped"
        return "ERROR", f"no bone called {item.bone!r}"
    if essential:
        return "ERROR", "required, not mapped"
    return "DOT", "optional, not mapped"


class NEURAL_IK_UL_bone_map(bpy.types.UIList):
    """Roles of the network and the bone that plays each one."""

    bl_idname = "NEURAL_IK_UL_bone_map"

    def draw_item(self, context, layout, data, item, icon, active_data, active_propname, index=0, flt_flag=0):
        armature = item.id_data
        status_icon, _words = role_status(item, armature)
        row = layout.row(align=True)
        split = row.split(factor=0.4, align=True)
        split.label(text=item.role)
        if armature is not None and armature.type == "ARMATURE":
            split.prop_search(item, "bone", armature.data, "bones", text="")
        else:
            split.prop(item, "bone", text="")
        row.label(text="", icon=status_icon)


class NEURAL_IK_MT_bone_map_presets(bpy.types.Menu):
    """Known rigs whose bone names Neural IK can map in one click."""

    bl_idname = "NEURAL_IK_MT_bone_map_presets"
    bl_label = "Bone Map Preset"

    def draw(self, context):
        layout = self.layout
        layout.operator_enum(operator_idname("apply_preset"), "preset")


# Every operator, in the order of the work, for F3 search and the Object menu.
MENU_OPERATORS = (
    "create_demo_rig", "auto_map", "import_bvh_folder", "extract", "train", "train_starter", "cancel_training", "evaluate",
    "load_model", "create_targets", "run", "stop", "bake", "export_onnx",
)


class NEURAL_IK_MT_operators(bpy.types.Menu):
    """All Neural IK operations (this menu is what makes them findable with F3)."""

    bl_idname = "NEURAL_IK_MT_operators"
    bl_label = "Neural IK"

    def draw(self, context):
        layout = self.layout
        for name in MENU_OPERATORS:
            layout.operator(operator_idname(name))
        layout.menu(NEURAL_IK_MT_bone_map_presets.bl_idname)


def draw_object_menu(self, context):
    self.layout.separator()
    self.layout.menu(NEURAL_IK_MT_operators.bl_idname)


classes = (NEURAL_IK_UL_bone_map, NEURAL_IK_MT_bone_map_presets, NEURAL_IK_MT_operators)


# Object mode and Pose mode each have their own menu in the 3D viewport header.
HOST_MENUS = ("VIEW3D_MT_object", "VIEW3D_MT_pose")


def register_extra():
    for name in HOST_MENUS:
        getattr(bpy.types, name).append(draw_object_menu)


def unregister_extra():
    for name in HOST_MENUS:
        getattr(bpy.types, name).remove(draw_object_menu)
