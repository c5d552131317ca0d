"""The demo rig and its procedural motion: a 54-bone humanoid and actions the project writes itself.

Why: the extension must train out of the box with no external data, and the data must carry the structure a
human prior needs: spine, shoulders and arms moving together, knees bending with the hips, feet planted while they
carry weight and hands landing on targets. Legs and reaching arms are therefore *solved*, not keyed: every frame a
closed-form two-bone solve puts the ankle on a planted (or swinging) target and the wrist on a reach target, so
the local rotations in the data are the ones an IK solution has.

Space: Blender armature space in metres, +Z up, the character faces -Y (its left is +X). A bone's rest frame has
its Y axis along the bone (Blender's convention); limbs take their X axis on the hinge of the elbow or knee so
bending is a rotation about local X. Local rotations are relative to the rest (Blender's `matrix_basis`), as
quaternions (w, x, y, z); the hips location is in the hips bone's rest frame, as Blender stores pose location.
The skeleton itself (bones, rest frames, rolls) is data/demo_skeleton.py. Everything here is deterministic from the
seed. Pure NumPy: no bpy.
"""

from dataclasses import dataclass, field

import numpy as np

from ..geometry.rotations import axis_angle_to_matrix, matrix_to_axis_angle, matrix_to_quaternion
from ..skeleton.roles import task_from_name
from .demo_skeleton import (
    BONE_INDEX,
    BONE_NAMES,
    BONES,
    PARENT_INDEX,
    REST_FRAMES,
    REST_HEADS,
    REST_TAILS,
    _normalize,
    frame_from,
)

FPS = 30
GRAVITY = 9.81


# ---- posing ------------------------------------------------------------------------------------------------------

def _rot(axis, angle):
    """Rotation matrices (F, 3, 3) about a fixed axis by angles (F,)."""
    angle = np.asarray(angle, dtype=np.float64)
    return axis_angle_to_matrix(np.asarray(axis, dtype=np.float64) * angle[..., None])


def rx(a):
    return _rot((1.0, 0.0, 0.0), a)


def ry(a):
    return _rot((0.0, 1.0, 0.0), a)


def rz(a):
    return _rot((0.0, 0.0, 1.0), a)


def two_bone_directions(root, target, pole, upper, lower):
    """Closed-form two-bone IK: (upper dir, lower dir, hinge axis, reached) with the middle joint toward `pole`.

    The hinge axis is normalize(pole x (target - root)), so a limb whose rest X axis is that hinge bends about X.
    """
    to_target = target - root
    dist = np.linalg.norm(to_target, axis=-1)
    u = _normalize(to_target)
    n = _normalize(np.cross(pole, u))
    bend = np.cross(u, n)
    reach = np.clip(dist, abs(upper - lower) + 1e-6, (upper + lower) * (1.0 - 1e-6))
    cos_a = np.clip((upper * upper + reach * reach - lower * lower) / (2.0 * upper * reach), -1.0, 1.0)
    sin_a = np.sqrt(1.0 - cos_a * cos_a)
    mid = root + upper * (cos_a[:, None] * u + sin_a[:, None] * bend)
    end = root + reach[:, None] * u
    return _normalize(mid - root), _normalize(end - mid), n, dist <= (upper + lower) * (1.0 - 1e-6)


class PoseBuilder:
    """World rotations and head positions of every bone over F frames, filled parent first; locals at the end."""

    def __init__(self, frames):
        self.frames = frames
        self.world = [None] * len(BONES)
        self.heads = [None] * len(BONES)
        self.local = [None] * len(BONES)

    def _neutral(self, i):
        """World rotation and head of bone i if its own local rotation were identity."""
        p = PARENT_INDEX[i]
        bridge = REST_FRAMES[p].T @ REST_FRAMES[i]
        offset = REST_FRAMES[p].T @ (REST_HEADS[i] - REST_HEADS[p])
        return self.world[p] @ bridge, self.heads[p] + np.einsum("fij,j->fi", self.world[p], offset)

    def set_hips(self, position, rotation):
        i = BONE_INDEX["Hips"]
        self.world[i] = rotation @ REST_FRAMES[i]
        self.heads[i] = np.asarray(position, dtype=np.float64)
        self.local[i] = REST_FRAMES[i].T @ rotation @ REST_FRAMES[i]

    def turn(self, name, delta):
        """Pose a bone by a rotation in its parent's posed, armature-aligned axes (F, 3, 3)."""
        i = BONE_INDEX[name]
        neutral, head = self._neutral(i)
        local = REST_FRAMES[i].T @ delta @ REST_FRAMES[i]
        self.local[i], self.world[i], self.heads[i] = local, neutral @ local, head

    def set_local(self, name, local):
        i = BONE_INDEX[name]
        neutral, head = self._neutral(i)
        self.local[i], self.world[i], self.heads[i] = local, neutral @ local, head

    def set_world(self, name, world):
        i = BONE_INDEX[name]
        neutral, head = self._neutral(i)
        self.local[i] = np.swapaxes(neutral, -1, -2) @ world
        self.world[i], self.heads[i] = world, head

    def head(self, name):
        i = BONE_INDEX[name]
        if self.heads[i] is None:
            return self._neutral(i)[1]
        return self.heads[i]

    def solve_limb(self, upper, lower, target, pole):
        """Two-bone solve of upper/lower so the lower bone's tail lands on target; returns the reached mask."""
        iu, il = BONE_INDEX[upper], BONE_INDEX[lower]
        root = self._neutral(iu)[1]
        len_u = np.linalg.norm(REST_TAILS[iu] - REST_HEADS[iu])
        len_l = np.linalg.norm(REST_TAILS[il] - REST_HEADS[il])
        d_u, d_l, hinge, reached = two_bone_directions(root, target, pole, len_u, len_l)
        self.set_world(upper, frame_from(d_u, hinge))
        self.set_world(lower, frame_from(d_l, hinge))
        return reached

    def finish(self):
        """(F, 54, 4) quaternions, identity for every bone left unposed (fingers, end bones)."""
        eye = np.broadcast_to(np.eye(3), (self.frames, 3, 3))
        for i in range(len(BONES)):
            if self.local[i] is None:
                self.set_local(BONE_NAMES[i], eye)
        quats = matrix_to_quaternion(np.stack(self.local, axis=1))
        # keep each bone's quaternion on one hemisphere over time so Blender's per-channel interpolation is smooth
        for f in range(1, self.frames):
            flip = np.sum(quats[f] * quats[f - 1], axis=-1) < 0
            quats[f, flip] *= -1
        return quats


