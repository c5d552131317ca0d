"""A hand target swept smoothly through the space around a shoulder: the path a new user's drag takes.

`sweep_path` gives target positions, one per tick, a fixed distance apart, along a closed loop around the shoulder
that passes below it (where a hanging arm's hand is), in front, out to the side, overhead, behind, low again, across
the body and back. The distance from the shoulder swings smoothly between `reach[0]` and `reach[1]` arm lengths
(0.6-1.05 by default: close in, and a little beyond what the arm reaches), `waves` times a lap, so every region is
visited near and far. It is made for checks of a solve's smoothness (the largest turn of a bone from one step to the
next) and its landing (the miss wherever the target is within reach); `lap_length` says how long one lap is, so a
caller can choose `steps` to cover it.

Everything is in character space (whatever frame the shoulder position is given in); `forward`, `outward` (from the
body toward the arm's side) and `up` say how the body faces in it. The defaults suit the right arm of a rig that faces
-Y with +Z up (the demo rig: its left side is +X); for the left arm pass outward=(1, 0, 0). Pure NumPy, deterministic.

The varied paths (issue 33: one loop alone is a weak benchmark) are other drags. `varied_plan(seed)` draws a path's
shape: 1-3 laps of the azimuth, back and forth between across the body and behind, or round the shoulder; an
elevation range within -80..+60 degrees; a distance range within 0.55-1.05 arm lengths; steps whose length swings
between a slow and a fast one; the hand's rotation held or slowly turning. `issue_plan(hand)` is the issue's own path.
`plan_path` walks a plan into the hand target's positions and rotations, one per step. The same seed always gives
the same path.

Training never uses these paths: no training code imports this module (the tests check it). The training's reach
clips are demo_motion.plan_reach_around's, drawn key by key from its own generator (np.random.default_rng([seed, 23])
in generate_reach_actions); varied_plan draws from np.random.default_rng([seed, 33]), so a benchmark seed and a
training seed never share a stream, even when they are the same number.
"""

from dataclasses import dataclass, replace

import numpy as np

from ..geometry.rotations import axis_angle_to_matrix

# The loop's waypoints as directions from the shoulder in the body's frame (forward, outward, up); the path runs
# through them in order and back to the first, as a smooth closed curve on the unit sphere.
WAYPOINTS = (
    (0.15, 0.25, -1.0),     # low: the hanging arm's hand
    (1.0, 0.2, -0.6),       # low in front
    (1.0, 0.0, 0.0),        # front
    (0.5, 1.0, 0.1),        # side, a little forward
    (0.2, 0.4, 1.0),        # overhead
    (-0.8, 0.7, 0.4),       # behind, high
    (-0.8, 0.6, -0.5),      # behind, low
    (0.0, 0.6, -1.0),       # low at the side
    (0.9, -0.3, -0.4),      # low across the body
    (0.7, -0.8, 0.1),       # across the body
    (0.8, -0.4, 0.6),       # across, up
    (1.0, 0.3, -0.2),       # back to the front on the way down
)
SAMPLES_PER_SEGMENT = 400   # dense samples of the curve between waypoints, before it is walked in equal steps


def _unit(v):
    v = np.asarray(v, np.float64)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _loop_directions(samples_per_segment=SAMPLES_PER_SEGMENT):
    """(n, 3) unit directions (forward, outward, up) densely along the closed loop through WAYPOINTS, and the loop
    parameter (n,) in [0, 1) of each: a periodic Catmull-Rom spline through the waypoints' unit vectors, normalised."""
    points = _unit(WAYPOINTS)
    n = len(points)
    u = np.arange(samples_per_segment) / samples_per_segment
    basis = 0.5 * np.stack([-u ** 3 + 2 * u ** 2 - u, 3 * u ** 3 - 5 * u ** 2 + 2, -3 * u ** 3 + 4 * u ** 2 + u,
                            u ** 3 - u ** 2], axis=-1)                                            # (s, 4)
    segments = [basis @ points[[(i - 1) % n, i, (i + 1) % n, (i + 2) % n]] for i in range(n)]
    directions = _unit(np.concatenate(segments))
    return directions, np.arange(len(directions)) / len(directions)


