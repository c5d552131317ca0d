"""Bake: solve every frame of a range with an armature's model and write the result as a new action
'<source>.nik' (targets from an action's own effectors, hips given) or '<armature>.nik' (targets from the empties).

`bake` is the whole procedure; the evaluation calls it as the Bake operator does. Raises LiveError with a message
for the user.
"""

import bpy
import numpy as np

from ..neural_network.data.features import detect_contacts
from ..neural_network.data.files import FileRefused
from ..neural_network.geometry import kinematics
from ..neural_network.runtime.solver import Solver
from ..neural_network.runtime.status import HELD, HELD_BAD_TARGETS, describe
from ..neural_network.skeleton.roles import EFFECTOR_ROLES, FOOT_ROLES, ROLE_INDEX, TASKS
from . import action_layouts, control_rig, evaluated_pose, pose_read, pose_write, rig_model
from .errors import LiveError
from .extract import action_task
from .live import LiveCharacter, missing_targets
from .models import model_of, rig_of


class BakeSource:
    """What a bake from an action takes from it: per frame the targets (its own effectors), the hips, its contacts,
    and what FK needs where unmapped in-between bones move (CMU's CC_Base_Pelvis): their bridges/offsets for the
    solve and their channel values for the baked action - given, as the hips are."""

    def __init__(self, frames, targets, hips_rotation, hips_position, contacts, task, links, inbetween):
        self.frames, self.targets, self.contacts, self.task = frames, targets, contacts, task
        self.hips_rotation, self.hips_position = hips_rotation, hips_position
        self.links = links              # (bridges (F, 23, 3, 3), offsets (F, 23, 3)) or None where the rest's hold
        self.inbetween = inbetween      # {bone: {property: (F, width)}} for pose_write.key_bone_values
        self.keys_hips = False          # inbetween holds the hips and the bones above them that move them


def bake_source(obj, rig, action, frame_start, frame_end, fps):
    """BakeSource of an action's frames frame_start..frame_end (0: its own first / last frame)."""
    frames, targets, hips_rot, hips_pos, contacts, task, sample = _targets_from_action(
        obj, rig, action, frame_start, frame_end, fps)
    links = (sample.bridges, sample.offsets) if sample.moving_links else None
    bones = rig_model.inbetween_bones(rig) if not rig.driven else []     # a control rig: its controls are keyed
    above = moving_bones_above_hips(obj, rig, action)
    if above:        # a root above the hips moves them: the hips are given as the source keys them, root and all
        bones = bones + above + [rig.bone_names[int(rig.role_bones[0])]]
    inbetween = pose_read.read_bone_values(rig, obj, action, bones, frames[0], frames[-1]) if bones else {}
    source = BakeSource(frames, targets, hips_rot, hips_pos, contacts, task, links, inbetween)
    source.keys_hips = bool(above)
    return source


def moving_bones_above_hips(obj, rig, action):
    """Names of the hips bone's ancestors (a root bone) that the action animates, root first; [] for a driven rig
    (its controls are written instead)."""
    if rig.driven:
        return []
    animated = action_layouts.animated_bones(obj, action)
    above = []
    b = int(rig.parents[int(rig.role_bones[0])])
    while b >= 0:
        above.append(rig.bone_names[b])
        b = int(rig.parents[b])
    return [name for name in reversed(above) if name in animated]


def _targets_from_action(obj, rig, action, frame_start, frame_end, fps):
    sample = pose_read.read_action(rig, obj, action, frame_start if frame_start > 0 else None,
                                frame_end if frame_end > 0 else None)
    if len(sample.frames) == 0:
        raise LiveError(f"action {action.name!r} has no frames in {frame_start}-{frame_end}")
    n = len(sample.frames)
    targets = np.broadcast_to(np.eye(4), (n, 6, 4, 4)).copy()
    roles = [ROLE_INDEX["Hips"]] + list(EFFECTOR_ROLES)
    targets[:, :, :3, :3] = sample.rotations[:, roles]
    targets[:, :, :3, 3] = sample.positions[:, roles]
    contacts = detect_contacts(sample.positions[:, list(FOOT_ROLES)], 0.0, fps, rig.skeleton.height)
    task = action_task(action)
    return sample.frames, targets, sample.hips_rotation, sample.hips_position, contacts, task, sample


def bake_targets_from_empties(context, obj, rig, frame_start, frame_end):
    """Sample the target empties at every frame (scene.frame_set; the current frame is restored)."""
    scene = context.scene
    character = LiveCharacter(obj, rig, None)
    frames = np.arange(frame_start, frame_end + 1)
    targets = np.zeros((len(frames), 6, 4, 4))
    current = scene.frame_current
    try:
        for i, f in enumerate(frames):
            scene.frame_set(int(f))
            character.read_targets(targets[i])
    finally:
        scene.frame_set(current)
    return frames, targets