# ---- motion building blocks --------------------------------------------------------------------------------------

def smoothstep(x):
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def keyed(t, times, values):
    """Ease-in-out interpolation through (time, value) keys (flat tangents at every key)."""
    times = np.asarray(times, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    seg = np.clip(np.searchsorted(times, t, side="right") - 1, 0, len(times) - 2)
    w = smoothstep((t - times[seg]) / np.maximum(times[seg + 1] - times[seg], 1e-9))
    return values[seg] + (values[seg + 1] - values[seg]) * w


def _smooth(x, sigma):
    radius = int(3 * sigma) + 1
    k = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    k /= k.sum()
    padded = np.pad(x, radius, mode="edge")
    return np.convolve(padded, k, mode="valid")


LEG_LENGTH = float(np.linalg.norm(REST_TAILS[BONE_INDEX["LeftThigh"]] - REST_HEADS[BONE_INDEX["LeftThigh"]])
                   + np.linalg.norm(REST_TAILS[BONE_INDEX["LeftShin"]] - REST_HEADS[BONE_INDEX["LeftShin"]]))
_ANKLE_TO_BALL = REST_HEADS[BONE_INDEX["LeftToeBase"]] - REST_HEADS[BONE_INDEX["LeftFoot"]]
_ANKLE_HEIGHT = float(REST_HEADS[BONE_INDEX["LeftFoot"]][2])


def _foot_on_ball(ball, pitch):
    """Ankle position when the foot pivots about a planted ball by `pitch` (heel up positive)."""
    return ball - np.einsum("fij,j->fi", rx(pitch), _ANKLE_TO_BALL)


def _lower_hips_to_reach(hips_pos, hips_rot, ankles):
    """Lower the hips just enough (and smoothly) that both legs reach their ankle targets."""
    need = np.zeros(len(hips_pos))
    radius = 0.997 * LEG_LENGTH
    for side in ("Left", "Right"):
        offset = REST_HEADS[BONE_INDEX[f"{side}Thigh"]] - REST_HEADS[BONE_INDEX["Hips"]]
        hip = hips_pos + np.einsum("fij,j->fi", hips_rot, offset)
        d = ankles[side] - hip
        horizontal = np.minimum(np.linalg.norm(d[:, :2], axis=-1), radius * 0.999)
        allowed = np.sqrt(radius * radius - horizontal * horizontal)
        need = np.maximum(need, -d[:, 2] - allowed)
    need = np.maximum(need, 0.0)
    widened = np.max(np.stack([np.roll(need, k) for k in range(-3, 4)]), axis=0)
    widened[:3], widened[-3:] = need[:3].max(), need[-3:].max()
    drop = np.maximum(_smooth(widened, 1.5), need)
    out = hips_pos.copy()
    out[:, 2] -= drop
    return out


@dataclass
class Plan:
    """Everything an action decides per frame before the solve (canonical heading: walking toward -Y)."""
    frames: int
    hips_pos: np.ndarray
    hips_rot: np.ndarray
    ankles: dict                   # side -> (F, 3) ankle targets
    foot_pitch: dict               # side -> (F,) foot pitch about X, heel up positive
    contact: dict                  # side -> (F,) bool, foot planted
    spine: np.ndarray              # (F, 3) flexion, side bend, twist for the whole spine (radians)
    look: np.ndarray               # (F, 2) head pitch and yaw on top of keeping the gaze level
    arm_swing: dict = field(default_factory=dict)    # side -> (F, 3) forward swing, adduction, elbow bend (FK arms)
    hand_targets: dict = field(default_factory=dict)  # side -> (F, 3) wrist targets (IK arms)
    shoulder_lift: dict = field(default_factory=dict)  # side -> (F,) clavicle elevation
    curl: dict = field(default_factory=dict)          # side -> (F,) finger curl
    reach_spec: tuple = None      # (sides, azimuth, elevation, extent, weight over time) for reach and grab
    reach_paths: dict = field(default_factory=dict)   # side -> ReachPath: the hand all around the shoulder
    protraction: dict = field(default_factory=dict)   # side -> (F,) clavicle forward (+) or back (-), radians


def _base_plan(frames, rng):
    f = frames
    zeros = np.zeros(f)
    ankles = {s: np.tile([sx * 0.09, 0.0, _ANKLE_HEIGHT], (f, 1)) for s, sx in (("Left", 1), ("Right", -1))}
    return Plan(
        frames=f, hips_pos=np.tile([0.0, 0.0, 0.95], (f, 1)), hips_rot=np.broadcast_to(np.eye(3), (f, 3, 3)).copy(),
        ankles=ankles, foot_pitch={"Left": zeros.copy(), "Right": zeros.copy()},
        contact={"Left": np.ones(f, bool), "Right": np.ones(f, bool)},
        spine=np.zeros((f, 3)), look=np.zeros((f, 2)),
        arm_swing={s: np.tile([0.0, np.radians(45.0), np.radians(12.0)], (f, 1)) for s in ("Left", "Right")},
        shoulder_lift={"Left": zeros.copy(), "Right": zeros.copy()},
        curl={"Left": np.full(f, 0.25), "Right": np.full(f, 0.25)},
    )


def _hips_rotation(yaw, pitch, roll):
    return rz(yaw) @ rx(pitch) @ ry(roll)


# ---- the actions -------------------------------------------------------------------------------------------------

def plan_idle(frames, rng, variant):
    p = _base_plan(frames, rng)
    t = np.arange(frames) / FPS
    breath = 2 * np.pi * t / rng.uniform(3.0, 4.5)
    shift = rng.uniform(0.01, 0.04) * np.sin(2 * np.pi * t / rng.uniform(2.5, 4.0) + rng.uniform(0, 6))
    p.hips_pos[:, 0] += shift
    p.hips_pos[:, 2] -= rng.uniform(0.0, 0.012)
    p.hips_rot = _hips_rotation(0.05 * np.sin(breath * 0.5), 0.02 * np.sin(breath), -shift * 1.5)
    p.spine[:, 0] = 0.04 * np.sin(breath) + rng.uniform(-0.05, 0.08)
    p.spine[:, 1] = shift * 2.0
    p.look[:, 1] = rng.uniform(0.1, 0.5) * np.sin(2 * np.pi * t / rng.uniform(3.0, 6.0))
    p.look[:, 0] = rng.uniform(-0.15, 0.1)
    for i, side in enumerate(("Left", "Right")):
        p.arm_swing[side][:, 0] = 0.06 * np.sin(breath + i)
        p.arm_swing[side][:, 1] = np.radians(rng.uniform(40, 50))
        p.arm_swing[side][:, 2] = np.radians(rng.uniform(8, 25))
        p.shoulder_lift[side] = 0.04 * np.sin(breath)
    return p


def plan_gait(frames, rng, speed, period, duty, lift, running):
    """Walking and running: stance feet stay planted (rolling onto the ball late in stance), swing feet arc over."""
    p = _base_plan(frames, rng)
    t = np.arange(frames) / FPS
    phase0 = rng.uniform(0, 1)
    p.hips_pos[:, 1] = -speed * t
    width = rng.uniform(0.07, 0.10)
    roll_up = np.radians(35.0 if running else 22.0)
    for side, sx, shift in (("Left", 1, 0.0), ("Right", -1, 0.5)):
        cyc = t / period + phase0 + shift
        index, phi = np.floor(cyc), cyc - np.floor(cyc)
        y_now = -speed * (index - phase0 - shift + 0.5 * duty) * period     # planted under the hips at mid-stance
        y_next = y_now - speed * period
        stance = phi < duty
        s = np.clip((phi - duty) / (1 - duty), 0, 1)
        late = np.clip((phi - 0.55 * duty) / (0.45 * duty), 0, 1)
        pitch = np.where(stance, roll_up * smoothstep(late), roll_up * (1 - smoothstep(s * 1.6)) - 0.15 * smoothstep(s))
        ball_y = np.where(stance, y_now, y_now + (y_next - y_now) * smoothstep(s)) + _ANKLE_TO_BALL[1]
        ball = np.stack([np.full(frames, sx * width), ball_y, np.full(frames, _ANKLE_TO_BALL[2] + _ANKLE_HEIGHT)], -1)
        ankle = _foot_on_ball(ball, pitch)
        swing_lift = lift * np.sin(np.pi * s) ** (1.5 if running else 1.0)
        ankle[:, 2] += np.where(stance, 0.0, swing_lift)
        if running:
            ankle[:, 1] += np.where(stance, 0.0, 0.12 * np.sin(np.pi * s) * (1 - s))
        p.ankles[side], p.foot_pitch[side], p.contact[side] = ankle, pitch, stance
        swing = rng.uniform(0.25, 0.45) * (1.6 if running else 1.0)
        p.arm_swing[side][:, 0] = swing * np.cos(2 * np.pi * phi)
        p.arm_swing[side][:, 1] = np.radians(rng.uniform(38, 48) - (8 if running else 0))
        elbow = np.radians(rng.uniform(70, 95) if running else rng.uniform(10, 30))
        p.arm_swing[side][:, 2] = elbow + 0.3 * swing * np.maximum(0, -np.cos(2 * np.pi * phi))
        p.shoulder_lift[side] = 0.05 * np.cos(2 * np.pi * phi)
    left_phi = (t / period + phase0) % 1.0
    gait = 2 * np.pi * left_phi
    p.hips_pos[:, 0] = 0.025 * np.sin(gait + 0.3) * (0.5 if running else 1.0)
    p.hips_pos[:, 2] = 0.95 - (0.06 if running else 0.02) + (0.03 if running else 0.015) * np.cos(2 * gait)
    lean = rng.uniform(0.12, 0.22) if running else rng.uniform(0.0, 0.08)
    yaw = rng.uniform(0.06, 0.12) * np.cos(gait)
    p.hips_rot = _hips_rotation(yaw, lean * 0.6 + 0.02 * np.cos(2 * gait), 0.05 * np.sin(gait))
    p.spine[:, 0] = lean * 0.6
    p.spine[:, 2] = -yaw * 1.6
    p.spine[:, 1] = -0.04 * np.sin(gait)
    p.look[:, 0] = -lean * 0.5
    return p


def plan_crouch(frames, rng, depth):
    p = _base_plan(frames, rng)
    t = np.arange(frames) / FPS
    dur = frames / FPS
    w = keyed(t, [0, 0.2 * dur, 0.45 * dur, 0.65 * dur, dur], [0, 0, 1, 1, 0])
    stance = rng.uniform(0.11, 0.17)
    for side, sx in (("Left", 1), ("Right", -1)):
        p.ankles[side][:, 0] = sx * stance
        p.ankles[side][:, 1] = -0.02
    p.hips_pos[:, 2] = 0.94 - depth * w
    p.hips_pos[:, 1] = 0.25 * depth * w
    p.hips_rot = _hips_rotation(0 * w, 0.55 * depth * w, 0 * w)
    p.spine[:, 0] = 0.8 * depth * w + rng.uniform(0, 0.1)
    p.look[:, 0] = -1.2 * depth * w
    reach = rng.uniform(0.2, 0.9)
    for side in ("Left", "Right"):
        p.arm_swing[side][:, 0] = -reach * w
        p.arm_swing[side][:, 2] = np.radians(15) + 0.6 * w * reach
    return p


def plan_reach(frames, rng, side, azimuth, elevation, extent, grab):
    """Reach (or grab) one or both hands to a target around the body and come back; the trunk turns and leans."""
    p = _base_plan(frames, rng)
    t = np.arange(frames) / FPS
    dur = frames / FPS
    w = keyed(t, [0, 0.15 * dur, 0.45 * dur, 0.6 * dur, 0.9 * dur, dur], [0, 0, 1, 1, 0, 0])
    sides = ("Left", "Right") if side == "Both" else (side,)
    sign = {"Left": 1.0, "Right": -1.0, "Both": 0.0}[side]
    low = max(0.0, -np.sin(elevation))
    p.spine[:, 0] = w * (0.25 * extent + 1.0 * low)
    p.spine[:, 2] = w * sign * 0.5 * np.sin(azimuth)
    p.spine[:, 1] = w * sign * 0.15 * np.cos(elevation) * extent
    p.look[:, 0] = w * (np.sin(elevation) * -0.6 + 0.4 * low)
    p.look[:, 1] = w * sign * 0.5 * np.sin(azimuth)
    crouch = 0.35 * low * (1.0 if grab else 0.6)
    p.hips_pos[:, 2] -= w * crouch
    p.hips_pos[:, 1] += w * crouch * 0.4
    p.hips_rot = _hips_rotation(w * sign * 0.15 * np.sin(azimuth), w * (0.2 * low + 0.05 * extent), w * sign * -0.04)
    p.reach_spec = (sides, azimuth, elevation, extent, w)
    for s in sides:
        p.shoulder_lift[s] = w * 0.25 * max(0.0, np.sin(elevation)) + 0.05 * w
        if grab:
            hold = keyed(t, [0, 0.4 * dur, 0.5 * dur, dur], [0.2, 0.2, 1.0, 1.0])
            p.curl[s] = hold
    return p


def plan_jump(frames, rng, height, distance):
    p = _base_plan(frames, rng)
    t = np.arange(frames) / FPS
    flight = 2.0 * np.sqrt(2.0 * height / GRAVITY)
    t_dip, t_off = 0.45, 0.75
    t_land = t_off + flight
    dip = rng.uniform(0.18, 0.3)
    stand = 0.94
    z = keyed(t, [0, 0.15, t_dip, t_off], [stand, stand, stand - dip, stand + 0.04])
    land = keyed(t, [t_land, t_land + 0.25, t_land + 0.7, t_land + 2.0], [stand + 0.02, stand - dip * 0.8, stand, stand])
    air = (t > t_off) & (t < t_land)
    tau = t - t_off
    v0 = GRAVITY * flight / 2
    z = np.where(air, stand + 0.04 + v0 * tau - 0.5 * GRAVITY * tau ** 2, np.where(t >= t_land, land, z))
    forward = np.where(t <= t_off, 0.0, np.where(t >= t_land, distance, distance * tau / flight))
    p.hips_pos[:, 2] = z
    p.hips_pos[:, 1] = -forward
    crouched = np.clip((stand - z) / dip, 0, 1.2)
    p.hips_rot = _hips_rotation(0 * t, 0.5 * crouched * dip + 0.1 * air, 0 * t)
    p.spine[:, 0] = 0.6 * crouched * dip * 2 + 0.1 * air
    p.look[:, 0] = -0.5 * crouched * dip * 2
    heel = keyed(t, [0, t_dip, t_off - 0.05, t_off], [0, 0, 0.6, 0.9])
    for side, sx in (("Left", 1), ("Right", -1)):
        planted_y = np.where(t >= t_land - 1e-9, -distance, 0.0)
        ball = np.stack([np.full(frames, sx * 0.1), planted_y + _ANKLE_TO_BALL[1],
                         np.full(frames, _ANKLE_TO_BALL[2] + _ANKLE_HEIGHT)], -1)
        pitch = np.where(t < t_land, heel, 0.0)
        ankle = _foot_on_ball(ball, pitch)
        tuck = np.sin(np.pi * np.clip(tau / flight, 0, 1)) * rng.uniform(0.15, 0.3)
        under_hips = p.hips_pos + np.array([sx * 0.1, 0.05, -(0.8 * LEG_LENGTH + 0.03)])
        under_hips[:, 2] += tuck
        ankle = np.where(air[:, None], under_hips, ankle)
        # blend the last take-off frame and the first landing frame so the feet do not snap
        p.ankles[side], p.foot_pitch[side], p.contact[side] = ankle, np.where(air, 0.5, pitch), ~air
        swing = keyed(t, [0, t_dip, t_off, t_land, t_land + 0.6], [0.0, 0.7, -1.3, -0.3, 0.0])
        p.arm_swing[side][:, 0] = swing
        p.arm_swing[side][:, 2] = np.radians(20) + 0.3 * np.abs(swing)
    return p


# ---- reaches all around the body ----------------------------------------------------------------------------------
# A hand target dragged anywhere around the shoulder (front, side, overhead, low, across the body, behind; close in and
# beyond the arm's reach) with the clavicle and the trunk taking part. Not in the standard demo set (generate_actions):
# the shipped model's recipe adds them (generate_reach_actions; scripts/make_default_weights.sh).

ARM_LENGTH = float(sum(np.linalg.norm(REST_TAILS[BONE_INDEX[f"Left{b}"]] - REST_HEADS[BONE_INDEX[f"Left{b}"]])
                       for b in ("Arm", "ForeArm")))


def reach_direction(azimuth, elevation):
    """Unit directions (..., 3) in a side's body frame (forward, outward, up): azimuth 0 in front, +pi/2 out to the
    side, pi behind, negative across the body; elevation up from the horizontal (radians)."""
    c = np.cos(elevation)
    return np.stack([c * np.cos(azimuth), c * np.sin(azimuth), np.sin(elevation)], axis=-1)


# The elbow's direction as a smooth field over reach directions with its only zero behind the back across the body
# (azimuth -150, elevation -10 degrees), where no hand goes: the "dipole" tangent field (1 - d.q) e + (d.e)(q - d),
# zero at d = q alone, e at d = -q. With e below: elbow back for a hanging arm, out and down in front, back and down
# at the side, out overhead, forward across the body.
_POLE_ZERO = reach_direction(np.radians(-150.0), np.radians(-10.0))
_POLE_FAR = _normalize(np.array([-0.26, 0.68, -0.68]) - np.dot([-0.26, 0.68, -0.68], _POLE_ZERO) * _POLE_ZERO)


def elbow_pole(direction):
    """Pole directions (..., 3) for reach directions (..., 3), both in the body frame (forward, outward, up)."""
    d = np.asarray(direction, np.float64)
    q, e = _POLE_ZERO, _POLE_FAR
    return (1.0 - d @ q)[..., None] * e + (d @ e)[..., None] * (q - d)


def _body_axes(direction, sx):
    """Body-frame vectors (forward, outward, up) of a side as armature axes before the heading (+X left, -Y forward)."""
    d = np.asarray(direction, np.float64)
    return np.stack([sx * d[..., 1], -d[..., 0], d[..., 2]], axis=-1)


@dataclass
class ReachPath:
    direction: np.ndarray   # (F, 3) unit, body frame of the side (forward, outward, up)
    distance: np.ndarray    # (F,) from the posed shoulder joint, in arm lengths
    wrist: np.ndarray       # (F, 2) wrist flexion and deviation (radians) while the hand follows the forearm
    hold: float             # 0: the hand follows the forearm; 1: it keeps its first frame's world orientation


def _key_times(duration, rng, low=0.7, high=1.3):
    """Key times from 0 to `duration`, `low` to `high` seconds apart (the last gap stretched to end on duration)."""
    times = [0.0]
    while times[-1] + low + high <= duration:
        times.append(times[-1] + rng.uniform(low, high))
    times.append(duration)
    return np.array(times)


def _reach_keys(rng, count):
    """(azimuth, elevation, distance) of `count` targets: the hanging hand first, then spread over the shell, area-
    uniform in direction (azimuth -80..190 degrees), each within 130 degrees of azimuth of the one before."""
    keys = [(np.radians(rng.uniform(5, 30)), np.radians(rng.uniform(-85, -72)), rng.uniform(0.9, 0.98))]
    while len(keys) < count:
        azimuth = np.radians(rng.uniform(-80, 190))
        if abs(azimuth - keys[-1][0]) > np.radians(130):
            continue
        keys.append((azimuth, np.arcsin(rng.uniform(-0.97, 0.97)), rng.uniform(0.55, 1.08)))
    return np.array(keys)


def plan_reach_around(frames, rng, sides):
    """One or both hands moving from target to target all around the shoulder (eased, a pause at each), the trunk
    turning, leaning and crouching toward far targets, the clavicle rising for high ones and moving forward or back."""
    p = _base_plan(frames, rng)
    t = np.arange(frames) / FPS
    trunk = rng.uniform(0.4, 1.2)
    flex, bend, twist, crouch = np.zeros(frames), np.zeros(frames), np.zeros(frames), np.zeros(frames)
    for side in sides:
        sx = 1.0 if side == "Left" else -1.0
        times = _key_times(frames / FPS, rng)
        keys = _reach_keys(rng, len(times))
        azimuth, elevation, distance = (keyed(t, times, keys[:, k]) for k in range(3))
        d = reach_direction(azimuth, elevation)
        far = np.clip((distance - 0.8) / 0.25, 0.0, 1.0)          # the clavicle and the chest's turn help early
        beyond = np.clip((distance - 0.95) / 0.13, 0.0, 1.0)      # the trunk leans and crouches past the arm's reach
        clavicle = rng.uniform(0.6, 1.3)
        p.shoulder_lift[side] = clavicle * (0.04 + 0.35 * np.maximum(d[:, 2], 0.0) * (0.4 + 0.6 * far))
        p.protraction[side] = clavicle * 0.3 * d[:, 0] * (0.3 + 0.7 * far)
        flex += trunk * beyond * (np.maximum(d[:, 0], 0.0) * (0.25 + 0.5 * np.maximum(-d[:, 2], 0.0))
                                  - 0.1 * np.maximum(-d[:, 0], 0.0) * np.maximum(d[:, 2], 0.0))
        bend += sx * trunk * 0.2 * d[:, 1] * beyond
        twist += sx * trunk * 0.4 * np.cos(elevation) * np.sin(azimuth) * far
        crouch = np.maximum(crouch, trunk * 0.3 * np.maximum(-d[:, 2] - 0.5, 0.0) * beyond)
        wrist = np.stack([keyed(t, times, rng.uniform(-0.6, 0.6, len(times))),
                          keyed(t, times, rng.uniform(-0.3, 0.3, len(times)))], axis=-1)
        hold = 1.0 if rng.uniform() < 0.5 else float(rng.uniform(0.0, 1.0))   # half: a target dragged, not turned
        p.reach_paths[side] = ReachPath(d, distance, wrist, hold)
        p.curl[side] = keyed(t, times, rng.uniform(0.0, 0.9, len(times)))
    p.spine[:, 0] = np.clip(flex, -0.3, 0.9)
    p.spine[:, 1] = np.clip(bend, -0.3, 0.3)
    p.spine[:, 2] = np.clip(twist, -0.7, 0.7)
    p.look[:, 1] = 0.5 * p.spine[:, 2]
    p.look[:, 0] = -0.5 * p.spine[:, 0]
    p.hips_pos[:, 2] -= crouch
    p.hips_pos[:, 1] += 0.4 * crouch
    p.hips_rot = _hips_rotation(0.3 * p.spine[:, 2], 0.6 * crouch + 0.1 * p.spine[:, 0], 0 * t)
    return p


def _solve_reach_path(pb, side, path, turn):
    """Two-bone solve of an arm toward its reach path (pole from elbow_pole), then the hand's orientation; returns
    (reached, wrist targets)."""
    sx = 1.0 if side == "Left" else -1.0
    shoulder = pb.head(f"{side}Arm")
    direction = np.einsum("fij,fj->fi", turn, _body_axes(path.direction, sx))
    pole = np.einsum("fij,fj->fi", turn, _body_axes(elbow_pole(path.direction), sx))
    goal = shoulder + ARM_LENGTH * path.distance[:, None] * direction
    reached = pb.solve_limb(f"{side}Arm", f"{side}ForeArm", goal, pole)
    hand = f"{side}Hand"
    pb.set_local(hand, rx(path.wrist[:, 0]) @ rz(-sx * path.wrist[:, 1]))
    follow = pb.world[BONE_INDEX[hand]]
    to_first = _unwrapped(matrix_to_axis_angle(np.swapaxes(follow, -1, -2) @ follow[:1]))
    pb.set_world(hand, follow @ axis_angle_to_matrix(path.hold * to_first))
    return reached, goal


def _unwrapped(rotation_vectors):
    """Axis-angle vectors (F, 3) made continuous over time: where one flips across the half turn, its twin of the
    same rotation (angle - 2 pi about the same axis) continues the one before."""
    out = np.array(rotation_vectors, np.float64)
    for f in range(1, len(out)):
        angle = np.linalg.norm(out[f])
        if angle > 1e-9:
            twin = out[f] * (1.0 - 2.0 * np.pi / angle)
            if np.linalg.norm(twin - out[f - 1]) < np.linalg.norm(out[f] - out[f - 1]):
                out[f] = twin
    return out


# ---- from plan to keys -------------------------------------------------------------------------------------------

@dataclass
class DemoAction:
    name: str
    task: int
    frame_start: int
    frame_end: int
    rotations: np.ndarray       # (F, 54, 4) quaternions (w, x, y, z) = matrix_basis rotation of each bone
    hips_location: np.ndarray   # (F, 3) pose location of the hips in its rest frame
    ankle_targets: dict         # side -> (F, 3) armature-space ankle targets of the solve
    contact: dict               # side -> (F,) bool
    hand_targets: dict          # side -> (F, 3) wrist targets for reach/grab (IK arms only)
    reached: dict               # effector -> (F,) bool: the solve put the joint on its target


def _swing(start, end, w, max_length):
    """Per-frame blend of two offsets (F, 3): slerp of their directions, linear blend of their lengths."""
    len_a, len_b = np.linalg.norm(start, axis=-1), np.linalg.norm(end, axis=-1)
    a, b = start / len_a[:, None], end / len_b[:, None]
    angle = np.arccos(np.clip(np.sum(a * b, axis=-1), -1.0, 1.0))
    sin = np.maximum(np.sin(angle), 1e-9)
    wa = np.where(angle > 1e-6, np.sin((1 - w) * angle) / sin, 1 - w)
    wb = np.where(angle > 1e-6, np.sin(w * angle) / sin, w)
    direction = _normalize(wa[:, None] * a + wb[:, None] * b)
    return direction * np.minimum(len_a + (len_b - len_a) * w, max_length)[:, None]


def _arm_fk(pb, side, swing):
    sx = 1.0 if side == "Left" else -1.0
    pb.turn(f"{side}Arm", rx(swing[:, 0]) @ ry(sx * swing[:, 1]))
    pb.set_local(f"{side}ForeArm", rx(swing[:, 2]))
    pb.set_local(f"{side}Hand", rx(0.1 * swing[:, 2]))


def solve_plan(plan, heading):
    """Pose every bone for a plan: trunk and head by FK, legs and reaching arms by the two-bone solve."""
    f = plan.frames
    turn = rz(np.full(f, heading))
    pb = PoseBuilder(f)
    hips_pos = _lower_hips_to_reach(plan.hips_pos, plan.hips_rot, plan.ankles)
    pb.set_hips(np.einsum("fij,fj->fi", turn, hips_pos), turn @ plan.hips_rot)
    flex, bend, twist = plan.spine[:, 0] / 3, plan.spine[:, 1] / 3, plan.spine[:, 2] / 3
    for name in ("Spine", "Spine1", "Spine2"):
        pb.turn(name, rz(twist) @ ry(bend) @ rx(flex))
    head_pitch = plan.look[:, 0] / 3
    for name in ("NeckLower", "NeckUpper", "Head"):
        pb.turn(name, rz(plan.look[:, 1] / 3 - twist) @ rx(head_pitch - flex * 0.6))
    reached = {}
    for side, sx in (("Left", 1.0), ("Right", -1.0)):
        lift = plan.shoulder_lift[side]
        forward = plan.protraction.get(side, 0.0)
        pb.turn(f"{side}Shoulder", ry(-sx * lift) @ rz(sx * 0.3 * lift - sx * forward))
    hand_targets = {}
    reach_spec = plan.reach_spec
    for side, sx in (("Left", 1.0), ("Right", -1.0)):
        if side in plan.reach_paths:
            reached[f"{side}Hand"], hand_targets[side] = _solve_reach_path(pb, side, plan.reach_paths[side], turn)
        elif reach_spec and side in reach_spec[0]:
            sides, azimuth, elevation, extent, w = reach_spec
            shoulder = pb.head(f"{side}Arm")
            local_sx = sx if len(sides) == 1 else sx * 0.35
            direction = np.array([local_sx * np.sin(azimuth) * np.cos(elevation), -np.cos(azimuth) * np.cos(elevation),
                                  np.sin(elevation)])
            direction = np.einsum("fij,j->fi", turn, _normalize(direction))
            hang = np.einsum("fij,j->fi", turn, [sx * 0.1, 0.02, -0.51])
            peak = int(np.argmax(w))
            target = shoulder[peak] + 0.53 * extent * direction[peak]
            # swing from the hanging hand to the world target around the shoulder (direction slerped, distance
            # blended), so the arm stays extended on the way as a person's does, and within reach while the trunk moves
            goal = shoulder + _swing(hang, target - shoulder, w, 0.54)
            pole = np.einsum("fij,j->fi", turn, _normalize([sx * 0.6, 0.4, -1.0]))
            reached[f"{side}Hand"] = pb.solve_limb(f"{side}Arm", f"{side}ForeArm", goal, pole)
            pb.set_local(f"{side}Hand", rx(-0.3 * w))
            hand_targets[side] = goal
        else:
            _arm_fk(pb, side, plan.arm_swing[side])
        curl = plan.curl[side]
        for finger in ("Index", "Middle", "Ring", "Pinky"):
            for k in (1, 2, 3):
                pb.set_local(f"{side}Hand{finger}{k}", rz(-sx * curl * (0.9 if k == 1 else 1.2)))
        pb.set_local(f"{side}HandThumb1", rz(-sx * 0.4 * curl))
        pb.set_local(f"{side}HandThumb2", rz(-sx * 0.6 * curl))
    ankle_targets = {}
    for side in ("Left", "Right"):
        target = np.einsum("fij,fj->fi", turn, plan.ankles[side])
        forward = np.einsum("fij,j->fi", turn, [0.0, -1.0, 0.0])
        hips_side = np.einsum("fij,j->fi", turn @ plan.hips_rot, [1.0 if side == "Left" else -1.0, 0.0, 0.0])
        pole = _normalize(forward + 0.15 * hips_side)
        reached[f"{side}Foot"] = pb.solve_limb(f"{side}Thigh", f"{side}Shin", target, pole)
        foot = turn @ rx(plan.foot_pitch[side]) @ REST_FRAMES[BONE_INDEX[f"{side}Foot"]]
        pb.set_world(f"{side}Foot", foot)
        pb.set_local(f"{side}ToeBase", rx(-np.clip(plan.foot_pitch[side], 0, None)))
        ankle_targets[side] = target
    quats = pb.finish()
    hips = BONE_INDEX["Hips"]
    location = (pb.heads[hips] - REST_HEADS[hips]) @ REST_FRAMES[hips]   # R_rest^T (x - head), row by row
    return quats, location, ankle_targets, hand_targets, reached


def _action_specs(rng):
    """(name, planner) pairs: 25 actions over the six tasks, parameters drawn from rng."""
    specs = []
    for i in range(3):
        specs.append((f"idle_stand_{i + 1:02d}", 90, lambda f, r, i=i: plan_idle(f, r, i)))
    for i, (label, speed) in enumerate((("slow", 0.8), ("slow", 0.95), ("normal", 1.1), ("normal", 1.25), ("fast", 1.4))):
        speed = speed * rng.uniform(0.95, 1.05)
        period = 1.25 - 0.25 * (speed - 0.8) / 0.6
        specs.append((f"walk_{label}_{i + 1:02d}", 96,
                      lambda f, r, s=speed, T=period: plan_gait(f, r, s, T, r.uniform(0.58, 0.62), r.uniform(0.06, 0.1), False)))
    for i, speed in enumerate((2.4, 2.9, 3.4)):
        speed = speed * rng.uniform(0.95, 1.05)
        specs.append((f"run_{('easy', 'steady', 'fast')[i]}_{i + 1:02d}", 72,
                      lambda f, r, s=speed: plan_gait(f, r, s, 0.72 - 0.04 * (s - 2.4), r.uniform(0.34, 0.4),
                                                      r.uniform(0.12, 0.18), True)))
    for i, depth in enumerate((0.2, 0.32, 0.45)):
        specs.append((f"crouch_{('shallow', 'medium', 'deep')[i]}_{i + 1:02d}", 100,
                       lambda f, r, d=depth: plan_crouch(f, r, d * r.uniform(0.9, 1.1))))
    reach_targets = (("high_left", "Left", 0.3, 0.9), ("side_right", "Right", 1.2, 0.1), ("front_left", "Left", 0.0, 0.0),
                     ("across_right", "Right", -0.6, 0.2), ("low_left", "Left", 0.4, -0.6))
    for i, (label, side, az, el) in enumerate(reach_targets):
        specs.append((f"reach_{label}_{i + 1:02d}", 90,
                      lambda f, r, s=side, a=az, e=el: plan_reach(f, r, s, a + r.uniform(-0.2, 0.2), e + r.uniform(-0.15, 0.15),
                                                                  r.uniform(0.8, 0.97), False)))
    grab_targets = (("floor_right", "Right", 0.2, -1.1), ("table_left", "Left", 0.1, -0.5), ("both_low", "Both", 0.0, -0.9),
                    ("shelf_right", "Right", 0.3, 0.4))
    for i, (label, side, az, el) in enumerate(grab_targets):
        specs.append((f"grab_{label}_{i + 1:02d}", 110,
                      lambda f, r, s=side, a=az, e=el: plan_reach(f, r, s, a + r.uniform(-0.15, 0.15), e + r.uniform(-0.1, 0.1),
                                                                  r.uniform(0.85, 0.97), True)))
    for i, (height, distance) in enumerate(((0.2, 0.0), (0.35, 0.0), (0.25, 0.6), (0.4, 0.9))):
        specs.append((f"jump_{('small', 'high', 'forward', 'long')[i]}_{i + 1:02d}", 90,
                      lambda f, r, h=height, d=distance: plan_jump(f, r, h * r.uniform(0.9, 1.1), d * r.uniform(0.9, 1.1))))
    return specs


def generate_actions(seed=0):
    """All demo actions for a seed: the same seed gives identical numbers, a different seed different ones."""
    rng = np.random.default_rng(seed)
    return _actions(_action_specs(rng), rng)


def generate_reach_actions(seed=0, count=48, frames=150):
    """`count` actions of hands reaching all around the body (plan_reach_around): the right hand, the left, both, in
    turn; named reach_around_NN (task reach) and idle_around_NN (task idle) alternately, since a user drags a hand
    target under either task. Deterministic from the seed, and apart from generate_actions(seed)'s numbers."""
    rng = np.random.default_rng([seed, 23])
    sides = (("Right",), ("Left",), ("Left", "Right"))
    specs = [(f"{('reach', 'idle')[i % 2]}_around_{i + 1:02d}", frames,
              lambda f, r, s=sides[i % 3]: plan_reach_around(f, r, s)) for i in range(count)]
    return _actions(specs, rng)


def _actions(specs, rng):
    actions = []
    for name, frames, planner in specs:
        plan = planner(frames, rng)
        heading = rng.uniform(-np.pi, np.pi)
        quats, location, ankles, hands, reached = solve_plan(plan, heading)
        actions.append(DemoAction(
            name=name, task=task_from_name(name), frame_start=1, frame_end=frames,
            rotations=quats, hips_location=location, ankle_targets=ankles, contact=dict(plan.contact),
            hand_targets=hands, reached=reached))
    return actions