def _radius(t, reach, waves, start):
    """Distance from the shoulder (in arm lengths) at loop parameter t: a sine between reach[0] and reach[1], `waves`
    times a lap, `start` at t = 0 and growing."""
    middle, amplitude = 0.5 * (reach[0] + reach[1]), 0.5 * (reach[1] - reach[0])
    phase = np.arcsin(np.clip((start - middle) / amplitude, -1.0, 1.0)) if amplitude > 0 else 0.0
    return middle + amplitude * np.sin(2 * np.pi * waves * t + phase)


def _dense_loop(arm_length, reach, waves, start):
    """(n + 1, 3) points of one closed lap in the body's frame (the first repeated at the end) and their arc lengths."""
    directions, t = _loop_directions()
    points = directions * (arm_length * _radius(t, reach, waves, start))[:, None]
    points = np.concatenate([points, points[:1]])
    arc = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(points, axis=0), axis=-1))])
    return points, arc


def lap_length(arm_length, reach=(0.6, 1.05), waves=4, start=0.9):
    """Length of one lap of sweep_path's loop (metres when arm_length is; the frame does not change it)."""
    return float(_dense_loop(arm_length, reach, waves, start)[1][-1])


def sweep_path(shoulder, arm_length, steps, step_length, forward=(0.0, -1.0, 0.0), outward=(-1.0, 0.0, 0.0),
               up=(0.0, 0.0, 1.0), reach=(0.6, 1.05), waves=4, start=0.9):
    """(steps, 3) hand target positions in character space, `step_length` apart along the loop around `shoulder`
    (3,), starting below it at `start` arm lengths; past one lap (lap_length) the loop repeats.

    arm_length: the upper arm's plus the forearm's length (shoulder joint to wrist). forward, outward, up: the body's
    axes in character space (made orthonormal: up is kept, forward made perpendicular to it, outward's sign decides
    the side). reach: the nearest and farthest distance from the shoulder, in arm lengths; waves: how many times a lap
    the distance goes from one to the other and back."""
    if steps < 1 or not step_length > 0 or not arm_length > 0:
        raise ValueError("sweep_path needs steps >= 1 and positive step_length and arm_length")
    frame = _body_frame(forward, outward, up)                       # body frame -> character space (columns)
    points, arc = _dense_loop(arm_length, reach, waves, start)
    s = np.mod(np.arange(steps) * float(step_length), arc[-1])
    along = np.stack([np.interp(s, arc, points[:, i]) for i in range(3)], axis=-1)
    return np.asarray(shoulder, np.float64) + along @ frame.T


# ---- varied paths: the benchmark's other drags (issue 33) -----------------------------------------------------------

@dataclass(frozen=True)
class PathPlan:
    """The shape of one varied path in the body's frame. Angles in degrees: azimuth 0 in front, 90 out to the side,
    180 behind, negative across the body; elevation up from the horizontal. Lengths in arm lengths."""
    laps: int                   # times the azimuth goes from azimuth[0] to azimuth[1] and back (or round: see below)
    azimuth: tuple              # (where it starts, where it turns back)
    elevation: tuple            # (lowest, highest): the path starts at the lowest
    elevation_waves: float      # times the elevation goes up and down again over the path (0.5: it rises once)
    reach: tuple                # (nearest, farthest) distance from the shoulder
    reach_waves: float          # times the distance goes from one to the other and back over the path
    speed: tuple                # (slowest, fastest) step: the step length swings between them as the path is walked
    speed_period: float         # walked length from one slowest step to the next
    turn: tuple = ()            # the hand's rotation: () held; else (amplitude degrees, period) about each body axis
    name: str = ""
    round: bool = False         # the azimuth goes on round the shoulder instead: laps whole turns from azimuth[0],
                                # the way azimuth[1] lies (behind the back across the body too, where no arm reaches)


