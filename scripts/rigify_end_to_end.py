"""Rigify end to end, as the issue's acceptance asks: a freshly generated Rigify rig animated on its controls (IK
hands and feet, torso), Extract (checked against Blender's evaluated deform bones), Train, then Bake from each
held-out source action with refinement, and the evaluated DEF- hands, feet and head of the baked action (assigned
alone, with the limbs on IK as the file has them and on FK) and of the source played again after it, against the
source's; no switch changed by Bake or by playing; Run IK started and stopped leaves switches, pose and action as
they were.

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
    from neural_ik.blender.rig.action_layouts import assign_action

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
    from rigify_helpers import RIGIFY_MAP, generate_rigify, key_controls, open_rigify, rest_pose
    from test_rig_io import state_hash

    from neural_ik.blender import models
    from neural_ik.blender.live import session as live_session
    from neural_ik.blender.live.tick import LiveTick
    from neural_ik.blender.rig import rig_model
    from neural_ik.blender.rig.action_layouts import assign_action
    from neural_ik.blender.rig.evaluated_pose import number_properties
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
    from neural_ik.blender.workflows.extract import extract_dataset

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
    limbs = [(bone, "IK_FK") for bone in ("upper_arm_parent.L", "upper_arm_parent.R", "thigh_parent.L", "thigh_parent.R")]
    head = effectors.index(RIGIFY_MAP["Head"])
    misses = {"IK": [], "FK": [], "clip": [], "cleared": []}
    switches_kept = True
    for source in held:
        first, last = (int(v) for v in source.frame_range)
        frames = list(range(first, last + 1))
        rest_pose(obj)               # the clip's own pose: its keys, the controls it does not key at rest
        want = evaluated_heads(bpy, obj, source, frames, effectors)     # the file's switches: IK
        saved = number_properties(obj)
        assert bpy.ops.neural_ik.bake(source_action=source.name, refine_iterations=4) == {"FINISHED"}
        baked = obj.animation_data.action
        got = {"IK": evaluated_heads(bpy, obj, baked, frames, effectors),      # the baked action, switches as they are
               "clip": evaluated_heads(bpy, obj, source, frames, effectors)}   # the user's clip again after it
        rest_pose(obj)               # Pose > Clear Transform > All: what the clip does not key back at rest
        got["cleared"] = evaluated_heads(bpy, obj, source, frames, effectors)
        switches_kept &= number_properties(obj) == saved
        for bone, key in limbs:                                                 # the user turns the limbs to FK
            obj.pose.bones[bone][key] = 1.0
        got["FK"] = evaluated_heads(bpy, obj, baked, frames, effectors)
        for bone, key in limbs:
            obj.pose.bones[bone][key] = saved[(bone, key)]
        for label, heads in got.items():
            misses[label].append(np.linalg.norm(heads - want, axis=-1) * rig.scale)
    misses = {label: np.concatenate(m) for label, m in misses.items()}
    hands_feet = np.delete(misses["clip"], head, axis=1).max(axis=1)
    misses = {label: m.max(axis=1) for label, m in misses.items()}
    within = min(float(np.mean(misses[label] <= 1e-3)) for label in ("IK", "FK", "cleared"))
    print(f"bake with refinement from {len(held)} held-out source actions, {len(misses['IK'])} frames: evaluated DEF- "
          f"hands, feet and head vs the source's, frames within 1 mm (worst, median): " + "; ".join(
              f"{label} {100 * np.mean(m <= 1e-3):.1f}% ({1e3 * m.max():.3f}, {1e3 * np.median(m):.4f} mm)"
              for label, m in (("baked, limbs on IK", misses["IK"]), ("baked, limbs on FK", misses["FK"]),
                               ("the source again after it", misses["clip"]),
                               ("the source again after Clear Transform", misses["cleared"]))))
    print(f"the source again after the baked action: hands and feet (its IK controls) worst {1e3 * hands_feet.max():.3f}"
          f" mm; its head follows the spine, neck and head controls it does not key, which keep the baked action's last "
          f"values (Blender's rule: Pose > Clear Transform puts them back)")
    print(f"bake and playing the baked action left every switch as it was: {switches_kept}")
    within = min(within, float(np.mean(hands_feet <= 1e-3)))

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
    if not (extract_ok and within >= 0.99 and switches_kept and restored):
        raise SystemExit("acceptance failed")


if __name__ == "__main__":
    main()
