"""The demo rig's skeleton: its 54 bones (heads, tails, the X axis each bone's hinge turns about), their rest frames
and Blender rolls. The rig data/demo_motion.py poses. Space: Blender armature space in metres, +Z up, facing -Y; a
bone's rest frame has its Y axis along the bone. Pure NumPy: no bpy.
"""

from dataclasses import dataclass

import numpy as np

from ..geometry.rotations import axis_angle_to_matrix


@dataclass(frozen=True)
class BoneDef:
    name: str
    parent: str          # "" for the root
    head: tuple
    tail: tuple
    x_hint: tuple        # direction the bone's local X axis should follow (made orthogonal to the bone)
    connect: bool = False


_ARM_DOWN = np.radians(35.0)   # A-pose: arms 35 degrees below horizontal


def _side_bones(side):
    """One side of the body; `side` is +1 for left (+X), -1 for right."""
    pre = "Left" if side > 0 else "Right"
    s = float(side)
    c, d = np.cos(_ARM_DOWN), np.sin(_ARM_DOWN)
    arm_dir = np.array([s * c, 0.0, -d])
    arm_x = tuple(np.array([-d, 0.0, -s * c]))          # the elbow hinge in rest (see module docstring)
    shoulder = np.array([s * 0.18, 0.0, 1.41])
    elbow = shoulder + 0.29 * arm_dir
    wrist = elbow + 0.26 * arm_dir
    knuckles = wrist + 0.09 * arm_dir
    bones = [
        BoneDef(f"{pre}Shoulder", "Spine2", (s * 0.03, 0.0, 1.40), tuple(shoulder), arm_x),
        BoneDef(f"{pre}Arm", f"{pre}Shoulder", tuple(shoulder), tuple(elbow), arm_x, True),
        BoneDef(f"{pre}ForeArm", f"{pre}Arm", tuple(elbow), tuple(wrist), arm_x, True),
        BoneDef(f"{pre}Hand", f"{pre}ForeArm", tuple(wrist), tuple(knuckles), arm_x, True),
    ]
    for finger, forward, lengths in (("Index", -0.024, (0.045, 0.028, 0.022)), ("Middle", -0.008, (0.048, 0.030, 0.024)),
                                     ("Ring", 0.008, (0.044, 0.028, 0.022)), ("Pinky", 0.023, (0.036, 0.022, 0.018))):
        start = knuckles + np.array([0.0, forward, 0.0])
        parent = f"{pre}Hand"
        for i, length in enumerate(lengths, 1):
            end = start + length * arm_dir
            bones.append(BoneDef(f"{pre}Hand{finger}{i}", parent, tuple(start), tuple(end), arm_x, i > 1))
            parent, start = f"{pre}Hand{finger}{i}", end
    thumb_dir = arm_dir * 0.6 + np.array([0.0, -0.8, 0.0])
    thumb_dir /= np.linalg.norm(thumb_dir)
    start = wrist + 0.025 * arm_dir + np.array([0.0, -0.025, 0.0])
    parent = f"{pre}Hand"
    for i, length in enumerate((0.04, 0.032), 1):
        end = start + length * thumb_dir
        bones.append(BoneDef(f"{pre}HandThumb{i}", parent, tuple(start), tuple(end), arm_x, i > 1))
        parent, start = f"{pre}HandThumb{i}", end
    x = s * 0.09
    bones += [
        BoneDef(f"{pre}Thigh", "Hips", (x, 0.0, 0.93), (x, 0.0, 0.50), (1.0, 0.0, 0.0)),
        BoneDef(f"{pre}Shin", f"{pre}Thigh", (x, 0.0, 0.50), (x, 0.0, 0.09), (1.0, 0.0, 0.0), True),
        BoneDef(f"{pre}Foot", f"{pre}Shin", (x, 0.0, 0.09), (x, -0.13, 0.025), (1.0, 0.0, 0.0), True),
        BoneDef(f"{pre}ToeBase", f"{pre}Foot", (x, -0.13, 0.025), (x, -0.19, 0.02), (1.0, 0.0, 0.0), True),
        BoneDef(f"{pre}Toe_End", f"{pre}ToeBase", (x, -0.19, 0.02), (x, -0.22, 0.02), (1.0, 0.0, 0.0), True),
    ]
    return bones


