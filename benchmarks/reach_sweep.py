"""Reach sweep: a new user's first drags of a hand target on the demo rig, measured from Blender's evaluated pose.

    .venv/bin/python benchmarks/reach_sweep.py [--model weights/demo.npz] [--hand right|left|both] [--steps 600]
                                               [--step-cm 0.65] [--paths default|varied|all] [--seeds 3]
                                               [--varied-steps 0] [--refine 2] [--json out.json]

What it does, as a user would: Create Demo Rig (the shipped model, or --model loaded onto it), the first frame of
`idle_stand_01`, Create Targets, then Run IK while the hand target moves along each path, the other five targets left
where Create Targets put them. The paths (report/reach_sweep.py), each in the body's own axes (idle_stand_01 faces its
own heading, not -Y; the left hand's path is the right's mirror image):
- default: `sweep_path`, one loop (front, across the body, overhead, side, behind and low, at 0.6-1.05 of the arm's
  length from the shoulder), --steps of --step-cm, the hand's rotation held;
- varied (issue 33): `issue_plan`'s path (round the shoulder twice for the right hand, three times for the left, the
  elevation rising from -80 to +60 degrees, 0.55-1.05 arm lengths, the rotation held), then `varied_plan(seed)`'s for
  seeds 0 to --seeds - 1 (their own laps, back and forth or round, elevations, distances, speeds, and a hand held or
  slowly turning: the target empty turns with it). Each whole (or its first --varied-steps steps), after a straight
  drag from the hand to its start. No training clip is made from these paths (see report/reach_sweep.py).
Each step is one real live tick: the Run IK operator's own modal code (operators/live.py LiveRunner, driven with a
TIMER event as the live tests drive it, since timers never fire in the bpy module), then `view_layer.update()` (what
Blender does after the timer event) and the pose read back from Blender's evaluated pose bones.

Rows, per path and hand:
- refined (refinement --refine, default 2): the hand's miss (wrist to target: mean, p95, max over every step, and the
  worst where the target is within 98 % of the arm's length from the shoulder), the largest per-step rotation of
  any mapped bone (the angle between its armature-space orientations one step apart) with the bone, and how many
  steps turn some mapped bone more than 15 degrees;
- network alone (refinement 0): the same figures;
- Blender IK: its IK constraint on the same path (blender_ik.BaselineRig: limb IK on each forearm and shin with
  chain 2, the head chain, Copy Rotation on hands, feet and head, starting each evaluation from the model's mean
  pose; here aimed at the target empties), evaluated by Blender after each move of the target.
A table per path and hand, then one line per path, hand and row; --json writes every figure (`paths`: each path with
its plan, per hand; `hands`: the default path's, where it was before the varied paths). No times: the figures do not
depend on the machine.
"""

import argparse
import dataclasses
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "tests"))           # live_helpers: the live tests' stand-ins for the window

from addon_loader import load_addon  # noqa: E402

POP_DEGREES = 15.0
WITHIN = 0.98           # "within reach": the target at most this share of the arm's length from the shoulder
START_ACTION = "idle_stand_01"
SIDES = {"right": ("Right", "right_hand"), "left": ("Left", "left_hand")}


def character_to_world(obj, rig, position):
    """World location of a character-space position (metres) of the armature."""
    return np.array(obj.matrix_world) @ np.append(rig.basis.T @ position / rig.scale, 1.0)


def place_target(obj, rig, target, start, position, turn=None):
    """Put a target empty at a character-space position, turned by `turn` (3, 3, character space) from its start
    matrix (a mathutils Matrix: where Create Targets put it); None keeps the start's rotation."""
    from mathutils import Matrix

    m = np.array(start)
    if turn is not None:
        linear = np.array(obj.matrix_world)[:3, :3] @ rig.basis.T       # character space -> world (up to the scale)
        m[:3, :3] = linear @ turn @ np.linalg.inv(linear) @ m[:3, :3]
    m[:3, 3] = character_to_world(obj, rig, position)[:3]
    target.matrix_world = Matrix(m.tolist())


def read_pose(obj, rig):
    """(23, 3) heads and (23, 3, 3) orientations of the mapped bones, character space, from the evaluated pose."""
    from neural_ik.blender.rig import pose_read

    return pose_read.armature_pose_heads(obj, rig), pose_read.armature_pose_rotations(obj, rig)


