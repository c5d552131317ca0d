"""Which armature a workflow acts on: the active object when it is an armature, else the one picked in the panel."""

import bpy


def chosen_armature(context):
    """The armature Neural IK acts on: the active object when it is an armature, else the one picked in the panel."""
    obj = context.active_object
    if obj is not None and obj.type == "ARMATURE":
        return obj
    settings = getattr(context.scene, "neural_ik", None)
    chosen = settings.armature if settings is not None else None
    return chosen if chosen is not None and chosen.type == "ARMATURE" else None


def check_armature(obj, error, missing="select an armature first"):
    """`obj` when it is an armature outside Edit Mode; else raises `error` with a message for the user (`missing`
    when there is no object at all)."""
    if obj is None:
        raise error(missing)
    if obj.type != "ARMATURE":
        raise error(f"{obj.name!r} is not an armature: {missing}")
    if obj.mode == "EDIT":
        raise error(f"{obj.name!r} is in Edit Mode: switch to Object or Pose Mode first")
    return obj


def armature_to_use(context, error, name="", missing="select an armature first"):
    """The armature called `name` (empty: the chosen one), checked by check_armature."""
    return check_armature(bpy.data.objects.get(name) if name else chosen_armature(context), error, missing)