AZIMUTH, ELEVATION, REACH = (-80.0, 170.0), (-80.0, 60.0), (0.55, 1.05)   # every varied path's (azimuth: back and forth)
SPEED = (0.004, 0.036)          # step length bounds, arm lengths (0.2-2 cm on the demo rig's 55 cm arm)
TURN_AMPLITUDE, TURN_PERIOD = (15.0, 45.0), (4.0, 10.0)     # a turning hand: degrees about each axis, arm lengths
SEED_KEY = 33                   # varied_plan's generator is np.random.default_rng([seed, SEED_KEY])
ISSUE_LAPS = {"right": 2, "left": 3}
CURVE_SAMPLES = 60000           # dense samples of a varied curve, before it is walked in steps


def varied_plan(seed):
    """The seeded plan of a varied path: 1-3 laps of the azimuth (back and forth between across the body and behind;
    a third of the seeds round the shoulder instead), an elevation range within -80..60 degrees, a reach range within
    0.55-1.05 arm lengths, steps of 0.2-2 cm (on the demo arm) and a hand held (half the seeds) or slowly turning.
    Deterministic per seed; its own generator (see the module's docstring)."""
    rng = np.random.default_rng([int(seed), SEED_KEY])
    laps = int(rng.integers(1, 4))
    azimuth = (rng.uniform(AZIMUTH[0], -30.0), rng.uniform(100.0, AZIMUTH[1]))
    if rng.uniform() < 0.5:
        azimuth = azimuth[::-1]
    slow = rng.uniform(SPEED[0], 0.012)
    plan = PathPlan(laps=laps, azimuth=azimuth, elevation=(rng.uniform(ELEVATION[0], -40.0),
                                                           rng.uniform(10.0, ELEVATION[1])),
                    elevation_waves=rng.uniform(0.5, 2.0 * laps), reach=(rng.uniform(REACH[0], 0.75),
                                                                         rng.uniform(0.9, REACH[1])),
                    reach_waves=laps * rng.uniform(1.5, 4.0), speed=(slow, rng.uniform(0.012, SPEED[1])),
                    speed_period=rng.uniform(1.0, 4.0), name=f"seed {seed}")
    if rng.uniform() < 0.5:
        turn = tuple((rng.uniform(*TURN_AMPLITUDE), rng.uniform(*TURN_PERIOD)) for _axis in range(3))
        plan = replace(plan, turn=turn)
    return replace(plan, round=bool(rng.uniform() < 1 / 3))


def issue_plan(hand):
    """The path of issue 33: round the shoulder twice for the right hand, three times for the left (the azimuth from
    the front, outward first), the elevation rising once from -80 to +60 degrees meanwhile, the distance waving
    between 0.55 and 1.05 arm lengths (four times a lap), 0.012 arm lengths a step (0.65 cm on the demo arm), the
    hand's rotation held."""
    laps = ISSUE_LAPS[hand]
    return PathPlan(laps=laps, azimuth=(0.0, 90.0), elevation=(-80.0, 60.0), elevation_waves=0.5, reach=(0.55, 1.05),
                    reach_waves=4.0 * laps, speed=(0.012, 0.012), speed_period=1.0, name="issue 33", round=True)


def _body_frame(forward, outward, up):
    """(3, 3) body frame -> character space: columns forward, outward, up (made orthonormal: up kept, forward made
    perpendicular to it, outward's sign decides the side)."""
    up = _unit(up)
    forward = _unit(np.asarray(forward, np.float64) - np.dot(forward, up) * up)
    side = np.cross(up, forward)
    side = side if np.dot(side, outward) >= 0 else -side
    return np.stack([forward, side, up], axis=1)


