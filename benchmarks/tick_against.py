"""The live tick of this checkout against another checkout's, both in one process, their passes alternated.

    .venv/bin/python benchmarks/tick_against.py OTHER_CHECKOUT [--rounds 8] [--no-action]

Issue 33 asks that the live tick with nothing free stay within 10 % of the tick when the issue was filed (e7e157c:
`git worktree add /tmp/e7 e7e157c`, then pass /tmp/e7). Two processes of the same code differ by up to 20 % on one
machine (their memory layout, the machine's load at the time), so a comparison of separate runs cannot see 10 %.
Here this checkout is imported as `neural_ik` (registered: its operators make the demo rig and its targets) and the
other as `nik_other` (not registered: only its live tick and its model loader run). Each side ticks the demo rig
with its own shipped model (weights/demo.npz), 2 refinement iterations, on the held-out demo clips (their targets
placed on the six empties before each tick, untimed, as `tick.py`'s shipped-model row); a round runs one pass of
each, in alternating order. Prints each pass's median tick (us) and the median ratio over the rounds.

The other checkout needs `blender/live/tick.LiveTick([(obj, model, data)])` and
`neural_network/runtime/model_files.load_model_file(path, skeleton)`, as every commit since the live tick has had.
Every target is pinned on both sides (issue 33's bar is the tick with nothing free; `tick.py` times the free ticks).
"""

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "tests"))           # live_helpers.place_targets, as the live tests place them

from addon_loader import load_addon  # noqa: E402

OTHER = "nik_other"


def import_other(path):
    """Import the checkout at `path` as the package nik_other (without registering it)."""
    spec = importlib.util.spec_from_file_location(OTHER, os.path.join(path, "__init__.py"),
                                                  submodule_search_locations=[path])
    module = importlib.util.module_from_spec(spec)
    sys.modules[OTHER] = module
    spec.loader.exec_module(module)
    return module


def one_pass(tick_class, obj, rig, model, data, samples, scene):
    """Median tick (us) of one session over every frame of `samples` (the first 20 ticks left out: warm-up)."""
    from live_helpers import place_targets

    tick = tick_class([(obj, model, data)])
    tick.start()
    times = []
    try:
        for sample in samples:
            for i in range(len(sample.frames)):
                place_targets(obj, rig, sample, i)
                began = time.perf_counter()
                tick.tick(scene)
                times.append(time.perf_counter() - began)
    finally:
        tick.stop()
    return float(np.median(times[20:]) * 1e6)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", help="the other checkout (a folder with the add-on's __init__.py)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--no-action", action="store_true",
                        help="take the demo rig's action away (the tick reads the empties alone; by default the rig "
                             "keeps it and the empties at influence 1 stand in for it, as after Create Targets)")
    args = parser.parse_args(argv)
    other = os.path.abspath(args.other)
    if not os.path.isfile(os.path.join(other, "__init__.py")):
        parser.error(f"{other} is not a checkout of the add-on (no __init__.py)")
    load_addon()
    import bpy

    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.properties import get_bone_map

    import_other(other)
    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    bpy.ops.neural_ik.create_demo_rig()
    obj = bpy.context.active_object
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    bpy.ops.neural_ik.create_targets()
    obj.neural_ik.refine_iterations = 2
    if args.no_action:
        obj.animation_data_clear()
    scene = bpy.context.scene
    with open(os.path.join(REPO, "weights", "demo_metrics.json"), encoding="utf-8") as f:
        names = [n for n in json.load(f)["validation_actions"] if n in bpy.data.actions]
    samples = [pose_read.read_action(rig, obj, bpy.data.actions[n]) for n in names]
    sides = {}
    for label, package, checkout in (("this", "neural_ik", REPO), ("other", OTHER, other)):
        tick_class = importlib.import_module(package + ".blender.live.tick").LiveTick
        load = importlib.import_module(package + ".neural_network.runtime.model_files").load_model_file
        skeleton = importlib.import_module(package + ".blender.rig.rig_model").read_rig(obj, get_bone_map(obj)).skeleton
        sides[label] = (tick_class, *load(os.path.join(checkout, "weights", "demo.npz"), skeleton))
    medians = {label: [] for label in sides}
    for round_ in range(args.rounds):
        for label in ("this", "other") if round_ % 2 == 0 else ("other", "this"):
            tick_class, model, data = sides[label]
            medians[label].append(one_pass(tick_class, obj, rig, model, data, samples, scene))
    ratios = np.array(medians["this"]) / np.array(medians["other"])
    frames = sum(len(s.frames) for s in samples)
    print(f"the refined tick (2 iterations), shipped models, {frames} ticks a pass on {', '.join(names)}"
          f"{'; no action' if args.no_action else '; the rig keeps its action'}")
    print(f"  this checkout  {' '.join(f'{t:6.1f}' for t in medians['this'])} us")
    print(f"  {other:<14} {' '.join(f'{t:6.1f}' for t in medians['other'])} us")
    print(f"  ratio (median over rounds) {np.median(ratios):.3f}  (rounds {ratios.min():.3f}-{ratios.max():.3f})")


if __name__ == "__main__":
    main()
