"""Train, Train Starter Model and Cancel: shells over blender/workflows/training.py and starter.py (a background
NumPy thread in the UI, synchronous headless)."""

import bpy
from bpy.props import BoolProperty, EnumProperty, FloatProperty, IntProperty, StringProperty

from ..blender.errors import DataError
from ..blender.workflows import starter, training
from .common import poll_armature, poll_no_training

MODE = EnumProperty(name="Mode", items=[("AUTO", "Auto", "Thread in the UI, synchronous in background mode"),
                                        ("THREAD", "Thread", "Always a background thread"),
                                        ("SYNC", "Synchronous", "Train before returning")],
                    default="AUTO", options={"HIDDEN", "SKIP_SAVE"})


def started(operator, start):
    """Call start() -> (message, warning or None) and report it: ERROR and CANCELLED on a DataError."""
    try:
        message, warning = start()
    except DataError as exc:
        operator.report({"ERROR"}, str(exc))
        return {"CANCELLED"}
    if warning:
        operator.report({"WARNING"}, warning)
    operator.report({"INFO"}, message)
    return {"FINISHED"}


class NEURAL_IK_OT_train(bpy.types.Operator):
    bl_idname = "neural_ik.train"
    bl_label = "Train"
    bl_description = ("Train the network on a dataset in the background; the armature's model becomes the best "
                      "checkpoint when it ends")
    bl_options = {"REGISTER"}

    filepath: StringProperty(name="Dataset", subtype="FILE_PATH", description="Training set (.npz); empty: the scene's")
    directory: StringProperty(name="Output", subtype="DIR_PATH",
                              description="Folder for model.npz, metrics.json and loss.svg; empty: the scene's setting")
    epochs: IntProperty(name="Epochs", min=1, default=300)
    time_limit: FloatProperty(name="Time Limit", min=0.0, default=0.0, description="Seconds; 0 for no limit")
    seed: IntProperty(name="Seed", min=0, default=0, description="Seed of the split, initialisation and batches")
    batch_size: IntProperty(name="Batch", min=0, default=0, description="0: the scene's setting")
    learning_rate: FloatProperty(name="Learning Rate", min=0.0, default=0.0, precision=5,
                                 description="0: the scene's setting")
    resume: BoolProperty(name="Resume", default=False,
                         description="Continue the run saved in the output folder instead of starting over")
    mode: MODE

    @classmethod
    def poll(cls, context):
        return poll_no_training(cls, context)

    def execute(self, context):
        settings = context.scene.neural_ik
        return started(self, lambda: training.start_training(
            context, bpy.path.abspath(self.filepath or settings.dataset_path),
            bpy.path.abspath(self.directory or settings.output_directory), self.epochs, self.time_limit, self.seed,
            self.batch_size, self.learning_rate, self.resume, self.mode))


class NEURAL_IK_OT_train_starter(bpy.types.Operator):
    bl_idname = "neural_ik.train_starter"
    bl_label = "Train Starter Model"
    bl_description = ("Train a model for the active armature from the starter motion that ships with Neural IK "
                      "(CMU motion capture, retargeted onto the rig) and its own clips if it has any; the "
                      "armature's model becomes the result. Nothing in the file changes")
    bl_options = {"REGISTER"}

    directory: StringProperty(name="Output", subtype="DIR_PATH",
                              description="Folder for model.npz, metrics.json and loss.svg; empty: a folder of its "
                                          "own in the extension's user folder")
    time_limit: FloatProperty(name="Time Limit", min=1.0, default=starter.DEFAULT_TIME_LIMIT,
                              description="Seconds of training")
    seed: IntProperty(name="Seed", min=0, default=0, description="Seed of the split, initialisation and batches")
    mode: MODE

    @classmethod
    def poll(cls, context):
        return poll_no_training(cls, context) and poll_armature(cls, context)

    def execute(self, context):
        return started(self, lambda: starter.train_starter(context, self.directory, self.time_limit, self.seed,
                                                           self.mode))


class NEURAL_IK_OT_cancel_training(bpy.types.Operator):
    bl_idname = "neural_ik.cancel_training"
    bl_label = "Cancel Training"
    bl_description = "Stop training within a second; the best model so far stays on disk and becomes the armature's"
    bl_options = {"REGISTER"}

    @classmethod
    def poll(cls, _context):
        if training.is_running():
            return True
        cls.poll_message_set("Training is not running")
        return False

    def execute(self, _context):
        self.report({"INFO"}, training.cancel_training())
        return {"FINISHED"}


classes = (NEURAL_IK_OT_train, NEURAL_IK_OT_train_starter, NEURAL_IK_OT_cancel_training)


def register_extra():
    training.register_handlers()


def unregister_extra():
    training.unregister_handlers()
