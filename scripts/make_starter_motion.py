"""Write the starter motion that ships with the extension (`weights/starter_motion.npz`, Train Starter Model) from
BVH folders of one skeleton: the CMU takes of ../shared/mocap/cmu and cmu-more (free for any use; credit: CMU
Graphics Lab Motion Capture Database, mocap.cs.cmu.edu, created with funding from NSF EIA-0196217). Never the Bandai
data (non-commercial).

    .venv/bin/python scripts/make_starter_motion.py --folder ../shared/mocap/cmu --folder ../shared/mocap/cmu-more \\
        --out weights/starter_motion.npz [--exclude 005_10,006_01,006_14] [--fps 30]

How a file becomes starter motion: blender/workflows/starter.py (build_starter_motion). Reads the folders (never
copied); writes only --out.
"""

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from addon_loader import isolate_user_resources, load_addon  # noqa: E402

CREDIT = ("CMU Graphics Lab Motion Capture Database (mocap.cs.cmu.edu); the database was created with funding from "
          "NSF EIA-0196217. Free for any use, research or commercial.")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", action="append", required=True, help="a BVH folder (repeat for more)")
    parser.add_argument("--out", required=True, help="the .npz to write")
    parser.add_argument("--exclude", default="", help="comma-separated file name patterns to leave out")
    parser.add_argument("--fps", type=float, default=30.0, help="frame rate of the stored motion")
    parser.add_argument("--scale", type=float, default=0.01, help="BVH units to metres")
    args = parser.parse_args()
    isolate_user_resources()
    load_addon()
    from neural_ik.blender.errors import DataError
    from neural_ik.blender.workflows.starter import build_starter_motion

    try:
        motion = build_starter_motion(args.folder, args.fps, args.exclude, args.scale, CREDIT, log=print)
        motion.save(args.out)
    except DataError as exc:
        sys.exit(f"make_starter_motion: error: {exc}")
    print(f"{args.out}: {len(motion)} clips, {motion.frame_count} frames at {args.fps:g} fps, "
          f"{os.path.getsize(args.out) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
