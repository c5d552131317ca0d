"""Reading what Blender shows: the evaluated pose of an armature, frame by frame, for rigs whose mapped bones are
driven (constraints, drivers, NLA strips: a control rig such as Rigify, whose keys live on controls and whose deform
bones follow them through constraints), and keeping the scene as it was while doing so.

The key-reading path (pose_read) stays the path of plain rigs; `rig_model.driven_reasons` says when this one is
needed. Each action is assigned in turn (its slot on Blender 5), every frame evaluated with `frame_set` of a
throwaway scene holding the armature alone (Blender evaluates the armature and what it depends on, not the user's
meshes: faster than the scene's own frame_set, same matrices) and every bone's matrix read with one `foreach_get` on
the evaluated object; frame, action, pose channels and the pose bones' custom properties (IK/FK switches) are put
back afterwards.
"""

import bpy
import numpy as np

from .action_layouts import action_slot_for, assign_action

POSE_CHANNELS = (("rotation_quaternion", 4), ("rotation_euler", 3), ("rotation_axis_angle", 4), ("location", 3),
                 ("scale", 3))


def number_properties(obj):
    """{(bone, key): value} of every pose bone's numeric custom property (Rigify's IK_FK, FK_limb_follow, ...)."""
    out = {}
    for pb in obj.pose.bones:
        for key in pb.keys():
            value = pb[key]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[(pb.name, key)] = value
    return out


class KeptScene:
    """Context manager: on exit the scene frame, the armature's action (and slot), every pose bone's channels and
    numeric custom properties are as they were on entry (what evaluating other frames and actions overwrites)."""

    def __init__(self, scene, obj):
        self.scene, self.obj = scene, obj

    def __enter__(self):
        obj = self.obj
        self.frame = (self.scene.frame_current, self.scene.frame_subframe)
        ad = obj.animation_data
        self.action = (ad.action, getattr(ad, "action_slot", None)) if ad is not None else None
        count = len(obj.pose.bones)
        self.channels = {}
        for prop, width in POSE_CHANNELS:
            buf = np.empty(count * width, np.float32)
            obj.pose.bones.foreach_get(prop, buf)
            self.channels[prop] = buf
        self.properties = number_properties(obj)
        return self

    def __exit__(self, *exc):
        obj = self.obj
        if self.action is not None:
            ad = obj.animation_data_create()
            ad.action = self.action[0]
            if self.action[1] is not None:
                ad.action_slot = self.action[1]
        elif obj.animation_data is not None:
            obj.animation_data.action = None
        for prop, buf in self.channels.items():
            obj.pose.bones.foreach_set(prop, buf)
        pose_bones = obj.pose.bones
        for (bone, key), value in self.properties.items():
            pose_bones[bone][key] = value
        obj.update_tag()       # Blender shows the restored pose on its next evaluation
        if (self.scene.frame_current, self.scene.frame_subframe) != self.frame:
            self.scene.frame_set(self.frame[0], subframe=self.frame[1])
        return False


def _use_action(obj, action):
    """Let `action` drive obj through the slot that animates obj."""
    assign_action(obj, action)
    slot = action_slot_for(obj, action)
    ad = obj.animation_data
    if slot is not None and getattr(ad, "action_slot", None) != slot:
        ad.action_slot = slot


def evaluated_matrices(scene, obj, jobs, bones):
    """Blender's evaluated pose of `bones` (pose-bone indices) at every frame of each (action, first, last) of
    `jobs`, action after action: (K, 4, 4, N) float64 armature-space matrices (frames last; rows and columns as
    `pose_bone.matrix`). Changes the frame and the action assignment: run it inside KeptScene."""
    count = len(obj.pose.bones)
    bones = np.asarray(bones, dtype=np.int64)
    total = sum(last - first + 1 for _, first, last in jobs)
    buf = np.empty(count * 16, np.float32)
    raw = np.empty((total, len(bones), 4, 4), np.float32)       # column-major 4x4s, as foreach_get gives them
    own = bpy.data.scenes.new("Neural IK evaluation")            # the armature alone (and what it depends on): the
    try:                                                          # user's meshes and other objects are not evaluated
        own.render.fps, own.render.fps_base = scene.render.fps, scene.render.fps_base
        own.collection.objects.link(obj)
        layer = own.view_layers[0]
        row = 0
        for action, first, last in jobs:
            _use_action(obj, action)
            for f in range(first, last + 1):
                own.frame_set(f)
                obj.evaluated_get(layer.depsgraph).pose.bones.foreach_get("matrix", buf)
                raw[row] = buf.reshape(count, 4, 4)[bones]
                row += 1
    finally:
        bpy.data.scenes.remove(own)
    return raw.transpose(1, 3, 2, 0).astype(np.float64)       # (K, rows, columns, N)
