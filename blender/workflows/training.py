"""Training from Blender: the dataset is loaded and prepared on the main thread, NumPy trains in a background thread.

`start_training` runs neural_network.model.trainer (pure NumPy, no bpy) in a thread and registers a `bpy.app.timers`
callback on the main thread that redraws the sidebar while it runs and, when it ends, points the armature's model at
the best checkpoint. Only state.training crosses the thread wall. In background mode (`blender -b`, the bpy module)
timers never fire, so it trains synchronously and prints its progress (EpochLine). Loading another file,
disabling the add-on or quitting cancels the run and waits for the thread (`register_handlers`).
"""

import atexit
import os
import threading

import bpy
from bpy.app.handlers import persistent

from ... import state
from ...neural_network.data.dataset import Dataset
from ...neural_network.data.files import FileRefused
from ...neural_network.model import library_choice, trainer
from ...neural_network.model.losses import LossWeights
from ...properties import get_bone_map
from ..errors import DataError
from ..progress import ProgressLine, duration
from ..rig.armatures import chosen_armature

POLL_SECONDS = 0.25
JOIN_SECONDS = 5.0


ADDON_PACKAGE = __package__.rsplit(".", 2)[0]     # this module is <add-on>.blender.workflows.training


def default_output_directory(dataset_path):
    """The extension's user folder when installed as an extension (bl_ext.<repo>.neural_ik), else a folder beside
    the dataset."""
    try:
        return bpy.utils.extension_path_user(ADDON_PACKAGE, path="training", create=True)
    except (ValueError, RuntimeError, TypeError):
        folder = os.path.join(os.path.dirname(os.path.abspath(dataset_path)), "neural_ik_training")
        os.makedirs(folder, exist_ok=True)
        return folder


def config_from_scene(settings, epochs, time_limit, seed, batch_size, learning_rate):
    weights = LossWeights(fk=settings.weight_fk, pose=settings.weight_pose, contact=settings.weight_contact,
                          limit=settings.weight_limit, slip=settings.weight_slip)
    return trainer.TrainConfig(epochs=epochs, time_limit=time_limit, seed=seed,
                               batch_size=batch_size or settings.batch_size,
                               learning_rate=learning_rate or settings.learning_rate, loss_weights=weights,
                               own_share=settings.own_share, limb_mix=settings.limb_mix,
                               library=settings.library.lower(), prior_members=settings.prior_members)


def armature_matches(obj, skeleton):
    """True when the armature's bone map names the same bone for every role as the dataset's rig."""
    if obj is None or obj.type != "ARMATURE":
        return False
    mapping = get_bone_map(obj)
    return all(mapping[role] == bone for role, bone in zip(mapping, skeleton.bone_names))


class _Run:
    """The one training run of this Blender session: its thread and what to do on the main thread at the end."""
    thread = None
    armature_name = ""
    scene_name = ""


def _worker(run):
    """The training thread: prepare the data and train (run())."""
    progress = state.training
    try:
        run()
    except trainer.Cancelled as exc:
        progress.message = str(exc)
    except Exception as exc:     # noqa: BLE001 - the user gets the reason in the panel, not a traceback in a thread
        progress.error = f"training failed: {exc}"
        progress.message = progress.error
    finally:
        progress.running = False


def _finish_on_main_thread():
    """Point the armature at the best checkpoint (when there is one) and say so."""
    progress = state.training
    path = progress.checkpoint_path
    obj = bpy.data.objects.get(_Run.armature_name) if _Run.armature_name else None
    if path and os.path.exists(path) and not progress.error and obj is not None:
        obj.neural_ik.model_path = path
    _Run.thread = None
    _redraw()


def _redraw():
    wm = getattr(bpy.context, "window_manager", None)
    for window in getattr(wm, "windows", []):
        for area in window.screen.areas:
            if area.type == "VIEW_3D":
                area.tag_redraw()


def _poll():
    """Timer on the main thread: redraw while the thread runs; finish once it has ended."""
    thread = _Run.thread
    if thread is not None and thread.is_alive():
        _redraw()
        return POLL_SECONDS
    _finish_on_main_thread()
    return None


def stop_training(wait=True):
    """Cancel a running training and wait for its thread (the best checkpoint stays on disk)."""
    thread = _Run.thread
    state.training.cancel.set()
    if wait and thread is not None and thread is not threading.current_thread():
        thread.join(JOIN_SECONDS)
    if thread is not None and not thread.is_alive():
        _Run.thread = None


@persistent
def _on_load_pre(*_args):
    """Another file is about to replace this one: stop training; the model path belongs to the old file's armature."""
    if _Run.thread is not None:
        stop_training(wait=True)
    _Run.armature_name = ""
    if bpy.app.timers.is_registered(_poll):
        bpy.app.timers.unregister(_poll)


def is_running():
    return _Run.thread is not None and _Run.thread.is_alive()


