"""Shared by the live-IK tests: a small humanoid Skeleton, models on it, and poses with their targets.

The models here are real Models (the class the trainer produces): either random weights, or a linear layer fitted by
least squares to poses of the skeleton, which is a weak but honest network whose errors refinement must fix.
"""

import numpy as np

from neural_ik.neural_network.data.features import FeatureSpec, build_inputs, references_from_data
from neural_ik.neural_network.geometry import kinematics
from neural_ik.neural_network.geometry.rotations import axis_angle_to_matrix, matrix_to_axis_angle
from neural_ik.neural_network.model.model import Model
from neural_ik.neural_network.skeleton.roles import EFFECTOR_ROLES, NUM_ROLES, ROLE_INDEX, ROLE_PARENTS, ROLES
from neural_ik.neural_network.skeleton.skeleton import Skeleton

OFFSETS = {
    "Spine": (0, 0, 0.10), "Spine1": (0, 0, 0.12), "Spine2": (0, 0, 0.12), "NeckLower": (0, 0, 0.18),
    "NeckUpper": (0, 0, 0.05), "Head": (0, 0, 0.06),
    "LeftShoulder": (0.03, 0, 0.15), "LeftArm": (0.15, 0, 0), "LeftForeArm": (0.28, 0, 0), "LeftHand": (0.25, 0, 0),
    "RightShoulder": (-0.03, 0, 0.15), "RightArm": (-0.15, 0, 0), "RightForeArm": (-0.28, 0, 0),
    "RightHand": (-0.25, 0, 0),
    "LeftThigh": (0.1, 0, -0.05), "LeftShin": (0, 0, -0.42), "LeftFoot": (0, 0, -0.42), "LeftToeBase": (0, -0.14, -0.07),
    "RightThigh": (-0.1, 0, -0.05), "RightShin": (0, 0, -0.42), "RightFoot": (0, 0, -0.42),
    "RightToeBase": (0, -0.14, -0.07),
}
HIPS_HEIGHT = 1.0


def humanoid_skeleton(drop=(), twist=0.0):
    """A T-posed humanoid in character space; `drop` leaves roles unmapped, `twist` turns every bridge (radians)."""
    names = ["" if role in drop else f"bone_{role}" for role in ROLES]
    offsets = np.array([[0, 0, 0]] + [OFFSETS[r] for r in ROLES[1:]], np.float64)
    for j, role in enumerate(ROLES):   # an unmapped role's offset folds into its children
        if role in drop:
            for c in range(NUM_ROLES):
                if ROLE_PARENTS[c] == j:
                    offsets[c] = offsets[c] + offsets[j]
    bridges = np.broadcast_to(axis_angle_to_matrix(np.array([0.0, twist, 0.0])), (NUM_ROLES, 3, 3)).copy()
    bridges[0] = np.eye(3)
    skel = Skeleton(names, offsets, bridges, np.broadcast_to(np.eye(3), (NUM_ROLES, 3, 3)), np.zeros((NUM_ROLES, 3)),
                    name="test humanoid")
    pose = kinematics.forward(skel, np.broadcast_to(np.eye(3), (1, NUM_ROLES, 3, 3)).copy(), np.eye(3)[None],
                              np.array([[0, 0, HIPS_HEIGHT]]))
    skel.rest_positions = np.where(skel.role_mask[:, None], pose.positions[0], 0.0)
    skel.rest_rotations = pose.rotations[0]
    return skel


def mean_pose(seed=0):
    rng = np.random.default_rng(seed)
    return axis_angle_to_matrix(rng.normal(0, 0.15, (NUM_ROLES, 3)))


def limits(width=1.2):
    low = np.full((NUM_ROLES, 3), -width)
    return low, -low


def random_poses(skeleton, n, seed=1, spread=0.35, mean=None):
    """n poses: local rotations near `mean`, a random hips transform; returns (local, hips_R, hips_p, FK pose)."""
    rng = np.random.default_rng(seed)
    mean = mean_pose() if mean is None else mean
    deltas = rng.normal(0, spread, (n, NUM_ROLES, 3))
    local = mean[None] @ axis_angle_to_matrix(deltas)
    local[:, ~skeleton.role_mask] = np.eye(3)
    hips_R = axis_angle_to_matrix(rng.normal(0, 0.3, (n, 3)) + np.array([0, 0, 1]) * rng.uniform(-3, 3, (n, 1)))
    hips_p = rng.normal(0, 0.5, (n, 3)) + np.array([0, 0, HIPS_HEIGHT])
    pose = kinematics.forward(skeleton, local, hips_R, hips_p)
    return local, hips_R, hips_p, pose


def targets_of(pose, hips_R, hips_p):
    """(n, 6, 4, 4) target matrices in character space (root, then the five effectors) from an FK pose."""
    n = len(hips_R)
    out = np.broadcast_to(np.eye(4), (n, 6, 4, 4)).copy()
    out[:, 0, :3, :3], out[:, 0, :3, 3] = hips_R, hips_p
    out[:, 1:, :3, :3] = pose.rotations[:, list(EFFECTOR_ROLES)]
    out[:, 1:, :3, 3] = pose.positions[:, list(EFFECTOR_ROLES)]
    return out


