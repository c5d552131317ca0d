"""Whole-body reach: one hand pinned beyond the arm's reach, the root and the head free, the body follows.

    .venv/bin/python benchmarks/reach_body.py [--model weights/demo.npz] [--ticks 120] [--refine 2] [--json out.json]

What a new user does (issue 33): Create Demo Rig (the shipped model), the first frame of `idle_stand_01`, Create
Targets, the root and the head set Free, Run IK; then only the right-hand target moves, in --ticks live ticks (the
Run IK operator's modal code, as benchmarks/reach_sweep.py drives it), to each of three goals the arm alone cannot
reach, the feet and the other hand staying where Create Targets put them:
- floor: on the ground 30 cm in front of the right toes;
- forward: at shoulder height, 1.4 arm lengths in front of the shoulder;
- overhead: 1.2 arm lengths above the shoulder.
Per goal and method it prints what moved: the hand's miss at the goal, the feet's and the left hand's largest move
from where they stood (mm), the largest turn of any mapped bone in one tick, the spine's bend at the end (the angle
between the hips' and the chest's orientations), how far the hips came down and how far the head moved. Methods:
Neural IK with the root and head free; Neural IK with all six pinned (today's, the root and head held); Blender's IK
constraint with the hand's chain down to the hips (blender_ik.BaselineRig, its head chain taken off). No times:
the figures do not depend on the machine.
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import reach_sweep  # noqa: E402  (its live driving, target placing and pose reading)

GOALS = ("floor", "forward", "overhead")
CHEST = ("Spine2", "Spine1", "Spine")        # the chest: the highest spine role the rig maps


def goal_of(name, heads, rotations):
    """Character-space goal of the right hand."""
    from neural_ik.neural_network.skeleton.roles import ROLE_INDEX

    shoulder, _wrist, length = reach_sweep.arm_of(heads, "Right")
    forward, _outward, up = reach_sweep.body_axes(heads, rotations, "right")
    if name == "floor":
        goal = heads[ROLE_INDEX["RightToeBase"]] + 0.30 * forward
        goal[2] = 0.0
        return goal
    if name == "forward":
        return shoulder + 1.4 * length * forward
    return shoulder + 1.2 * length * up


def path_to(start, goal, ticks):
    """Positions from start to goal in `ticks` steps, easing in and out (a drag)."""
    s = np.linspace(0.0, 1.0, ticks + 1)[1:]
    s = s * s * (3.0 - 2.0 * s)
    return start + s[:, None] * (goal - start)


def spine_bend(rotations):
    """Degrees between the hips' and the chest's orientations (what the spine bends); rotations (23, 3, 3)."""
    from neural_ik.neural_network.geometry.rotations import angle_between
    from neural_ik.neural_network.skeleton.roles import ROLE_INDEX

    chest = next(ROLE_INDEX[r] for r in CHEST if np.isfinite(rotations[..., ROLE_INDEX[r], :, :]).all())
    return np.degrees(angle_between(rotations[..., ROLE_INDEX["Hips"], :, :], rotations[..., chest, :, :]))


def what_moved(heads, rotations, start_heads, start_rotations, goal):
    from neural_ik.neural_network.geometry.rotations import angle_between
    from neural_ik.neural_network.skeleton.roles import ROLE_INDEX, ROLES

    feet, left = [ROLE_INDEX["LeftFoot"], ROLE_INDEX["RightFoot"]], ROLE_INDEX["LeftHand"]
    all_rotations = np.concatenate([start_rotations[None], rotations])
    mapped = np.isfinite(start_heads[:, 0])
    turns = np.degrees(angle_between(all_rotations[:-1], all_rotations[1:]))[:, mapped]
    step, bone = np.unravel_index(int(np.argmax(turns)), turns.shape)
    hips, head = ROLE_INDEX["Hips"], ROLE_INDEX["Head"]
    return {
        "hand_miss_cm": float(100 * np.linalg.norm(heads[-1, ROLE_INDEX["RightHand"]] - goal)),
        "feet_moved_mm": float(1000 * np.linalg.norm(heads[:, feet] - start_heads[feet], axis=-1).max()),
        "left_hand_moved_mm": float(1000 * np.linalg.norm(heads[:, left] - start_heads[left], axis=-1).max()),
        "largest_step_deg": float(turns[step, bone]),
        "largest_step_bone": [r for r, m in zip(ROLES, mapped) if m][bone],
        "steps_over_15_deg": int((turns.max(axis=1) > reach_sweep.POP_DEGREES).sum()),
        "spine_bend_deg": float(spine_bend(rotations[-1])),
        "spine_bend_start_deg": float(spine_bend(start_rotations)),
        "hips_down_cm": float(100 * (start_heads[hips, 2] - heads[-1, hips, 2])),
        "head_moved_cm": float(100 * np.linalg.norm(heads[-1, head] - start_heads[head])),
    }


def chain_to_the_hips(baseline, bone_map, targets):
    """Blender IK as a user would set it for a body reach: the right forearm's IK chain down to the hips, and no head
    chain (the head is free)."""
    pose = baseline.copy.pose.bones
    forearm = pose[bone_map["RightForeArm"]]
    next(c for c in forearm.constraints if c.type == "IK").chain_count = baseline._chain_length_to_hips(forearm.name)
    for pb in pose:
        for con in list(pb.constraints):
            if con.type == "IK" and con.target is targets["Head"]:
                pb.constraints.remove(con)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="checkpoint or ONNX file for the demo rig (default: the shipped)")
    parser.add_argument("--ticks", type=int, default=120, help="live ticks from the start to each goal")
    parser.add_argument("--refine", type=int, default=2, help="refinement iterations")
    parser.add_argument("--json", default="", help="write every figure here")
    args = parser.parse_args(argv)
    reach_sweep.load_addon()
    import bpy

    from neural_ik.blender.live.tick import targets_of
    from neural_ik.neural_network.skeleton.roles import ROLE_INDEX

    obj, rig, model = reach_sweep.demo_scene(bpy, args.model)
    heads0, rotations0 = reach_sweep.read_pose(obj, rig)
    target = obj.neural_ik.target_right_hand
    report = {"ticks": args.ticks, "refine": args.refine, "goals": {}}
    print(f"whole-body reach on the demo rig from {reach_sweep.START_ACTION} frame 1: the right hand dragged in "
          f"{args.ticks} live ticks to each goal, refinement {args.refine}")
    print(f"{'goal':<9} {'method':<22} {'hand miss cm':>12} {'feet moved mm':>13} {'left hand mm':>12} "
          f"{'largest step':>12} {'bone':<14} {'spine bend':>10} {'hips down cm':>12} {'head moved cm':>13}")
    for name in GOALS:
        goal = goal_of(name, heads0, rotations0)
        path = path_to(heads0[ROLE_INDEX["RightHand"]], goal, args.ticks)
        rows = {}
        for method, free in (("free root and head", True), ("six pinned", False)):
            obj.neural_ik.layer_root.free = obj.neural_ik.layer_head.free = free
            rows[method] = what_moved(*reach_sweep.live_run(bpy, obj, rig, target, path, None, args.refine),
                                      heads0, rotations0, goal)
        obj.neural_ik.layer_root.free = obj.neural_ik.layer_head.free = False
        baseline = reach_sweep.blender_ik_run(bpy, obj, rig, model, targets_of(obj)[1:], target, path, None,
                                              chain_to_the_hips)
        rows["Blender IK (to the hips)"] = what_moved(*baseline, heads0, rotations0, goal)
        report["goals"][name] = rows
        for method, row in rows.items():
            print(f"{name:<9} {method:<22} {row['hand_miss_cm']:12.2f} {row['feet_moved_mm']:13.2f} "
                  f"{row['left_hand_moved_mm']:12.2f} "
                  f"{row['largest_step_deg']:12.1f} {row['largest_step_bone']:<14} {row['spine_bend_deg']:10.1f} "
                  f"{row['hips_down_cm']:12.1f} {row['head_moved_cm']:13.1f}")
    reach_sweep.write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
