"""Neural IK on the command line, inside Blender or with the bpy wheel.

    blender -b file.blend --python scripts/nik.py -- <command> [options]
    python scripts/nik.py <command> [options]          (with `pip install bpy==5.0.1`)

Every command prints one line of reason and exits non-zero on failure. `python scripts/nik.py --help` lists them.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from addon_loader import exit_crashes_after_python, exit_process, isolate_user_resources, load_addon  # noqa: E402

COMMANDS = {}


def command(name, help_text):
    """Register a sub-command: the decorated function takes (parser) to add options and returns a runner."""
    def wrap(setup):
        COMMANDS[name] = (help_text, setup)
        return setup
    return wrap


class CommandError(Exception):
    """A failure with a message for the user (printed as one line)."""


def run_operator(op, **kwargs):
    """Call a bpy.ops operator; turn its error report into a CommandError with Blender's message."""
    try:
        result = op(**kwargs)
    except RuntimeError as exc:
        message = str(exc).strip().splitlines()
        raise CommandError(message[-1] if message else "operator failed") from None
    if "FINISHED" not in result:
        raise CommandError(f"{op.idname_py()} did not finish ({', '.join(sorted(result))})")
    return result


def open_blend(path):
    import bpy

    if path:
        if not os.path.isfile(path):
            raise CommandError(f"{path} does not exist")
        bpy.ops.wm.open_mainfile(filepath=os.path.abspath(path))


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
        bpy.ops.wm.save_as_mainfile(filepath=os.path.abspath(path), check_existing=False)
        print(f"saved {path}")


def check_output_folders(*paths):
    """Fail early, before any work, when the folder of an output file does not exist."""
    for path in paths:
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise CommandError(f"folder of {path} does not exist")


# ---- commands are added below, one block each -----------------------------------------------------------------


@command("evaluate", "Re-solve real motion from its own effectors (network and Blender IK) and measure it")
def _evaluate_command(parser):
    parser.add_argument("--blend", help=".blend file whose armature's actions are evaluated")
    parser.add_argument("--armature", help="armature name in the .blend")
    parser.add_argument("--actions", default="", help="comma-separated action names (default: all of the rig)")
    parser.add_argument("--bvh-folder", default="", help="evaluate BVH files of this folder instead, one at a time")
    parser.add_argument("--files", default="", help="comma-separated name patterns within --bvh-folder")
    parser.add_argument("--max-files", type=int, default=0, help="at most this many files (0: all)")
    parser.add_argument("--model", default="", help="checkpoint to evaluate (default: Blender IK baseline only)")
    parser.add_argument("--refine", type=int, default=2, help="refinement iterations of the refined network row")
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also run Blender's IK constraint (without and with poles)")
    parser.add_argument("--poles", action=argparse.BooleanOptionalAction, default=True,
                        help="include the Blender IK row with poles placed from the reference")
    parser.add_argument("--start-pose", action="store_true", help="add a row for the baseline's start pose, no IK")
    parser.add_argument("--train-folder", default="", help="BVH folder of training clips for the baseline's start pose "
                        "(used when no --model is given)")
    parser.add_argument("--train-files", default="", help="comma-separated name patterns within --train-folder")
    parser.add_argument("--train-max", type=int, default=20, help="at most this many training files for the start pose")
    parser.add_argument("--json", default="", help="write the full results here")
    parser.add_argument("--png", default="", help="write the error-over-frames and per-role chart here")

    def run(args):
        import bpy

        if args.blend:
            open_blend(args.blend)
        elif not args.bvh_folder:
            raise CommandError("give --blend FILE or --bvh-folder DIR")
        armature = active_armature(args.armature).name if args.blend else ""
        check_output_folders(args.json, args.png)
        run_operator(bpy.ops.neural_ik.evaluate, armature=armature, actions=args.actions,
                     bvh_folder=os.path.abspath(args.bvh_folder) if args.bvh_folder else "", files=args.files,
                     max_files=args.max_files, model_path=os.path.abspath(args.model) if args.model else "",
                     refine_iterations=args.refine, baseline=args.baseline, poles=args.poles,
                     start_pose=args.start_pose,
                     mean_pose_folder=os.path.abspath(args.train_folder) if args.train_folder else "",
                     mean_pose_files_pattern=args.train_files, mean_pose_files=args.train_max,
                     json_path=os.path.abspath(args.json) if args.json else "",
                     png_path=os.path.abspath(args.png) if args.png else "")
        if args.json:
            print(f"results written to {args.json}")
        if args.png:
            print(f"chart written to {args.png}")
    return run


