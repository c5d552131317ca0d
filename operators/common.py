"""What several operators share: polls that say why an operator is unavailable (which armature they act on is
blender.armatures.chosen_armature)."""

from .. import state
from ..blender.rig.armatures import chosen_armature


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


class TimerSteps:
    """What the modal runners share (Import BVH Folder, Evaluate): one step of work per window-manager TIMER event,
    a progress bar of `count` steps and a line in the status bar. A subclass says what its status line reads
    (status_text) and calls begin_steps / end_steps."""
    timer = None
    TIMER_SECONDS = 0.01

    def begin_steps(self, context, count):
        wm = context.window_manager
        wm.progress_begin(0, count)
        self.timer = wm.event_timer_add(self.TIMER_SECONDS, window=context.window)
        wm.modal_handler_add(self)
        self._show_status(context)
        return {"RUNNING_MODAL"}

    def _show_status(self, context, text=None):
        workspace = getattr(context, "workspace", None)
        if workspace is not None:
            workspace.status_text_set(self.status_text() if text is None else text)

    def _end(self, context):
        """Drop the timer, the progress bar and the status line (once)."""
        wm = context.window_manager
        if self.timer is not None:
            wm.event_timer_remove(self.timer)
            self.timer = None
            wm.progress_end()
            workspace = getattr(context, "workspace", None)
            if workspace is not None:
                workspace.status_text_set(None)