def arm_of(heads, side):
    """(shoulder, wrist, arm length): the upper arm's head, the hand's head and upper arm + forearm lengths."""
    from neural_ik.neural_network.skeleton.roles import ROLE_INDEX

    shoulder, elbow, wrist = (heads[ROLE_INDEX[f"{side}{part}"]] for part in ("Arm", "ForeArm", "Hand"))
    return shoulder, wrist, float(np.linalg.norm(elbow - shoulder) + np.linalg.norm(wrist - elbow))


def body_axes(heads, rotations, hand):
    """(forward, outward, up) of a hand's side: the root frame the network reads (left along the thigh-to-thigh axis,
    up +Z, forward their cross product), outward toward the hand's side."""
    from neural_ik.neural_network.data.features import root_frame

    _origin, root = root_frame(heads[None], rotations[None, 0])
    left, back, up = root[0].T
    return -back, (left if hand == "left" else -left), up


def hand_paths(heads, rotations, hand, args):
    """[(name, plan or None, positions (S, 3), turns (S, 3, 3) or None)] of one hand: the paths --paths asks for,
    around the hand's shoulder in its side's body axes; and the shoulder and the arm's length."""
    from neural_ik.neural_network.report.reach_sweep import issue_plan, plan_path, sweep_path, varied_plan

    shoulder, wrist, length = arm_of(heads, SIDES[hand][0])
    forward, outward, up = body_axes(heads, rotations, hand)
    paths = []
    if args.paths in ("default", "all"):
        positions = sweep_path(shoulder, length, args.steps, args.step_cm / 100.0, forward, outward, up)
        paths.append(("default", None, positions, None))
    if args.paths in ("varied", "all"):
        for plan in [issue_plan(hand)] + [varied_plan(seed) for seed in range(args.seeds)]:
            positions, turns = plan_path(plan, shoulder, length, args.varied_steps or None, forward, outward, up,
                                         start=wrist)
            paths.append((plan.name, plan, positions, turns))
    return paths, shoulder, length


def live_run(bpy, obj, rig, target, path, turns, refine):
    """Drive Run IK's modal code along the path (turning the target by `turns` if given); returns the evaluated heads
    (S, 23, 3) and rotations (S, 23, 3, 3)."""
    from live_helpers import Event, StandInContext, runner_reporting_to

    obj.neural_ik.refine_iterations = refine
    reports = []
    context = StandInContext()
    runner = runner_reporting_to(reports)()
    if runner.invoke(context, Event("NONE")) != {"RUNNING_MODAL"}:
        raise SystemExit(f"Run IK did not start: {reports}")
    heads, rotations = [], []
    start = target.matrix_world.copy()
    try:
        for i, position in enumerate(path):
            place_target(obj, rig, target, start, position, None if turns is None else turns[i])
            bpy.context.view_layer.update()           # the user's drag, evaluated before the next timer event
            runner.last_tick = 0.0                    # the modal keeps to the live rate; every event here is a tick
            if runner.modal(context, Event("TIMER")) != {"RUNNING_MODAL"}:
                raise SystemExit(f"Run IK stopped: {reports}")
            bpy.context.view_layer.update()
            h, r = read_pose(obj, rig)
            heads.append(h)
            rotations.append(r)
    finally:
        runner.modal(context, Event("ESC"))
        target.matrix_world = start
        bpy.context.view_layer.update()
    return np.array(heads), np.array(rotations)


def blender_ik_run(bpy, obj, rig, model, target_objects, target, path, turns, adjust=None):
    """Blender's IK constraint (as the evaluation's baseline, aimed at the target empties) along the path. adjust:
    a function given the built BaselineRig and the bone map, to change its constraints first."""
    from neural_ik.blender.workflows.blender_ik import BaselineRig
    from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES, ROLES

    bone_map = dict(rig.bone_map)
    mean_pose = {bone_map[role]: np.asarray(model.mean_pose[j], np.float64)
                 for j, role in enumerate(ROLES) if bone_map.get(role)}
    targets = {ROLES[r]: t for r, t in zip(EFFECTOR_ROLES, target_objects)}
    scene = bpy.context.scene
    baseline = BaselineRig(scene, obj, bone_map, mean_pose, bpy.data.actions[START_ACTION], targets=targets).build()
    if adjust is not None:
        adjust(baseline, bone_map, targets)
    heads, rotations = [], []
    start = target.matrix_world.copy()
    try:
        for i, position in enumerate(path):
            place_target(obj, rig, target, start, position, None if turns is None else turns[i])
            bpy.context.view_layer.update()
            h, r = read_pose(baseline.copy, rig)
            heads.append(h)
            rotations.append(r)
    finally:
        baseline.remove()
        target.matrix_world = start
        bpy.context.view_layer.update()
    return np.array(heads), np.array(rotations)


