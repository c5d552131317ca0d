"""Retargeting speed: importing a BVH library onto a rig of another skeleton against importing it plainly.

    .venv/bin/python benchmarks/retarget.py [--files PATTERNS] [--onto demo|cmu] [--repeats 1]

The anchor is the plain import of the same files in the same process: `blender.workflows.bvh_import.import_bvh_files` into an
empty file (Blender's BVH importer per file, later files re-expressed on the first file's armature, the imported
armatures removed). The measured path is the same call onto another rig (`onto=`, what Import BVH Folder with Onto
Active Armature runs): per file Blender's importer, the source's bone map, reading every frame of it, the retarget
math and the new action's keys on the target. The target is the demo rig (54 bones, its 27 own clips calibrate it;
made before the timing) or the CMU iClone rig (--onto cmu, two of its clips). The two paths run alternately (plain,
retarget, retarget, plain, ...) so machine load hits both alike; figures are medians, the ratio is the median
retarget time over the median plain time of this run. The issue's bar: at most 2x. Needs ../shared/mocap/bandai.
"""

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from addon_loader import isolate_user_resources, load_addon  # noqa: E402

MOCAP = os.path.normpath(os.path.join(REPO, "..", "shared", "mocap"))
BAR = 2.0


def _quiet(fn, *args, **kwargs):
    """Blender's importer prints a few lines per file; keep the benchmark's output readable."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(1)
    sys.stdout.flush()
    os.dup2(devnull, 1)
    try:
        return fn(*args, **kwargs)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(devnull)
        os.close(saved)


def _fresh():
    import bpy

    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)


def _target(onto):
    import bpy

    from neural_ik.blender.workflows.bvh_import import import_bvh_files

    if onto == "cmu":
        obj, _, _ = import_bvh_files(bpy.context, os.path.join(MOCAP, "cmu"), 0.01, files="005_01,006_01")
    else:
        bpy.ops.neural_ik.create_demo_rig(seed=0)
        obj = bpy.context.scene.neural_ik.armature
    return obj


def run_plain(folder, files):
    import bpy

    from neural_ik.blender.workflows.bvh_import import import_bvh_files

    _fresh()
    start = time.perf_counter()
    _, imported, skipped = _quiet(import_bvh_files, bpy.context, folder, 0.01, files)
    return time.perf_counter() - start, len(imported), len(skipped)


def run_retarget(folder, files, onto):
    import bpy

    from neural_ik.blender.workflows.bvh_import import import_bvh_files

    _fresh()
    target = _quiet(_target, onto)
    start = time.perf_counter()
    _, imported, skipped = _quiet(import_bvh_files, bpy.context, folder, 0.01, files, "", target)
    elapsed = time.perf_counter() - start
    retargeted = sum('"retargeted": true' in bpy.data.actions[n].get("neural_ik_source", "") for n in imported)
    return elapsed, retargeted, len(skipped)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="", help="name patterns of the Bandai files (default: all 280)")
    parser.add_argument("--onto", choices=("demo", "cmu"), default="demo")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    folder = os.path.join(MOCAP, "bandai")
    if not os.path.isdir(folder):
        print(f"benchmarks/retarget.py: {folder} not found (the benchmark needs the Bandai files)")
        return 1
    isolate_user_resources()
    load_addon()
    plain, carried = [], []
    for r in range(args.repeats):
        order = (("plain", "retarget") if r % 2 == 0 else ("retarget", "plain"))
        for which in order:
            if which == "plain":
                seconds, count, skipped = run_plain(folder, args.files)
                plain.append(seconds)
            else:
                seconds, count, skipped = run_retarget(folder, args.files, args.onto)
                carried.append(seconds)
            print(f"  {which:8s} {count} files ({skipped} skipped): {seconds:.1f} s", flush=True)
    p, c = statistics.median(plain), statistics.median(carried)
    ratio = c / p
    print(f"plain import {p:.1f} s ({1000 * p / max(count, 1):.0f} ms per file); retargeted onto the {args.onto} rig "
          f"{c:.1f} s: {ratio:.2f}x the plain import (bar: at most {BAR:.0f}x) -> {'OK' if ratio <= BAR else 'SLOWER'}")
    return 0 if ratio <= BAR else 2


if __name__ == "__main__":
    code = main()
    from addon_loader import exit_process

    exit_process(code)
