"""The reach sweep (report/reach_sweep.py): equal steps, the distance range asked for, every region around the
shoulder visited, and the loop closing on itself; the varied paths (issue 33) within their bounds, the same for a seed
and different between seeds, with a hand rotation that turns smoothly; and training never on them."""

import os
import re
import subprocess

import numpy as np
import pytest

from neural_ik.neural_network.geometry.rotations import angle_between
from neural_ik.neural_network.report import reach_sweep
from neural_ik.neural_network.report.reach_sweep import issue_plan, lap_length, plan_path, sweep_path, varied_path, varied_plan

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AZIMUTH, ELEVATION, REACH, SPEED = reach_sweep.AZIMUTH, reach_sweep.ELEVATION, reach_sweep.REACH, reach_sweep.SPEED
TURN_AMPLITUDE, TURN_PERIOD = reach_sweep.TURN_AMPLITUDE, reach_sweep.TURN_PERIOD


@pytest.mark.parametrize("outward", [(-1.0, 0.0, 0.0), (1.0, 0.0, 0.0)])
def test_sweep_visits_every_region_in_equal_steps(outward):
    shoulder, arm = np.array([0.2, 0.05, 1.4]), 0.55
    steps = int(lap_length(arm) / 0.0065) + 1
    path = sweep_path(shoulder, arm, steps, 0.0065, outward=outward)
    assert path.shape == (steps, 3)
    step = np.linalg.norm(np.diff(path, axis=0), axis=-1)
    assert step.min() > 0.0064 and step.max() <= 0.0065 + 1e-12
    distance = np.linalg.norm(path - shoulder, axis=-1) / arm
    assert distance.min() == pytest.approx(0.6, abs=1e-3) and distance.max() == pytest.approx(1.05, abs=1e-3)
    assert distance[0] == pytest.approx(0.9)
    direction = (path - shoulder) / (distance[:, None] * arm)
    forward, side, up = -direction[:, 1], direction[:, 0] * outward[0], direction[:, 2]
    regions = {"front": forward > 0.9, "side": side > 0.8, "overhead": up > 0.85, "low": up < -0.85,
               "across": side < -0.6, "behind": forward < -0.6}
    for name, where in regions.items():
        assert where.any(), name
    again = sweep_path(shoulder, arm, 2 * steps, 0.0065, outward=outward)     # past a lap: the loop again, no jump
    assert np.linalg.norm(np.diff(again, axis=0), axis=-1).max() <= 0.0065 + 1e-12


def test_sweep_refuses_empty_paths():
    with pytest.raises(ValueError):
        sweep_path(np.zeros(3), 0.5, 0, 0.01)


# ---- the varied paths (issue 33) -------------------------------------------------------------------------------

SHOULDER, ARM = np.array([0.2, 0.05, 1.4]), 0.55
PLANS = [issue_plan("right"), issue_plan("left")] + [varied_plan(seed) for seed in range(12)]


def body_coordinates(positions, outward):
    """(azimuth, elevation) in degrees and distance in arm lengths of positions around SHOULDER, for a rig facing -Y
    with +Z up (the defaults) and the side outward (-1 right, +1 left) along X."""
    d = (positions - SHOULDER) / ARM
    forward, side, up = -d[:, 1], outward * d[:, 0], d[:, 2]
    distance = np.linalg.norm(d, axis=-1)
    return np.degrees(np.arctan2(side, forward)), np.degrees(np.arcsin(up / distance)), distance