@command("train", "Train the network on an extracted dataset; writes model.npz, metrics.json and loss.png")
def _train_command(parser):
    parser.add_argument("--dataset", required=True, help="dataset .npz written by the extract command")
    parser.add_argument("--out", required=True, help="output folder (created when missing)")
    parser.add_argument("--epochs", type=int, default=300, help="number of epochs (default 300; early stop ends sooner)")
    parser.add_argument("--time-limit", type=float, default=0.0, help="stop after this many seconds (0: no limit)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the action split, initialisation and batches")
    parser.add_argument("--batch", type=int, default=256, help="rows per step (default 256)")
    parser.add_argument("--lr", type=float, default=2e-3, help="learning rate (default 0.002)")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    parser.add_argument("--blend", default="", help="open this .blend first; its armature's model becomes the result")
    parser.add_argument("--armature", help="armature name in the .blend")
    parser.add_argument("--save", default="", help="save the .blend here afterwards")

    def run(args):
        import bpy

        check_output_folders(args.save)
        if not os.path.isfile(args.dataset):
            raise CommandError(f"{args.dataset} does not exist")
        if args.epochs < 1 or args.batch < 2 or args.lr <= 0 or args.time_limit < 0:
            raise CommandError("--epochs and --batch must be positive, --lr above 0, --time-limit 0 or more")
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as exc:
            raise CommandError(f"cannot create {args.out}: {exc.strerror or exc}") from None
        if args.blend:
            open_blend(args.blend)
            active_armature(args.armature)
        run_operator(bpy.ops.neural_ik.train, filepath=os.path.abspath(args.dataset), directory=os.path.abspath(args.out),
                     epochs=args.epochs, time_limit=args.time_limit, seed=args.seed, batch_size=args.batch,
                     learning_rate=args.lr, resume=args.resume, mode="SYNC")
        from neural_ik import state

        print(state.training.message)
        print(f"model: {state.training.checkpoint_path}")
        save_blend(args.save)
    return run


@command("import-bvh", "Import every .bvh file of a folder as actions on one armature (and auto-map it)")
def _import_bvh_command(parser):
    parser.add_argument("folder", help="folder holding .bvh files")
    parser.add_argument("--scale", type=float, default=1.0, help="scale of the files (0.01 for centimetre data)")
    parser.add_argument("--save", default="", help="save the result as this .blend")
    parser.add_argument("--files", default="", help="comma-separated name patterns of files to import (default: all)")
    parser.add_argument("--exclude", default="", help="comma-separated name patterns of files to leave out")
    parser.add_argument("--blend", default="", help="open this .blend and add the clips to its armature (same skeleton)")
    parser.add_argument("--armature", help="with --blend: the armature to import onto")

    def run(args):
        import bpy

        check_output_folders(args.save)
        if args.blend:
            open_blend(args.blend)
            active_armature(args.armature)
        run_operator(bpy.ops.neural_ik.import_bvh_folder, directory=os.path.abspath(args.folder),
                     global_scale=args.scale, files=args.files, exclude=args.exclude, onto_active=bool(args.blend))
        obj = bpy.context.scene.neural_ik.armature
        print(f"imported {len(bpy.data.actions)} actions onto {obj.name!r}")
        save_blend(args.save)
    return run


@command("extract", "Extract every frame of every action of an armature into a training set (.npz)")
def _extract_command(parser):
    parser.add_argument("--blend", default="", help=".blend file to read (default: the open file)")
    parser.add_argument("--armature", default="", help="armature name in the .blend")
    parser.add_argument("--out", default="dataset.npz", help="dataset file to write")

    def run(args):
        import bpy

        open_blend(args.blend)
        active_armature(args.armature or None)
        run_operator(bpy.ops.neural_ik.extract, filepath=os.path.abspath(args.out))
        from neural_ik.neural_network.data.dataset import Dataset

        print(f"wrote {Dataset.load(os.path.abspath(args.out)).summary_text()} to {args.out}")
    return run


@command("create-demo-rig", "Add the demo rig with its procedural actions (idle, walk, run, crouch, reach, grab, jump)")
def _create_demo_rig_command(parser):
    parser.add_argument("--seed", type=int, default=0, help="seed of the procedural motion (same seed, same keys)")
    parser.add_argument("--save", default="", help="save the result as this .blend")

    def run(args):
        import bpy

        if args.seed < 0:
            raise CommandError("--seed must be 0 or more")
        check_output_folders(args.save)
        run_operator(bpy.ops.neural_ik.create_demo_rig, seed=args.seed)
        obj = bpy.context.scene.neural_ik.armature
        print(f"created {obj.name!r}: {len(obj.data.bones)} bones, {len(bpy.data.actions)} actions (seed {args.seed})")
        save_blend(args.save)
    return run


@command("export", "Export the armature's model as one ONNX file (opset 17) with a JSON sidecar")
def _export_command(parser):
    parser.add_argument("--blend", default="", help="open this .blend first")
    parser.add_argument("--armature", help="armature name in the .blend")
    parser.add_argument("--model", default="", help="checkpoint (.npz) or .onnx to export (default: the armature's)")
    parser.add_argument("--out", required=True, help="the .onnx file to write (the sidecar .json goes beside it)")

    def run(args):
        import bpy

        open_blend(args.blend)
        active_armature(args.armature)
        if args.model:
            run_operator(bpy.ops.neural_ik.load_model, filepath=os.path.abspath(args.model))
        run_operator(bpy.ops.neural_ik.export_onnx, filepath=os.path.abspath(args.out))
        print(f"wrote {args.out}")
    return run


