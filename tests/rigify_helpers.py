"""A Rigify rig as a new user makes it: enable Rigify (it ships inside Blender), add the human meta-rig, Generate
Rig; then motion keyed on its controls (the IK hand and foot controls and the torso), as animators key it."""

import math

import numpy as np

RIGIFY_MAP = {
    "Hips": "DEF-spine", "Spine": "DEF-spine.001", "Spine1": "DEF-spine.002", "Spine2": "DEF-spine.003",
    "NeckLower": "DEF-spine.004", "NeckUpper": "DEF-spine.005", "Head": "DEF-spine.006",
}
for side, s in (("Left", "L"), ("Right", "R")):
    RIGIFY_MAP.update({f"{side}Shoulder": f"DEF-shoulder.{s}", f"{side}Arm": f"DEF-upper_arm.{s}",
                       f"{side}ForeArm": f"DEF-forearm.{s}", f"{side}Hand": f"DEF-hand.{s}",
                       f"{side}Thigh": f"DEF-thigh.{s}", f"{side}Shin": f"DEF-shin.{s}",
                       f"{side}Foot": f"DEF-foot.{s}", f"{side}ToeBase": f"DEF-toe.{s}"})


def generate_rigify(path):
    """Generate the rig from Blender's human meta-rig into a fresh file saved at `path`."""
    import addon_utils
    import bpy

    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    addon_utils.enable("rigify", default_set=True, persistent=True)
    bpy.ops.object.armature_human_metarig_add()
    bpy.ops.pose.rigify_generate()
    bpy.ops.object.mode_set(mode="OBJECT")
    bpy.data.objects["metarig"].hide_set(True)
    bpy.ops.wm.save_as_mainfile(filepath=str(path))


def open_rigify(path):
    """Open the generated file; the rig becomes the active object."""
    import bpy

    bpy.ops.wm.open_mainfile(filepath=str(path))
    rig = bpy.data.objects["rig"]
    bpy.context.view_layer.objects.active = rig
    return rig


def key_controls(obj, name, frames=40, seed=0, amplitude=1.0):
    """An action `name` keyed on every frame 1..frames on the IK hand and foot controls and the torso (location and
    rotation): a walk-like sway, different per seed, hands and feet within reach (no IK stretch). Returns the action
    (left assigned to obj)."""

    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 2 * math.pi, 8)
    ad = obj.animation_data_create()
    ad.action = None
    pb = obj.pose.bones
    for f in range(1, frames + 1):
        t = 2 * math.pi * (f - 1) / frames
        a = amplitude
        torso = pb["torso"]
        torso.location = (0.03 * a * math.sin(t + phase[0]), 0.05 * a * math.sin(t + phase[1]),
                          -0.04 - 0.06 * a * (1 - math.cos(t + phase[2])))      # knees bent: feet within reach
        torso.rotation_quaternion = (1.0, 0.08 * a * math.sin(t + phase[3]), 0.05 * a * math.sin(t), 0.1 * a * math.cos(t))
        torso.keyframe_insert("location", frame=f)
        torso.keyframe_insert("rotation_quaternion", frame=f)
        for k, (bone, sign) in enumerate((("hand_ik.L", 1), ("hand_ik.R", -1))):
            b = pb[bone]
            b.location = (-sign * (0.15 + 0.05 * a * math.sin(t + phase[4 + k])), -0.1 * a * (1 + math.sin(t + sign)),
                          0.1 * a * math.cos(t + phase[6 + k]))           # toward the body: within the arm's reach
            b.keyframe_insert("location", frame=f)
        for k, (bone, sign) in enumerate((("foot_ik.L", 1), ("foot_ik.R", -1))):
            b = pb[bone]
            b.location = (0.0, 0.18 * a * math.sin(t * sign + k), 0.06 * a * max(0.0, math.sin(t * sign + k)))
            b.keyframe_insert("location", frame=f)
    action = ad.action
    action.name = name
    return action


def rest_pose(obj):
    """Clear every pose bone's channels (what key_controls left at its last frame) without touching actions."""
    for pb in obj.pose.bones:
        pb.location = (0, 0, 0)
        pb.rotation_quaternion = (1, 0, 0, 0)
        pb.rotation_euler = (0, 0, 0)
        pb.scale = (1, 1, 1)