@pytest.mark.parametrize("plan", PLANS, ids=[f"{p.name} {p.laps} laps" for p in PLANS])
@pytest.mark.parametrize("outward", [-1.0, 1.0])
def test_varied_paths_keep_to_their_bounds(plan, outward):
    """Steps between the plan's slowest and fastest (a little shorter where the path turns sharply back: the chord
    of a bend), elevation, reach and azimuth within the plan's ranges and those within every varied path's (a path
    round the shoulder: laps whole turns of the azimuth, always the same way), and a hand rotation that stays a
    rotation and turns at most the plan's rate a step."""
    positions, turns = plan_path(plan, SHOULDER, ARM, outward=(outward, 0.0, 0.0))
    assert len(positions) == len(turns) > 300
    step = np.linalg.norm(np.diff(positions, axis=0), axis=-1) / ARM
    slow, fast = plan.speed
    assert SPEED[0] <= slow <= fast <= SPEED[1]
    assert step.max() <= fast + 1e-9 and step.min() >= 0.75 * slow and np.mean(step >= 0.95 * slow) > 0.99
    azimuth, elevation, distance = body_coordinates(positions, outward)
    if plan.round:
        travel = np.degrees(np.diff(np.unwrap(np.radians(azimuth)))) * np.sign(plan.azimuth[1] - plan.azimuth[0])
        assert travel.min() > -1e-6 and travel.sum() == pytest.approx(360.0 * plan.laps, abs=3.0)
    else:
        assert AZIMUTH[0] <= min(plan.azimuth) and max(plan.azimuth) <= AZIMUTH[1]
        assert min(plan.azimuth) - 1e-6 <= azimuth.min() and azimuth.max() <= max(plan.azimuth) + 1e-6
    assert ELEVATION[0] <= plan.elevation[0] and plan.elevation[1] <= ELEVATION[1]
    assert plan.elevation[0] - 1e-6 <= elevation.min() and elevation.max() <= plan.elevation[1] + 1e-6
    assert REACH[0] <= plan.reach[0] and plan.reach[1] <= REACH[1]
    assert plan.reach[0] - 1e-6 <= distance.min() and distance.max() <= plan.reach[1] + 1e-6
    assert elevation[0] == pytest.approx(plan.elevation[0]) and azimuth[0] == pytest.approx(plan.azimuth[0])
    np.testing.assert_allclose(turns @ np.swapaxes(turns, -1, -2), np.broadcast_to(np.eye(3), turns.shape), atol=1e-9)
    np.testing.assert_allclose(np.linalg.det(turns), 1.0, atol=1e-9)
    np.testing.assert_allclose(turns[0], np.eye(3), atol=1e-12)
    turned = np.degrees(angle_between(turns[:-1], turns[1:]))
    if not plan.turn:
        assert turned.max() < 1e-6
    else:
        rate = np.linalg.norm([2 * np.pi * amplitude / period for amplitude, period in plan.turn])   # deg a length
        assert turned.max() <= rate * fast + 1e-6 and turned.max() < 5.0
        assert np.degrees(angle_between(turns[0], turns)).max() > 10.0          # it does turn


def test_varied_plans_vary_and_repeat_per_seed():
    """Over 40 seeds every lap count, back and forth and round, held and turning hands, and a spread of speeds,
    elevations and distances; a seed gives the same path again, two seeds different ones; the right and left paths
    are mirror images."""
    plans = [varied_plan(seed) for seed in range(40)]
    assert {p.laps for p in plans} == {1, 2, 3}
    assert 5 < sum(p.round for p in plans) < 25
    assert 10 < sum(bool(p.turn) for p in plans) < 30
    for p in plans:
        for amplitude, period in p.turn:
            assert TURN_AMPLITUDE[0] <= amplitude <= TURN_AMPLITUDE[1] and TURN_PERIOD[0] <= period <= TURN_PERIOD[1]
    assert np.ptp([p.speed[1] / p.speed[0] for p in plans]) > 2.0
    assert np.ptp([p.elevation[0] for p in plans]) > 20 and np.ptp([p.reach[1] for p in plans]) > 0.08
    a, b = varied_path(SHOULDER, ARM, 400, 5), varied_path(SHOULDER, ARM, 400, 5)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    other = varied_path(SHOULDER, ARM, 400, 6)
    assert np.abs(other[0] - a[0]).max() > 0.05
    left = varied_path(SHOULDER, ARM, 400, 5, outward=(1.0, 0.0, 0.0))
    mirror = np.diag([-1.0, 1.0, 1.0])
    np.testing.assert_allclose((left[0] - SHOULDER) @ mirror, a[0] - SHOULDER, atol=1e-12)
    np.testing.assert_allclose(mirror @ left[1] @ mirror, a[1], atol=1e-12)


