"""What several operators share: polls that say why an operator is unavailable (which armature they act on is
blender.armatures.chosen_armature)."""

from .. import state
from ..blender.armatures import chosen_armature


def poll_armature(cls, context):
    """Poll for operators that need an armature outside Edit Mode; the message names what is missing."""
    obj = chosen_armature(context)
    if obj is None:
        cls.poll_message_set("Select an armature (or choose one in the Neural IK panel)")
        return False
    if obj.mode == "EDIT":
        cls.poll_message_set(f"'{obj.name}' is in Edit Mode: switch to Object or Pose Mode first")
        return False
    return True


def poll_not_editing(cls, context):
    """Poll for operators that add or read whole objects: not while any object is being edited."""
    if context.mode.startswith("EDIT"):
        cls.poll_message_set("An object is in Edit Mode: switch to Object or Pose Mode first")
        return False
    return True


def poll_no_training(cls, _context):
    if state.training.running:
        cls.poll_message_set("A training run is already going on: wait for it or cancel it first")
        return False
    return True


def cancelled(operator, exc):
    """Report an error (an exception's message) and cancel."""
    operator.report({"ERROR"}, str(exc))
    return {"CANCELLED"}