def inputs_of(spec, pose, hips_R, task=0, phase=0.0, ground=0.0):
    n = len(hips_R)
    return build_inputs(spec, pose.positions, pose.rotations, hips_R, np.full((n, 2), ground), np.zeros((n, 2)),
                        np.ones((n, 2)), np.full(n, phase), np.full(n, task))


def random_model(skeleton, hidden=(32, 24), seed=2, spec=None):
    rng = np.random.default_rng(seed)
    sizes = [50, *hidden, NUM_ROLES * 3]
    weights = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        weights += [rng.normal(0, 1 / np.sqrt(a), (a, b)).astype(np.float32), rng.normal(0, 0.1, b).astype(np.float32)]
    spec = spec or FeatureSpec(np.broadcast_to(np.eye(3), (5, 3, 3)).copy(), np.eye(3))
    low, high = limits()
    return Model(skeleton, spec, weights, rng.normal(0, 0.3, 50).astype(np.float32),
                 rng.uniform(0.5, 2.0, 50).astype(np.float32), mean_pose(), low, high, meta={"metrics": {"test": 1}})


def fitted_model(skeleton, n=3000, seed=3, spread=0.3):
    """A linear Model (no hidden layer) fitted by ridge regression to random poses of the skeleton."""
    mean = mean_pose()
    local, hips_R, hips_p, pose = random_poses(skeleton, n, seed=seed, spread=spread, mean=mean)
    spec = references_from_data(pose.positions, pose.rotations, hips_R)
    x = inputs_of(spec, pose, hips_R).astype(np.float64)
    deltas = matrix_to_axis_angle(np.swapaxes(mean, -1, -2)[None] @ local).reshape(n, -1)
    mu, sd = x.mean(0), np.maximum(x.std(0), 1e-3)
    z = np.concatenate([(x - mu) / sd, np.ones((n, 1))], axis=1)
    coef = np.linalg.solve(z.T @ z + 1e-3 * np.eye(z.shape[1]), z.T @ deltas)
    low, high = limits(1.6)
    return Model(skeleton, spec, [coef[:-1].astype(np.float32), coef[-1].astype(np.float32)], mu.astype(np.float32),
                 sd.astype(np.float32), mean, low, high)


def mpjpe(a, b, mask):
    return float(np.mean(np.linalg.norm(a[:, mask] - b[:, mask], axis=-1)))


__all__ = ["humanoid_skeleton", "limits", "mean_pose", "random_model", "fitted_model", "random_poses", "targets_of",
           "inputs_of", "mpjpe", "ROLE_INDEX"]


# ---- Blender side --------------------------------------------------------------------------------------------------

def demo_armature():
    """The demo rig with its actions, made by the add-on's own create_demo_rig (the active object afterwards)."""
    import bpy

    bpy.ops.neural_ik.create_demo_rig()
    return bpy.context.active_object


def drive_with(obj, model):
    """Make `model` (a Model built in the test) the armature's model, the way blender/models.py holds a model given in
    memory: cached under the key "" with no model path. A path left on the armature (create_demo_rig points it at
    the shipped weights/demo.npz) would win over the cached model, and the operators would run the shipped one."""
    from neural_ik.blender import models

    obj.neural_ik.model_path = ""
    models.loaded_models[obj.name] = ("", model, None)


def runs(obj, model):
    """Whether the armature's operators use `model` now (blender/models.model_of gives that very object): how a test
    shows which model ran."""
    from neural_ik.blender import models

    return models.model_of(obj)[0] is model


def assign_action(obj, action):
    ad = obj.animation_data_create()
    ad.action = action
    if hasattr(ad, "action_slot") and len(action.slots):
        ad.action_slot = action.slots[0]


def follow_empties(obj, position=1.0, rotation=1.0):
    """Every target's layer influences set (1: the empties drive, also while the rig's action plays in Run IK)."""
    from neural_ik.blender.live.motion import LAYER_SLOTS

    for slot in LAYER_SLOTS:
        layer = getattr(obj.neural_ik, slot)
        layer.position, layer.rotation = position, rotation


def make_sliding(rig, action, factor=1.06):
    """Make a walk slide, in place: its hips' location keys travel `factor` times as far as its steps (as a clip
    retargeted onto longer legs does)."""
    from neural_ik.blender.rig import action_layouts

    hips = rig.bone_names[int(rig.role_bones[0])]
    for fc in action_layouts.all_action_fcurves(action):
        if fc.data_path == f'pose.bones["{hips}"].location':
            co = np.empty(2 * len(fc.keyframe_points))
            fc.keyframe_points.foreach_get("co", co)
            co[1::2] = co[1] + factor * (co[1::2] - co[1])
            fc.keyframe_points.foreach_set("co", co)
            fc.update()


def evaluated_effectors(obj, rig, action, frames):
    """(len(frames), 5, 3) effector positions in metres (character space) from Blender's own evaluated pose: the action
    assigned to obj, each frame set with scene.frame_set, the heads read with pose_read.armature_pose_heads."""
    import bpy

    from neural_ik.blender.rig import pose_read

    assign_action(obj, action)
    out = []
    for frame in frames:
        bpy.context.scene.frame_set(frame)
        out.append(pose_read.armature_pose_heads(obj, rig)[list(EFFECTOR_ROLES)])
    return np.array(out)


