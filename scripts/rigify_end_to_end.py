"""Rigify end to end, as the issue's acceptance asks: a freshly generated Rigify rig animated on its controls (IK
hands and feet, torso), Extract (checked against Blender's evaluated deform bones), Train, then Bake from each
held-out source action with refinement, and the evaluated DEF- hands, feet and head of the baked action (assigned
alone) against the source's; Run IK started and stopped leaves switches, pose and action as they were.

    .venv/bin/python scripts/rigify_end_to_end.py [--clips 10] [--frames 60] [--held-out 2] [--time-limit 90]

Prints one line per stage and the figures; exits non-zero when an acceptance figure fails.
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))

from addon_loader import isolate_user_resources, load_addon  # noqa: E402


def evaluated_heads(bpy, obj, action, frames, bones):
    from neural_ik.blender.action_layouts import assign_action

    assign_action(obj, action)
    scene = bpy.context.scene
    out = np.empty((len(frames), len(bones), 3))
    for i, f in enumerate(frames):
        scene.frame_set(int(f))
        out[i] = [tuple(obj.pose.bones[b].head) for b in bones]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=10)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--held-out", type=int, default=2)
    parser.add_argument("--time-limit", type=float, default=90.0)
    args = parser.parse_args(sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else None)
    isolate_user_resources()
    load_addon()
    import bpy
    from rigify_helpers import RIGIFY_MAP, generate_rigify, key_controls, open_rigify
    from test_rig_io import state_hash

    from neural_ik.blender import live_session, models, rig_model
    from neural_ik.blender.action_layouts import assign_action
    from neural_ik.blender.evaluated_pose import number_properties
    from neural_ik.blender.live import LiveTick
    from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES, ROLES

    out = tempfile.mkdtemp(prefix="nik_rigify_e2e_")
    began = time.perf_counter()
    generate_rigify(os.path.join(out, "rigify.blend"))
    obj = open_rigify(os.path.join(out, "rigify.blend"))
    clips = [key_controls(obj, f"clip{k:02d}", frames=args.frames, seed=k, amplitude=0.6 + 0.9 * (k % 5) / 4)
             for k in range(args.clips)]
    held = clips[-args.held_out:]
    for action in held:                        # held out of the training set: the bake's sources
        action.name = "held_" + action.name
    assign_action(obj, clips[0])
    print(f"rig generated and {args.clips} clips of {args.frames} frames keyed on its controls "
          f"({time.perf_counter() - began:.0f} s)")
    assert bpy.ops.neural_ik.auto_map() == {"FINISHED"}
    rig = rig_model.read_rig(obj, RIGIFY_MAP)

    dataset_path = os.path.join(out, "rigify.npz")
    t = time.perf_counter()
    from neural_ik.blender.extract import extract_dataset

    dataset, notes = extract_dataset(bpy.context, obj, actions=[a.name for a in clips[:-args.held_out]])
    dataset.save(dataset_path)
    bones = [RIGIFY_MAP[r] for r in ROLES]
    worst = 0.0
    for a, name in enumerate(dataset.action_names):
        rows = dataset.action == a
        heads = evaluated_heads(bpy, obj, bpy.data.actions[str(name)], dataset.frame[rows], bones)
        worst = max(worst, float(np.max(np.abs(dataset.positions[rows] - heads @ rig.basis.T * rig.scale))))
    height = dataset.skeleton.height
    print(f"extract: {len(dataset)} frames in {time.perf_counter() - t:.1f} s, {notes[-1]}; dataset heads vs the "
          f"evaluated DEF- heads: worst {worst:.2e} m ({worst / height:.1e} of the rig height)")
    extract_ok = worst <= 1e-4 * height

    t = time.perf_counter()
    os.makedirs(os.path.join(out, "model"), exist_ok=True)
    assert bpy.ops.neural_ik.train(filepath=dataset_path, directory=os.path.join(out, "model"),
                                   time_limit=args.time_limit, epochs=1000) == {"FINISHED"}
    print(f"train: {time.perf_counter() - t:.0f} s, model {obj.neural_ik.model_path}")
    if not obj.neural_ik.model_path:
        obj.neural_ik.model_path = os.path.join(out, "model", "model.npz")

    effectors = [RIGIFY_MAP[ROLES[r]] for r in EFFECTOR_ROLES]
    misses = []
    for source in held:
        first, last = (int(v) for v in source.frame_range)
        frames = list(range(first, last + 1))
        want = evaluated_heads(bpy, obj, source, frames, effectors)
        # the source is evaluated with the file's switches (IK); the baked action keys them to FK
        saved = number_properties(obj)
        assert bpy.ops.neural_ik.bake(source_action=source.name, refine_iterations=4) == {"FINISHED"}
        baked = obj.animation_data.action
        got = evaluated_heads(bpy, obj, baked, frames, effectors)
        for (bone, key), value in saved.items():
            obj.pose.bones[bone][key] = value
        misses.append(np.linalg.norm(got - want, axis=-1).max(axis=1) * rig.scale)
    misses = np.concatenate(misses)
    within = float(np.mean(misses <= 1e-3))
    print(f"bake with refinement from {len(held)} held-out source actions, {len(misses)} frames: evaluated DEF- hands, "
          f"feet and head vs the source's: {100 * within:.1f}% of frames within 1 mm (worst {1e3 * misses.max():.3f} "
          f"mm, median {1e3 * np.median(misses):.4f} mm)")

    assign_action(obj, clips[0])
    bpy.context.scene.frame_set(7)
    if not any(t is not None for t in (obj.neural_ik.target_root,)):
        bpy.ops.neural_ik.create_targets()
    before, switches = state_hash(obj), number_properties(obj)
    model = models.model_of(obj, rig)[0]
    tick = LiveTick([(obj, model, None)])
    tick.start()
    for _ in range(5):
        tick.tick(bpy.context.scene)
    tick.stop()
    live_session.stop_all("")
    restored = state_hash(obj) == before and number_properties(obj) == switches
    print(f"run IK: 5 ticks, then stopped: switches, pose and action as they were: {restored}")
    if not (extract_ok and within >= 0.99 and restored):
        raise SystemExit("acceptance failed")


if __name__ == "__main__":
    main()
