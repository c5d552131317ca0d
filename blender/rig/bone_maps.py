"""Bone maps of armature objects: auto-mapping or a named preset (the core's `bone_map` decides), stored on the
object; the map a workflow uses when none is stored."""

from ...neural_network.skeleton import bone_map
from ...neural_network.skeleton.roles import ROLES
from ...properties import get_bone_map, set_bone_map
from .rig_model import driven_reasons

# The real-mocap rigs whose bone names identify them when an evaluated armature carries no bone map of its own.
MOCAP_PRESETS = ("bandai", "cmu")


def rig_bones(obj):
    """([(bone, parent or None)], {bone: rest head}) of an armature object, what the core's bone_map reads."""
    bones = [(b.name, b.parent.name if b.parent else None) for b in obj.data.bones]
    heads = {b.name: tuple(b.head_local) for b in obj.data.bones}
    return bones, heads


def auto_map(obj):
    """The core's MapResult for the armature (not stored)."""
    return bone_map.auto_map(*rig_bones(obj))


def preset_map(obj, preset):
    """The core's MapResult of a named preset for the armature (not stored)."""
    return bone_map.preset_map(preset, rig_bones(obj)[0])


def store_map(obj, result):
    """Store a MapResult on the armature: its map (even a partial one, so it can be finished by hand) and preset."""
    set_bone_map(obj, result.mapping)
    obj.neural_ik.preset = result.preset or ""


def auto_map_object(obj):
    """Auto-map an armature and store the map; returns the MapResult."""
    result = auto_map(obj)
    store_map(obj, result)
    return result


def bone_map_of(obj):
    """The stored bone map; when nothing is stored yet, what auto-mapping finds (not stored: extraction changes
    nothing of the user's)."""
    mapping = get_bone_map(obj)
    if not any(mapping.values()):
        mapping = {role: auto_map(obj).mapping.get(role, "") or "" for role in ROLES}
    return mapping


def stored_or_preset_map(obj):
    """{role: bone}: the armature's stored bone map when it has one, else the map of the mocap preset whose bones it
    has (MOCAP_PRESETS); None when neither."""
    stored = get_bone_map(obj) if hasattr(obj, "neural_ik") else {}
    if any(stored.values()):
        return stored
    names = set(obj.data.bones.keys())
    for name in MOCAP_PRESETS:
        preset = bone_map.PRESETS[name]
        if all(bone in names for bone in preset.values()):
            return {role: preset.get(role, "") for role in ROLES}
    return None


OUTSIDE_CHAIN = "is outside its chain"


def map_driven_reasons(obj, mapping):
    """rig_model.driven_reasons for the bones of a map and their ancestors: why Blender's evaluated pose of them does
    not follow from their keys (constraints, drivers, NLA strips: a control rig), [] for a plain rig."""
    bones = obj.data.bones
    needed = set()
    for name in mapping.values():
        bone = bones.get(name) if name else None
        while bone is not None and bone.name not in needed:
            needed.add(bone.name)
            bone = bone.parent
    return driven_reasons(obj, sorted(needed))


def driven_map_problems(obj, mapping, problems):
    """(problems, note) of a bone map on this armature. A control rig's deform bones (Rigify's DEF-) are not one
    parent chain but follow other bones through constraints, so 'outside its chain' is no problem there: Extract
    reads Blender's evaluated pose and the chain is the roles'. Those problems are dropped and the note says why
    (empty note: the map's problems as they were)."""
    if not any(OUTSIDE_CHAIN in p for p in problems):
        return list(problems), ""
    reasons = map_driven_reasons(obj, mapping)
    if not reasons:
        return list(problems), ""
    return ([p for p in problems if OUTSIDE_CHAIN not in p],
            f"its mapped bones are driven ({'; '.join(reasons)}): Extract reads Blender's evaluated pose")
