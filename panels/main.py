"""The "Neural IK" tab of the 3D viewport's sidebar: one panel, with a sub-panel per step of the work.

Rig -> Data -> Training -> Live -> Bake and Export. Panels only draw: they read the scene/object settings
(properties.py) and the runtime state (state.py) and offer the operators; they never change data. An operator, or
an operator property, that does not exist raises (panels.common.operator): a typo fails the draw, loudly.
"""

import os

import bpy

from .. import state
from ..blender.live.motion import LAYER_SLOTS, TARGET_LABELS, TARGET_SLOTS, free_flags, target_source
from ..blender.live.tick import playing_action
from ..blender.rig.bone_maps import driven_map_problems
from ..blender.rig.control_rig import control_map_summary
from ..neural_network.model.prior import TARGETS as FREE_NAMES
from ..neural_network.model.trainer import epoch_text
from ..neural_network.model.trainer import score as trainer_score
from ..neural_network.skeleton import bone_map
from ..neural_network.skeleton.roles import ROLES
from ..properties import get_bone_map
from .common import absolute, dataset_summary, format_number, format_seconds, metric_lines, operator, read_meta
from .lists import NEURAL_IK_MT_bone_map_presets, NEURAL_IK_UL_bone_map


def scene_settings(context):
    return context.scene.neural_ik


def chosen_armature(context):
    """The armature the scene's Neural IK settings point at (None when none is chosen or it is not an armature)."""
    obj = scene_settings(context).armature
    return obj if obj is not None and obj.type == "ARMATURE" else None


def wrapped_label(layout, text, icon="NONE", width=44):
    """A label broken into lines at word boundaries (sidebar labels do not wrap by themselves)."""
    words, line, first = text.split(), "", True
    column = layout.column(align=True)
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            column.label(text=line, icon=icon if first else "BLANK1")
            line, first = word, False
        else:
            line = f"{line} {word}" if line else word
    if line:
        column.label(text=line, icon=icon if first else "BLANK1")


def act_on(layout, armature):
    """Make the panel's buttons act on the picked armature.

    The operators take `context.active_object` first; a button's context store overrides it, so pressing a button
    here works on the armature chosen in the panel even when another object is active.
    """
    if armature is not None:
        layout.context_pointer_set("active_object", armature)
        layout.context_pointer_set("object", armature)


def need_armature(layout, context):
    """The chosen armature (set as the buttons' active object), or None after telling the user to choose one."""
    armature = chosen_armature(context)
    if armature is None:
        layout.label(text="Choose an armature in Rig first", icon="INFO")
    act_on(layout, armature)
    return armature


# ---- bone map problems ---------------------------------------------------------------------------------------


def bone_map_problems(armature):
    """Problems of the armature's bone map, in words: the core's `bone_map.validate` decides what makes a map
    unusable."""
    mapping = get_bone_map(armature)
    if not any(mapping.values()):
        return ["No bones are mapped yet: press Auto Map or choose a preset."]
    bones = [(bone.name, bone.parent.name if bone.parent else None) for bone in armature.data.bones]
    return driven_map_problems(armature, mapping, [str(p) for p in bone_map.validate(mapping, bones)])[0]


# ---- panels --------------------------------------------------------------------------------------------------


class NeuralIKPanel:
    bl_space_type = "VIEW_3D"
    bl_region_type = "UI"
    bl_category = "Neural IK"


class NEURAL_IK_PT_main(NeuralIKPanel, bpy.types.Panel):
    bl_idname = "NEURAL_IK_PT_main"
    bl_label = "Neural IK"

    def draw(self, context):
        layout = self.layout
        armature = chosen_armature(context)
        if armature is None:
            layout.label(text="Learned full-body IK for an armature")
            operator(layout, "create_demo_rig", text="Create Demo Rig", icon="ARMATURE_DATA")
            return
        training = state.training
        session = state.live_sessions.get(armature.name)
        if training.running:
            layout.label(text=f"Training: {epoch_text(training.epoch, training.epochs)}", icon="SORTTIME")
        elif session is not None:
            layout.label(text=f"Live IK running on {armature.name}", icon="PLAY")
        else:
            layout.label(text=armature.name, icon="ARMATURE_DATA")


