"""Write the starter network that ships with the extension (`weights/starter_network.npz`): the network Train
Starter Model carries onto a user's rig and trains on from there (neural_network/model/transfer.py).

    .venv/bin/python scripts/make_starter_network.py --out weights/starter_network.npz [--epochs 2500]
        [--starter-motion weights/starter_motion.npz] [--work out/starter_network]

The shipped network was made from the starter motion without the 3 CMU takes the measurements keep unseen:

    .venv/bin/python scripts/make_starter_motion.py --folder ../shared/mocap/cmu --folder ../shared/mocap/cmu-more \
        --exclude 005_10,006_01,006_14 --out out/starter_heldout.npz
    .venv/bin/python scripts/make_starter_network.py --starter-motion out/starter_heldout.npz \
        --out weights/starter_network.npz

It trains on the starter motion alone, retargeted onto the demo rig without its procedural clips (the demo rig maps
all 23 roles, so every role of a user's rig has a counterpart), from scratch, for --epochs epochs (a count, not a
time, so the result does not depend on the machine's load; 2500 take about 30 minutes on 2 cores); then it stores the
demo rig's retarget calibration in the model (what carrying it onto another rig needs). Writes only --work and
--out.
"""

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from addon_loader import isolate_user_resources, load_addon  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the .npz to write")
    parser.add_argument("--epochs", type=int, default=2500, help="epochs of training")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--starter-motion", default="", help="default: the shipped weights/starter_motion.npz")
    parser.add_argument("--work", default="out/starter_network", help="the training run's folder")
    args = parser.parse_args()
    isolate_user_resources()
    load_addon()
    import bpy

    from neural_ik.blender.workflows import starter, training
    from neural_ik.neural_network.model import checkpoint, transfer

    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    bpy.ops.neural_ik.create_demo_rig(seed=0)
    obj = bpy.context.scene.neural_ik.armature
    for action in list(bpy.data.actions):            # the starter motion alone
        bpy.data.actions.remove(action)
    obj.neural_ik.model_path = ""
    os.makedirs(args.work, exist_ok=True)
    _, retargeter = starter.usable_rig(bpy.context)
    dataset, _, _ = starter.starter_dataset(bpy.context, obj, retargeter, starter.load_starter_motion(args.starter_motion))
    message, _ = training.start_training(bpy.context, "", os.path.abspath(args.work), args.epochs, seed=args.seed,
                                         mode="SYNC", dataset=dataset, armature=obj)
    print(message)
    network = checkpoint.load_model(os.path.join(args.work, "model.npz"))
    keep = ("training", "metrics", "sources", "train_frames", "validation_frames", "losses")
    network.meta = {key: network.meta[key] for key in keep if key in network.meta}      # not the epochs' history
    network.meta[transfer.STARTER_CALIBRATION] = retargeter.calibration.to_json()
    network.skeleton.name = "the demo rig (starter network)"
    checkpoint.save_model(args.out, network)
    print(f"{args.out}: {os.path.getsize(args.out) / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