def measured_controls(context, obj, rig):
    """The rig's ControlRig with its offsets measured (None for a rig whose mapped bones are written directly): the
    switches set to what the solver needs and the action taken off while measuring; everything put back."""
    controls = control_rig.control_rig(obj, rig)
    if controls is not None:
        with evaluated_pose.KeptScene(context.scene, obj):
            if obj.animation_data is not None:
                obj.animation_data.action = None
            controls.set_switches()
            controls.measure()
        controls.saved_switches = None      # KeptScene put them back
    return controls


def bake(context, obj, source_action="", frame_start=0, frame_end=0, refine_iterations=4):
    """Solve frames frame_start..frame_end (0: the source action's or the scene's first / last) and write them as a
    new action, assigned to the armature. Targets: the effectors of the action called `source_action` (its hips and
    unmapped in-between bones given and keyed with the source's values), else the armature's target empties
    (in-between bones as they are now). Returns (the new action, a one-line summary)."""
    try:
        rig = rig_of(obj)
        model, data = model_of(obj, rig)
        controls = measured_controls(context, obj, rig)
        settings = obj.neural_ik
        scene = context.scene
        inbetween = {}
        if source_action:
            action = bpy.data.actions.get(source_action)
            if action is None:
                raise LiveError(f"there is no action called {source_action!r}")
            source = bake_source(obj, rig, action, frame_start, frame_end, scene.render.fps / scene.render.fps_base)
            frames, targets, hips_rot, hips_pos = source.frames, source.targets, source.hips_rotation, source.hips_position
            contacts, task, links, inbetween = source.contacts, source.task, source.links, source.inbetween
            name, desired, key_hips = f"{action.name}.nik", contacts, not source.keys_hips
        else:
            missing = missing_targets(obj)
            if missing:
                raise LiveError(f"{obj.name} has no {', '.join(missing)} target: give a source action or "
                                "create targets")
            start = frame_start or scene.frame_start
            end = frame_end or scene.frame_end
            if end < start:
                raise LiveError(f"the frame range {start}-{end} is empty")
            frames, targets = bake_targets_from_empties(context, obj, rig, start, end)
            links = pose_read.current_links(obj, rig) if not rig.driven else None   # in-between bones stay as now
            bones = rig_model.inbetween_bones(rig) if links is not None else []
            inbetween = pose_read.current_bone_values(rig, obj, bones, len(frames)) if bones else {}
            hips_rot = hips_pos = None
            contacts, key_hips = None, True
            desired = np.array([[settings.contact_left, settings.contact_right]], np.float64)
            task = TASKS.index(settings.task.lower())
            name = f"{obj.name}.nik"
        n = len(frames)
        solver = Solver(model, data, characters=n, links=links, sequence=True)      # frames in order, as live ticks
        phase = (np.arange(n) / max(n, 1)) % 1.0
        result = solver.solve(targets, 0.0, desired, np.full(n, task), phase,
                              refine_iterations=refine_iterations, dt=1.0 / 30, contact=contacts)
        if hips_rot is None:
            hips_rot, hips_pos = result.hips_rotation, result.hips_position
    except (FileRefused, rig_model.RigError, control_rig.ControlRigError) as exc:
        raise LiveError(str(exc)) from None
    held = int(np.count_nonzero(result.status & HELD))
    if controls is not None:      # a control rig: key its controls so that its deform bones take the solved pose
        pose = kinematics.forward(rig.skeleton, result.local, np.asarray(hips_rot, np.float64),
                                  np.asarray(hips_pos, np.float64), *(links if links is not None else (None, None)))
        action, _slot, container = action_layouts.new_action(obj, name)
        action.use_fake_user = True
        scales = control_rig.role_scales(rig.skeleton, pose.offsets) if links is not None else None
        controls.key(container, frames, controls.control_pose(
            control_rig.deform_worlds(rig, pose.rotations, pose.positions, scales)))
    else:
        action = pose_write.write_action(obj, rig, name, frames, result.local, hips_rot, hips_pos, key_hips=key_hips)
    if inbetween:
        pose_write.key_bone_values(obj, action, frames, inbetween)
    ad = obj.animation_data_create()
    ad.action = action
    if hasattr(ad, "action_slot") and len(action.slots):
        ad.action_slot = action.slots[0]
    errors = result.errors[np.isfinite(result.errors).all(axis=1)]
    worst = float(errors.max()) * 100 if len(errors) else float("nan")
    note = f"; {held} frames held the previous pose ({describe(HELD_BAD_TARGETS)})" if held else ""
    return action, f"baked {n} frames into {action.name!r} (worst effector miss {worst:.2f} cm){note}"