class NEURAL_IK_PT_rig(NeuralIKPanel, bpy.types.Panel):
    bl_idname = "NEURAL_IK_PT_rig"
    bl_parent_id = "NEURAL_IK_PT_main"
    bl_label = "Rig"

    def draw(self, context):
        layout = self.layout
        settings = scene_settings(context)
        row = layout.row(align=True)
        row.prop(settings, "armature", text="")
        operator(row, "create_demo_rig", text="", icon="ADD")
        armature = chosen_armature(context)
        if armature is None:
            layout.label(text="Choose the armature to map, train and drive", icon="INFO")
            return
        act_on(layout, armature)
        row = layout.row(align=True)
        preset = armature.neural_ik.preset
        row.menu(NEURAL_IK_MT_bone_map_presets.bl_idname, text=preset or "Preset")
        operator(row, "auto_map", text="Auto Map", icon="AUTO")
        object_settings = armature.neural_ik
        layout.template_list(NEURAL_IK_UL_bone_map.bl_idname, "", object_settings, "bone_map",
                             object_settings, "bone_map_index", rows=6)
        mapped = sum(1 for bone in get_bone_map(armature).values() if bone)
        layout.label(text=f"{mapped} of {len(ROLES)} roles mapped")
        problems = bone_map_problems(armature)
        if problems:
            box = layout.box()
            for problem in problems[:8]:
                wrapped_label(box, problem, icon="ERROR")
            if len(problems) > 8:
                box.label(text=f"... and {len(problems) - 8} more")
        else:
            layout.label(text="The bone map is complete", icon="CHECKMARK")
        controls = control_map_summary(armature, get_bone_map(armature))
        if controls:
            wrapped_label(layout, controls, icon="CONSTRAINT_BONE")


class NEURAL_IK_PT_data(NeuralIKPanel, bpy.types.Panel):
    bl_idname = "NEURAL_IK_PT_data"
    bl_parent_id = "NEURAL_IK_PT_main"
    bl_label = "Data"

    def draw(self, context):
        layout = self.layout
        settings = scene_settings(context)
        armature = need_armature(layout, context)
        col = layout.column(align=True)
        col.prop(settings, "bvh_directory", text="")
        operator(col, "import_bvh_folder", text="Import BVH Folder", icon="IMPORT",
                 directory=settings.bvh_directory or None)
        layout.separator()
        actions = len(bpy.data.actions)
        layout.label(text=f"{actions} action{'s' if actions != 1 else ''} in this file", icon="ACTION")
        layout.prop(settings, "dataset_path")
        row = layout.row()
        row.enabled = armature is not None
        operator(row, "extract", text="Extract Dataset", icon="EXPORT", filepath=settings.dataset_path or None)
        draw_dataset(layout, settings)


class NEURAL_IK_PT_training(NeuralIKPanel, bpy.types.Panel):
    bl_idname = "NEURAL_IK_PT_training"
    bl_parent_id = "NEURAL_IK_PT_main"
    bl_label = "Training"

    def draw(self, context):
        layout = self.layout
        settings = scene_settings(context)
        training = state.training
        armature = need_armature(layout, context)      # Train is greyed out without one: say why
        col = layout.column(align=True)
        col.enabled = not training.running
        col.prop(settings, "epochs")
        col.prop(settings, "batch_size")
        col.prop(settings, "learning_rate")
        col.prop(settings, "time_limit")
        col.prop(settings, "own_share")
        col.prop(settings, "library")
        col.prop(settings, "limb_mix")
        col.prop(settings, "prior_members")
        col.prop(settings, "output_directory", text="")
        draw_loss_weights(layout, settings, training.running)
        row = layout.row(align=True)
        row.scale_y = 1.3
        if training.running:
            operator(row, "cancel_training", text="Cancel", icon="CANCEL")
        else:
            row.enabled = armature is not None
            operator(row, "train", text="Train", icon="PLAY", filepath=settings.dataset_path or None,
                     directory=settings.output_directory or None, epochs=settings.epochs,
                     time_limit=settings.time_limit)
            row = layout.row(align=True)
            row.enabled = armature is not None
            operator(row, "train_starter", text="Train Starter Model", icon="OUTLINER_OB_ARMATURE")
            if armature is not None and not armature.neural_ik.model_path:
                wrapped_label(layout, "First hour on your rig: Auto Map, Train Starter Model (5 minutes, motion "
                                      "that ships with Neural IK), Create Targets, Run IK; your own clips join it "
                                      "when you have some", icon="INFO")
        draw_progress(layout, training)
        draw_loss_curve(layout, training.history, training.plot_path)
        draw_best(layout, context, training)