def sample_inputs(spec, skeleton, sample):
    """The network's inputs for every frame of a pose_read.ActionSample: its own pose as the targets, the ground at 0,
    the contacts detected in it (as flags and as the desired contact), the phase through the clip, the task its name
    says."""
    from neural_ik.neural_network.data.features import detect_contacts
    from neural_ik.neural_network.skeleton.roles import FOOT_ROLES, task_from_name

    n = len(sample.frames)
    contacts = detect_contacts(sample.positions[:, list(FOOT_ROLES)], 0.0, 30.0, skeleton.height)
    return build_inputs(spec, np.nan_to_num(sample.positions), sample.rotations, sample.hips_rotation, np.zeros((n, 2)),
                        contacts, contacts, np.arange(n) / n, np.full(n, task_from_name(sample.name)))


def linear_model_for(skeleton, samples):
    """A linear Model fitted by ridge regression to pose_read.ActionSamples (what a quickly trained network does)."""
    positions = np.concatenate([s.positions for s in samples])
    rotations = np.concatenate([s.rotations for s in samples])
    hips_R = np.concatenate([s.hips_rotation for s in samples])
    local = np.concatenate([s.local_rotations for s in samples])
    spec = references_from_data(np.nan_to_num(positions), rotations, hips_R)
    x = np.concatenate([sample_inputs(spec, skeleton, s) for s in samples]).astype(np.float64)
    from neural_ik.neural_network.geometry.rotations import chordal_mean

    mean = chordal_mean(local, axis=0)
    deltas = matrix_to_axis_angle(np.swapaxes(mean, -1, -2)[None] @ local)
    low = deltas.min(axis=0) - 0.2
    high = deltas.max(axis=0) + 0.2
    mu, sd = x.mean(0), np.maximum(x.std(0), 1e-3)
    z = np.concatenate([(x - mu) / sd, np.ones((len(x), 1))], axis=1)
    coef = np.linalg.solve(z.T @ z + 1e-2 * np.eye(z.shape[1]), z.T @ deltas.reshape(len(x), -1))
    return Model(skeleton, spec, [coef[:-1].astype(np.float32), coef[-1].astype(np.float32)], mu.astype(np.float32),
                 sd.astype(np.float32), mean, low, high)


def place_targets(obj, rig, sample, i):
    """Put the six target empties on frame i of a character-space ActionSample (world = armature matrix @ ...)."""
    from mathutils import Matrix

    from neural_ik.blender.live.tick import targets_of as target_objects

    roles = [0] + list(EFFECTOR_ROLES)
    world = np.array(obj.matrix_world)
    for target, role in zip(target_objects(obj), roles):
        m = np.eye(4)
        m[:3, :3] = rig.basis.T @ sample.rotations[i, role]
        m[:3, 3] = rig.basis.T @ sample.positions[i, role] / rig.scale
        target.matrix_world = Matrix((world @ m).tolist())


# ---- stand-ins for what only Blender's window gives a modal operator (timers never fire in the bpy module) ----

class StandInWindowManager:
    """Records what the modal operator asks of the window manager (timers never fire in the bpy module)."""

    def __init__(self):
        self.timers, self.handlers, self.removed = [], [], []

    def event_timer_add(self, step, window=None):
        self.timers.append(step)
        return ("timer", step)

    def event_timer_remove(self, timer):
        self.removed.append(timer)

    def modal_handler_add(self, op):
        self.handlers.append(op)


def runner_reporting_to(reports):
    """The Run operator's logic (operators.live.LiveRunner) as a class whose reports go to the list `reports` as
    (kind, message) instead of Blender's info bar."""
    from neural_ik.operators import live as live_ops

    class Runner(live_ops.LiveRunner):
        def report(self, kind, message):
            reports.append((next(iter(kind)), message))

    return Runner


class StandInContext:
    """The parts of a context the modal operators use, from the real bpy.context, with a recording window manager."""

    def __init__(self):
        import bpy

        self.scene = bpy.context.scene
        self.view_layer = bpy.context.view_layer
        self.active_object = bpy.context.active_object
        self.window = None
        self.window_manager = StandInWindowManager()

    @property
    def mode(self):
        import bpy

        return bpy.context.mode


class Event:
    def __init__(self, kind):
        self.type = kind
        self.value = "PRESS"


POSE_CHANNELS = (("rotation_quaternion", 4), ("rotation_euler", 3), ("rotation_axis_angle", 4), ("location", 3),
                 ("scale", 3))


def pose_channels(obj):
    """Every pose bone's rotation (all three modes), location and scale, concatenated as foreach_get reads them."""
    out = []
    for prop, width in POSE_CHANNELS:
        buf = np.empty(len(obj.pose.bones) * width, np.float32)
        obj.pose.bones.foreach_get(prop, buf)
        out.append(buf)
    return np.concatenate(out)
