"""Extraction speed: the project's path against the naive loop, on the demo rig and the CMU iClone rig.

    .venv/bin/python benchmarks/extract.py [--cmu FILE,FILE] [--repeats 7]

About 20 s on 2 cores by default; raise --repeats for steadier medians. Each row is a ratio to the anchor measured in
the same process, the naive loop on the same rig and frames (absolute times move ~2x between machines of the same
kind; frames/s and ms are printed beside the ratio).

What each figure includes:
- naive loop: for every usable action, assign it, then for every frame `scene.frame_set(f)` and read
  `pose_bone.matrix` of every mapped bone (the assignment is restored afterwards, outside the timing).
- project extract: `blender.workflows.extract.extract_dataset`, exactly what `bpy.ops.neural_ik.extract` runs before writing the
  file: read the rig and the bone map, parse every action's curves, read the keys, NumPy FK, contacts, phase, task,
  input references and the 50 inputs, every float32/int32 array the dataset stores.
- project extract + write: the same plus `Dataset.save` of the .npz into a temporary folder (the whole operator).
- project read only: `pose_read.read_actions` (curves + FK to ActionSamples), for orientation.

The paths are measured on the same actions and frames, alternately (naive, project, project, naive, ...) so machine
load hits both alike; each figure is the median over the repeats, and the ratio is the median naive time over the
median project time of this run. Both paths must agree (heads to 1e-5 of the rig height, orientations to 1e-5 rad)
or the script fails. The CMU rig is skipped when ../shared/mocap is absent.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from addon_loader import isolate_user_resources, load_addon  # noqa: E402

MOCAP_CMU = os.path.normpath(os.path.join(REPO, "..", "shared", "mocap", "cmu"))
TARGET = 15.0


def naive_read(obj, rig, actions_and_frames):
    """frame_set every frame and read pose_bone.matrix of each mapped bone: [(F, 23, 4, 4)] armature space."""
    import bpy
    import numpy as np

    from neural_ik.blender.rig import action_layouts

    anim = obj.animation_data or obj.animation_data_create()
    bones = [obj.pose.bones[rig.bone_names[b]] if b >= 0 else None for b in rig.role_bones]
    scene = bpy.context.scene
    out = []
    for action, frames in actions_and_frames:
        anim.action = action
        slot = action_layouts.action_slot_for_any(action)
        if slot is not None:
            anim.action_slot = slot
        mats = np.tile(np.eye(4), (len(frames), len(bones), 1, 1))
        for i, f in enumerate(frames):
            scene.frame_set(int(f))
            for r, pb in enumerate(bones):
                if pb is not None:
                    mats[i, r] = pb.matrix
        out.append(mats)
    return out


class UserState:
    """The assigned action/slot and scene frame, put back after the naive loop (which must change them)."""

    def __init__(self, obj):
        import bpy

        anim = obj.animation_data
        self.obj = obj
        self.action = anim.action if anim else None
        self.slot = getattr(anim, "action_slot", None) if anim else None
        self.frame = bpy.context.scene.frame_current

    def restore(self):
        import bpy

        anim = self.obj.animation_data
        if anim is not None:
            anim.action = self.action
            if self.action is not None and self.slot is not None:
                anim.action_slot = self.slot
        bpy.context.scene.frame_set(self.frame)


def bench_rig(label, obj, mapping, repeats):
    import bpy
    import numpy as np

    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.blender.workflows.extract import extract_dataset, usable_actions
    from neural_ik.neural_network.geometry.rotations import angle_between

    rig = rig_model.read_rig(obj, mapping)
    actions = [a for a, _ in usable_actions(obj, rig)[0]]
    height = rig.skeleton.height
    mask = rig.role_mask
    state = UserState(obj)
    folder = tempfile.mkdtemp(prefix="nik_bench_")

    def project():
        return extract_dataset(bpy.context, obj, mapping)[0]

    def project_and_write():
        project().save(os.path.join(folder, "bench.npz"))

    def read_only():
        return list(pose_read.read_actions(rig, obj, actions))

    dataset = project()          # warm-up, and the rows the naive loop reproduces
    samples = read_only()
    names = [str(n) for n in dataset.action_names]
    plan = [(bpy.data.actions[n], dataset.frame[dataset.action == a]) for a, n in enumerate(names)]
    frames = len(dataset)
    naive = naive_read(obj, rig, plan)
    state.restore()

    times = {"naive": [], "extract": [], "write": [], "read": []}
    for rep in range(repeats):     # alternate the order so a load spike hits both paths alike
        order = ["naive", "extract", "write", "read"] if rep % 2 == 0 else ["read", "write", "extract", "naive"]
        for kind in order:
            t0 = time.perf_counter()
            if kind == "naive":
                naive_read(obj, rig, plan)
            elif kind == "extract":
                project()
            elif kind == "write":
                project_and_write()
            else:
                read_only()
            times[kind].append(time.perf_counter() - t0)
            if kind == "naive":
                state.restore()

    pos_err = rot_err = 0.0
    by_name = {s.name: s for s in samples}
    for (action, _frames), mats in zip(plan, naive):
        heads = rig.to_character_positions(mats[:, mask][..., :3, 3])
        mine = dataset.positions[dataset.action == names.index(action.name)][:, mask].astype(np.float64)
        pos_err = max(pos_err, float(np.max(np.abs(heads - mine))) / height)
        rots = rig.to_character_rotations(mats[:, mask][..., :3, :3])
        sample = by_name[action.name]
        rot_err = max(rot_err, float(np.max(angle_between(rots, sample.rotations[:, mask]))))
        hips = dataset.hips_rotation[dataset.action == names.index(action.name)].astype(np.float64)
        rot_err = max(rot_err, float(np.max(angle_between(rots[:, 0], hips))))
    agree = pos_err < 1e-5 and rot_err < 1e-5
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"{label}: {len(plan)} actions, {frames} frames, {len(rig.bone_names)} bones ({len(rig.needed)} read), "
          f"{int(mask.sum())} roles; medians of {repeats} alternated repeats")
    print(f"  agree: {'yes' if agree else 'NO'} (dataset heads {pos_err:.1e} x height, orientations {rot_err:.1e} rad)")
    print(f"  {'speed-up over the anchor (the naive loop, this run)':52s} {'x naive':>8} {'frames/s':>9} {'ms':>8}")
    print(f"  {'anchor: naive frame_set loop':52s} {1.0:7.1f}x {frames / median['naive']:9.0f} {1000 * median['naive']:8.1f}")
    for kind, text in (("extract", "project extract (dataset)"), ("write", "project extract + .npz write"),
                       ("read", "project read only")):
        print(f"  {text:52s} {median['naive'] / median[kind]:7.1f}x {frames / median[kind]:9.0f} "
              f"{1000 * median[kind]:8.1f}")
    per_repeat = [n / e for n, e in zip(times["naive"], times["extract"])]
    ratio = median["naive"] / median["extract"]
    print(f"  per-repeat ratios (extract): {', '.join(f'{r:.1f}' for r in per_repeat)}")
    print(f"  target {TARGET:.0f}x for the project extract: {'met' if ratio >= TARGET else 'NOT met'} ({ratio:.1f}x)")
    return agree, ratio


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cmu", default="006_08.bvh,006_06.bvh,005_01.bvh", help="CMU files to import")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    isolate_user_resources()
    load_addon()
    import bpy

    from neural_ik.blender.rig.bone_maps import bone_map_of
    from neural_ik.blender.workflows.bvh_import import import_bvh_files

    results = []
    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    bpy.ops.neural_ik.create_demo_rig()
    obj = bpy.context.active_object
    results.append(bench_rig("demo rig", obj, bone_map_of(obj), args.repeats))
    if os.path.isdir(MOCAP_CMU):
        bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
        folder = tempfile.mkdtemp(prefix="nik_bench_")
        for name in args.cmu.split(","):
            os.symlink(os.path.join(MOCAP_CMU, name), os.path.join(folder, name))
        obj, _, _ = import_bvh_files(bpy.context, folder, 0.01)
        results.append(bench_rig("CMU iClone rig", obj, bone_map_of(obj), args.repeats))
    else:
        print(f"CMU rig: skipped ({MOCAP_CMU} not found)")
    return 0 if all(r[0] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