def figures(heads, rotations, path, wrist_role, shoulder, arm_length):
    """The row's figures: hand miss (cm) overall and within reach, the largest per-step turn of a mapped bone."""
    from neural_ik.neural_network.geometry.rotations import angle_between
    from neural_ik.neural_network.report.metrics import summary
    from neural_ik.neural_network.skeleton.roles import ROLES

    miss = 100.0 * np.linalg.norm(heads[:, wrist_role] - path, axis=-1)
    reach = np.linalg.norm(path - shoulder, axis=-1) / arm_length
    within = reach <= WITHIN
    mapped = np.isfinite(heads[0, :, 0])
    turns = np.degrees(angle_between(rotations[:-1], rotations[1:]))[:, mapped]      # (S-1, mapped)
    names = [role for role, m in zip(ROLES, mapped) if m]
    step, bone = np.unravel_index(int(np.argmax(turns)), turns.shape)
    popping = turns.max(axis=1) > POP_DEGREES
    worst_bones = sorted({names[b] for b in np.argmax(turns, axis=1)[popping]})
    return {
        "miss_cm": summary(miss),
        "miss_within_cm": summary(miss[within]),
        "steps_within": int(within.sum()),
        "steps_missing_1mm_within": int(np.sum(miss[within] > 0.1)),
        "largest_step_deg": float(turns[step, bone]),
        "largest_step_bone": names[bone],
        "largest_step_at": int(step + 1),
        "steps_over_15_deg": int(popping.sum()),
        "bones_over_15_deg": worst_bones,
        "per_step": {"miss_cm": [round(float(v), 4) for v in miss], "reach": [round(float(v), 4) for v in reach],
                     "largest_turn_deg": [0.0] + [round(float(v), 3) for v in turns.max(axis=1)]},
    }


def describe(plan):
    """A plan in a few words, for the table's heading."""
    turn = "hand held" if not plan.turn else "hand turning up to " + "/".join(f"{a:.0f}" for a, _p in plan.turn) + " deg"
    laps = f"{plan.laps} lap" + "s" * (plan.laps > 1)
    if plan.round:
        way = "outward" if plan.azimuth[1] > plan.azimuth[0] else "across"
        laps += f" round the shoulder from azimuth {plan.azimuth[0]:.0f}, {way} first"
    else:
        laps += f" of azimuth {plan.azimuth[0]:.0f} to {plan.azimuth[1]:.0f} and back"
    return (f"{laps}, elevation {plan.elevation[0]:.0f} to {plan.elevation[1]:.0f}, reach {plan.reach[0]:.2f}-"
            f"{plan.reach[1]:.2f}, {turn}")


def print_table(rows):
    """One path's table: a line per row (refined, network alone, Blender IK)."""
    print(f"{'method':<16} {'miss mean':>9} {'p95':>8} {'max':>8} {'max within':>10} {'>1mm within':>11} "
          f"{'largest step':>12} {'bone':<14} {'steps >15deg':>12}")
    for name, row in rows.items():
        print(f"{name:<16} {row['miss_cm']['mean']:9.3f} {row['miss_cm']['p95']:8.3f} {row['miss_cm']['max']:8.3f} "
              f"{row['miss_within_cm']['max']:10.3f} {row['steps_missing_1mm_within']:11d} "
              f"{row['largest_step_deg']:12.1f} {row['largest_step_bone']:<14} {row['steps_over_15_deg']:12d}")


