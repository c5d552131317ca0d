"""BVH files the project makes itself, so tests of general behaviour (import, extract, bad input, write and read back,
"each operator changes only what it documents") run on a fresh clone without ../shared/mocap: a few of the demo
rig's actions written by Blender's own BVH exporter (io_anim_bvh), in centimetres as motion capture comes, to be
imported at global_scale 0.01. Built once per test session (conftest's `demo_bvh` fixture).

Files of other skeletons (Bandai's and CMU's names, hierarchies, channels and frame rates, CMU's moving pelvis, the
importer's end-bone rolls) are made in tests/other_skeletons.py; the real files run the same tests as extras.
"""

import os
from dataclasses import dataclass, field

from neural_ik.neural_network.skeleton.roles import ROLES

# walk and run first (two locomotion clips), two of one kind for name patterns, then other tasks
ACTIONS = ("walk_normal_03", "run_easy_01", "reach_high_left_01", "idle_stand_01", "walk_normal_04")
FRAMES = 40                         # frames 1..40 of each action: small files, every kind of motion still in them
DEMO_MAP = {role: role for role in ROLES}      # the demo rig's bones carry the role names, and so do its BVH joints


@dataclass
class DemoBvh:
    folder: str                                 # the folder holding the files (shared by the session: link, never edit)
    files: tuple = ()                           # file names in ACTIONS order
    bone_map: dict = field(default_factory=lambda: dict(DEMO_MAP))

    def path(self, name):
        return os.path.join(self.folder, name)


def export_demo_bvh(folder, actions=ACTIONS, frames=FRAMES, seed=0):
    """Write `actions` of the demo rig (seed) as BVH files into folder with Blender's exporter; leaves an empty
    scene behind. Returns a DemoBvh."""
    import addon_utils
    import bpy

    from neural_ik.blender.rig import action_layouts

    addon_utils.enable("io_anim_bvh", default_set=False)
    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    bpy.ops.neural_ik.create_demo_rig(seed=seed)
    obj = bpy.context.active_object
    files = []
    for name in actions:
        action_layouts.assign_action(obj, bpy.data.actions[name])
        path = os.path.join(folder, f"{name}.bvh")
        result = bpy.ops.export_anim.bvh(filepath=path, check_existing=False, global_scale=100.0, frame_start=1,
                                         frame_end=frames, rotate_mode="NATIVE", root_transform_only=False)
        assert result == {"FINISHED"} and os.path.getsize(path) > 0, name
        files.append(f"{name}.bvh")
    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    return DemoBvh(str(folder), tuple(files))
