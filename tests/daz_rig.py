"""A DAZ-style armature built in the tests (no DAZ rig or motion ships here): hip > lButtock > lThigh > lShin > lFoot
with no toe bone, a pelvis between the hips and the buttocks, and an upper arm in two bones (lShldrBend >
lShldrTwist > lForearmBend), as DAZ Genesis rigs have them."""

import numpy as np


def daz_style_bones():
    """hip > lButtock > lThigh > lShin > lFoot (no toe bone), DAZ-style arms whose upper arm is 'lShldrBend'."""
    bones = [("hip", None), ("pelvis", "hip"), ("abdomenLower", "hip"), ("abdomenUpper", "abdomenLower"),
             ("chestLower", "abdomenUpper"), ("chestUpper", "chestLower"), ("neckLower", "chestUpper"),
             ("neckUpper", "neckLower"), ("head", "neckUpper")]
    heads = {"hip": (0, 0, 1.0), "pelvis": (0, 0, 0.98), "abdomenLower": (0, 0, 1.05), "abdomenUpper": (0, 0, 1.15),
             "chestLower": (0, 0, 1.25), "chestUpper": (0, 0, 1.35), "neckLower": (0, 0, 1.5),
             "neckUpper": (0, 0, 1.55), "head": (0, 0, 1.62)}
    for s, x in (("l", 1.0), ("r", -1.0)):
        bones += [(f"{s}Buttock", "pelvis"), (f"{s}Thigh", f"{s}Buttock"), (f"{s}Shin", f"{s}Thigh"),
                  (f"{s}Foot", f"{s}Shin"), (f"{s}Collar", "chestUpper"), (f"{s}ShldrBend", f"{s}Collar"),
                  (f"{s}ShldrTwist", f"{s}ShldrBend"), (f"{s}ForearmBend", f"{s}ShldrTwist"),
                  (f"{s}Hand", f"{s}ForearmBend")]
        heads.update({f"{s}Buttock": (0.05 * x, 0, 0.97), f"{s}Thigh": (0.09 * x, 0, 0.93),
                      f"{s}Shin": (0.1 * x, 0, 0.5), f"{s}Foot": (0.1 * x, 0, 0.08),
                      f"{s}Collar": (0.03 * x, 0, 1.45), f"{s}ShldrBend": (0.18 * x, 0, 1.45),
                      f"{s}ShldrTwist": (0.3 * x, 0, 1.45), f"{s}ForearmBend": (0.45 * x, 0, 1.45),
                      f"{s}Hand": (0.7 * x, 0, 1.45)})
    return bones, heads


def daz_style_rig():
    """An armature built here with DAZ-style names: hip > lButtock > lThigh > lShin > lFoot (no toe bone), a pelvis
    between the hips and the buttocks, arms out in a T-pose; no clips of its own (calibrated from its rest)."""
    import bpy

    from neural_ik.blender.workflows.demo_rig import build_armature

    bones, heads = daz_style_bones()
    children = {}
    for name, parent in bones:
        children.setdefault(parent, []).append(name)
    edit_bones = []
    for name, parent in bones:                      # parents come first in the list
        kids = children.get(name, [])
        tail = np.array(heads[kids[0]]) if kids else None
        if tail is None or np.linalg.norm(tail - np.array(heads[name])) < 1e-3:
            step = np.array(heads[name]) - np.array(heads[parent]) if parent else np.array([0, 0, 0.1])
            if "Foot" in name:
                step = np.array([0.0, -0.1, -0.05])
            tail = np.array(heads[name]) + 0.1 * step / max(np.linalg.norm(step), 1e-6)
        edit_bones.append((name, parent, heads[name], tuple(tail), 0.0, False))
    return build_armature(bpy.context, "daz", edit_bones)


def daz_style_rig_with_clips(folder, names):
    """A new empty scene at 30 fps (as DAZ exports) with the DAZ-style rig, auto-mapped, and each BVH file named in
    `names` (patterns within `folder`) retargeted onto it; returns (the rig, [(name, its imported action names)])."""
    import bpy

    from neural_ik.blender.rig import bone_maps
    from neural_ik.blender.workflows.bvh_import import import_bvh_files

    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    bpy.context.scene.render.fps = 30
    daz = daz_style_rig()
    bone_maps.auto_map_object(daz)
    clips = []
    for name in names:
        _, imported, _ = import_bvh_files(bpy.context, folder, 0.01, files=name, onto=daz)
        clips.append((name, imported))
    return daz, clips