class NEURAL_IK_PT_live(NeuralIKPanel, bpy.types.Panel):
    bl_idname = "NEURAL_IK_PT_live"
    bl_parent_id = "NEURAL_IK_PT_main"
    bl_label = "Live"

    def draw(self, context):
        layout = self.layout
        armature = need_armature(layout, context)
        if armature is None:
            return
        settings = armature.neural_ik
        row = layout.row(align=True)
        row.prop(settings, "model_path", text="")
        operator(row, "load_model", text="", icon="FILE_FOLDER", filepath=settings.model_path or None)
        if not settings.model_path:
            wrapped_label(layout, "No model yet: Train Starter Model (Training) or Load Model", icon="INFO")
        operator(layout, "create_targets", text="Create Targets", icon="EMPTY_AXIS")
        session = state.live_sessions.get(armature.name)
        row = layout.row(align=True)
        row.scale_y = 1.3
        if session is not None:
            operator(row, "stop", text="Stop", icon="PAUSE")
        else:
            operator(row, "run", text="Run IK", icon="PLAY")
        col = layout.column(align=True)
        col.prop(settings, "refine_iterations")
        col.prop(scene_settings(context), "live_rate")
        col = layout.column(align=True)
        col.prop(settings, "task")
        row = col.row(align=True)
        row.prop(settings, "phase")
        row.prop(settings, "phase_follows_time", text="", icon="TIME")
        row = layout.row(align=True)
        row.prop(settings, "contact_left", toggle=True)
        row.prop(settings, "contact_right", toggle=True)
        draw_targets(layout, armature, session)
        if session is not None:
            draw_tick_times(layout, session)


class NEURAL_IK_PT_bake_export(NeuralIKPanel, bpy.types.Panel):
    bl_idname = "NEURAL_IK_PT_bake_export"
    bl_parent_id = "NEURAL_IK_PT_main"
    bl_label = "Bake and Export"
    bl_options = {"DEFAULT_CLOSED"}

    def draw(self, context):
        layout = self.layout
        settings = scene_settings(context)
        armature = need_armature(layout, context)
        col = layout.column(align=True)
        row = col.row(align=True)
        row.prop(settings, "bake_frame_start")
        row.prop(settings, "bake_frame_end")
        col.prop_search(settings, "bake_source_action", bpy.data, "actions", text="Source", icon="ACTION")
        row = layout.row()
        row.enabled = armature is not None
        refine = armature.neural_ik.refine_iterations if armature is not None else None
        operator(row, "bake", text="Bake", icon="REC", source_action=settings.bake_source_action,
                 frame_start=settings.bake_frame_start, frame_end=settings.bake_frame_end, refine_iterations=refine,
                 lock_feet=armature.neural_ik.lock_feet if armature is not None else None)
        layout.separator()
        row = layout.row()
        row.enabled = armature is not None
        operator(row, "export_onnx", text="Export ONNX", icon="EXPORT")


# ---- drawing helpers of the panels above ----------------------------------------------------------------


def draw_dataset(layout, settings):
    meta, reason = read_meta(settings.dataset_path)
    box = layout.box()
    if meta is None:
        box.label(text=f"Dataset: {reason}", icon="INFO")
        return
    if meta.get("kind") != "neural_ik.dataset":
        box.label(text=f"Not a dataset ({meta.get('kind')})", icon="ERROR")
        return
    facts = dataset_summary(meta)
    col = box.column(align=True)
    col.label(text=f"{facts['actions']} actions, {facts['frames']} frames", icon="FILE_MOVIE")
    if facts["retargeted"]:
        col.label(text=f"{facts['actions'] - facts['retargeted']} own, {facts['retargeted']} retargeted library",
                  icon="BLANK1")
    for task, frames in facts["per_task"]:
        col.label(text=f"{task.capitalize()}: {frames} frames", icon="BLANK1")
    if facts["rig"]:
        col.label(text=f"Rig: {facts['rig']}", icon="ARMATURE_DATA")
    if str(meta.get("pose_source", "")).startswith("evaluated"):
        col.label(text="Read from Blender's evaluated pose (driven bones)", icon="CONSTRAINT_BONE")
    if facts["fps"]:
        col.label(text=f"{format_number(facts['fps'], '{:g}')} fps", icon="BLANK1")