def _all_bones():
    up = (1.0, 0.0, 0.0)
    centre = [
        BoneDef("Hips", "", (0.0, 0.0, 0.95), (0.0, 0.0, 1.05), up),
        BoneDef("Spine", "Hips", (0.0, 0.0, 1.05), (0.0, 0.0, 1.17), up, True),
        BoneDef("Spine1", "Spine", (0.0, 0.0, 1.17), (0.0, 0.0, 1.29), up, True),
        BoneDef("Spine2", "Spine1", (0.0, 0.0, 1.29), (0.0, 0.0, 1.45), up, True),
        BoneDef("NeckLower", "Spine2", (0.0, 0.0, 1.45), (0.0, -0.005, 1.52), up, True),
        BoneDef("NeckUpper", "NeckLower", (0.0, -0.005, 1.52), (0.0, -0.01, 1.58), up, True),
        BoneDef("Head", "NeckUpper", (0.0, -0.01, 1.58), (0.0, -0.01, 1.78), up, True),
        BoneDef("HeadTop_End", "Head", (0.0, -0.01, 1.78), (0.0, -0.01, 1.81), up, True),
    ]
    return centre + _side_bones(1) + _side_bones(-1)


BONES = tuple(_all_bones())
BONE_NAMES = tuple(b.name for b in BONES)
BONE_INDEX = {name: i for i, name in enumerate(BONE_NAMES)}
PARENT_INDEX = tuple(BONE_INDEX[b.parent] if b.parent else -1 for b in BONES)
END_BONES = ("HeadTop_End", "LeftToe_End", "RightToe_End")


def _normalize(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def frame_from(y_axis, x_hint):
    """Rotation (..., 3, 3) whose columns are X, Y, Z with Y along y_axis and X as close to x_hint as possible."""
    y = _normalize(y_axis)
    z = _normalize(np.cross(x_hint, y))
    x = np.cross(y, z)
    return np.stack([x, y, z], axis=-1)


def blender_roll_frame(direction, roll):
    """Blender's vec_roll_to_mat3: the rest frame Blender builds from a bone direction and its roll."""
    x, y, z = _normalize(direction)
    theta = 1.0 + y
    theta_alt = x * x + z * z
    if theta > 1e-5 or theta_alt > 1e-9:
        if theta <= 1e-5:
            theta = theta_alt * 0.5 + theta_alt * theta_alt * 0.125
        b = np.array([[1 - x * x / theta, x, -x * z / theta],
                      [-x, y, -z],
                      [-x * z / theta, z, 1 - z * z / theta]])
    else:
        b = np.diag([-1.0, -1.0, 1.0])
    return axis_angle_to_matrix(_normalize(direction) * roll) @ b


def roll_for_frame(frame):
    """The roll that makes Blender build `frame` from the bone's direction (inverse of blender_roll_frame)."""
    y = frame[:, 1]
    base_x = blender_roll_frame(y, 0.0)[:, 0]
    return float(np.arctan2(np.dot(np.cross(base_x, frame[:, 0]), y), np.dot(base_x, frame[:, 0])))


REST_HEADS = np.array([b.head for b in BONES], dtype=np.float64)
REST_TAILS = np.array([b.tail for b in BONES], dtype=np.float64)
REST_FRAMES = np.stack([frame_from(np.subtract(b.tail, b.head), b.x_hint) for b in BONES])
REST_ROLLS = tuple(roll_for_frame(f) for f in REST_FRAMES)


def rig_bones():
    """[(name, parent or None, head, tail, roll, connect)] in parent-first order, for building edit bones."""
    return [(b.name, b.parent or None, tuple(map(float, b.head)), tuple(map(float, b.tail)), roll, b.connect)
            for b, roll in zip(BONES, REST_ROLLS)]
