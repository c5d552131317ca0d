"""`neural_ik.evaluate`: re-solve real motion from its own effectors and measure it against the motion itself.

A thin shell over blender.evaluate (the pipeline: clips, methods, metrics, JSON and PNG); it prints the results
table and reports a one-line summary.
"""

import bpy
from bpy.props import BoolProperty, IntProperty, StringProperty

from ..blender.errors import UserError
from ..blender.evaluate import evaluate, summary
from .common import poll_no_training, poll_not_editing


class NEURAL_IK_OT_evaluate(bpy.types.Operator):
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
    baseline: BoolProperty(name="Blender IK Baseline", default=True)
    poles: BoolProperty(name="Baseline With Poles", default=True, description="Also run Blender IK with poles from the reference")
    start_pose: BoolProperty(name="Start Pose Row", default=False, description="Also measure the baseline's start pose without IK")
    mean_pose_folder: StringProperty(name="Training BVH Folder", subtype="DIR_PATH",
                                     description="Training clips whose mean pose starts Blender IK (when no model is given)")
    mean_pose_files_pattern: StringProperty(name="Training Files", description="Comma-separated patterns in that folder")
    mean_pose_files: IntProperty(name="Training Files Max", min=0, default=20)
    json_path: StringProperty(name="JSON", subtype="FILE_PATH")
    png_path: StringProperty(name="PNG", subtype="FILE_PATH")

    @classmethod
    def poll(cls, context):
        return poll_not_editing(cls, context) and poll_no_training(cls, context)

    def execute(self, context):
        options = {name: getattr(self, name) for name in self.__annotations__}
        notes = []
        try:
            report = evaluate(context, options, notes)
        except (UserError, OSError, ValueError) as exc:
            self.report({"ERROR"}, str(exc).strip() or type(exc).__name__)
            return {"CANCELLED"}
        finally:
            for note in notes:
                self.report({"WARNING"}, note)
        table, line = summary(report)
        print(table)
        self.report({"INFO"}, line)
        return {"FINISHED"}


classes = (NEURAL_IK_OT_evaluate,)