def draw_loss_weights(layout, settings, running):
    box = layout.box()
    header = box.row()
    header.prop(settings, "show_loss_weights", emboss=False,
                icon="DISCLOSURE_TRI_DOWN" if settings.show_loss_weights else "DISCLOSURE_TRI_RIGHT")
    if settings.show_loss_weights:
        col = box.column(align=True)
        col.enabled = not running
        for name in ("weight_fk", "weight_pose", "weight_contact", "weight_limit", "weight_slip"):
            col.prop(settings, name)


def draw_progress(layout, training):
    error = training.error
    if error and not training.running:
        wrapped_label(layout, error, icon="ERROR")
    if not training.running and training.epoch == 0:
        if training.message and not error:
            wrapped_label(layout, training.message, icon="INFO")
        return
    text = f"Epoch {training.epoch}/{training.epochs}"
    layout.progress(factor=min(max(training.fraction, 0.0), 1.0), type="BAR", text=text)
    col = layout.column(align=True)
    col.label(text=f"Loss: {format_number(training.train_loss)}")
    col.label(text=f"Validation error: {format_number(training.val_error_cm, '{:.2f}')} cm")
    col.label(text=f"Inner joints: {format_number(training.val_inner_cm, '{:.2f}')} cm")
    if training.running:
        col.label(text=f"Time left: {format_seconds(training.seconds_left)}")
    if training.message:
        wrapped_label(col, training.message, icon="INFO")


def draw_best(layout, context, training):
    metrics, source, sources = training.best_metrics, "this run", None
    if not metrics:
        armature = chosen_armature(context)
        model_path = armature.neural_ik.model_path if armature is not None else ""
        meta, _reason = read_meta(model_path)
        metrics = (meta or {}).get("metrics") or {}
        sources = (meta or {}).get("sources")
        source = os.path.basename(absolute(model_path))
    if metrics:
        box = layout.box()
        box.label(text=f"Best checkpoint ({source})", icon="CHECKMARK")
        col = box.column(align=True)
        for label, value in metric_lines(metrics):
            row = col.row()
            row.label(text=label)
            row.label(text=value)
        if training.library and source == "this run":        # library "Compare": which run was kept, both figures
            wrapped_label(col, training.library, icon="INFO")
        if isinstance(sources, dict) and sources.get("retargeted_frames"):
            col.label(text=f"Validated on {sources.get('validation', 'all clips')}; trained on "
                           f"{sources.get('own_frames', 0)} own and {sources['retargeted_frames']} retargeted frames",
                      icon="INFO")
    armature = chosen_armature(context)
    free = [] if armature is None else [name for name, f in zip(FREE_NAMES, free_flags(armature)) if f]
    operator(layout, "evaluate", text=f"Evaluate (free: {', '.join(free)})" if free else "Evaluate", icon="GRAPH",
             free=",".join(free))


# ---- live timing and the loss curve --------------------------------------------------------------------------


def playing_action_name(armature, session):
    """The name of the action the armature plays in Run IK ("" for none): while live, the one the session follows
    (Run IK takes it off the armature meanwhile); else the assigned one."""
    if session is not None:
        motion = next((c.motion for c in session.tick.characters if c.name == armature.name), None)
        return motion.name if motion is not None else ""
    playing = playing_action(armature)
    return playing[0].name if playing is not None else ""