def test_issue_path_is_the_issues():
    """Issue 33's path: round the shoulder twice (right hand) or three times (left), from the front and outward first,
    the elevation rising from -80 to +60 degrees, the distance from 0.55 to 1.05 arm lengths, the rotation held,
    equal steps."""
    for hand, outward, laps in (("right", -1.0, 2), ("left", 1.0, 3)):
        positions, turns = plan_path(issue_plan(hand), SHOULDER, ARM, outward=(outward, 0.0, 0.0))
        azimuth, elevation, distance = body_coordinates(positions, outward)
        azimuth = np.degrees(np.unwrap(np.radians(azimuth)))
        assert azimuth[0] == pytest.approx(0.0) and np.diff(azimuth).min() > 0
        assert azimuth[-1] == pytest.approx(360.0 * laps, abs=3.0)
        assert elevation[0] == pytest.approx(-80, abs=0.01) and elevation[-1] == pytest.approx(60, abs=0.5)
        assert distance.min() == pytest.approx(0.55, abs=1e-3) and distance.max() == pytest.approx(1.05, abs=1e-3)
        np.testing.assert_array_equal(turns, np.broadcast_to(np.eye(3), turns.shape))
        step = np.linalg.norm(np.diff(positions, axis=0), axis=-1) / ARM
        assert np.median(step) == pytest.approx(0.012, rel=1e-3)


def test_a_path_with_a_start_and_a_step_count():
    """start: a straight drag from the hand to the path at the slowest step, the rotation held; a step count past the
    path's end walks back along it (no jump); and paths refuse nonsense."""
    plan = varied_plan(2)
    hand = SHOULDER + ARM * np.array([0.05, 0.1, -0.95])
    positions, turns = plan_path(plan, SHOULDER, ARM, start=hand)
    whole, _turns = plan_path(plan, SHOULDER, ARM)
    lead = len(positions) - len(whole)
    assert lead > 3
    np.testing.assert_allclose(positions[0], hand)
    np.testing.assert_allclose(positions[lead:], whole)
    assert np.linalg.norm(np.diff(positions[:lead + 1], axis=0), axis=-1).max() <= plan.speed[0] * ARM + 1e-12
    np.testing.assert_array_equal(turns[:lead], np.broadcast_to(np.eye(3), (lead, 3, 3)))
    longer, _turns = plan_path(plan, SHOULDER, ARM, steps=3 * len(whole))
    assert len(longer) == 3 * len(whole)
    assert np.linalg.norm(np.diff(longer, axis=0), axis=-1).max() <= plan.speed[1] * ARM + 1e-12
    with pytest.raises(ValueError):
        plan_path(plan, SHOULDER, 0.0)
    with pytest.raises(ValueError):
        varied_path(SHOULDER, ARM, 0, 1)


# ---- training never on the benchmark's paths --------------------------------------------------------------------