def start_training(context, dataset_path, directory, epochs, time_limit=0.0, seed=0, batch_size=0, learning_rate=0.0,
                   resume=False, mode="AUTO", dataset=None, armature=None, start_from=None, started=0.0,
                   prior_members=0):
    """Train on the dataset at `dataset_path` (or the Dataset `dataset`) into `directory` (empty: a default folder).
    mode AUTO: a thread in the UI, synchronous in background mode; THREAD or SYNC force one. armature: the object
    whose model becomes the result (default: the active or chosen one); start_from: a Model to start from
    (trainer.Trainer); started: the time.time() the time limit counts from (default: when training starts);
    prior_members: how many of each prior to train (0: the scene's setting).
    Returns (message, warning or None); raises DataError with a plain reason on bad input or a failed synchronous
    run."""
    if is_running():
        raise DataError("a training run is already going on: cancel it first")
    if not dataset_path and dataset is None:
        raise DataError("choose a dataset (.npz) to train on: extract one first")
    settings = context.scene.neural_ik
    try:
        dataset = dataset if dataset is not None else Dataset.load(dataset_path)
        directory = directory or default_output_directory(dataset_path)
        if not os.path.isdir(directory):
            raise FileRefused(f"output folder {directory} does not exist")
        if not os.access(directory, os.W_OK):
            raise FileRefused(f"output folder {directory} is not writable")
        config = config_from_scene(settings, epochs, time_limit, seed, batch_size, learning_rate)
        config.started = started
        config.prior_members = prior_members or config.prior_members
        trainer.check_dataset(dataset)
        progress = state.training
        progress.reset(epochs)
        background = mode == "SYNC" or (mode == "AUTO" and bpy.app.background)
        printer = EpochLine() if background else None

        def run():
            return library_choice.train(dataset, config, directory, progress, resume=resume, on_epoch=printer,
                                        start_from=start_from)

        if background and not library_choice.needs_choice(dataset, config):
            # the synchronous run prepares here, so a refused file is this call's error
            prepared = trainer.Trainer(dataset, config, directory, progress, resume=resume, on_epoch=printer,
                                       start_from=start_from)
            run = prepared.run
    except (FileRefused, ValueError, OSError) as exc:
        state.training.running = False
        raise DataError(str(exc)) from None
    obj = armature if armature is not None else chosen_armature(context)
    _Run.armature_name = obj.name if armature_matches(obj, dataset.skeleton) else ""
    warning = None
    if obj is not None and not _Run.armature_name:
        warning = f"{obj.name}'s bone map differs from the dataset's rig: its model is left as is"
    if background:
        _Run.thread = None
        _worker(run)
        printer.done()
        _finish_on_main_thread()
        if state.training.error:
            raise DataError(state.training.error)
        return f"{state.training.message}; model {state.training.checkpoint_path}", warning
    _Run.thread = threading.Thread(target=_worker, args=(run,), name="neural_ik_training", daemon=True)
    _Run.thread.start()
    if not bpy.app.timers.is_registered(_poll):
        bpy.app.timers.register(_poll, first_interval=POLL_SECONDS)
    return f"training on {len(dataset)} frames in the background; results go to {directory}", warning


def cancel_training():
    """Stop a running training (the best checkpoint stays and becomes the armature's model). A thread still preparing
    its data stops at the end of its current stage; the timer then finishes it, and until then no new run starts.
    Returns what to tell the user."""
    stop_training(wait=True)
    if _Run.thread is not None:
        return "training cancelled; it stops when the current step of its data preparation ends"
    _finish_on_main_thread()
    return "training cancelled; the best model so far is kept"


class EpochLine:
    """Training progress in background mode: one line that updates (epoch, loss, validation error, time left);
    with verbose (the CLI's --verbose) a line per epoch with every validation figure."""

    def __init__(self):
        self.line = ProgressLine()

    def __call__(self, entry):
        p = state.training
        self.line.update(
            f"training: {trainer.epoch_text(p.epoch, p.epochs)}, loss {entry['train_loss']:.4f}, validation effector "
            f"{entry['val_effector_cm_mean']:.2f} cm, inner {entry['val_inner_mpjpe_cm']:.2f} cm, "
            f"{duration(p.seconds_left)} left",
            detail=f"{trainer.epoch_text(p.epoch, p.epochs)}  loss {entry['train_loss']:.4f}  effector "
                   f"{entry['val_effector_cm_mean']:.2f} cm (p95 {entry['val_effector_cm_p95']:.1f})  inner "
                   f"{entry['val_inner_mpjpe_cm']:.2f} cm  rot {entry['val_effector_rotation_deg']:.1f} deg  "
                   f"{entry['seconds']:.0f} s")

    def done(self):
        self.line.done()


def _stop_at_exit():
    stop_training(wait=True)


def register_handlers():
    if _on_load_pre not in bpy.app.handlers.load_pre:
        bpy.app.handlers.load_pre.append(_on_load_pre)
    atexit.register(_stop_at_exit)


def unregister_handlers():
    stop_training(wait=True)
    if _on_load_pre in bpy.app.handlers.load_pre:
        bpy.app.handlers.load_pre.remove(_on_load_pre)
    if bpy.app.timers.is_registered(_poll):
        bpy.app.timers.unregister(_poll)
    atexit.unregister(_stop_at_exit)