def draw_targets(layout, armature, session):
    """Each target's source in words (empty, action, blend, free) with its Free toggle (the model places a free
    target; its empty follows while live) and its position and rotation influences (keyable: I over a field), the
    Ground (object, collection) and Lock Feet."""
    settings = armature.neural_ik
    action = playing_action_name(armature, session)
    box = layout.box()
    box.label(text=f"Targets over {action}" if action else "Targets (no action: the empties drive)", icon="ACTION")
    col = box.column(align=True)
    for slot, layer_slot, label in zip(TARGET_SLOTS, LAYER_SLOTS, TARGET_LABELS):
        layer = getattr(settings, layer_slot)
        words = "free (the model places it)" if layer.free else target_source(
            getattr(settings, slot) is not None, layer.position, layer.rotation, bool(action))
        row = col.row(align=True)
        row.label(text=f"{label.capitalize()}: {words}")
        row.prop(layer, "free", text="", icon="UNLOCKED" if layer.free else "LOCKED", toggle=True)
        sub = row.row(align=True)
        sub.active = not layer.free
        sub.prop(layer, "position", text="Pos")
        sub.prop(layer, "rotation", text="Rot")
    col = box.column(align=True)
    col.prop(settings, "ground_object")
    col.prop(settings, "ground_collection")
    col.prop(settings, "lock_feet")


def tick_times_ms(session):
    """(mean, p99, ticks) of the live session's solver tick in milliseconds (LiveSession.tick_stats)."""
    stats = session.tick_stats()
    return stats["mean_ms"], stats["p99_ms"], stats["ticks"]


def draw_tick_times(layout, session):
    mean, p99, ticks = tick_times_ms(session)
    box = layout.box()
    col = box.column(align=True)
    col.label(text=f"Tick: {format_number(mean, '{:.2f}')} ms mean, {format_number(p99, '{:.2f}')} ms p99", icon="TIME")
    col.label(text=f"{ticks} ticks", icon="BLANK1")
    for name, words in session.tick_stats()["status"].items():
        wrapped_label(box, f"{name}: {words}", icon="ERROR")
    if session.stop_reason:
        wrapped_label(box, session.stop_reason, icon="INFO")


def recent_epochs(history, rows=5):
    """The last `rows` epochs of a run as text for the panel: [(epoch, loss, effector cm, inner cm, is_best)], the
    best epoch (the trainer's score: validation effector + inner-joint error) marked wherever it is."""
    def score(h):
        return trainer_score({"effector_cm_mean": h.get("val_effector_cm_mean", float("nan")),
                              "inner_mpjpe_cm": h.get("val_inner_mpjpe_cm", float("nan"))})

    scores = [score(h) for h in history]
    finite = [i for i, v in enumerate(scores) if v == v]
    best = min(finite, key=lambda i: scores[i]) if finite else -1
    shown = list(range(max(len(history) - rows, 0), len(history)))
    if best >= 0 and best not in shown:
        shown = [best] + shown[1:]
    out = []
    for i in shown:
        h = history[i]
        epoch = h.get("epoch", i + 1)
        out.append((format_number(epoch, "{:g}"), format_number(h.get("train_loss", float("nan"))),
                    format_number(h.get("val_effector_cm_mean", float("nan")), "{:.2f}"),
                    format_number(h.get("val_inner_mpjpe_cm", float("nan")), "{:.2f}"), i == best))
    return out


def draw_loss_curve(layout, history, plot_path):
    """The loss curve as numbers in Blender's own UI font (crisp at any UI scale, unlike a preview image): the last
    epochs and the best one; the curve itself is the SVG the trainer writes beside the checkpoint."""
    rows = recent_epochs(history)
    if not rows:
        return
    box = layout.box()
    box.label(text="Recent epochs (validation error in cm)", icon="GRAPH")
    col = box.column(align=True)
    for cells, icon in [(("Epoch", "Loss", "Effector", "Inner"), "BLANK1")] + [
            (r[:4], "CHECKMARK" if r[4] else "BLANK1") for r in rows]:
        row = col.row(align=True)
        row.label(text=cells[0], icon=icon)
        for cell in cells[1:]:
            row.label(text=cell)
    path = absolute(plot_path)
    if path and os.path.isfile(path):
        box.operator("wm.path_open", text=f"Open {os.path.basename(path)}", icon="FILE_IMAGE").filepath = path


classes = (
    NEURAL_IK_PT_main,
    NEURAL_IK_PT_rig,
    NEURAL_IK_PT_data,
    NEURAL_IK_PT_training,
    NEURAL_IK_PT_live,
    NEURAL_IK_PT_bake_export,
)
