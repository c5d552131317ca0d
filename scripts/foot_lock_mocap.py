"""Lock Feet on real motion capture: BVH files retargeted onto a rig of other proportions (so the retargeted feet
slide), baked with refinement, with and without Lock Feet.

    .venv/bin/python scripts/foot_lock_mocap.py [--onto demo|daz] [--folder ../shared/mocap/bandai] [--files PATTERNS]

--onto demo: the demo rig with the shipped model. --onto daz: the DAZ-style test rig (tests/daz_rig.py: no toe bone,
a pelvis and a twist bone in between), with the files themselves retargeted onto it and a model trained on them for
--train seconds (the skate figures come from the refinement; the model only sets the inner joints).

Every figure is read from Blender's evaluated pose of the demo rig. Skate = the mean horizontal speed of a foot
through its contacts (cm per frame), the contacts detected on the source skeleton (the same file imported plainly,
`features.detect_contacts`). Also: how far the hands, head and (outside their contacts and the fade after each)
the feet end up from the retargeted clip's, how far the hips came down, and the inner-joint MPJPE against the clip.
"""

import argparse
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from addon_loader import isolate_user_resources, load_addon  # noqa: E402

CM = 100.0
FILES = ("dataset-1_walk_normal_001,dataset-1_walk_tired_001,dataset-2_walk_normal_001,dataset-2_walk-turn-left_normal_001,"
         "dataset-2_run_normal_001")


def _evaluated_heads(obj, rig, action, frames):
    import bpy

    from neural_ik.blender.rig import pose_read
    from neural_ik.blender.rig.action_layouts import assign_action

    assign_action(obj, action)
    out = []
    for f in frames:
        bpy.context.scene.frame_set(int(f))
        out.append(pose_read.armature_pose_heads(obj, rig))
    return np.array(out)


