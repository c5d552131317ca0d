"""Actions in both of Blender's layouts: 4.2 LTS (F-curves on the action) and 5.x (slotted actions: layers, strips,
channelbags). Everything that finds, makes, assigns or parses an action's curves goes through here.
"""

import math
import re
from operator import attrgetter, itemgetter

import bpy
import numpy as np

_BONE_PATH = re.compile(r'^pose\.bones\["((?:[^"\\]|\\.)*)"\]\.(location|rotation_quaternion|rotation_euler|'
                        r'rotation_axis_angle|scale)$')

def _unescape(name):
    return re.sub(r"\\(.)", r"\1", name)

def action_slot_for(obj, action):
    """The slot of `action` that animates `obj`: the assigned one, else the OBJECT slot named like the object,
    else the first OBJECT slot. None for a legacy (Blender 4.2) action or an action without an object slot."""
    slots = getattr(action, "slots", None)
    if slots is None or not len(slots):
        return None
    anim = obj.animation_data
    if anim is not None and anim.action == action and getattr(anim, "action_slot", None) is not None:
        return anim.action_slot
    object_slots = [s for s in slots if s.target_id_type in ("OBJECT", "UNSPECIFIED")]
    for s in object_slots:
        if s.name_display == obj.name:
            return s
    return object_slots[0] if object_slots else None

def action_slot_for_any(action):
    """The first OBJECT slot of an action (None for a legacy action): the slot an importer created."""
    slots = getattr(action, "slots", None)
    if not slots:
        return None
    return next((s for s in slots if s.target_id_type in ("OBJECT", "UNSPECIFIED")), slots[0])

def _curve_container(action, slot):
    """The channelbag of a slot (Blender 5) or the legacy action (4.2): whatever holds `.fcurves` and `.groups`."""
    if slot is not None:
        from bpy_extras.anim_utils import action_get_channelbag_for_slot

        return action_get_channelbag_for_slot(action, slot)
    return action if getattr(action, "fcurves", None) is not None else None

def action_fcurves(action, slot):
    """The F-curves of one slot of an action (Blender 5 channelbag), or action.fcurves on Blender 4.2."""
    container = _curve_container(action, slot)
    return list(container.fcurves) if container is not None else []

def all_action_fcurves(action):
    """Every F-curve of an action: those of each of its slots (Blender 4.4+), or action.fcurves (4.2 has no slots)."""
    slots = getattr(action, "slots", None)
    if slots is None:
        return action_fcurves(action, None)
    return [fc for slot in slots for fc in action_fcurves(action, slot)]

def curve_container(obj):
    """What holds the F-curves that drive obj through its assigned action (the slot's channelbag on Blender 5, the
    action itself on 4.2); None without an action (or, on Blender 5, without a slot)."""
    anim = obj.animation_data
    if anim is None or anim.action is None:
        return None
    if hasattr(anim, "action_slot"):
        return _curve_container(anim.action, anim.action_slot) if anim.action_slot is not None else None
    return _curve_container(anim.action, None)

def assign_action(obj, action):
    """Let `action` drive obj. On Blender 4.4+ the object also needs a slot: the one Blender picked on assignment,
    else the first suitable one (4.2's actions have no slots and need nothing more)."""
    anim = obj.animation_data_create()
    anim.action = action
    if action is None or not hasattr(anim, "action_slot") or anim.action_slot is not None:
        return
    slots = list(anim.action_suitable_slots) or list(action.slots)
    if slots:
        anim.action_slot = slots[0]

def _parse_layout(paths, indices):
    """[(position, (bone, property, index))] of the pose-bone transform curves among data paths."""
    layout = []
    for k, path in enumerate(paths):
        m = _BONE_PATH.match(path)
        if m:
            name = m.group(1)
            layout.append((k, (_unescape(name) if "\\" in name else name, m.group(2), int(indices[k]))))
    return Layout(layout)

def _curve_flags(fcurves, count, skip_muted):
    indices = np.zeros(count, dtype=np.int32)
    muted = np.zeros(count, dtype=bool)
    if hasattr(fcurves, "foreach_get"):
        fcurves.foreach_get("array_index", indices)
        if skip_muted:
            fcurves.foreach_get("mute", muted)
    else:
        indices[:] = [fc.array_index for fc in fcurves]
        if skip_muted:
            muted[:] = [fc.mute for fc in fcurves]
    return indices, muted

