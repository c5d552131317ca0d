"""The live tick on a generated Rigify rig against the plain demo rig's tick, measured in the same run.

    .venv/bin/python benchmarks/tick_rigify.py [--repeats 2000]

About a minute on 2 cores (generating the rig takes ~10 s). Each rig sits in its own file (the Rigify file with its
~200 widget objects, as users have it; reading the targets costs a little more in a file with many objects), the
files opened in turn, twice; each tick is timed without
Blender's evaluation of the rig (`view_layer.update()`, which Blender runs after the timer event anyway), as the
project's live tick runs it: read the six targets, solve (ONNX Runtime when installed), write. The demo rig writes its
mapped bones; the Rigify rig writes its controls (blender/rig/control_live.py: one NumPy product for the single-joint
controls, mathutils for the torso and head chain, one foreach_set of the rotations, a matrix_basis set for each of
the torso and head, an Euler set for each shoulder). Rows: each tick's median (and p99), the Rigify tick as a ratio
to the demo tick (the issue asks for at most 2x), and `view_layer.update()` of each rig after its tick, for scale;
then the same ticks back to back with no evaluation between them (the tick's own cost with warm caches: after
Rigify's ~6 ms evaluation the next tick starts with cold caches); then what Blender's API alone costs on each rig,
the floor under any write of the pose: one `foreach_set` of every pose bone's quaternion and one pose-bone property
set (an RNA update, which tags the whole pose for evaluation). Same network size and
weights kind on both (random weights; the cost does not depend on them), no refinement; targets moved every tick
along each rig's own clip (so nothing is cached between ticks).
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "tests"))

from addon_loader import isolate_user_resources, load_addon  # noqa: E402


def tick_times(bpy, obj, rig, model, sample, repeats, floor=False):
    """(tick us (N,), view_layer.update us (N,), tick us with no update between ticks (N,)) of LiveTick on obj,
    targets on the sample's frames in turn. floor: a control rig's write replaced by Blender's API calls alone (the
    foreach_set of the rotations and the location controls' matrix_basis sets, of values computed once): what the
    tick would cost if posing the controls took no time."""
    from live_helpers import place_targets

    from neural_ik.blender.live.tick import LiveTick

    scene = bpy.context.scene
    obj.neural_ik.refine_iterations = 0
    tick = LiveTick([(obj, model, None)])
    tick.start()
    for group in tick.live_groups if floor else ():
        for _, writer in group.controlled:
            bones = [(step[12], step[12].matrix_basis.copy()) for step in writer.steps if step[11] == "matrix"]

            def bare(extended, hips_location, writer=writer, bones=bones):
                writer.set_all("rotation_quaternion", writer.quaternions.reshape(-1))
                for bone, basis in bones:
                    bone.matrix_basis = basis
            writer.write = bare
    ticks, updates, alone = np.empty(repeats), np.empty(repeats), np.empty(repeats)
    frames = len(sample.frames)
    try:
        for i in range(-50, repeats):
            place_targets(obj, rig, sample, i % frames)
            began = time.perf_counter()
            tick.tick(scene)
            middle = time.perf_counter()
            bpy.context.view_layer.update()
            if i >= 0:
                ticks[i], updates[i] = middle - began, time.perf_counter() - middle
        for i in range(-50, repeats):      # back to back: the tick's own cost with warm caches
            place_targets(obj, rig, sample, i % frames)
            began = time.perf_counter()
            tick.tick(scene)
            if i >= 0:
                alone[i] = time.perf_counter() - began
    finally:
        tick.stop()
    return ticks * 1e6, updates * 1e6, alone * 1e6


def api_costs(bpy, obj, repeats):
    """(us of one foreach_set of every pose bone's rotation_quaternion, us of one matrix_basis set) on obj."""
    pose_bones = obj.pose.bones
    buffer = np.empty(4 * len(pose_bones), np.float32)
    pose_bones.foreach_get("rotation_quaternion", buffer)
    bone = pose_bones[len(pose_bones) // 2]
    basis = bone.matrix_basis.copy()
    out = []
    for step in (lambda: pose_bones.foreach_set("rotation_quaternion", buffer),
                 lambda: setattr(bone, "matrix_basis", basis)):
        times = np.empty(repeats)
        for i in range(repeats):
            began = time.perf_counter()
            step()
            times[i] = time.perf_counter() - began
        out.append(float(np.median(times)) * 1e6)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args(sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else None)
    isolate_user_resources()
    load_addon()
    import bpy
    from live_helpers import linear_model_for
    from rigify_helpers import RIGIFY_MAP, generate_rigify, key_controls, open_rigify
    from tick import random_network

    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.properties import get_bone_map

    path = os.path.join(tempfile.mkdtemp(prefix="nik_rigify_"), "rigify.blend")
    generate_rigify(path)

    def rigify_scene():
        """The generated rig in its own file (with Rigify's widget objects, as users have it), a clip on its
        controls, its targets, a random network on its skeleton."""
        obj = open_rigify(path)
        clip = key_controls(obj, "clip", frames=40, seed=3)
        assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
        rig = rig_model.read_rig(obj, RIGIFY_MAP)
        sample = pose_read.read_action(rig, obj, clip)
        model = random_network(rig.skeleton, linear_model_for(rig.skeleton, [sample]).feature_spec)
        obj.animation_data.action = None
        bpy.ops.neural_ik.create_targets()
        return obj, rig, model, sample

    def demo_scene():
        """The demo rig in a fresh file, one of its clips, its targets, a random network on its skeleton."""
        bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
        bpy.ops.neural_ik.create_demo_rig()
        obj = bpy.context.active_object
        rig = rig_model.read_rig(obj, get_bone_map(obj))
        sample = pose_read.read_action(rig, obj, bpy.data.actions[sorted(
            a.name for a in bpy.data.actions if a.name.startswith(("walk", "idle")))[0]])
        model = random_network(rig.skeleton, linear_model_for(rig.skeleton, [sample]).feature_spec)
        obj.animation_data.action = None
        bpy.ops.neural_ik.create_targets()
        return obj, rig, model, sample

    rows, bones, api = {}, {}, {}
    for _ in range(2):             # alternated, so the machine's load hits both alike
        for label, scene in (("demo", demo_scene), ("rigify", rigify_scene)):
            obj, rig, model, sample = scene()
            bones[label] = len(obj.pose.bones)
            api.setdefault(label, []).append(api_costs(bpy, obj, args.repeats // 2))
            if label == "rigify":
                obj, rig, model, sample = scene()
                for row, values in zip(rows.setdefault("floor", ([], [], [])),
                                       tick_times(bpy, obj, rig, model, sample, args.repeats // 2, floor=True)):
                    row.append(values)
            for row, values in zip(rows.setdefault(label, ([], [], [])),
                                   tick_times(bpy, obj, rig, model, sample, args.repeats // 2)):
                row.append(values)
    out = {label: [np.concatenate(r) for r in row] for label, row in rows.items()}
    demo_tick, demo_alone = float(np.median(out["demo"][0])), float(np.median(out["demo"][2]))
    print(f"live tick without view_layer.update(), {args.repeats} ticks per rig, alternated:")
    for label in ("demo", "rigify"):
        ticks, updates, alone = out[label]
        print(f"  {label:6s} ({bones[label]} bones): tick {np.median(ticks):7.1f} us (p99 {np.percentile(ticks, 99):7.1f}),"
              f" {np.median(ticks) / demo_tick:.2f}x the demo tick, each after Blender's view_layer.update() of the rig "
              f"({np.median(updates):7.1f} us); ticks back to back {np.median(alone):6.1f} us, "
              f"{np.median(alone) / demo_alone:.2f}x")
    ticks, _, alone = out["floor"]
    print(f"  floor  (706 bones): tick {np.median(ticks):7.1f} us, {np.median(ticks) / demo_tick:.2f}x; back to back "
          f"{np.median(alone):6.1f} us, {np.median(alone) / demo_alone:.2f}x  (the Rigify tick with posing the controls "
          "free: read, solve, and Blender's API calls that write the pose)")
    print("Blender's API alone (the floor under any write of the pose):")
    for label in ("demo", "rigify"):
        foreach_set, one_set = np.median(api[label], axis=0)
        print(f"  {label:6s}: foreach_set of every bone's quaternion {foreach_set:6.1f} us "
              f"({foreach_set / demo_alone:.2f}x the demo tick back to back), one pose-bone property set "
              f"{one_set:5.1f} us")


if __name__ == "__main__":
    main()
