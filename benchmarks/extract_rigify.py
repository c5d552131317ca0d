"""Extraction speed on a generated Rigify rig (its DEF- bones are driven by constraints, so Extract reads Blender's
evaluated pose): the project's path against the naive loop, in the same process.

    .venv/bin/python benchmarks/extract_rigify.py [--frames 60] [--actions 2] [--repeats 5]

About a minute on 2 cores (generating the rig takes ~10 s). Rows are ratios to the anchor measured in the same run
(absolute times move ~2x between machines of the same kind; ms per frame beside).

- naive loop (the anchor): for every action, assign it, then for every frame `scene.frame_set(f)` and one
  `pose.bones.foreach_get("matrix")` on the evaluated armature (every bone at once).
- project extract: `blender.workflows.extract.extract_dataset`, what `bpy.ops.neural_ik.extract` runs before writing the file
  (evaluated pose of a throwaway scene holding the armature alone, role locals, contacts, the 50 inputs, the scene
  put back).
Each is measured on the bare rig and with an 8k-vertex mesh skinned to it (a character: the user's scene evaluates
it, the project's does not). Runs alternate (naive, project, project, naive, ...); medians; the dataset's heads must
equal the naive loop's (1e-4 of the rig height) or the script fails.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "tests"))

from addon_loader import isolate_user_resources, load_addon  # noqa: E402


def naive_read(obj, actions, frames):
    """[(F, B, 4, 4)] every bone's evaluated matrix (column-major, as foreach_get gives them) per action."""
    import bpy
    import numpy as np

    from neural_ik.blender.rig.action_layouts import assign_action

    scene = bpy.context.scene
    count = len(obj.pose.bones)
    buf = np.empty(count * 16, np.float32)
    out = []
    for action in actions:
        assign_action(obj, action)
        mats = np.empty((frames, count, 4, 4), np.float32)
        for i, f in enumerate(range(1, frames + 1)):
            scene.frame_set(f)
            obj.evaluated_get(bpy.context.evaluated_depsgraph_get()).pose.bones.foreach_get("matrix", buf)
            mats[i] = buf.reshape(count, 4, 4)
        out.append(mats)
    return out


def add_character_mesh(obj):
    """An 8k-vertex sphere skinned to the spine and thighs with an Armature modifier."""
    import bpy

    bpy.ops.mesh.primitive_uv_sphere_add(segments=128, ring_count=64, radius=0.4, location=(0, 0, 1))
    mesh = bpy.context.active_object
    everything = list(range(len(mesh.data.vertices)))
    for bone in ("DEF-spine.003", "DEF-thigh.L", "DEF-thigh.R"):
        mesh.vertex_groups.new(name=bone).add(everything, 0.3, "REPLACE")
    mesh.modifiers.new("Armature", "ARMATURE").object = obj
    bpy.context.view_layer.objects.active = obj
    return mesh


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--actions", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else None)
    isolate_user_resources()
    load_addon()
    import bpy
    import numpy as np
    from rigify_helpers import RIGIFY_MAP, generate_rigify, key_controls, open_rigify

    from neural_ik.blender.rig.action_layouts import assign_action
    from neural_ik.blender.workflows.extract import extract_dataset
    from neural_ik.neural_network.skeleton.roles import ROLES

    path = os.path.join(tempfile.mkdtemp(prefix="nik_rigify_"), "rigify.blend")
    generate_rigify(path)
    obj = open_rigify(path)
    actions = [key_controls(obj, f"clip{k}", frames=args.frames, seed=k) for k in range(args.actions)]
    assign_action(obj, actions[0])
    index = {pb.name: i for i, pb in enumerate(obj.pose.bones)}
    role_rows = [index[RIGIFY_MAP[r]] for r in ROLES]
    frames = args.frames * args.actions
    print(f"Rigify rig: {len(obj.pose.bones)} bones, {args.actions} actions x {args.frames} frames, "
          f"{args.repeats} repeats")
    for label in ("bare rig", "with an 8k-vertex skinned mesh"):
        if label != "bare rig":
            add_character_mesh(obj)
        naive_times, project_times = [], []
        dataset = extract_dataset(bpy.context, obj, dict(RIGIFY_MAP))[0]
        for k in range(args.repeats):
            for which in (("naive", "project") if k % 2 == 0 else ("project", "naive")):
                t = time.perf_counter()
                if which == "naive":
                    now = bpy.context.scene.frame_current
                    mats = naive_read(obj, actions, args.frames)
                    assign_action(obj, actions[0])
                    bpy.context.scene.frame_set(now)
                    naive_times.append(time.perf_counter() - t)
                else:
                    dataset = extract_dataset(bpy.context, obj, dict(RIGIFY_MAP))[0]
                    project_times.append(time.perf_counter() - t)
        heads = np.concatenate([m[:, role_rows, 3, :3] for m in mats])
        rig_basis = np.array(dataset.skeleton.extra["basis"])
        expected = heads @ rig_basis.T * dataset.skeleton.extra["scale"]
        worst = float(np.max(np.abs(dataset.positions - expected)))
        if worst > 1e-4 * dataset.skeleton.height:
            raise SystemExit(f"the dataset's heads differ from the naive loop's by {worst:.2e} m")
        naive, project = statistics.median(naive_times), statistics.median(project_times)
        print(f"{label}: project extract {naive / project:.2f}x the naive loop's speed "
              f"(naive {1e3 * naive / frames:.2f} ms/frame, project {1e3 * project / frames:.2f} ms/frame; "
              f"heads agree to {worst:.1e} m)")


if __name__ == "__main__":
    main()
