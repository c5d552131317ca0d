"""Bake: solve every frame of a range with an armature's model and write the result as a new action
'<source>.nik' (targets from an action's own effectors, hips given) or '<armature>.nik' (targets from the empties).

`bake` is the whole procedure; the evaluation calls it as the Bake operator does. Raises LiveError with a message
for the user.
"""

import math

import bpy
import numpy as np

from ...neural_network.data.files import FileRefused
from ...neural_network.geometry import kinematics
from ...neural_network.geometry.quaternion_math import matrices_to_quaternions
from ...neural_network.ik import foot_lock, layering, terrain
from ...neural_network.runtime.free_targets import FreeTargets
from ...neural_network.runtime.solver import Solver
from ...neural_network.runtime.status import HELD, HELD_BAD_TARGETS, describe
from ...neural_network.skeleton.roles import FOOT_ROLES, NUM_ROLES, ROLE_INDEX, TASKS
from ..errors import LiveError
from ..live.ground import Ground
from ..live.motion import LAYER_SLOTS, TARGET_LABELS, free_flags, targets_from_action
from ..live.tick import LiveCharacter, missing_targets, targets_of
from ..models import model_of, rig_of
from ..rig import action_layouts, control_rig, evaluated_pose, pose_read, pose_write, rig_model
from .extract import scene_fps

