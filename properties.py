"""Settings stored in the .blend: per scene (data, training), per armature object (bone map, model, live IK)
and per action (task override). Runtime state that must not be saved (training progress, live ticks) lives in
state.py instead.
"""

import bpy
from bpy.props import (
    BoolProperty,
    CollectionProperty,
    EnumProperty,
    FloatProperty,
    IntProperty,
    PointerProperty,
    StringProperty,
)

from . import state
from .neural_network.skeleton.roles import ROLES, TASKS

TASK_ITEMS = [(t.upper(), t.capitalize(), f"Motion task: {t}") for t in TASKS]


def _live_setting_changed(_self, _context):
    """A live setting was edited (panel or Python): running ticks re-read every character's settings next tick."""
    state.live_settings.value += 1


def _is_armature(_self, obj):
    return obj.type == "ARMATURE"


def _is_empty(_self, obj):
    return obj.type == "EMPTY"


class NIK_BoneMapItem(bpy.types.PropertyGroup):
    role: StringProperty(name="Role", description="Network role this entry maps")
    bone: StringProperty(name="Bone", description="Bone of this armature that plays the role (empty: the rig lacks it)")


def _is_mesh(_self, obj):
    return obj.type == "MESH"


class NIK_TargetLayer(bpy.types.PropertyGroup):
    """How much of one target comes from its empty rather than the playing action (keyable: a pin fades in and out).
    Without an action the empties drive; a target without an empty follows the action."""
    position: FloatProperty(name="Position", min=0.0, max=1.0, default=0.0, subtype="FACTOR",
                            description="Share of the target's position taken from its empty while an action plays "
                                        "(0: where the action puts the effector, 1: the empty)",
                            update=_live_setting_changed)
    rotation: FloatProperty(name="Rotation", min=0.0, max=1.0, default=0.0, subtype="FACTOR",
                            description="Share of the target's rotation taken from its empty while an action plays "
                                        "(0: the action's, 1: the empty's)",
                            update=_live_setting_changed)
    free: BoolProperty(name="Free", default=False, update=_live_setting_changed,
                       description="Leave this target to the model: neither its empty nor the playing action places "
                                   "it, the model's learned prior does from the pinned targets (never all six)")


class NIK_ObjectSettings(bpy.types.PropertyGroup):
    bone_map: CollectionProperty(type=NIK_BoneMapItem)
    bone_map_index: IntProperty(name="Active Role", default=0)
    preset: StringProperty(name="Preset", description="Bone-map preset detected or chosen for this rig")
    model_path: StringProperty(name="Model", subtype="FILE_PATH",
                               description="Checkpoint (.npz) or ONNX model that drives this armature")
    target_root: PointerProperty(name="Root Target", type=bpy.types.Object, poll=_is_empty)
    target_left_hand: PointerProperty(name="Left Hand Target", type=bpy.types.Object, poll=_is_empty)
    target_right_hand: PointerProperty(name="Right Hand Target", type=bpy.types.Object, poll=_is_empty)
    target_left_foot: PointerProperty(name="Left Foot Target", type=bpy.types.Object, poll=_is_empty)
    target_right_foot: PointerProperty(name="Right Foot Target", type=bpy.types.Object, poll=_is_empty)
    target_head: PointerProperty(name="Head Target", type=bpy.types.Object, poll=_is_empty)
    layer_root: PointerProperty(name="Root Layer", type=NIK_TargetLayer)
    layer_left_hand: PointerProperty(name="Left Hand Layer", type=NIK_TargetLayer)
    layer_right_hand: PointerProperty(name="Right Hand Layer", type=NIK_TargetLayer)
    layer_left_foot: PointerProperty(name="Left Foot Layer", type=NIK_TargetLayer)
    layer_right_foot: PointerProperty(name="Right Foot Layer", type=NIK_TargetLayer)
    layer_head: PointerProperty(name="Head Layer", type=NIK_TargetLayer)
    ground_object: PointerProperty(name="Ground", type=bpy.types.Object, poll=_is_mesh, update=_live_setting_changed,
                                   description="Mesh the feet stand on: a ray cast down at each foot gives the ground's "
                                               "height and slope there (empty: the flat ground heights below)")
    ground_collection: PointerProperty(name="Ground Collection", type=bpy.types.Collection,
                                       update=_live_setting_changed,
                                       description="Meshes of this collection are ground too (with or instead of the "
                                                   "Ground object)")
    lock_feet: BoolProperty(name="Lock Feet", default=False, update=_live_setting_changed,
                            description="Hold each planted foot where it landed (position and heading) for its whole "
                                        "contact, so a sliding clip stops sliding; contacts come from the motion")
    ground_left: FloatProperty(name="Left Ground", unit="LENGTH", default=0.0,
                               description="Ground height under the left foot",
                               update=_live_setting_changed)
    ground_right: FloatProperty(name="Right Ground", unit="LENGTH", default=0.0,
                                description="Ground height under the right foot",
                                update=_live_setting_changed)
    contact_left: BoolProperty(name="Left Contact", default=True, description="The left foot should stay planted",
                               update=_live_setting_changed)
    contact_right: BoolProperty(name="Right Contact", default=True, description="The right foot should stay planted",
                                update=_live_setting_changed)
    task: EnumProperty(name="Task", items=TASK_ITEMS, default="IDLE", description="Motion task the pose should suit",
                       update=_live_setting_changed)
    phase: FloatProperty(name="Phase", min=0.0, max=1.0, default=0.0, subtype="FACTOR",
                         description="Phase of the motion cycle",
                         update=_live_setting_changed)
    phase_follows_time: BoolProperty(name="Phase Follows Time", default=False,
                                     description="Advance the phase with the scene frame",
                                     update=_live_setting_changed)
    refine_iterations: IntProperty(name="Refinement", min=0, max=50, default=2,
                                   description="Damped least-squares iterations that make effectors land exactly",
                                   update=_live_setting_changed)