def bone_channels(fcurves, skip_muted=False, layouts=None):
    """{(bone, property, index): fcurve} for the pose-bone transform curves among fcurves (a list or an F-curve
    collection; with a collection, indices and mute flags are read in one call each). skip_muted leaves out curves
    Blender does not evaluate (muted). layouts: a dict shared over one extraction; actions whose curves have the
    same paths and indices (every file of one BVH folder, every action of one rig) are parsed once."""
    curves = list(fcurves)
    indices, muted = _curve_flags(fcurves, len(curves), skip_muted)
    paths = tuple(map(_DATA_PATH, curves))
    key = (paths, indices.tobytes())
    layout = None if layouts is None else layouts.get(key)
    if layout is None:
        layout = _parse_layout(paths, indices)
        if layouts is not None:
            layouts[key] = layout
    if muted.any():
        return Channels({channel: curves[k] for k, channel in layout if not muted[k]}, layout=layout)
    return Channels(zip(layout.keys, itemgetter(*layout.positions)(curves)) if len(layout.positions) > 1 else
                    {channel: curves[k] for k, channel in layout}, layout=layout, bones=layout.bones)

class Layout(list):
    """[(position, (bone, property, index))] of one list of curves, with the same as columns and the bone names."""

    def __init__(self, items):
        super().__init__(items)
        self.positions = [k for k, _ in items]
        self.keys = [channel for _, channel in items]
        self.bones = frozenset(bone for bone, _, _ in self.keys)

class Channels(dict):
    """{(bone, property, index): fcurve}; `layout` is the parsed curve list shared by every action with the same
    curves, so per-rig work on it (which channels the chain reads) is done once per layout; `bones` the animated
    bone names when known."""

    def __init__(self, items=(), layout=None, bones=None):
        super().__init__(items)
        self.layout = layout
        self.bones = bones

def _channels_of(action, slot, layouts=None):
    """bone_channels of the curves Blender would evaluate for a slot (muted curves and groups left out)."""
    container = _curve_container(action, slot)
    if container is None:
        return {}
    out = bone_channels(container.fcurves, skip_muted=True, layouts=layouts)
    groups = container.groups
    if out and len(groups):
        group_muted = np.zeros(len(groups), dtype=bool)
        groups.foreach_get("mute", group_muted)
        if group_muted.any():
            out = Channels({key: fc for key, fc in out.items() if fc.group is None or not fc.group.mute})
    return out

def action_channels(obj, action, layouts=None):
    """{(bone, property, index): fcurve} of the curves that would drive obj (unmuted, through its slot).
    layouts: see bone_channels (one dict per extraction)."""
    return _channels_of(action, action_slot_for(obj, action), layouts)

def animated_bones(obj, action, channels=None):
    """Names of the bones whose transform the action animates (through the slot that would drive obj)."""
    channels = action_channels(obj, action) if channels is None else channels
    known = getattr(channels, "bones", None)
    return set(known) if known is not None else {bone for bone, _, _ in channels}

def action_frame_range(action):
    """Integer (first, last) frame of an action: its manual range when set, else its keys."""
    start, end = action.frame_range
    return int(math.ceil(start - 1e-6)), int(math.floor(end + 1e-6))

_DATA_PATH = attrgetter("data_path")

CHANNEL_WIDTHS = {"location": 3, "rotation_quaternion": 4, "rotation_euler": 3, "rotation_axis_angle": 4, "scale": 3}

def new_action(obj, name):
    """(action, slot, container): a new action with what will hold its F-curves for obj: an OBJECT slot named
    like obj and its channelbag on Blender 4.4+, the action itself (slot None) on 4.2. Not assigned to obj."""
    action = bpy.data.actions.new(name)    # Blender appends .001 on a clash; nothing is overwritten
    slot = None
    if hasattr(action, "slots"):
        slot = action.slots.new(id_type="OBJECT", name=obj.name)
        from bpy_extras.anim_utils import action_ensure_channelbag_for_slot

        container = action_ensure_channelbag_for_slot(action, slot)
    else:
        container = action
    return action, slot, container

def _key_curve(container, data_path, index, group, frames, values):
    try:
        fc = container.fcurves.new(data_path, index=index, group_name=group)
    except TypeError:      # Blender 4.2: a legacy action's fcurves.new names the group action_group
        fc = container.fcurves.new(data_path, index=index, action_group=group)
    fc.keyframe_points.add(len(frames))
    co = np.empty(2 * len(frames), dtype=np.float32)
    co[0::2] = frames
    co[1::2] = values
    fc.keyframe_points.foreach_set("co", co)
    fc.keyframe_points.foreach_set("interpolation", np.full(len(frames), 2, dtype=np.int32))   # LINEAR
    fc.update()
    return fc