@command("bake", "Solve a frame range with the network and write a new action '<source>.nik'")
def _bake_command(parser):
    parser.add_argument("--blend", default="", help="open this .blend first")
    parser.add_argument("--armature", help="armature name in the .blend")
    parser.add_argument("--model", default="", help="checkpoint (.npz) or .onnx (default: the armature's)")
    parser.add_argument("--source-action", default="", help="re-solve this action's effectors (default: the targets)")
    parser.add_argument("--start", type=int, default=0, help="first frame (0: the source's or the scene's)")
    parser.add_argument("--end", type=int, default=0, help="last frame (0: the source's or the scene's)")
    parser.add_argument("--refine", type=int, default=4, help="refinement iterations (0: network only)")
    parser.add_argument("--save", default="", help="save the .blend here afterwards")

    def run(args):
        import bpy

        check_output_folders(args.save)
        open_blend(args.blend)
        obj = active_armature(args.armature)
        if args.model:
            run_operator(bpy.ops.neural_ik.load_model, filepath=os.path.abspath(args.model))
        run_operator(bpy.ops.neural_ik.bake, source_action=args.source_action, frame_start=args.start,
                     frame_end=args.end, refine_iterations=args.refine)
        print(f"baked {obj.animation_data.action.name!r}")
        save_blend(args.save)
    return run


@command("demo", "The main job on the embedded default: demo rig -> extract -> train -> export -> evaluate")
def _demo_command(parser):
    parser.add_argument("--out", default=os.path.join("out", "demo"), help="folder for every file the demo writes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the training actions (held-out ones use seed+1)")
    parser.add_argument("--epochs", type=int, default=200, help="training epochs at most (default 200)")
    parser.add_argument("--time-limit", type=float, default=300.0, help="training stops after this many seconds")
    parser.add_argument("--refine", type=int, default=2, help="refinement iterations of the refined rows")
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also run Blender's IK constraint on the same frames")

    def run(args):
        import json
        import time

        import bpy

        out = os.path.abspath(args.out)
        try:
            os.makedirs(out, exist_ok=True)
        except OSError as exc:
            raise CommandError(f"cannot create {out}: {exc.strerror or exc}") from None
        paths = {name: os.path.join(out, name) for name in
                 ("dataset.npz", "model.onnx", "evaluation.json", "evaluation.png", "train.blend", "heldout.blend")}
        started = time.perf_counter()

        def step(text):
            print(f"[{time.perf_counter() - started:6.1f} s] {text}", flush=True)

        step(f"demo rig with procedural actions (seed {args.seed}) for training")
        bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
        run_operator(bpy.ops.neural_ik.create_demo_rig, seed=args.seed)
        rig = active_armature()
        step(f"extract {len(bpy.data.actions)} actions of {rig.name!r}")
        run_operator(bpy.ops.neural_ik.extract, filepath=paths["dataset.npz"])
        from neural_ik import state
        from neural_ik.neural_network.data.dataset import Dataset

        print("    " + Dataset.load(paths["dataset.npz"]).summary_text())
        step(f"train (at most {args.epochs} epochs, {args.time_limit:.0f} s)")
        run_operator(bpy.ops.neural_ik.train, filepath=paths["dataset.npz"], directory=out, epochs=args.epochs,
                     time_limit=args.time_limit, seed=args.seed, mode="SYNC")
        print("    " + state.training.message)
        model_path = state.training.checkpoint_path
        step("export ONNX + JSON sidecar")
        run_operator(bpy.ops.neural_ik.export_onnx, filepath=paths["model.onnx"])
        save_blend(paths["train.blend"])
        step(f"evaluate on held-out actions (demo seed {args.seed + 1}), network and Blender IK side by side")
        bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
        run_operator(bpy.ops.neural_ik.create_demo_rig, seed=args.seed + 1)
        held_out = active_armature()
        run_operator(bpy.ops.neural_ik.evaluate, armature=held_out.name, model_path=model_path,
                     refine_iterations=args.refine, baseline=args.baseline, poles=args.baseline,
                     json_path=paths["evaluation.json"], png_path=paths["evaluation.png"])
        save_blend(paths["heldout.blend"])
        with open(os.path.join(out, "metrics.json")) as handle:
            metrics = json.load(handle)
        step("done")
        print(f"model: {model_path}\nonnx: {paths['model.onnx']} (+ .json sidecar)\n"
              f"training metrics: {os.path.join(out, 'metrics.json')} ({len(metrics)} entries), loss plot: "
              f"{os.path.join(out, 'loss.png')}\nevaluation: {paths['evaluation.json']}, {paths['evaluation.png']}")
    return run


def main(argv):
    parser = argparse.ArgumentParser(prog="nik", description="Neural IK: learned full-body IK for Blender rigs")
    sub = parser.add_subparsers(dest="command", metavar="command")
    runners = {}
    for name, (help_text, setup) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        runners[name] = setup(sub_parser)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    isolate_user_resources()
    try:
        load_addon()
        runners[args.command](args)
    except CommandError as exc:
        print(f"nik {args.command}: error: {exc}", file=sys.stderr)
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