class NIK_SceneSettings(bpy.types.PropertyGroup):
    armature: PointerProperty(name="Armature", type=bpy.types.Object, poll=_is_armature,
                              description="Armature that Neural IK maps, trains and drives")
    bvh_directory: StringProperty(name="BVH Folder", subtype="DIR_PATH")
    dataset_path: StringProperty(name="Dataset", subtype="FILE_PATH", description="Extracted training set (.npz)")
    output_directory: StringProperty(name="Output", subtype="DIR_PATH",
                                     description="Folder for checkpoints, metrics and plots (empty: the extension's user folder)")
    epochs: IntProperty(name="Epochs", min=1, max=100000, default=300)
    batch_size: IntProperty(name="Batch", min=8, max=8192, default=256)
    learning_rate: FloatProperty(name="Learning Rate", min=1e-6, max=1.0, default=2e-3, precision=5)
    time_limit: FloatProperty(name="Time Limit", min=0.0, default=0.0, unit="TIME_ABSOLUTE",
                              description="Stop training after this many seconds (0: no limit)")
    own_share: FloatProperty(name="Own Clips Share", min=0.0, max=0.95, default=0.25, subtype="FACTOR",
                             description="Share of every epoch taken from the rig's own clips when the dataset also "
                                         "holds library motion retargeted from other skeletons (0: no weighting)")
    library: EnumProperty(
        name="Library", default="AUTO",
        items=[("AUTO", "Compare", "With library motion in the dataset: train on your own clips alone and with the "
                "library, keep the library only if it is better on your own clips both refined (inner joints) and "
                "alone, and train the one kept on (both figures are reported); with fewer than 4 own clips, train "
                "with the library"),
               ("ALWAYS", "Use", "Train on your own clips and the library motion"),
               ("NEVER", "Leave Out", "Train on your own clips alone (the library motion in the dataset is skipped)")],
        description="Whether training uses the retargeted library motion in the dataset; Compare measures which is "
                    "better on your own clips")
    limb_mix: FloatProperty(name="Limb Mix", min=0.0, max=4.0, default=1.0,
                            description="Poses made of the limbs of random frames, added to training as this share of "
                                        "its frames (teaches the network that limbs move independently; 0: none)")
    prior_members: IntProperty(name="Prior Ensemble", min=1, max=8, default=2,
                               description="Each target prior (what places a free target) is this many trained apart "
                                           "and averaged: better placements, a longer Train (Train Starter Model "
                                           "trains one: its time limit goes to the network)")
    weight_fk: FloatProperty(name="FK", min=0.0, default=1.0)
    weight_pose: FloatProperty(name="Pose", min=0.0, default=0.3)
    weight_contact: FloatProperty(name="Contact", min=0.0, default=0.5)
    weight_limit: FloatProperty(name="Joint Limits", min=0.0, default=0.1)
    weight_slip: FloatProperty(name="Foot Slip", min=0.0, default=0.2)
    show_loss_weights: BoolProperty(name="Loss Weights", default=False)
    live_rate: FloatProperty(name="Rate", min=1.0, max=240.0, default=60.0, description="Live ticks per second")
    bake_source_action: StringProperty(name="Source Action",
                                       description="Action whose effectors are re-solved (empty: the target empties)")
    bake_frame_start: IntProperty(name="Start", default=1)
    bake_frame_end: IntProperty(name="End", default=100)


classes = (NIK_BoneMapItem, NIK_TargetLayer, NIK_ObjectSettings, NIK_SceneSettings)


def register():
    for cls in classes:
        bpy.utils.register_class(cls)
    bpy.types.Scene.neural_ik = PointerProperty(type=NIK_SceneSettings)
    bpy.types.Object.neural_ik = PointerProperty(type=NIK_ObjectSettings)
    bpy.types.Action.neural_ik_task = EnumProperty(
        name="Neural IK Task", items=[("AUTO", "From Name", "Take the task from the action's name")] + TASK_ITEMS,
        default="AUTO", description="Motion task of this action for Neural IK training")


def unregister():
    del bpy.types.Action.neural_ik_task
    del bpy.types.Object.neural_ik
    del bpy.types.Scene.neural_ik
    for cls in reversed(classes):
        bpy.utils.unregister_class(cls)




def get_bone_map(obj):
    """{role: bone name} of an armature object ("" where the role is unmapped); every role present."""
    stored = {item.role: item.bone for item in obj.neural_ik.bone_map}
    return {role: stored.get(role, "") for role in ROLES}


def set_bone_map(obj, mapping):
    """Store {role: bone} on the armature object, one entry per role in network order."""
    items = obj.neural_ik.bone_map
    items.clear()
    for role in ROLES:
        item = items.add()
        item.role = role
        item.bone = mapping.get(role, "") or ""
