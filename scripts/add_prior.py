"""Give a model trained before free targets existed its target prior, leaving its IK network as it is.

    .venv/bin/python scripts/add_prior.py --model weights/demo.npz --dataset out/weights/dataset.npz \
        --seconds 600 --out weights/demo.npz

Trains neural_network.model.prior on the dataset's frames (whole actions held out for validation, as Train does; the
mirror images added) for --seconds, and writes the checkpoint with the prior beside the unchanged network (the same
six-target figures). Train does this itself for every new model; this is for the shipped demo model.

    .venv/bin/python scripts/add_prior.py --model weights/demo.npz --dataset D --mirror-frames-only --out weights/demo.npz

keeps the prior's weights and gives it the rig's mirror frames fitted on the dataset (a prior made before it answered
the mirror image too; the shipped one got its frames this way from the demo rig's procedural clips, seed 0).

    .venv/bin/python scripts/add_prior.py --model M --dataset D --clip --seconds 480 --out M

trains the model's clip prior instead (prior.WINDOW: Bake's free effectors), leaving the rest of the model as it is.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from addon_loader import load_package  # noqa: E402

load_package()

from neural_ik.neural_network.data import augment  # noqa: E402
from neural_ik.neural_network.data.dataset import Dataset  # noqa: E402
from neural_ik.neural_network.model import checkpoint, prior  # noqa: E402
from neural_ik.neural_network.model.trainer import TrainingArrays  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--members", type=int, default=1,
                        help="train this many priors apart and merge them into one (Train's Prior Ensemble)")
    parser.add_argument("--clip", action="store_true", help="train the clip prior (a window over the clip) instead")
    parser.add_argument("--mirror-frames-only", action="store_true",
                        help="keep the prior's weights, only fit the rig's mirror frames on the dataset")
    args = parser.parse_args()
    if args.members < 1 or args.seconds <= 0:
        sys.exit("add_prior: error: --members must be at least 1 and --seconds above 0")
    model = checkpoint.load_model(args.model)
    dataset = Dataset.load(args.dataset)
    if dataset.skeleton.fingerprint() != model.skeleton.fingerprint():
        sys.exit("add_prior: error: the dataset is of another rig than the model")
    train, val = dataset.split_by_action(seed=args.seed, val_fraction=0.1)
    train, mirror = augment.with_mirror(train)
    if args.mirror_frames_only:
        if model.prior is None or not mirror.ok:
            sys.exit(f"add_prior: error: {'the model has no prior' if model.prior is None else mirror.reason}")
        model.prior.mirror_frames = prior.mirror_frames_of(mirror)
        checkpoint.save_model(args.out, model)
        print(f"wrote {args.out}: the prior's weights unchanged, mirror frames fitted on {len(train) // 2} frames")
        return
    rows = [TrainingArrays(part) for part in (train, val)]
    targets = [prior.targets_of_rows(r.positions, r.global_rotations) for r in rows]
    window = prior.WINDOW if args.clip else ()
    fps = float(dataset.meta.get("fps") or 30.0)
    windows = [prior.clip_window_rows(part.action, part.frame, window, fps) if window else None
               for part in (train, val)]
    trained = prior.train_prior(targets[0], targets[1], prior.references_of(model.feature_spec),
                                model.skeleton.height, args.seconds, args.seed,
                                mirror_frames=prior.mirror_frames_of(mirror), window=window, train_rows=windows[0],
                                val_rows=windows[1], members=args.members)
    if args.clip:
        model.clip_prior = trained
    else:
        model.prior = trained
    checkpoint.save_model(args.out, model)
    print(f"wrote {args.out}: {trained.meta}")


if __name__ == "__main__":
    main()