def print_overview(report):
    """One line per path, hand and row: the figures the per-path tables give, side by side."""
    print(f"\n{'path':<10} {'hand':<6} {'steps':>6} {'method':<16} {'miss mean':>9} {'p95':>8} {'max':>8} "
          f"{'max within':>10} {'largest step':>12} {'bone':<14} {'>15deg':>6}")
    for name, path in report["paths"].items():
        for hand, result in path["hands"].items():
            for method, row in result["rows"].items():
                print(f"{name:<10} {hand:<6} {result['steps']:6d} {method:<16} {row['miss_cm']['mean']:9.3f} "
                      f"{row['miss_cm']['p95']:8.3f} {row['miss_cm']['max']:8.3f} {row['miss_within_cm']['max']:10.3f} "
                      f"{row['largest_step_deg']:12.1f} {row['largest_step_bone']:<14} {row['steps_over_15_deg']:6d}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="checkpoint or ONNX file for the demo rig (default: the shipped "
                                                    "weights/demo.npz that Create Demo Rig loads)")
    parser.add_argument("--hand", choices=("right", "left", "both"), default="both")
    parser.add_argument("--paths", choices=("default", "varied", "all"), default="all",
                        help="the default loop, the varied paths (issue 33's and --seeds seeded ones), or both")
    parser.add_argument("--steps", type=int, default=600, help="steps of the default path")
    parser.add_argument("--step-cm", type=float, default=0.65, help="step length of the default path in cm")
    parser.add_argument("--seeds", type=int, default=3, help="seeded varied paths: seeds 0 to N - 1")
    parser.add_argument("--varied-steps", type=int, default=0, help="steps of each varied path (0: all of it)")
    parser.add_argument("--refine", type=int, default=2, help="refinement iterations of the refined row")
    parser.add_argument("--no-blender-ik", action="store_true", help="leave out the Blender IK row")
    parser.add_argument("--json", default="", help="write every figure here")
    args = parser.parse_args(argv)
    load_addon()
    import bpy

    from neural_ik.blender.live.tick import targets_of
    from neural_ik.neural_network.skeleton.roles import ROLE_INDEX

    obj, rig, model = demo_scene(bpy, args.model)
    model_path = bpy.path.abspath(obj.neural_ik.model_path)
    start_heads, start_rotations = read_pose(obj, rig)
    objects = targets_of(obj)                           # root, left hand, right hand, left foot, right foot, head
    report = {"model": os.path.relpath(model_path, REPO) if model_path.startswith(REPO) else model_path,
              "steps": args.steps, "step_cm": args.step_cm, "refine": args.refine, "start": f"{START_ACTION} frame 1",
              "hands": {}, "paths": {}}
    hands = ("right", "left") if args.hand == "both" else (args.hand,)
    print(f"reach sweep on the demo rig, model {report['model']}, from {START_ACTION} frame 1; hand miss in cm (wrist "
          f"to target), per-step turn of any mapped bone in degrees")
    for hand in hands:
        side, slot = SIDES[hand]
        target = getattr(obj.neural_ik, f"target_{slot}")
        wrist = ROLE_INDEX[f"{side}Hand"]
        paths, shoulder, length = hand_paths(start_heads, start_rotations, hand, args)
        for name, plan, path, turns in paths:
            reach = np.linalg.norm(path - shoulder, axis=-1) / length
            rows = {}
            for method, refine in ((f"refined ({args.refine})", args.refine), ("network alone", 0)):
                rows[method] = figures(*live_run(bpy, obj, rig, target, path, turns, refine), path, wrist, shoulder,
                                       length)
            if not args.no_blender_ik:
                rows["Blender IK"] = figures(*blender_ik_run(bpy, obj, rig, model, objects[1:], target, path, turns),
                                             path, wrist, shoulder, length)
            result = {"arm_length_m": length, "reach_min": float(reach.min()), "reach_max": float(reach.max()),
                      "steps_within": int(np.sum(reach <= WITHIN)), "rows": rows}
            if name == "default":
                report["hands"][hand] = result              # where the JSON had the one path before issue 33
            entry = report["paths"].setdefault(name, {"hands": {}})
            entry["hands"][hand] = dict(result, steps=len(path),
                                        plan=None if plan is None else dataclasses.asdict(plan))
            step = np.linalg.norm(np.diff(path, axis=0), axis=-1)
            print(f"\n{name} path, {hand} hand: {len(path)} steps of {100 * step.min():.2f}-{100 * step.max():.2f} cm,"
                  f" arm {100 * length:.1f} cm, target at {reach.min():.2f}-{reach.max():.2f} of it, "
                  f"{np.sum(reach <= WITHIN)} positions within {WITHIN:.0%}"
                  + ("" if plan is None else f"; {describe(plan)}"))
            print_table(rows)
    print_overview(report)
    write_json(args.json, report)
    return report


def demo_scene(bpy, model=""):
    """(armature, RigModel, Model): Create Demo Rig (the shipped model, or `model` loaded), the first frame of
    START_ACTION, Create Targets."""
    from neural_ik.blender.models import model_of, rig_of
    from neural_ik.blender.rig import action_layouts

    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    bpy.ops.neural_ik.create_demo_rig()
    obj = bpy.context.active_object
    if model:
        bpy.ops.neural_ik.load_model(filepath=os.path.abspath(model))
    action_layouts.assign_action(obj, bpy.data.actions[START_ACTION])
    bpy.context.scene.frame_set(1)
    bpy.ops.neural_ik.create_targets()
    rig = rig_of(obj)
    return obj, rig, model_of(obj, rig)[0]


def write_json(path, report):
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)
        print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