TOES = [ROLE_INDEX["LeftToeBase"], ROLE_INDEX["RightToeBase"]]   # the balls of the feet


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
    """BakeSource of an action's frames frame_start..frame_end (0: its own first / last frame). Raises LiveError for
    an action that animates none of the rig's bones (there would be nothing to re-solve)."""
    if not action_layouts.animated_bones(obj, action) & set(rig.bone_names):
        raise LiveError(f"the action {action.name!r} animates no bone of {obj.name}: nothing to re-solve")
    frames, targets, hips_rot, hips_pos, contacts, task, sample = targets_from_action(
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


def free_set(obj):
    """(6,) bool: the targets the armature leaves free (layer_<target>.free). LiveError when all six are."""
    free = free_flags(obj)
    if free.all():
        raise LiveError("all six targets are free: pin at least one")
    return free


def free_targets(model, free, prior=None):
    """FreeTargets for the model, or LiveError in words (the model has no prior)."""
    try:
        return FreeTargets(model, free, prior)
    except ValueError as exc:          # NoPrior, or all six free
        raise LiveError(str(exc)) from None


REST_VALUES = {"location": 0.0, "rotation_euler": 0.0, "scale": 1.0, "rotation_quaternion": (1.0, 0.0, 0.0, 0.0),
               "rotation_axis_angle": (0.0, 0.0, 1.0, 0.0)}


def _above_hips_at_rest(inbetween, hips, above):
    """A source's channel values with the hips left out (a free root: keyed from the solve) and the bones above the
    hips keyed at rest (the solve's hips are the whole of their motion)."""
    out = {bone: values for bone, values in inbetween.items() if bone != hips}
    for bone in above:
        if bone in out:
            out[bone] = {prop: np.broadcast_to(np.asarray(REST_VALUES[prop], np.float64), v.shape).copy()
                         for prop, v in out[bone].items()}
    return out


def _check_free(free, lock_feet, settings):
    """Refuse, in words, settings that would read a free foot from the clip: Lock Feet and the Ground fit the feet the
    clip gives."""
    if not (free[3] or free[4]):
        return
    if lock_feet:
        raise LiveError("Lock Feet holds the feet where the clip plants them, but a foot is free: pin both feet or "
                        "turn Lock Feet off")
    if settings.ground_object is not None or settings.ground_collection is not None:
        raise LiveError("the Ground fits the feet the clip gives, but a foot is free: pin both feet or clear the "
                        "Ground")


def check_layers(obj):
    """Refuse, in words, layer influences that would be ignored or poison the bake: one that is not a number, and
    one set (or keyed) on a target that has no empty to come from (Create Targets makes them)."""
    settings = obj.neural_ik
    for slot, label, empty in zip(LAYER_SLOTS, TARGET_LABELS, targets_of(obj)):
        layer = getattr(settings, slot)
        if layer.free and (layer.position != 0 or layer.rotation != 0):
            raise LiveError(f"the {label} is free, but its influences pin it to its target: set them to 0 or pin it")
        for kind in ("position", "rotation"):
            value = getattr(layer, kind)
            if not math.isfinite(value):
                raise LiveError(f"the {label}'s {kind} influence is not a number: set it between 0 and 1")
            if empty is None and (value != 0 or _layers_animated(obj, slot + ".")):
                raise LiveError(f"the {label}'s influences pin it to its target, but {obj.name} has no {label} "
                                "target: Create Targets first (nik.py create-targets), or set them to 0")


def _layers(context, obj, rig, frames):
    """A function that blends the armature's target empties into (F, 6, 4, 4) targets of a source action where its
    layer influences (keyable, so sampled at every frame) say; None when no empty has any influence."""
    settings = obj.neural_ik
    layers = [getattr(settings, slot) for slot in LAYER_SLOTS]
    empties = targets_of(obj)
    present = np.array([e is not None for e in empties])
    still = [layer.position == 0 and layer.rotation == 0 for layer, here in zip(layers, present) if here]
    if not present.any() or (all(still) and not _layers_animated(obj)):
        return None
    scene = context.scene
    sampled = np.broadcast_to(np.eye(4), (len(frames), len(empties), 4, 4)).copy()
    position, rotation = np.zeros(sampled.shape[:2]), np.zeros(sampled.shape[:2])
    current = scene.frame_current
    try:
        for i, f in enumerate(frames):
            scene.frame_set(int(f))
            to_character = rig_model.world_to_character(obj, rig)
            for k, (empty, layer) in enumerate(zip(empties, layers)):
                if empty is not None:
                    sampled[i, k] = to_character @ np.array(empty.matrix_world, np.float64)
                    position[i, k], rotation[i, k] = layer.position, layer.rotation
    finally:
        scene.frame_set(current)
    if not (np.all(np.isfinite(position)) and np.all(np.isfinite(rotation))):
        raise LiveError("a keyed layer influence is not a number on some frames: key it between 0 and 1")
    if not (position.any() or rotation.any()):
        return None
    return lambda targets: layering.blend_targets(targets, sampled, position, rotation, present)


def _feet_within_limits(refiner, result):
    """Turn back each foot that the ground's tilt took past its ankle's joint limits (the model's), in place: the
    sole follows the surface only as far as the ankle allows. A foot is the end of its chain, so its turn moves no
    other effector."""
    feet = list(FOOT_ROLES)
    local = result.local[:, feet]
    clamped = refiner.clamp_to_limits(local, np.array(feet))
    if clamped is not local:
        result.quaternions[:, feet] = matrices_to_quaternions(clamped)
        result._local = None


def _layers_animated(obj, slot="layer_"):
    """Whether a driver or a key of the armature's action animates its layer influences (those of `slot`: all)."""
    ad = obj.animation_data
    if ad is None:
        return False
    curves = list(ad.drivers) + (list(action_layouts.all_action_fcurves(ad.action)) if ad.action is not None else [])
    return any(fc.data_path.startswith(f"neural_ik.{slot}") for fc in curves)


def edit_targets(targets, hips_rotation, hips_position, links, rig, lock_feet, ground, world_to_character, fps, frames):
    """The edits of a clip's targets before the solve: Lock Feet (ik.foot_lock), the ground under each foot
    (ik.terrain, rays through `ground`), and the body brought down where a leg cannot reach its foot
    (foot_lock.hips_drop). Returns (the edited targets, or None where neither edit runs; the hips position (None
    where the root target places the hips); the planted feet (F, 2) or None; the planted feet the ground fit stands
    on the surface (a contact's landing or lift-off frames over another step leave it: terrain.hold_across_edges),
    or None; a note for the summary). The targets given are not changed."""
    if not lock_feet and ground is None:
        return None, hips_position, None, None, ""
    planted = foot_lock.planted_feet(foot_lock.foot_positions(targets), fps, rig.skeleton.height)
    notes = [f"{planted.mean() * 100:.0f} % of the feet's frames planted"]
    if lock_feet:
        targets = foot_lock.lock_feet(targets, planted, max_offset=foot_lock.RELEASE * rig.skeleton.height)
    lift = np.zeros(len(targets))
    standing = planted
    if ground is not None:
        heights, normals, standing = _ground_under_feet(ground, targets, planted, rig.skeleton, world_to_character,
                                                        frames)
        fitted, lift = terrain.fit_to_ground(targets, standing, heights, normals)
        _lift_sunk_balls(ground, fitted, targets, standing, rig.skeleton, world_to_character, frames)
        targets = fitted
        notes.append(f"on {', '.join(sorted(ground.names))}")
    if hips_position is not None:
        hips_position = np.array(hips_position, np.float64)
        hips_position[:, 2] += lift
    hips_rotation = targets[:, 0, :3, :3] if hips_rotation is None else hips_rotation
    hips = targets[:, 0, :3, 3] if hips_position is None else hips_position
    drop = _hips_drop(rig.skeleton, targets, hips_rotation, hips, links)
    if drop.any():       # the body comes down where a leg cannot otherwise reach its foot; the feet stay
        targets[:, list(foot_lock.BODY_TARGETS), 2, 3] -= drop[:, None]
        if hips_position is not None:
            hips_position[:, 2] -= drop
        notes.append(f"the body lowered up to {drop.max() * 100:.1f} cm")
    return targets, hips_position, planted, standing, "; " + ", ".join(notes)


def _ground_under_feet(ground, targets, planted, skeleton, world_to_character, frames):
    """(heights (F, 2), sole normals (F, 2, 3), the planted feet the fit stands on the ground (F, 2)) of the ground
    under each foot target, in character space: rays down at the ankle and at the ball of the foot (terrain.support,
    terrain.hold_across_edges; the ankle's ground alone on a rig without toes); raises LiveError where no ground lies
    under a foot."""
    ankles, ankle_normals = _cast(ground, foot_lock.foot_positions(targets), skeleton, world_to_character, frames)
    toes = _toe_offsets(skeleton)
    if toes is None:
        return ankles[..., 2], ankle_normals, planted
    balls, ball_normals = _cast(ground, terrain.balls(targets, toes), skeleton, world_to_character, frames)
    heights, normals, edges = terrain.support(ankles, balls, ankle_normals, ball_normals)
    return terrain.hold_across_edges(planted, heights, normals, edges)


def _toe_offsets(skeleton):
    """(2, 3) where each toe bone's head sits in its foot's frame; None on a rig without toe bones."""
    return skeleton.offsets[TOES] if skeleton.role_mask[TOES].all() else None


def _cast(ground, points, skeleton, world_to_character, frames):
    """(hits (F, 2, 3), unit normals (F, 2, 3)) in character space of the ground under character-space points
    (F, 2, 3) (a foot each); raises LiveError where none lies under a point."""
    to_world = np.linalg.inv(world_to_character)
    scale = np.linalg.norm(to_world[:3, 2])          # character metres -> world units
    world = points.reshape(-1, 3) @ to_world[:3, :3].T + to_world[:3, 3]
    h, n = ground.cast(world, 2.0 * skeleton.height * scale)
    missing = np.flatnonzero(~np.isfinite(h))
    if len(missing):
        i = int(missing[0])
        raise LiveError(f"no ground under the {('left', 'right')[i % 2]} foot at frame {int(frames[i // 2])}: "
                        f"{', '.join(sorted(ground.names))} is not within {2 * skeleton.height:.1f} m below it")
    hits = np.concatenate([world[:, :2], h[:, None]], axis=1) @ world_to_character[:3, :3].T + world_to_character[:3, 3]
    n = n @ world_to_character[:3, :3].T
    return hits.reshape(points.shape), (n / np.linalg.norm(n, axis=-1, keepdims=True)).reshape(points.shape)


def _lift_sunk_balls(ground, fitted, clip, planted, skeleton, world_to_character, frames, balls=None):
    """Raise each fitted foot target (in place) where, planted, the ball of its foot would sink below the ground it
    stands over (by less than the clip's own ball height above its flat ground); returns the largest sink (m). The
    balls are where `fitted` puts them (the sole plane is fitted at the clip's ball and the tilt moves it a little)
    or, given, where a solve put them (its ankle turned back inside the joint limits). Only planted feet are raised:
    in the swing the toes may pass close to a step's nose, as the clip's did over its flat floor."""
    toes = _toe_offsets(skeleton)
    if toes is None:
        return 0.0
    balls = terrain.balls(fitted, toes) if balls is None else balls
    hits, _normals = _cast(ground, balls, skeleton, world_to_character, frames)
    sink = np.where(planted, np.maximum(hits[..., 2] + terrain.balls(clip, toes)[..., 2] - balls[..., 2], 0.0), 0.0)
    fitted[:, list(foot_lock.FOOT_TARGETS), 2, 3] += sink
    return float(sink.max())


def _solve_edited(solver, network, edited, iterations, clip, planted, ground, rig, links, world_to_character, frames):
    """The network's pose of the clip refined toward the edited targets. On the ground, a foot that the surface's
    tilt took past its ankle's limits is turned back; where its ball then sinks, the foot is raised and the pose
    refined again (twice at most)."""
    result = solver.refine_toward(network, edited, iterations, dt=1.0 / 30)
    if ground is None:
        return result
    _feet_within_limits(solver.refiner, result)
    for _ in range(2):
        pose = kinematics.forward(rig.skeleton, result.local, result.hips_rotation, result.hips_position,
                                  *(links if links is not None else (None, None)))
        if _lift_sunk_balls(ground, edited, clip, planted, rig.skeleton, world_to_character, frames,
                            balls=pose.positions[:, TOES]) < 1e-3:
            break
        result = solver.refine_toward(network, edited, iterations, dt=1.0 / 30)
        _feet_within_limits(solver.refiner, result)
    return result


def _hips_drop(skeleton, targets, hips_rotation, hips_position, links):
    """foot_lock.hips_drop for the locked targets: the thighs' heads from the given hips (and moving in-between
    bones), the legs' lengths from the skeleton."""
    thighs = [ROLE_INDEX["LeftThigh"], ROLE_INDEX["RightThigh"]]
    n = len(targets)
    rest = kinematics.forward(skeleton, np.broadcast_to(np.eye(3), (n, NUM_ROLES, 3, 3)), np.asarray(hips_rotation, np.float64),
                              hips_position, *(links if links is not None else (None, None)))
    return foot_lock.hips_drop(rest.positions[:, thighs], foot_lock.foot_positions(targets),
                               foot_lock.leg_lengths(skeleton))


def measured_controls(context, obj, rig):
    """The rig's ControlRig with both chains measured (None for a rig whose mapped bones are written directly): the
    switches as the user has them (measuring sets the limbs' IK/FK itself), the action taken off while measuring;
    everything put back."""
    controls = control_rig.control_rig(obj, rig)
    if controls is not None:
        with evaluated_pose.KeptScene(context.scene, obj):
            if obj.animation_data is not None:
                obj.animation_data.action = None
            controls.measure(both_chains=True)
    return controls


def bake(context, obj, source_action="", frame_start=0, frame_end=0, refine_iterations=4, lock_feet=False, free=None,
         prior=None):
    """Solve frames frame_start..frame_end (0: the source action's or the scene's first / last) and write them as a
    new action, assigned to the armature. Targets: the effectors of the action called `source_action` (its hips and
    unmapped in-between bones given and keyed with the source's values), else the armature's target empties
    (in-between bones as they are now). With `lock_feet` each planted foot's target is held where it landed
    (ik.foot_lock; contacts found in the targets' own motion, and they are the network's contact inputs). free:
    (6,) bool, the targets to leave free (default: the armature's Free settings); prior: what places them (default:
    the model's learned prior; the evaluation passes prior.UprightPrior for its baseline). Returns (the new action,
    a one-line summary)."""
    try:
        rig = rig_of(obj)
        model, data = model_of(obj, rig)
        free = free_set(obj) if free is None else np.asarray(free, bool)
        loose = free_targets(model, free, prior) if free.any() else None
        controls = measured_controls(context, obj, rig)
        settings = obj.neural_ik
        scene = context.scene
        inbetween = {}
        if source_action:
            action = bpy.data.actions.get(source_action)
            if action is None:
                raise LiveError(f"there is no action called {source_action!r}")
            check_layers(obj)
            source = bake_source(obj, rig, action, frame_start, frame_end, scene_fps(scene))
            frames, targets, hips_rot, hips_pos = source.frames, source.targets, source.hips_rotation, source.hips_position
            contacts, task, links, inbetween = source.contacts, source.task, source.links, source.inbetween
            name, desired, key_hips = f"{action.name}.nik", contacts, not source.keys_hips
            if free[0] and source.keys_hips:     # the solve places the hips: the bones above them rest
                inbetween = _above_hips_at_rest(inbetween, rig.bone_names[int(rig.role_bones[0])],
                                                moving_bones_above_hips(obj, rig, action))
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
        if loose is not None:
            _check_free(free, lock_feet, settings)
            targets[:, free] = np.eye(4)        # a free target is not read from the clip or its empty: gone ...
            targets = loose.complete(targets, True, 1.0 / scene_fps(scene))   # ... the prior's guess stands in below
            if free[0]:                         # the hips come from the solve, and are keyed
                hips_rot = hips_pos = None
                key_hips = True
        ground = Ground.of(settings, context.evaluated_depsgraph_get())
        edited, hips_pos, planted, standing, note = edit_targets(
            targets, hips_rot, hips_pos, links, rig, lock_feet, ground, rig_model.world_to_character(obj, rig),
            scene_fps(scene), frames)
        blend = _layers(context, obj, rig, frames) if source_action else None
        if blend is not None:      # the pins last, as live: the body's lift and drop do not move a pinned hand
            edited = None if edited is None else blend(edited)
            targets = blend(targets)
        if planted is not None:
            contacts = desired = planted.astype(np.float64)
        # from the empties (targets a user moved), frames in order with the refinement's memory, as live ticks; a
        # source action's own motion is continuous already, and the memory's held swivels would only cost its inner
        # joints (a quickly fitted model's held-out clips: 0.52 cm refined inner without it, 1.51 with it)
        solver = Solver(model, data, characters=n, links=links, sequence=not source_action)
        phase = (np.arange(n) / max(n, 1)) % 1.0
        if loose is not None:      # free targets: the prior places them, frame after frame
            loose.step(solver, targets if edited is None else edited, max(refine_iterations, 1), sequence=True,
                       clip_dt=1.0 / scene_fps(scene), ground=0.0, desired_contact=desired, task=np.full(n, task),
                       phase=phase, dt=1.0 / 30, contact=contacts)
            result = solver.result()
        elif edited is None:
            result = solver.solve(targets, 0.0, desired, np.full(n, task), phase,
                                  refine_iterations=refine_iterations, dt=1.0 / 30, contact=contacts)
        else:      # the network sees the clip as training did (flat ground); the refinement reaches the edit
            network = solver.solve(targets, 0.0, desired, np.full(n, task), phase, dt=1.0 / 30, contact=contacts)
            result = _solve_edited(solver, network, edited, max(refine_iterations, 1), targets, standing, ground, rig,
                                   links, rig_model.world_to_character(obj, rig), frames)
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
    held_note = f"; {held} frames held the previous pose ({describe(HELD_BAD_TARGETS)})" if held else ""
    return action, f"baked {n} frames into {action.name!r} (worst effector miss {worst:.2f} cm{note}){held_note}"
