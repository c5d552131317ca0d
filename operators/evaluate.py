"""`neural_ik.evaluate`: re-solve real motion from its own effectors and measure it against the motion itself.

A thin shell over blender.evaluate (the pipeline: clips, methods, metrics, JSON and chart); it prints the results
table and reports a one-line summary. In Blender's window (the panel's button) it runs modally, one clip per timer
event with a progress bar and Esc (EvaluateRunner); called from Python or headless it runs straight through.
"""

import bpy
from bpy.props import BoolProperty, IntProperty, StringProperty

from ..blender.errors import UserError
from ..blender.progress import say
from ..blender.workflows.evaluate import Evaluation, summary
from .common import TimerSteps, poll_no_training, poll_not_editing

FAILURES = (UserError, OSError, ValueError)


class EvaluateRunner(TimerSteps):
    """The modal Evaluate logic, without bpy.types.Operator (so tests can drive it with stand-in context and event
    objects: timers never fire in the bpy module). One clip per TIMER event (every method on it), a progress bar and
    "clip i of n" in the status bar; Esc stops: nothing is written and the scene is as it was.

    Needs on self: settings() (the operator's settings as a dict) and report()."""
    evaluation = None
    notes = ()

    def prepare(self, context):
        """The Evaluation (clips chosen, models loaded), or None after reporting why not."""
        self.notes = []
        try:
            return Evaluation(context, self.settings(), self.notes)
        except FAILURES as exc:
            self.fail(exc)
            return None

    def start_evaluation(self, context):
        evaluation = self.prepare(context)
        if evaluation is None:
            return {"CANCELLED"}
        self.evaluation = evaluation
        return self.begin_steps(context, evaluation.steps[1])

    def modal(self, context, event):
        if event.type == "ESC":
            return self.stop(context)
        if event.type != "TIMER":      # the rest of the UI keeps working between clips
            return {"PASS_THROUGH"}
        evaluation = self.evaluation
        try:
            evaluation.step()
        except Exception as exc:        # noqa: BLE001 - the scene is put back and the reason reported, no traceback
            message = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
            return self.stop(context, f"evaluation stopped at {evaluation.status()}: {message}", level="ERROR")
        context.window_manager.progress_update(evaluation.steps[0])
        if not evaluation.done:
            self._show_status(context)
            return {"RUNNING_MODAL"}
        self._end(context)
        return self.finish(evaluation)

    def finish(self, evaluation):
        """Write the report (JSON, chart), print the table and report the summary."""
        try:
            report = evaluation.finish()
        except FAILURES as exc:
            return self.fail(exc)
        self._report_notes()
        table, line = summary(report)
        say(table)
        self.report({"INFO"}, line)
        return {"FINISHED"}

    def fail(self, exc):
        self._report_notes()
        self.report({"ERROR"}, str(exc).strip() or type(exc).__name__)
        return {"CANCELLED"}

    def stop(self, context, reason="", level="WARNING"):
        """Esc (or a failure): the clips done so far are dropped, nothing is written, the scene is put back."""
        self._end(context)
        evaluation = self.evaluation
        evaluation.abandon()
        self._report_notes()
        self.report({level}, reason or f"evaluation cancelled after {evaluation.position} of {evaluation.count} "
                                       "clips; nothing was written")
        return {"CANCELLED"}

    def cancel(self, context):
        """Blender ends the operator (file load, window closed): drop the timer, the progress bar and the run."""
        self._end(context)
        if self.evaluation is not None:
            self.evaluation.abandon()

    def _report_notes(self):
        for note in self.notes:
            self.report({"WARNING"}, note)
        self.notes = []

    def status_text(self):
        return f"Evaluating: {self.evaluation.status()}, Esc to cancel"


class NEURAL_IK_OT_evaluate(EvaluateRunner, bpy.types.Operator):
    """Re-solve real motion from its own effectors with the network and with Blender's IK, and measure both"""
    bl_idname = "neural_ik.evaluate"
    bl_label = "Evaluate"
    bl_options = {"REGISTER"}

    armature: StringProperty(name="Armature", description="Armature whose actions are evaluated (empty: the chosen one)")
    actions: StringProperty(name="Actions", description="Comma-separated action names (empty: every action of the rig)")
    bvh_folder: StringProperty(name="BVH Folder", subtype="DIR_PATH",
                               description="Evaluate these BVH files instead, imported one at a time")
    files: StringProperty(name="Files", description="Comma-separated name patterns within the BVH folder (empty: all)")
    max_files: IntProperty(name="Max Files", min=0, default=0, description="Evaluate at most this many files (0: all)")
    model_path: StringProperty(name="Model", subtype="FILE_PATH", description="Checkpoint to evaluate (empty: baseline only)")
    refine_iterations: IntProperty(name="Refinement", min=0, max=50, default=2)
    free: StringProperty(name="Free Targets", description="Comma-separated targets the model places (root, left_hand, "
                         "right_hand, left_foot, right_foot, head): adds rows with them free, placed by the learned "
                         "prior and upright over the feet (empty: none)")
    baseline: BoolProperty(name="Blender IK Baseline", default=True)
    poles: BoolProperty(name="Baseline With Poles", default=True, description="Also run Blender IK with poles from the reference")
    start_pose: BoolProperty(name="Start Pose Row", default=False, description="Also measure the baseline's start pose without IK")
    mean_pose_folder: StringProperty(name="Training BVH Folder", subtype="DIR_PATH",
                                     description="Training clips whose mean pose starts Blender IK (when no model is given)")
    mean_pose_files_pattern: StringProperty(name="Training Files", description="Comma-separated patterns in that folder")
    mean_pose_files: IntProperty(name="Training Files Max", min=0, default=20)
    json_path: StringProperty(name="JSON", subtype="FILE_PATH")
    svg_path: StringProperty(name="Chart", subtype="FILE_PATH",
                             description="Write the error-over-frames and per-role chart here (SVG)")

    @classmethod
    def poll(cls, context):
        return poll_not_editing(cls, context) and poll_no_training(cls, context)

    def settings(self):
        return {name: getattr(self, name) for name in self.__annotations__}

    def invoke(self, context, _event):
        if context.window is not None and not bpy.app.background:
            return self.start_evaluation(context)
        return self.execute(context)

    def execute(self, context):
        evaluation = self.prepare(context)
        if evaluation is None:
            return {"CANCELLED"}
        return self.finish(evaluation)


classes = (NEURAL_IK_OT_evaluate,)