def _varied_curve(plan):
    """(n, 3) points of a plan's curve in the body frame (arm lengths) and their arc lengths (n,)."""
    u = np.linspace(0.0, 1.0, CURVE_SAMPLES)
    if plan.round:
        azimuth = plan.azimuth[0] + np.sign(plan.azimuth[1] - plan.azimuth[0]) * 360.0 * plan.laps * u
    else:
        azimuth = plan.azimuth[0] + (plan.azimuth[1] - plan.azimuth[0]) * 0.5 * (1 - np.cos(2 * np.pi * plan.laps * u))
    low, high = plan.elevation
    elevation = low + (high - low) * 0.5 * (1 - np.cos(2 * np.pi * plan.elevation_waves * u))
    start = float(np.clip(0.9, *plan.reach))
    distance = _radius(u, plan.reach, plan.reach_waves, start)
    a, e = np.radians(azimuth), np.radians(elevation)
    points = distance[:, None] * np.stack([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)], axis=-1)
    return points, np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(points, axis=0), axis=-1))])


def _walk(plan, length, steps):
    """Arc positions (k,) of the steps along a curve `length` long: step lengths swinging between plan.speed's,
    slowest first; all of the curve when steps is None, else `steps` of them, turning back at its ends."""
    slow, fast = plan.speed
    s = [0.0]
    while (steps is None and s[-1] <= length) or (steps is not None and len(s) < steps):
        s.append(s[-1] + slow + (fast - slow) * 0.5 * (1 - np.cos(2 * np.pi * s[-1] / plan.speed_period)))
    s = np.array(s[:-1] if steps is None else s)
    return length - np.abs(length - np.mod(s, 2 * length))


def _hand_turns(plan, s):
    """(k, 3, 3) rotations of the hand from its first orientation at arc positions s, in the body frame."""
    if not plan.turn:
        return np.broadcast_to(np.eye(3), (len(s), 3, 3)).copy()
    vectors = np.stack([np.radians(amplitude) * np.sin(2 * np.pi * s / period) for amplitude, period in plan.turn],
                       axis=-1)
    return axis_angle_to_matrix(vectors)


def plan_path(plan, shoulder, arm_length, steps=None, forward=(0.0, -1.0, 0.0), outward=(-1.0, 0.0, 0.0),
              up=(0.0, 0.0, 1.0), start=None):
    """(positions (k, 3), turns (k, 3, 3)) of a plan's path around `shoulder` in character space: the hand target's
    positions, one per step, and its rotations from where it started (apply on the left of the target's first
    orientation, in character space). All of the curve when steps is None; else `steps` steps, back along the curve
    past its end. start: the hand's position; the path then begins with a straight drag from it, at the slowest step,
    the rotation held. forward, outward, up: as for sweep_path."""
    if not arm_length > 0 or (steps is not None and steps < 1):
        raise ValueError("plan_path needs a positive arm_length and steps >= 1")
    frame = _body_frame(forward, outward, up)
    points, arc = _varied_curve(plan)
    s = _walk(plan, arc[-1], steps)
    along = np.stack([np.interp(s, arc, points[:, i]) for i in range(3)], axis=-1)
    positions = np.asarray(shoulder, np.float64) + arm_length * along @ frame.T
    turns = frame @ _hand_turns(plan, s) @ frame.T
    if start is not None:
        gap = positions[0] - np.asarray(start, np.float64)
        lead = int(np.ceil(np.linalg.norm(gap) / (plan.speed[0] * arm_length)))
        ramp = start + gap * (np.arange(lead) / max(lead, 1))[:, None]
        positions = np.concatenate([ramp, positions])
        turns = np.concatenate([np.broadcast_to(np.eye(3), (lead, 3, 3)), turns])
    return positions, turns


def varied_path(shoulder, arm_length, steps, seed, forward=(0.0, -1.0, 0.0), outward=(-1.0, 0.0, 0.0),
                up=(0.0, 0.0, 1.0), start=None):
    """plan_path of varied_plan(seed): (positions (k, 3), turns (k, 3, 3)); steps None for the whole path."""
    return plan_path(varied_plan(seed), shoulder, arm_length, steps, forward, outward, up, start)
