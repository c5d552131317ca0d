"""Data operators: bring a folder of BVH files in as actions on one armature, and extract a training set.

Thin shells over blender.bvh_import (BvhFolderImport, one file per step) and blender.extract (write_dataset). In
Blender's window the import runs modally, one file per timer event (BvhImportRunner, the timer plumbing); headless
it runs every step at once.
"""

import bpy
from bpy.props import BoolProperty, FloatProperty, StringProperty

from ..blender.errors import DataError
from ..blender.rig.armatures import chosen_armature
from ..blender.workflows.bvh_import import BvhFolderImport, import_messages
from ..blender.workflows.extract import write_dataset
from .common import TimerSteps, cancelled, poll_armature, poll_not_editing


def report_import(operator, result):
    """Report a finished import (skipped files, then the summary) and end the operator."""
    for level, text in import_messages(*result):
        operator.report({level}, text)
    return {"FINISHED"}


class BvhImportRunner(TimerSteps):
    """The modal Import BVH Folder logic, without bpy.types.Operator (so tests can drive it with stand-in context and
    event objects: timers never fire in the bpy module). One file per TIMER event, a progress bar and "file i of n"
    in the status bar; Esc stops with the actions imported so far kept on the armature.

    Needs on self: directory, global_scale, files, exclude, onto_active and report()."""
    importer = None

    def make_importer(self, context):
        onto = chosen_armature(context) if self.onto_active else None
        if self.onto_active and onto is None:
            raise DataError("select the armature to import onto (Onto Active Armature is on)")
        return BvhFolderImport(context, self.directory, self.global_scale, self.files, self.exclude, onto)

    def invoke(self, context, _event):
        try:
            importer = self.make_importer(context)
        except DataError as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        return self.start_import(context, importer)

    def start_import(self, context, importer):
        self.importer = importer
        return self.begin_steps(context, importer.count)

    def modal(self, context, event):
        if event.type == "ESC":
            return self.stop(context)
        if event.type != "TIMER":      # the rest of the UI keeps working between files
            return {"PASS_THROUGH"}
        importer = self.importer
        try:
            importer.step()
        except Exception as exc:        # never leave half a file behind a traceback
            message = str(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
            return self.stop(context, f"import stopped at file {importer.position} of {importer.count}: {message}")
        context.window_manager.progress_update(importer.position)
        if not importer.done:
            self._show_status(context)
            return {"RUNNING_MODAL"}
        self._end(context)
        try:
            result = importer.finish(context)
        except DataError as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        return report_import(self, result)

    def stop(self, context, reason=""):
        """Esc (or a failure): the file in progress is undone, the files before it stay imported. FINISHED when
        something was imported, so the kept actions get their own undo step."""
        self._end(context)
        importer = self.importer
        target = importer.abandon(context)
        for name, why in importer.skipped:
            self.report({"WARNING"}, f"skipped {name}: it {why}")
        head = reason or f"import cancelled after {importer.position} of {importer.count} files"
        if target is None:
            self.report({"WARNING"}, f"{head}; nothing was imported")
            return {"CANCELLED"}
        self.report({"WARNING"}, f"{head}; kept {len(importer.imported)} actions on {target.name!r}")
        return {"FINISHED"}

    def cancel(self, context):
        """Blender ends the operator (file load, window closed): drop the timer and the progress bar."""
        self._end(context)
        if self.importer is not None:
            self.importer.abandon(context)

    def status_text(self):
        importer = self.importer
        return (f"Importing BVH: file {importer.position + 1} of {importer.count} "
                f"({importer.names[importer.position]}), Esc to cancel")


class NEURAL_IK_OT_import_bvh_folder(BvhImportRunner, bpy.types.Operator):
    """In Blender's window (opened from the file browser) the import runs one file per timer event with a progress
    bar; called from Python, the CLI or in background mode it runs synchronously, as scripts expect"""
    bl_idname = "neural_ik.import_bvh_folder"
    bl_label = "Import BVH Folder"
    bl_description = ("Import every .bvh file of a folder with Blender's BVH importer as actions on one armature "
                      "(onto an armature of another skeleton each file is retargeted through both bone maps; broken "
                      "files are reported and skipped; Esc stops)")
    bl_options = {"REGISTER", "UNDO"}

    directory: StringProperty(name="Folder", subtype="DIR_PATH", description="Folder holding .bvh files")
    global_scale: FloatProperty(name="Scale", default=1.0, min=1e-6, max=1e6,
                                description="Scale applied to the files (0.01 for centimetre data)")
    files: StringProperty(name="Files", description="Comma-separated name patterns of the files to import (empty: all)")
    exclude: StringProperty(name="Exclude", description="Comma-separated name patterns of files to leave out")
    onto_active: BoolProperty(name="Onto Active Armature", default=False,
                              description="Add the clips to the active armature instead of a new one (files of another "
                                          "skeleton are retargeted onto it through both bone maps)")
    run_modal: BoolProperty(name="Run Modal", default=False, options={"HIDDEN", "SKIP_SAVE"},
                            description="Set when opened from the UI: import on a timer so the window stays responsive")

    @classmethod
    def poll(cls, context):
        return poll_not_editing(cls, context)

    def invoke(self, context, _event):
        self.run_modal = True
        context.window_manager.fileselect_add(self)
        return {"RUNNING_MODAL"}

    def execute(self, context):
        try:
            importer = self.make_importer(context)
            if self.run_modal and context.window is not None and not bpy.app.background:
                return self.start_import(context, importer)
            result = importer.run(context)
        except DataError as exc:
            self.report({"ERROR"}, str(exc))
            return {"CANCELLED"}
        return report_import(self, result)


class NEURAL_IK_OT_extract(bpy.types.Operator):
    bl_idname = "neural_ik.extract"
    bl_label = "Extract Training Data"
    bl_description = ("Turn every frame of every action of the armature into a training set (.npz); the actions, "
                      "the scene frame and the armature's assigned action stay as they are")
    bl_options = {"REGISTER"}

    filepath: StringProperty(name="Dataset", subtype="FILE_PATH", description="Where to write the dataset (.npz)")

    @classmethod
    def poll(cls, context):
        return poll_armature(cls, context)

    def invoke(self, context, _event):
        if not self.filepath:
            self.filepath = context.scene.neural_ik.dataset_path or "dataset.npz"
        context.window_manager.fileselect_add(self)
        return {"RUNNING_MODAL"}

    def execute(self, context):
        try:
            path, dataset, notes = write_dataset(context, self.filepath)
        except DataError as exc:
            return cancelled(self, exc)
        for note in notes:
            self.report({"WARNING"}, note)
        self.report({"INFO"}, f"wrote {dataset.summary_text()} to {path}")
        return {"FINISHED"}


classes = (NEURAL_IK_OT_import_bvh_folder, NEURAL_IK_OT_extract)
