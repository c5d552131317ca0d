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
"""

import numpy as np

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
    up = _unit(up)
    forward = _unit(np.asarray(forward, np.float64) - np.dot(forward, up) * up)
    side = np.cross(up, forward)
    side = side if np.dot(side, outward) >= 0 else -side
    frame = np.stack([forward, side, up], axis=1)                   # body frame -> character space (columns)
    points, arc = _dense_loop(arm_length, reach, waves, start)
    s = np.mod(np.arange(steps) * float(step_length), arc[-1])
    along = np.stack([np.interp(s, arc, points[:, i]) for i in range(3)], axis=-1)
    return np.asarray(shoulder, np.float64) + along @ frame.T