def test_no_training_code_imports_the_benchmark_paths():
    """report/reach_sweep.py is imported by the benchmark and the tests alone: no module of the add-on (training,
    the demo clips, the operators) names it, and importing the demo motion and the trainer does not load it."""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    naming = []
    for path in tracked.stdout.split():
        if path.startswith(("tests/", "benchmarks/")) or path == "neural_network/report/reach_sweep.py":
            continue
        with open(os.path.join(REPO, path), encoding="utf-8") as handle:
            if re.search(r"\breach_sweep\b", handle.read()):
                naming.append(path)
    assert naming == []
    code = ("import sys; sys.path.insert(0, 'scripts'); from addon_loader import load_package; load_package(); "
            "import neural_ik.neural_network.data.demo_motion, neural_ik.neural_network.model.trainer; "
            "print(sorted(m for m in sys.modules if m.endswith('reach_sweep')))")
    loaded = subprocess.run([os.sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip().splitlines()[-1] == "[]"


def training_reach_paths(monkeypatch, seed=0, count=96):
    """Each reach-around clip's hand path as the shipped model's recipe makes them (generate_reach_actions(0, 96)):
    (frames, 3) in the side's body frame, arm lengths from the shoulder. The plans are taken as solve_plan gets them;
    the clips themselves are not solved (solve_plan draws nothing, so the plans are the same)."""
    from neural_ik.neural_network.data import demo_motion

    plans = []
    monkeypatch.setattr(demo_motion, "solve_plan", lambda plan, heading: (plans.append(plan), (None,) * 5)[1])
    demo_motion.generate_reach_actions(seed, count)
    assert len(plans) == count
    return [p.reach_paths[side].direction * p.reach_paths[side].distance[:, None]
            for p in plans for side in p.reach_paths]


def followed_length(clip, points, tolerance):
    """The longest stretch (arm lengths travelled) over which a clip's hand stays within `tolerance` of a path."""
    near = (np.sum(clip ** 2, axis=-1)[:, None] + np.sum(points ** 2, axis=-1)[None]
            - 2 * clip @ points.T).min(axis=1) < tolerance ** 2
    moved = np.concatenate([[0.0], np.linalg.norm(np.diff(clip, axis=0), axis=-1)])
    run = longest = 0.0
    for is_near, step in zip(near, moved):
        run = run + step if is_near else 0.0
        longest = max(longest, run)
    return longest


def test_no_training_clip_follows_a_benchmark_path(monkeypatch):
    """The shipped model's reach-around clips (128 hand paths, about 5 arm lengths each) never follow a benchmark
    path: none stays within 0.03 arm lengths (1.7 cm on the demo arm) of one for more than one arm length of its
    travel (they cross them, as they cross every region around the shoulder: at most about half an arm length)."""
    clips = training_reach_paths(monkeypatch)
    assert len(clips) == 128
    benchmark = [reach_sweep._varied_curve(plan)[0][::20] for plan in PLANS[:5]]
    loop = sweep_path(np.zeros(3), 1.0, int(lap_length(1.0) / 0.005), 0.005, forward=(1.0, 0.0, 0.0),
                      outward=(0.0, 1.0, 0.0))                    # the default loop, in the body frame directly
    for points in benchmark + [loop]:
        longest = max(followed_length(clip, points, 0.03) for clip in clips)
        assert longest < 1.0
    copied = plan_path(PLANS[0], np.zeros(3), 1.0, 150, forward=(1.0, 0.0, 0.0), outward=(0.0, 1.0, 0.0))[0]
    assert followed_length(copied, benchmark[0], 0.03) > 1.5       # a clip that did follow one (150 frames) is seen


# ---- the refinement never pops (issue 23): a hand target swept around the shoulder, live ticks --------------------

def sweep_live(obj, rig, model, side, step=0.0065, limb="hand"):
    """Live ticks (refinement 2) of the demo rig from the first frame of idle_stand_01 while the `side` hand's (or,
    limb="foot", foot's) target ramps to the sweep's start and goes round one lap about the shoulder (hip); read from
    Blender's evaluated pose after each tick. Returns (per step the largest turn of a mapped bone in degrees, its
    role, the hand's (foot's) miss in metres, whether the target is within 98 % of the limb from the evaluated
    shoulder (hip), per step the misses of the other pinned hands, feet and head in metres, (steps, 4))."""
    import bpy
    from live_helpers import place_targets
    from mathutils import Matrix

    from neural_ik.blender.live.tick import LiveTick, targets_of
    from neural_ik.blender.rig import pose_read
    from neural_ik.neural_network.geometry.rotations import angle_between
    from neural_ik.neural_network.skeleton.roles import ROLE_INDEX

    bpy.context.view_layer.objects.active = obj
    bpy.ops.neural_ik.create_targets()
    sample = pose_read.read_action(rig, obj, bpy.data.actions["idle_stand_01"])
    obj.animation_data_clear()
    place_targets(obj, rig, sample, 0)
    obj.neural_ik.refine_iterations = 2
    names = ("Arm", "ForeArm", "Hand") if limb == "hand" else ("Thigh", "Shin", "Foot")
    upper, fore, hand = (ROLE_INDEX[f"{side}{n}"] for n in names)
    index = (1 if side == "Left" else 2) + (0 if limb == "hand" else 2)
    target = targets_of(obj)[index]
    others = [ROLE_INDEX[r] for k, r in enumerate(("LeftHand", "RightHand", "LeftFoot", "RightFoot", "Head"))
              if k != index - 1]
    to_world = np.array(obj.matrix_world) @ np.diag([1.0 / rig.scale] * 3 + [1.0])
    to_world[:3, :3] = to_world[:3, :3] @ rig.basis.T
    mapped = [j for j in range(1, len(rig.role_mask)) if rig.role_mask[j]]
    tick = LiveTick([(obj, model, None)])
    tick.start()
    scene = bpy.context.scene
    try:
        tick.tick(scene)
        bpy.context.view_layer.update()
        arm = float(np.linalg.norm(rig.skeleton.offsets[fore]) + np.linalg.norm(rig.skeleton.offsets[hand]))
        start = sample.positions[0, hand]
        shoulder = pose_read.armature_pose_heads(obj, rig)[upper]
        lap = sweep_path(shoulder, arm, int(lap_length(arm) / step) + 1, step,
                         outward=(1.0 if side == "Left" else -1.0, 0.0, 0.0))
        ramp = start + (lap[0] - start) * np.linspace(0, 1, int(np.linalg.norm(lap[0] - start) / step) + 2)[1:, None]
        turns, worst, miss, within, held, before = [], [], [], [], [], None
        for p in np.concatenate([ramp, lap]):
            m = np.array(target.matrix_world)
            m[:3, 3] = (to_world @ np.append(p, 1.0))[:3]
            target.matrix_world = Matrix(m.tolist())
            tick.tick(scene)
            bpy.context.view_layer.update()
            rotations = pose_read.armature_pose_matrices(obj, rig)[mapped, :3, :3]
            heads = pose_read.armature_pose_heads(obj, rig)
            miss.append(np.linalg.norm(heads[hand] - p))
            within.append(np.linalg.norm(p - heads[upper]) <= 0.98 * arm)
            held.append(np.linalg.norm(heads[others] - sample.positions[0, others], axis=-1))
            if before is not None:
                turned = np.degrees(angle_between(before, rotations))
                turns.append(turned.max())
                worst.append(mapped[int(np.argmax(turned))])
            before = rotations
    finally:
        tick.stop()
    return np.array(turns), np.array(worst), np.array(miss), np.array(within), np.array(held)


def demo_with_a_poor_model():
    """The demo rig with a deliberately poor model loaded (a linear fit to the demo clips: their narrow motion,
    nothing of the space round the shoulder or the hip), so that the refinement is what a sweep tests."""
    import bpy
    from live_helpers import demo_armature, linear_model_for

    from neural_ik.blender import models
    from neural_ik.blender.rig import pose_read, rig_model
    from neural_ik.properties import get_bone_map

    obj = demo_armature()
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    model = linear_model_for(rig.skeleton, [pose_read.read_action(rig, obj, a) for a in bpy.data.actions])
    obj.neural_ik.model_path = ""
    models.loaded_models[obj.name] = ("", model, None)
    return obj, rig, model


@pytest.mark.slow
@pytest.mark.parametrize("side", ["Right", "Left"])
def test_a_hand_swept_round_the_shoulder_never_pops(empty_scene, side):
    """A deliberately poor model (a linear fit to the demo clips: their narrow motion, nothing of the space round the
    shoulder), so the refinement is what is tested: one lap of the sweep (front, side, overhead, behind, low, across;
    0.6-1.05 arm lengths, 0.65 cm a step), a live tick with refinement 2 each step. No step turns a mapped bone more
    than 15 degrees, and the hand lands within 1 mm wherever its target is within 98 % of the arm."""

    from neural_ik.blender import models
    from neural_ik.neural_network.skeleton.roles import ROLES

    obj, rig, model = demo_with_a_poor_model()
    try:
        turns, worst, miss, within, _held = sweep_live(obj, rig, model, side)
    finally:
        models.loaded_models.pop(obj.name, None)
    print(f"\n{side} hand, {len(miss)} steps: largest turn a step {turns.max():.1f} deg ({ROLES[worst[np.argmax(turns)]]}), "
          f"steps over 15 deg {int((turns > 15).sum())}; within 98 % of the arm {int(within.sum())} steps, hand miss "
          f"there at most {1000 * miss[within].max():.3f} mm")
    assert within.sum() > 300 and (~within).sum() > 100          # the lap goes both inside and beyond the reach
    assert turns.max() <= 15.0
    assert miss[within].max() < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("side", ["Left", "Right"])
def test_a_foot_swept_round_the_hip_never_pops(empty_scene, side):
    """The same lap with a foot round its hip and the poor model (the hips held where the clip has them, so beyond
    the leg's reach least squares runs every tick): no step turns a mapped bone more than 15 degrees, and the foot
    lands within 1 mm wherever its target is within 98 % of the leg. Before the reach assist helped the arms of a
    character with a leg beyond reach, least squares took over the hands that the network's moving pose left a few
    millimetres beyond reach, and its spine snapped back when the foot came within reach: 16-18 degree elbow steps."""
    from neural_ik.blender import models
    from neural_ik.neural_network.skeleton.roles import ROLES

    obj, rig, model = demo_with_a_poor_model()
    try:
        turns, worst, miss, within, held = sweep_live(obj, rig, model, side, limb="foot")
    finally:
        models.loaded_models.pop(obj.name, None)
    print(f"\n{side} foot, {len(miss)} steps: largest turn a step {turns.max():.1f} deg ({ROLES[worst[np.argmax(turns)]]}), "
          f"foot miss within reach at most {1000 * miss[within].max():.3f} mm, other pins at most "
          f"{1000 * held.max():.3f} mm")
    assert within.sum() > 300 and (~within).sum() > 100
    assert turns.max() <= 15.0
    assert miss[within].max() < 1e-3


@pytest.mark.slow
def test_a_foot_swept_round_the_hip_leaves_the_other_pins_where_they_are(empty_scene):
    """The shipped model, the left foot's lap: the two hands, the other foot and the head, pinned where Create
    Targets put them, stay within 1 mm of their targets but at a handful of steps (0 of 1,367 at the suite's seeds;
    1-2 with the seeds shifted by 101, 202 or 303, up to 6 mm: the restart after least squares that docs/results.md
    describes). Before the reach assist helped the arms of a character with a leg beyond reach, 104 of the 1,367
    steps had one more than 1 mm off (up to 22 mm)."""
    from live_helpers import demo_armature

    from neural_ik.blender import models
    from neural_ik.blender.rig import rig_model
    from neural_ik.properties import get_bone_map

    obj = demo_armature()
    rig = rig_model.read_rig(obj, get_bone_map(obj))
    turns, _worst, miss, within, held = sweep_live(obj, rig, models.model_of(obj)[0], "Left", limb="foot")
    off = int((held.max(axis=1) > 1e-3).sum())
    print(f"\nshipped model, left foot: other pins at most {1000 * held.max():.3f} mm, {off} of {len(held)} steps over "
          f"1 mm; largest turn {turns.max():.1f} deg")
    assert off <= 5
    assert turns.max() <= 15.0 and miss[within].max() < 1e-3
