"""Neural IK on the command line, inside Blender or with the bpy wheel.

    blender -b file.blend --python scripts/nik.py -- <command> [options]
    python scripts/nik.py <command> [options]          (with `pip install bpy==5.0.1`)

On any error a command prints one line on stderr, `nik <command>: error: <reason>`, nothing on stdout, and exits
non-zero; inputs are checked before Blender reads them, so a refused command writes nothing. Blender's own report
lines ("Info: ...") and messages stay out of the output unless --verbose is given (warnings are kept); long work
shows one progress line. `python scripts/nik.py --help` lists the commands.
"""

import argparse
import io
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from addon_loader import exit_crashes_after_python, exit_process, isolate_user_resources, load_addon  # noqa: E402

COMMANDS = {}
BLEND_MAGICS = (b"BLENDER", b"\x1f\x8b", b"\x28\xb5\x2f\xfd")     # plain, gzip- and zstd-compressed .blend
NPZ_MAGIC = b"PK\x03\x04"                                              # .npz is a zip archive


def command(name, help_text):
    """Register a sub-command: the decorated function takes (parser) to add options and returns a runner."""
    def wrap(setup):
        COMMANDS[name] = (help_text, setup)
        return setup
    return wrap


class CommandError(Exception):
    """A failure with a message for the user (printed as one line)."""


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one line, `nik <command>: error: <reason>` (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


# ---- output: the CLI's own lines, Blender's kept out --------------------------------------------------------------


class Output:
    """Where the CLI writes (`out`, `err`: the process's stdout and stderr as they were at start) and what it keeps
    from Blender. Without verbose, file descriptors 1 and 2 then point at the null device, so what Blender's C code
    prints (file reads, its exit messages) stays out; Python's sys.stdout/sys.stderr are these streams, and
    run_operator catches the report lines Blender prints for an operator called from Python."""
    out = sys.stdout
    err = sys.stderr
    verbose = False

    @classmethod
    def start(cls, verbose):
        cls.verbose = verbose
        if verbose:
            return
        import warnings

        warnings.simplefilter("ignore")
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            cls.out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
            cls.err = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            os.close(null)
        except (OSError, ValueError):        # no real descriptors (an embedding host): keep the streams as they are
            cls.out, cls.err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = cls.out, cls.err


def say(text):
    Output.out.write(text + "\n")
    Output.out.flush()


def run_operator(op, **kwargs):
    """Call a bpy.ops operator; turn its error report into a CommandError with Blender's message. The report lines
    Blender prints for it are kept: warnings are passed on, the rest only with --verbose."""
    captured, saved = io.StringIO(), (sys.stdout, sys.stderr)
    sys.stdout = captured
    sys.stderr = captured if not Output.verbose else sys.stderr     # an operator's own traceback
    try:
        result = op(**kwargs)
    except RuntimeError as exc:
        message = [line for line in str(exc).strip().splitlines()
                   if line.strip() and not line.startswith("Location:")]
        reason = message[-1].strip() if message else "operator failed"
        for prefix in ("Error: ", "Warning: "):
            reason = reason[len(prefix):] if reason.startswith(prefix) else reason
        raise CommandError(reason) from None
    finally:
        sys.stdout, sys.stderr = saved
    for line in captured.getvalue().splitlines():
        if Output.verbose or line.startswith("Warning"):
            say(line)
    if "FINISHED" not in result:
        raise CommandError(f"{op.idname_py()} did not finish ({', '.join(sorted(result))})")
    return result


# ---- checks of inputs and outputs, before Blender reads or writes anything -----------------------------------


def input_file(path, what, magics=(), suffixes=()):
    """Refuse a path that is missing, a folder, empty or not the kind of file its first bytes say."""
    if not path:
        raise CommandError(f"give the {what}")
    if not os.path.exists(path):
        raise CommandError(f"{path} does not exist")
    if os.path.isdir(path):
        raise CommandError(f"{path} is a folder, not a {what}")
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not head:
        raise CommandError(f"{path} is empty")
    if suffixes and path.lower().endswith(suffixes) and not magics:
        return os.path.abspath(path)
    if magics and not head.startswith(magics):
        raise CommandError(f"{path} is not a {what}")
    return os.path.abspath(path)


def input_blend(path):
    return input_file(path, ".blend file", BLEND_MAGICS)


def input_model(path):
    """A checkpoint (.npz) or an .onnx file (its contents are checked when it is loaded)."""
    if path.lower().endswith(".onnx"):
        return input_file(path, "model (.npz or .onnx)")
    return input_file(path, "model (.npz checkpoint or .onnx)", (NPZ_MAGIC,))


def input_folder(path, what="folder"):
    if not path:
        raise CommandError(f"give the {what}")
    if not os.path.exists(path):
        raise CommandError(f"{path} does not exist")
    if not os.path.isdir(path):
        raise CommandError(f"{path} is a file, not a {what}")
    return os.path.abspath(path)


def output_file(path, what="output file"):
    """Refuse an output path that is a folder or whose folder does not exist; returns the absolute path."""
    if not path:
        return ""
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise CommandError(f"{path} is a folder: give a file name for the {what}")
    folder = os.path.dirname(full)
    if not os.path.isdir(folder):
        raise CommandError(f"folder of {path} does not exist")
    if not os.access(folder, os.W_OK):
        raise CommandError(f"folder of {path} is not writable")
    return full


def check_output_folders(*paths):
    """Fail early, before any work, when an output file's folder does not exist (or the path is a folder)."""
    for path in paths:
        output_file(path)


_made_folders = []


def make_folder(path):
    """Create an output folder (and remember it: a failed command removes it again when it is still empty)."""
    full = os.path.abspath(path)
    if os.path.exists(full) and not os.path.isdir(full):
        raise CommandError(f"{path} is a file, not a folder")
    missing = []
    walk = full
    while not os.path.exists(walk):
        missing.append(walk)
        walk = os.path.dirname(walk)
    try:
        os.makedirs(full, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"cannot create {path}: {exc.strerror or exc}") from None
    _made_folders.extend(missing)
    return full


def remove_made_folders():
    for folder in _made_folders:        # deepest first
        try:
            os.rmdir(folder)
        except OSError:
            pass
    _made_folders.clear()


def number(kind, low=None, high=None, low_open=False):
    """argparse type: an int or a finite float within [low, high] (low excluded with low_open)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'a whole number' if kind is int else 'a number'}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if low is not None and (value <= low if low_open else value < low):
            raise argparse.ArgumentTypeError(f"{text} must be {'above' if low_open else 'at least'} {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{text} must be at most {high}")
        return value
    return parse


LAYER_NAMES = ("root", "left_hand", "right_hand", "left_foot", "right_foot", "head")


def influence(text):
    """argparse type of --influence TARGET=P[,R]: (target, position, rotation), each influence within 0..1."""
    target, _, values = text.partition("=")
    if target not in LAYER_NAMES or not values:
        raise argparse.ArgumentTypeError(f"{text!r} is not TARGET=P[,R] with TARGET one of {', '.join(LAYER_NAMES)}")
    parts = values.split(",")
    if len(parts) > 2:
        raise argparse.ArgumentTypeError(f"{text!r} has more than two influences")
    share = number(float, 0.0, 1.0)
    position = share(parts[0])
    return target, position, share(parts[1]) if len(parts) == 2 else position


def free_targets(text):
    """argparse type of --free TARGET[,TARGET...]: the target names (never all six)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in LAYER_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of targets from {', '.join(LAYER_NAMES)}")
    if set(names) == set(LAYER_NAMES):
        raise argparse.ArgumentTypeError("all six targets free: pin at least one")
    return names


def set_free(obj, names):
    """Mark the named targets free on the armature (and every other one pinned)."""
    for name in LAYER_NAMES:
        getattr(obj.neural_ik, f"layer_{name}").free = name in names


def set_ground(obj, name):
    """The armature's ground: the mesh object or the collection called `name` (CommandError for anything else)."""
    import bpy

    ground = bpy.data.objects.get(name)
    if ground is not None:
        if ground.type != "MESH":
            raise CommandError(f"--ground {name!r} is not a mesh ({ground.type.lower()})")
        obj.neural_ik.ground_object = ground
        return
    collection = bpy.data.collections.get(name)
    if collection is None:
        raise CommandError(f"--ground: no object or collection called {name!r} in this file")
    if not any(o.type == "MESH" for o in collection.all_objects):
        raise CommandError(f"--ground: the collection {name!r} holds no mesh")
    obj.neural_ik.ground_collection = collection


def blender():
    """Load Blender and the add-on (after a command's own checks, so bad input is refused at once); returns bpy."""
    load_addon()
    import bpy

    from neural_ik.blender import progress

    progress.Console.stream, progress.Console.verbose = Output.out, Output.verbose
    return bpy


def open_blend(path):
    bpy = blender()
    if path:
        run_operator(bpy.ops.wm.open_mainfile, filepath=input_blend(path))


def active_armature(name=None):
    """Make the named (or the only / the scene's chosen) armature active and return it."""
    import bpy

    if name:
        obj = bpy.data.objects.get(name)
        if obj is None or obj.type != "ARMATURE":
            raise CommandError(f"no armature called {name!r} in this file")
    else:
        chosen = bpy.context.scene.neural_ik.armature
        armatures = [o for o in bpy.context.scene.objects if o.type == "ARMATURE"]
        obj = chosen or (armatures[0] if len(armatures) == 1 else None)
        if obj is None:
            raise CommandError("no armature chosen: pass --armature NAME" if armatures else "this file has no armature")
    for other in bpy.context.view_layer.objects:
        other.select_set(False)
    bpy.context.view_layer.objects.active = obj
    obj.select_set(True)
    bpy.context.scene.neural_ik.armature = obj
    return obj


def save_blend(path):
    import bpy

    if path:
        run_operator(bpy.ops.wm.save_as_mainfile, filepath=os.path.abspath(path), check_existing=False)
        say(f"saved {path}")


# ---- commands are added below, one block each -----------------------------------------------------------------


@command("evaluate", "Re-solve real motion from its own effectors (network and Blender IK) and measure it")
def _evaluate_command(parser):
    parser.add_argument("--blend", help=".blend file whose armature's actions are evaluated")
    parser.add_argument("--armature", help="armature name in the .blend")
    parser.add_argument("--actions", default="", help="comma-separated action names (default: all of the rig)")
    parser.add_argument("--bvh-folder", default="", help="evaluate BVH files of this folder instead, one at a time")
    parser.add_argument("--files", default="", help="comma-separated name patterns within --bvh-folder")
    parser.add_argument("--max-files", type=number(int, 0), default=0, help="at most this many files (0: all)")
    parser.add_argument("--model", default="", help="checkpoint to evaluate (default: Blender IK baseline only)")
    parser.add_argument("--refine", type=number(int, 0, 50), default=2,
                        help="refinement iterations of the refined network row (0-50)")
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also run Blender's IK constraint (without and with poles)")
    parser.add_argument("--poles", action=argparse.BooleanOptionalAction, default=True,
                        help="include the Blender IK row with poles placed from the reference")
    parser.add_argument("--start-pose", action="store_true", help="add a row for the baseline's start pose, no IK")
    parser.add_argument("--free", type=free_targets, default=[], metavar="TARGET[,TARGET...]",
                        help="also solve with these targets free (placed by the model's learned prior, and upright "
                             "over the feet as a baseline): all joints' error and the pinned effectors' miss")
    parser.add_argument("--train-folder", default="", help="BVH folder of training clips for the baseline's start pose "
                        "(used when no --model is given)")
    parser.add_argument("--train-files", default="", help="comma-separated name patterns within --train-folder")
    parser.add_argument("--train-max", type=number(int, 0), default=20,
                        help="at most this many training files for the start pose")
    parser.add_argument("--json", default="", help="write the full results here")
    parser.add_argument("--svg", default="", help="write the error-over-frames and per-role chart here (SVG)")

    def run(args):
        if not args.blend and not args.bvh_folder:
            raise CommandError("give --blend FILE or --bvh-folder DIR")
        if args.blend:
            input_blend(args.blend)
        folder = input_folder(args.bvh_folder, "BVH folder") if args.bvh_folder else ""
        model = input_model(args.model) if args.model else ""
        train_folder = input_folder(args.train_folder, "folder of training BVH files") if args.train_folder else ""
        json_path, svg_path = output_file(args.json, "results"), output_file(args.svg, "chart")
        if not model and not args.baseline:
            raise CommandError("nothing to evaluate: give --model or leave the Blender IK baseline on")
        bpy = blender()
        if args.blend:
            open_blend(args.blend)
        armature = active_armature(args.armature).name if args.blend else ""
        run_operator(bpy.ops.neural_ik.evaluate, armature=armature, actions=args.actions, bvh_folder=folder,
                     files=args.files, max_files=args.max_files, model_path=model, refine_iterations=args.refine,
                     baseline=args.baseline, poles=args.poles, start_pose=args.start_pose, free=",".join(args.free),
                     mean_pose_folder=train_folder, mean_pose_files_pattern=args.train_files,
                     mean_pose_files=args.train_max, json_path=json_path, svg_path=svg_path)
        if args.json:
            say(f"results written to {args.json}")
        if args.svg:
            say(f"chart written to {args.svg}")
    return run


@command("train", "Train the network on an extracted dataset; writes model.npz, metrics.json and loss.svg")
def _train_command(parser):
    parser.add_argument("--dataset", required=True, help="dataset .npz written by the extract command")
    parser.add_argument("--out", required=True, help="output folder (created when missing)")
    parser.add_argument("--epochs", type=number(int, 1), default=300,
                        help="number of epochs (default 300; early stop ends sooner)")
    parser.add_argument("--time-limit", type=number(float, 0.0), default=0.0,
                        help="stop after this many seconds (0: no limit)")
    parser.add_argument("--seed", type=number(int, 0), default=0,
                        help="seed of the action split, initialisation and batches")
    parser.add_argument("--batch", type=number(int, 2), default=256, help="rows per step (default 256)")
    parser.add_argument("--lr", type=number(float, 0.0, low_open=True), default=2e-3,
                        help="learning rate (default 0.002)")
    parser.add_argument("--own-share", type=number(float, 0.0, 0.95), default=None,
                        help="share of each epoch drawn from the rig's own clips when the dataset also holds "
                             "retargeted library motion (default: the scene's setting, 0.25; 0: rows as they come)")
    parser.add_argument("--library", choices=("auto", "always", "never"), default=None,
                        help="with library motion in the dataset: auto (default) trains on the own clips alone and "
                             "with the library, keeps the library only if it is better on the own clips both refined "
                             "and alone, and trains the one kept on (with fewer than 4 own clips: the library); "
                             "always; never")
    parser.add_argument("--limb-mix", type=number(float, 0.0, 4.0), default=None,
                        help="add this share of training frames as poses mixing the limbs of random frames "
                             "(default: the scene's setting, 1.0; 0: none)")
    parser.add_argument("--prior-members", type=number(int, 1, 8), default=None,
                        help="train each target prior as this many apart and average them (default: the scene's "
                             "setting, 2)")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    parser.add_argument("--blend", default="", help="open this .blend first; its armature's model becomes the result")
    parser.add_argument("--armature", help="armature name in the .blend")
    parser.add_argument("--save", default="", help="save the .blend here afterwards")

    def run(args):
        save = output_file(args.save, ".blend file")
        dataset = input_file(args.dataset, "dataset (.npz)", (NPZ_MAGIC,))
        if args.blend:
            input_blend(args.blend)
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise CommandError(f"{args.out} is a file, not a folder")
        bpy = blender()
        from neural_ik.neural_network.data.dataset import Dataset
        from neural_ik.neural_network.data.files import FileRefused

        try:
            Dataset.load(dataset)           # refuse a foreign or broken file before the output folder is made
        except (FileRefused, ValueError, OSError) as exc:
            raise CommandError(str(exc)) from None
        if args.blend:
            open_blend(args.blend)
            active_armature(args.armature)
        out = make_folder(args.out)
        if args.own_share is not None:
            bpy.context.scene.neural_ik.own_share = args.own_share
        if args.library is not None:
            bpy.context.scene.neural_ik.library = args.library.upper()
        if args.limb_mix is not None:
            bpy.context.scene.neural_ik.limb_mix = args.limb_mix
        if args.prior_members is not None:
            bpy.context.scene.neural_ik.prior_members = args.prior_members
        run_operator(bpy.ops.neural_ik.train, filepath=dataset, directory=out, epochs=args.epochs,
                     time_limit=args.time_limit, seed=args.seed, batch_size=args.batch, learning_rate=args.lr,
                     resume=args.resume, mode="SYNC")
        from neural_ik import state

        say(state.training.message)
        say(f"model: {state.training.checkpoint_path}")
        save_blend(save)
    return run


@command("train-starter", "Train a model for an armature from the shipped starter motion (and its own clips)")
def _train_starter_command(parser):
    parser.add_argument("--blend", required=True, help="the .blend holding the armature")
    parser.add_argument("--armature", help="armature name in the .blend (default: the active or only one)")
    parser.add_argument("--out", required=True, help="output folder (created when missing)")
    parser.add_argument("--time-limit", type=number(float, 1.0), default=300.0,
                        help="seconds of training (default 300)")
    parser.add_argument("--seed", type=number(int, 0), default=0,
                        help="seed of the split, initialisation and batches")
    parser.add_argument("--starter-motion", default="",
                        help="a starter motion file (scripts/make_starter_motion.py; default: the shipped one)")
    parser.add_argument("--starter-network", default="",
                        help="the network to start from (scripts/make_starter_network.py; default: the shipped one; "
                             "'none': from scratch); a rig with a model of its own starts from that")
    parser.add_argument("--save", default="", help="save the .blend here afterwards (its armature's model set)")

    def run(args):
        save = output_file(args.save, ".blend file")
        input_blend(args.blend)
        motion = input_file(args.starter_motion, "starter motion (.npz)", (NPZ_MAGIC,)) if args.starter_motion else ""
        network = args.starter_network
        if network.lower() == "none":
            network = None
        elif network:
            network = input_file(network, "starter network (.npz)", (NPZ_MAGIC,))
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise CommandError(f"{args.out} is a file, not a folder")
        bpy = blender()
        open_blend(args.blend)
        active_armature(args.armature)
        from neural_ik.blender.errors import DataError
        from neural_ik.blender.workflows import starter

        try:
            obj, _ = starter.usable_rig(bpy.context)          # refused before the output folder is made
            starter.load_starter_motion(motion)
            if network is not None:
                starter.load_starter_network(network)
        except DataError as exc:
            raise CommandError(str(exc)) from None
        out = make_folder(args.out)
        try:
            message, warning = starter.train_starter(bpy.context, out, args.time_limit, args.seed, "SYNC", motion,
                                                     network)
        except DataError as exc:
            raise CommandError(str(exc)) from None
        from neural_ik import state

        if warning:
            say(f"warning: {warning}")
        say(message)
        say(state.training.message)
        say(f"model: {obj.neural_ik.model_path}")
        save_blend(save)
    return run


@command("import-bvh", "Import every .bvh file of a folder as actions on one armature (and auto-map it)")
def _import_bvh_command(parser):
    parser.add_argument("folder", help="folder holding .bvh files")
    parser.add_argument("--scale", type=number(float, 0.0, low_open=True), default=1.0,
                        help="scale of the files (0.01 for centimetre data)")
    parser.add_argument("--save", default="", help="save the result as this .blend")
    parser.add_argument("--files", default="", help="comma-separated name patterns of files to import (default: all)")
    parser.add_argument("--exclude", default="", help="comma-separated name patterns of files to leave out")
    parser.add_argument("--blend", default="", help="open this .blend and add the clips to its armature (files of "
                                                    "another skeleton are retargeted onto it)")
    parser.add_argument("--armature", help="with --blend: the armature to import onto")

    def run(args):
        check_output_folders(args.save)
        input_folder(args.folder, "folder of .bvh files")
        if args.blend:
            input_blend(args.blend)
        bpy = blender()
        if args.blend:
            open_blend(args.blend)
            active_armature(args.armature)
        before = {a.name for a in bpy.data.actions}          # --blend: the armature's clips are not this import's
        run_operator(bpy.ops.neural_ik.import_bvh_folder, directory=os.path.abspath(args.folder),
                     global_scale=args.scale, files=args.files, exclude=args.exclude, onto_active=bool(args.blend))
        obj = bpy.context.scene.neural_ik.armature
        added = len([a for a in bpy.data.actions if a.name not in before])
        there = f" ({len(before)} were there)" if before else ""
        say(f"imported {added} action{'' if added == 1 else 's'} onto {obj.name!r}{there}")
        save_blend(args.save)
    return run


@command("extract", "Extract every frame of every action of an armature into a training set (.npz)")
def _extract_command(parser):
    parser.add_argument("--blend", default="", help=".blend file to read (default: the open file)")
    parser.add_argument("--armature", default="", help="armature name in the .blend")
    parser.add_argument("--out", default="dataset.npz", help="dataset file to write")

    def run(args):
        out = output_file(args.out, "dataset")
        if args.blend:
            input_blend(args.blend)
        bpy = blender()
        open_blend(args.blend)
        active_armature(args.armature or None)
        run_operator(bpy.ops.neural_ik.extract, filepath=out)
        from neural_ik.neural_network.data.dataset import Dataset

        say(f"wrote {Dataset.load(out).summary_text()} to {args.out}")
    return run


@command("create-demo-rig", "Add the demo rig with its procedural actions (idle, walk, run, crouch, reach, grab, jump)")
def _create_demo_rig_command(parser):
    parser.add_argument("--seed", type=number(int, 0), default=0, help="seed of the procedural motion (same seed, same keys)")
    parser.add_argument("--reach-clips", type=number(int, 0, 500), default=0,
                        help="also add this many clips of hands reaching all around the body (the shipped model's recipe)")
    parser.add_argument("--save", default="", help="save the result as this .blend")

    def run(args):
        check_output_folders(args.save)
        bpy = blender()
        run_operator(bpy.ops.neural_ik.create_demo_rig, seed=args.seed, reach_clips=args.reach_clips)
        obj = bpy.context.scene.neural_ik.armature
        say(f"created {obj.name!r}: {len(obj.data.bones)} bones, {len(bpy.data.actions)} actions (seed {args.seed})")
        save_blend(args.save)
    return run


@command("export", "Export the armature's model as one ONNX file (opset 17) with a JSON sidecar")
def _export_command(parser):
    parser.add_argument("--blend", default="", help="open this .blend first")
    parser.add_argument("--armature", help="armature name in the .blend")
    parser.add_argument("--model", default="", help="checkpoint (.npz) or .onnx to export (default: the armature's)")
    parser.add_argument("--out", required=True, help="the .onnx file to write (the sidecar .json goes beside it)")

    def run(args):
        out = output_file(args.out, ".onnx file")
        if not out.lower().endswith(".onnx"):
            raise CommandError(f"{args.out} does not end in .onnx")
        if args.blend:
            input_blend(args.blend)
        model = input_model(args.model) if args.model else ""
        bpy = blender()
        open_blend(args.blend)
        active_armature(args.armature)
        if model:
            run_operator(bpy.ops.neural_ik.load_model, filepath=model)
        run_operator(bpy.ops.neural_ik.export_onnx, filepath=out)
        say(f"wrote {args.out} and its .json sidecar")
    return run


@command("bake", "Solve a frame range with the network and write a new action '<source>.nik'")
def _bake_command(parser):
    parser.add_argument("--blend", default="", help="open this .blend first")
    parser.add_argument("--armature", help="armature name in the .blend")
    parser.add_argument("--model", default="", help="checkpoint (.npz) or .onnx (default: the armature's)")
    parser.add_argument("--source-action", default="", help="re-solve this action's effectors (default: the targets)")
    parser.add_argument("--start", type=number(int, 0), default=0, help="first frame (0: the source's or the scene's)")
    parser.add_argument("--end", type=number(int, 0), default=0, help="last frame (0: the source's or the scene's)")
    parser.add_argument("--refine", type=number(int, 0, 50), default=4, help="refinement iterations (0: network only)")
    parser.add_argument("--lock-feet", action="store_true",
                        help="hold each planted foot where it landed for its whole contact (no sliding)")
    parser.add_argument("--ground", default="",
                        help="a mesh object (or a collection of meshes) the feet stand on: the clip is fitted to it")
    parser.add_argument("--influence", action="append", default=[], type=influence, metavar="TARGET=P[,R]",
                        help="how much of a target comes from its empty rather than the source action, position P "
                             "and rotation R in 0..1 (R defaults to P); TARGET is one of " + ", ".join(LAYER_NAMES)
                             + "; may repeat")
    parser.add_argument("--free", type=free_targets, default=None, metavar="TARGET[,TARGET...]",
                        help="leave these targets to the model's learned prior (from the pinned ones): a free target "
                             "comes neither from its empty nor from the source action; e.g. --free root,head")
    parser.add_argument("--save", default="", help="save the .blend here afterwards")

    def run(args):
        check_output_folders(args.save)
        if args.start and args.end and args.end < args.start:
            raise CommandError(f"--end {args.end} is before --start {args.start}")
        if args.blend:
            input_blend(args.blend)
        model = input_model(args.model) if args.model else ""
        bpy = blender()
        open_blend(args.blend)
        obj = active_armature(args.armature)
        if args.source_action and args.source_action not in bpy.data.actions:
            raise CommandError(f"there is no action called {args.source_action!r}")
        if args.ground:
            set_ground(obj, args.ground)
        for target, position, rotation in args.influence:
            layer = getattr(obj.neural_ik, f"layer_{target}")
            layer.position, layer.rotation = position, rotation
        if args.free is not None:
            set_free(obj, args.free)
        if model:
            run_operator(bpy.ops.neural_ik.load_model, filepath=model)
        run_operator(bpy.ops.neural_ik.bake, source_action=args.source_action, frame_start=args.start,
                     frame_end=args.end, refine_iterations=args.refine, lock_feet=args.lock_feet)
        say(f"baked {obj.animation_data.action.name!r}")
        save_blend(args.save)
    return run


@command("create-targets", "Add the six target empties (root, hands, feet, head) on the armature's current pose")
def _create_targets_command(parser):
    parser.add_argument("--blend", required=True, help="the .blend holding the armature")
    parser.add_argument("--armature", help="armature name in the .blend (default: the active or only one)")
    parser.add_argument("--frame", type=number(int, 0), default=0, help="the frame whose pose they start on (0: the "
                                                                        "file's current frame)")
    parser.add_argument("--save", required=True, help="save the .blend here (with the targets)")

    def run(args):
        check_output_folders(args.save)
        input_blend(args.blend)
        bpy = blender()
        open_blend(args.blend)
        obj = active_armature(args.armature)
        if args.frame:
            bpy.context.scene.frame_set(args.frame)
        run_operator(bpy.ops.neural_ik.create_targets)
        made = [getattr(obj.neural_ik, f"target_{name}") for name in LAYER_NAMES]
        say(f"created {len([t for t in made if t is not None])} targets on {obj.name!r}: "
            + ", ".join(t.name for t in made if t is not None))
        say("each drives the rig fully (influences 1); bake --influence TARGET=0 gives a target back to the clip")
        save_blend(args.save)
    return run


@command("demo", "The main job on the embedded default: demo rig -> extract -> train -> export -> evaluate")
def _demo_command(parser):
    parser.add_argument("--out", default=os.path.join("out", "demo"), help="folder for every file the demo writes")
    parser.add_argument("--seed", type=number(int, 0), default=0,
                        help="seed of the training actions (held-out ones use seed+1)")
    parser.add_argument("--epochs", type=number(int, 1), default=200, help="training epochs at most (default 200)")
    parser.add_argument("--time-limit", type=number(float, 0.0), default=300.0,
                        help="training stops after this many seconds (0: no limit)")
    parser.add_argument("--refine", type=number(int, 0, 50), default=2, help="refinement iterations of the refined rows")
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also run Blender's IK constraint on the same frames")

    def run(args):
        import time

        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise CommandError(f"{args.out} is a file, not a folder")
        bpy = blender()
        out = make_folder(args.out)
        names = ("dataset.npz", "model.npz", "model.onnx", "evaluation.json", "evaluation.svg", "train.blend",
                 "heldout.blend")
        paths = {name: os.path.join(out, name) for name in names}
        started = time.perf_counter()

        def step(text):
            say(f"[{time.perf_counter() - started:5.0f} s] {text}")

        say(f"Neural IK demo: train on the demo rig's motion (seed {args.seed}), then measure on unseen motion "
            f"(seed {args.seed + 1}) next to Blender's IK")
        run_operator(bpy.ops.wm.read_homefile, use_empty=True, use_factory_startup=True)
        run_operator(bpy.ops.neural_ik.create_demo_rig, seed=args.seed)
        rig = active_armature()
        step(f"demo rig {rig.name!r}: {len(rig.data.bones)} bones, {len(bpy.data.actions)} actions")
        run_operator(bpy.ops.neural_ik.extract, filepath=paths["dataset.npz"])
        from neural_ik import state
        from neural_ik.neural_network.data.dataset import Dataset

        step("extracted " + Dataset.load(paths["dataset.npz"]).summary_text().split(" of rig ")[0])
        run_operator(bpy.ops.neural_ik.train, filepath=paths["dataset.npz"], directory=out, epochs=args.epochs,
                     time_limit=args.time_limit, seed=args.seed, mode="SYNC")
        best = state.training.message.split(": ", 1)[-1]
        step(f"trained {len(state.training.history)} epochs ({best} on the validation actions)")
        model_path = state.training.checkpoint_path
        run_operator(bpy.ops.neural_ik.export_onnx, filepath=paths["model.onnx"])
        step("exported the model to ONNX with its JSON sidecar")
        save_blend_quietly(paths["train.blend"])
        run_operator(bpy.ops.wm.read_homefile, use_empty=True, use_factory_startup=True)
        run_operator(bpy.ops.neural_ik.create_demo_rig, seed=args.seed + 1)
        held_out = active_armature()
        step(f"evaluate on the {len(bpy.data.actions)} actions of seed {args.seed + 1}, read back from Blender's "
             "evaluated pose")
        run_operator(bpy.ops.neural_ik.evaluate, armature=held_out.name, model_path=model_path,
                     refine_iterations=args.refine, baseline=args.baseline, poles=args.baseline,
                     json_path=paths["evaluation.json"], svg_path=paths["evaluation.svg"])
        save_blend_quietly(paths["heldout.blend"])
        say(f"(seed {args.seed}, {len(state.training.history)} epochs, {args.refine} refinement iterations: the "
            "README's 'nik.py demo' table under Measured figures)")
        say(f"files in {args.out}: dataset.npz, model.npz (+ metrics.json, loss.svg), model.onnx (+ model.json,\n"
            "    model.prior.onnx, model.clip_prior.onnx), evaluation.json, evaluation.svg, train.blend, heldout.blend")
    return run


def save_blend_quietly(path):
    import bpy

    run_operator(bpy.ops.wm.save_as_mainfile, filepath=os.path.abspath(path), check_existing=False)


def main(argv):
    parser = Parser(prog="nik", description="Neural IK: learned full-body IK for Blender rigs")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true",
                        help="print every step (a line per epoch, clip and method) and Blender's own messages")
    sub = parser.add_subparsers(dest="command", metavar="command", parser_class=Parser)
    runners = {}
    for name, (help_text, setup) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        runners[name] = setup(sub_parser)
    args, unknown = parser.parse_known_args(argv)
    if unknown:      # said by the command's own parser, so the line names the command
        (sub.choices[args.command] if args.command else parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not args.command:
        parser.print_help()
        return 2
    Output.start(args.verbose)
    isolate_user_resources()
    failure = None
    try:
        runners[args.command](args)
    except CommandError as exc:
        failure = str(exc)
    except KeyboardInterrupt:
        failure = "interrupted"
    except Exception as exc:  # noqa: BLE001 - a bug: one line for the user, the traceback with --verbose
        if Output.verbose:
            import traceback

            traceback.print_exc(file=Output.err)
        failure = f"unexpected {type(exc).__name__}: {exc} (run again with --verbose for the traceback)"
    if failure is not None:
        remove_made_folders()
        Output.err.write(f"nik {args.command}: error: {failure}\n")
        Output.err.flush()
        return 1
    return 0



def _argv():
    if "--" in sys.argv:
        return sys.argv[sys.argv.index("--") + 1:]
    return sys.argv[1:]


if __name__ == "__main__":
    code = main(_argv())
    sys.stdout.flush()
    if code or exit_crashes_after_python():   # the Blender 4.2 module would crash on its way out (addon_loader)
        exit_process(code)