def _skate(feet, contacts):
    step = np.linalg.norm(np.diff(feet[..., :2], axis=0), axis=-1) * CM
    both = (contacts[1:] > 0.5) & (contacts[:-1] > 0.5)
    return float(step[both].mean()) if both.any() else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", default=os.path.join(REPO, "..", "shared", "mocap", "bandai"))
    parser.add_argument("--files", default=FILES)
    parser.add_argument("--refine", type=int, default=4)
    parser.add_argument("--onto", choices=("demo", "daz"), default="demo")
    parser.add_argument("--train", type=float, default=60.0, help="seconds of training for --onto daz")
    args = parser.parse_args()
    isolate_user_resources()
    load_addon()
    import bpy

    from neural_ik.blender.rig import bone_maps, rig_model
    from neural_ik.blender.workflows.bvh_import import import_bvh_files
    from neural_ik.neural_network.data.features import detect_contacts
    from neural_ik.neural_network.ik import foot_lock
    from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES, FOOT_ROLES, INNER_ROLES
    from neural_ik.properties import get_bone_map

    if args.onto == "daz":
        demo = _daz_with_model(args)
    else:
        bpy.ops.neural_ik.create_demo_rig(seed=0)
        demo = bpy.context.scene.neural_ik.armature
    demo_rig = rig_model.read_rig(demo, get_bone_map(demo))
    print(f"{'clip':34s} {'frames':>6s} {'skate clip':>10s} {'baked':>7s} {'locked':>7s} {'ratio':>6s} "
          f"{'hands/head mm (baked)':>21s} {'free feet mm':>12s} {'hips down cm':>12s} {'inner cm':>8s}")
    scene = bpy.context.scene
    for name in args.files.split(","):
        fps = scene.render.fps / scene.render.fps_base
        source_obj, _, _ = import_bvh_files(bpy.context, args.folder, 0.01, files=name)
        source_fps = scene.render.fps / scene.render.fps_base
        bone_maps.auto_map_object(source_obj)
        source_rig = rig_model.read_rig(source_obj, get_bone_map(source_obj))
        source_action = source_obj.animation_data.action
        frames = np.arange(int(source_action.frame_range[0]), int(source_action.frame_range[1]) + 1)
        source_feet = _evaluated_heads(source_obj, source_rig, source_action, frames)[:, list(FOOT_ROLES)]
        source_contacts = detect_contacts(source_feet, 0.0, source_fps, source_rig.skeleton.height)
        scene.render.fps, scene.render.fps_base = round(fps), 1.0       # the rig's rate (a file of another is resampled)

        bpy.context.view_layer.objects.active = demo
        clip_action = bpy.data.actions.get(f"{name}.onto") if args.onto == "daz" else None
        if clip_action is None:
            _, imported, _ = import_bvh_files(bpy.context, args.folder, 0.01, files=name, onto=demo)
            clip_action = bpy.data.actions[imported[0]]
        frames = np.arange(int(clip_action.frame_range[0]), int(clip_action.frame_range[1]) + 1)
        at = np.minimum(np.round((frames - frames[0]) * source_fps / fps).astype(int), len(source_contacts) - 1)
        contacts = source_contacts[at]                  # the source's contacts at the clip's frames
        clip = _evaluated_heads(demo, demo_rig, clip_action, frames)
        results = {}
        for lock in (False, True):
            demo.animation_data.action = clip_action
            bpy.ops.neural_ik.bake(source_action=clip_action.name, refine_iterations=args.refine, lock_feet=lock)
            results[lock] = _evaluated_heads(demo, demo_rig, demo.animation_data.action, frames)
        locked = results[True]
        feet = list(FOOT_ROLES)
        skate = [_skate(x[:, feet], contacts) for x in (clip, results[False], locked)]
        drop = clip[:, 0, 2] - locked[:, 0, 2]
        lowered = clip.copy()
        lowered[..., 2] -= drop[:, None]
        upper = [r for r in EFFECTOR_ROLES if r not in FOOT_ROLES]
        upper_miss = np.linalg.norm(locked[:, upper] - lowered[:, upper], axis=-1).max() * 1000
        plain_miss = np.linalg.norm(results[False][:, upper] - clip[:, upper], axis=-1).max() * 1000
        planted = foot_lock.planted_feet(clip[:, feet], fps, demo_rig.skeleton.height)
        free = ~planted
        for foot in range(2):
            for _start, end in foot_lock._spans(planted[:, foot]):
                free[end:end + 5, foot] = False
        free_miss = np.linalg.norm(locked[:, feet] - clip[:, feet], axis=-1)[free].max() * 1000
        inner = np.linalg.norm(locked[:, list(INNER_ROLES)] - clip[:, list(INNER_ROLES)], axis=-1).mean() * CM
        print(f"{name[:34]:34s} {len(frames):6d} {skate[0]:10.3f} {skate[1]:7.3f} {skate[2]:7.4f} "
              f"{skate[2] / skate[0]:6.3f} {upper_miss:12.2f} ({plain_miss:6.2f}) "
              f"{free_miss:12.2f} {drop.max() * CM:12.2f} {inner:8.2f}")
        bpy.data.objects.remove(source_obj)


def _daz_with_model(args):
    """The DAZ-style rig with the files retargeted onto it (each action renamed '<file>.onto') and a model trained on
    them, loaded for Bake."""
    import tempfile

    import bpy

    sys.path.insert(0, os.path.join(REPO, "tests"))
    from daz_rig import daz_style_rig_with_clips

    from neural_ik.blender import models
    from neural_ik.blender.workflows.extract import extract_dataset
    from neural_ik.neural_network.model.trainer import TrainConfig, train

    daz, clips = daz_style_rig_with_clips(args.folder, args.files.split(","))
    for name, imported in clips:
        bpy.data.actions[imported[0]].name = f"{name}.onto"
    dataset, _notes = extract_dataset(bpy.context, daz)
    out = tempfile.mkdtemp(prefix="nik_daz_")
    train(dataset, TrainConfig(time_limit=args.train), out_dir=out)
    daz.neural_ik.model_path = os.path.join(out, "model.npz")
    models.loaded_models.pop(daz.name, None)
    return daz


if __name__ == "__main__":
    main()
