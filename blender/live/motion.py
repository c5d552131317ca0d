"""An armature's action as the source of targets: its effectors at every frame (what Bake re-solves from a source
action), and `LiveMotion`, what a live tick takes from the rig's own action.

Run IK on a rig with an action follows the scene's frame. `LiveMotion` reads the action once, at session start
(`targets_from_action`: its effectors at every frame, and the contacts foot_lock.planted_feet finds in them), and per
tick takes the frame the scene is on (clamped to the action's range); then, as Bake does over a clip:

- Lock Feet and the ground under the feet: ik.online.OnlineEdits, the offline rules one frame at a time;
- layering: each empty blended in by its position and rotation influence (ik.layering). Influences keyed in the
  action are sampled at every frame at start (the action is off while live, so Blender no longer writes them);
  the others are read when a live setting is edited and in the tick's polled slices (drivers);
- the ground: rays down each foot through a cached `ground.Ground`, rebuilt only when a depsgraph update touched a
  ground mesh (`check`, from the session's depsgraph_update_post handler); no ground under a foot leaves it at the
  action's height, and the live status says so.

Unlike Bake, the edits of the feet and the body's rise with the ground come before the empties are blended in, and
the hips drop takes each body target's share (1 - its position influence): a hand pinned to an empty at influence 1
stays on it while the body rises and sinks.

Each frame's edits are kept (`memo`) until the ground or the armature moves or Lock Feet changes, and the first tick
works out the whole clip in order (`_fill`), so playing a clip casts no ray: a tick takes its frame's edits and
blends the empties in, if any.
"""

import math
import re

import bpy
import numpy as np

from ...neural_network.data.features import detect_contacts
from ...neural_network.geometry import kinematics
from ...neural_network.ik import foot_lock, layering
from ...neural_network.ik.online import OnlineEdits
from ...neural_network.skeleton.roles import EFFECTOR_ROLES, FOOT_ROLES, NUM_ROLES, ROLE_INDEX
from ..errors import LiveError, LiveStopped
from ..rig import action_layouts, pose_read
from ..rig.action_sources import action_task
from .ground import Ground, ground_objects

TARGET_SLOTS = ("target_root", "target_left_hand", "target_right_hand", "target_left_foot", "target_right_foot",
                "target_head")
LAYER_SLOTS = tuple(slot.replace("target_", "layer_") for slot in TARGET_SLOTS)   # properties.NIK_TargetLayer
TARGET_LABELS = ("root", "left hand", "right hand", "left foot", "right foot", "head")
_LAYER_PATH = re.compile(r"^neural_ik\.(layer_\w+)\.(position|rotation)$")
_BODY = list(foot_lock.BODY_TARGETS)
_FEET = list(foot_lock.FOOT_TARGETS)
_UP = (0.0, 0.0, 1.0)


def free_flags(obj):
    """(6,) bool: the targets the armature leaves free (layer_<target>.free; the model places them)."""
    return np.array([getattr(obj.neural_ik, slot).free for slot in LAYER_SLOTS], bool)


def targets_from_action(obj, rig, action, frame_start, frame_end, fps):
    """(frames (F,), targets (F, 6, 4, 4) character space, hips rotation (F, 3, 3), hips position (F, 3), contacts
    (F, 2), task index, the pose_read.ActionSample) of an action's frames frame_start..frame_end (0: its own first /
    last frame)."""
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


def target_source(has_empty, position, rotation, playing):
    """Where a target's value comes from, in words: "empty", "action", "blend" (some of each), or "no empty" (no
    action either: Run IK needs one)."""
    if not has_empty:
        return "action" if playing else "no empty"
    if not playing or (position >= 1.0 and rotation >= 1.0):
        return "empty"
    return "action" if position <= 0.0 and rotation <= 0.0 else "blend"


def thighs_in_hips_frame(skeleton, links=None):
    """(2, 3) the thighs' heads (left, right) in the hips' frame, in the rest pose (in-between bones as `links`:
    bridges (23, 3, 3) and offsets (23, 3), or None)."""
    thighs = [ROLE_INDEX["LeftThigh"], ROLE_INDEX["RightThigh"]]
    bridges, offsets = (None, None) if links is None else (links[0][None], links[1][None])
    rest = kinematics.forward(skeleton, np.broadcast_to(np.eye(3), (1, NUM_ROLES, 3, 3)), np.eye(3)[None],
                              np.zeros((1, 3)), bridges, offsets)
    return rest.positions[0, thighs]


class LiveMotion:
    """What one live armature takes from its action each tick (see the module's docstring)."""

    def __init__(self, obj, rig, action, slot, present, links=None):
        scene = bpy.context.scene
        fps = scene.render.fps / scene.render.fps_base
        frames, targets, *_ = targets_from_action(obj, rig, action, 0, 0, fps)
        self.obj = obj
        self.name = action.name
        self.first = int(frames[0])
        self.last = len(frames) - 1
        self.targets = targets
        self.present = np.asarray(present, bool)                # which targets have an empty
        height = rig.skeleton.height
        planted = foot_lock.planted_feet(foot_lock.foot_positions(targets), fps, height)
        self.edits = OnlineEdits(planted, thighs_in_hips_frame(rig.skeleton, links), foot_lock.leg_lengths(rig.skeleton),
                                 height, targets=targets)
        self.height = height
        # influences: keyed ones sampled at every frame of the action; the others read from the settings
        self.keyed = np.zeros((2, 6), bool)                     # (position, rotation) x target
        self.keyed_values = np.zeros((len(frames), 2, 6))
        for fc in action_layouts.action_fcurves(action, slot or action_layouts.action_slot_for(obj, action)):
            match = _LAYER_PATH.match(fc.data_path)
            if match is None or fc.mute or match.group(1) not in LAYER_SLOTS:
                continue
            kind, k = ("position", "rotation").index(match.group(2)), LAYER_SLOTS.index(match.group(1))
            self.keyed[kind, k] = True
            self.keyed_values[:, kind, k] = np.clip([fc.evaluate(float(f)) for f in frames], 0.0, 1.0)
        self.keyed &= self.present
        self.any_keyed = bool(self.keyed.any())
        self.values = np.zeros((2, 6))                         # the settings' influences (0 without an empty)
        self.blends = self.all_empties = False                 # refresh() sets them from the influences
        self.lock_feet = False
        self.ground = None                                     # ground.Ground, or None
        self.ground_key = (None, None)
        self.ground_objects = []
        self.ground_names = ""
        self.stale = False                                     # a depsgraph update touched the ground
        self.note = ""                                         # for the live status: no ground under a foot
        self.last_index = self.last_result = None              # the last tick's frame and results
        self.frames = None                                     # to_world, to_character as row lists (rays)
        # per frame index: its edits as the last tick on that frame (or _fill) worked them out since the ground, the
        # armature or Lock Feet last changed (see _edit). Playback loops over a clip: each frame's rays are cast and
        # its edits worked out once, a replay (or a scrub back to it) takes them as they were; with an empty blended
        # in, only the hips' drop is worked out again (it follows the empties)
        self.memo = {}
        self.fill = True                                       # work out every frame's edits on the next tick
        self.last_cast = [None, None]                          # per foot: (its point, its hit) at the last cast
        self.refresh()

    # -- settings: read at start, after an edit and in the tick's polled slices --------------------------------------
    def refresh(self):
        """Read the layer influences, Lock Feet and the Ground from the armature's settings."""
        settings = self.obj.neural_ik
        self.last_index = None
        for k, slot in enumerate(LAYER_SLOTS):
            layer = getattr(settings, slot)
            self.values[0, k], self.values[1, k] = layer.position, layer.rotation
        self.values[:, ~self.present] = 0.0
        self.blends = bool(self.any_keyed or self.values.any())
        self.all_empties = not self.any_keyed and bool((self.values >= 1.0).all())   # every target is its empty
        if settings.lock_feet != self.lock_feet:
            self.lock_feet = settings.lock_feet
            self.edits.reset()
            self.fill = True
        key = (settings.ground_object, settings.ground_collection)
        if key != self.ground_key:
            self._gone()
            self.ground_key = key
            self._build_ground(settings)
            self.fill = True

    def _gone(self):
        """LiveStopped when a ground object the session casts on was deleted."""
        for obj in self.ground_objects:
            try:
                obj.name  # noqa: B018  (raises ReferenceError when the object was deleted)
            except ReferenceError:
                raise LiveStopped(f"the ground {self.ground_names} was deleted: live IK stopped") from None

    def _build_ground(self, settings):
        try:
            objects = ground_objects(settings)
        except LiveError as exc:
            raise LiveStopped(f"{exc}: live IK stopped") from None
        had = self.ground is not None
        self.ground_objects = objects
        self.ground_names = ", ".join(repr(o.name) for o in objects)
        self.ground = Ground(objects, bpy.context.evaluated_depsgraph_get()) if objects else None
        self.stale = False
        self.last_cast = [None, None]
        self.memo.clear()
        if had != (self.ground is not None):
            self.edits.reset()
            self.note = ""

    def check(self, depsgraph):
        """From the session's depsgraph_update_post handler: mark the ground for a rebuild when an update touched it
        (or one of its objects is gone)."""
        if self.ground is None or self.stale:
            return
        for obj in self.ground_objects:
            try:
                obj.name  # noqa: B018
            except ReferenceError:
                self.stale = True
                return
        self.stale = self.ground.stale(depsgraph)

    # -- per tick -----------------------------------------------------------------------------------------------------
    def tick(self, frame, empties, to_world, to_character, moved=False):
        """(targets (6, 4, 4) character space, or None where they are the empties as read (every influence 1, no
        Lock Feet, no ground), each foot's ground (2,) or None, contact flags (2,) or None) for scene frame `frame`.
        empties: a callable giving the empties' targets (6, 4, 4) in character space (called only when one is blended
        in); to_world, to_character (4, 4): character space <-> world, for the rays; moved: the armature moved since
        the last tick. A tick on the frame of the last, with nothing blended in and nothing changed (settings, ground,
        the armature), gives the last tick's results again (playback at 24 or 30 fps under 60 ticks a second: every
        other tick)."""
        index = min(max(frame - self.first, 0), self.last)
        if index == self.last_index and not (self.stale or self.blends or moved):
            return self.last_result
        if moved:                                # the ground lies elsewhere under the rig now
            self.memo.clear()
        if self.stale:
            self._gone()
            self._build_ground(self.obj.neural_ik)
        if not (self.lock_feet or self.ground is not None):
            if self.all_empties:                 # the clip plays under six empties: the reader's targets stand
                return self._result(index, None, None)
            targets = self.targets[index]
            if self.blends:
                targets, _position = self._blended(targets.copy(), index, empties)
            return self._result(index, targets, None)
        if self.fill:                            # session start, or Lock Feet / the Ground just set: the whole clip
            self._fill(to_world, to_character, moved)
        kept = self.memo.get(index)
        if kept is None:                         # this frame's first tick since the ground or the armature moved
            self.edits.begin(index)
            kept = self._edit(index, to_world, to_character, moved)
        else:
            self.note = kept[3]
        pre, ground, pre_state, _note, final = kept
        if not self.blends:
            self.edits.restore(final[1])
            return self._result(index, final[0], ground)
        self.edits.resume(index, pre_state)      # lock and ground as kept; the drop follows the empties
        targets, position = self._blended(pre.copy(), index, empties)
        self.edits.drop(targets, None if position is None else 1.0 - position[_BODY], self.lock_feet)
        return self._result(index, targets, ground)

    def _edit(self, index, to_world, to_character, moved):
        """Frame `index`'s edits (Lock Feet, the ground, the hips' drop), after edits.begin(index); kept in `memo` as
        (the targets before the drop, the feet's ground, the edits' state then, the status note, (the targets after
        the drop with nothing blended in, the state then))."""
        edits = self.edits
        targets = self.targets[index].copy()
        ground = None
        if self.lock_feet:
            edits.lock(targets)
        if self.ground is not None:
            ground = edits.ground(targets, *self._ground_under(targets, to_world, to_character, moved))
        pre, pre_state = targets.copy(), edits.state()
        edits.drop(targets, None, self.lock_feet)
        kept = self.memo[index] = (pre, ground, pre_state, self.note, (targets, edits.state()))
        return kept

    def _fill(self, to_world, to_character, moved):
        """Every frame's edits, in order from the first (as a play through the clip would leave them): the rays for
        the whole clip are cast once when the session starts or Lock Feet or the Ground is set, so playing it casts
        none (a few ms per hundred frames, as reading the action is)."""
        self.fill = False
        self.memo.clear()
        self.edits.reset()
        for index in range(self.last + 1):
            self.edits.begin(index)
            self._edit(index, to_world, to_character, moved)
            moved = False
        self.edits.reset()

    def _blended(self, targets, index, empties):
        """(targets with the empties blended in by their influences at frame `index`, the position influences or
        None when none is above 0)."""
        values = np.where(self.keyed, self.keyed_values[index], self.values) if self.any_keyed else self.values
        if not values.any():
            return targets, None
        return self._blend(targets, empties(), values), values[0]

    def _result(self, index, targets, ground):
        contacts = self.edits.contact_rows[index] if self.lock_feet else None
        self.last_index, self.last_result = index, (targets, ground, contacts)
        return self.last_result

    def forget(self):
        """Drop the edits kept per frame (see `memo`), as when the ground or the armature moves: each frame's next
        tick casts its rays and works its edits out again."""
        self.memo.clear()
        self.fill = False

    def _blend(self, targets, empties, values):
        """layering.blend_targets for this frame, in place on `targets`: a target whose empty has both influences at 1
        is that empty as read (as Run IK without an action takes it), one at 0 stays the action's; only those in
        between are blended (a fade)."""
        between = []
        for k, (p, r) in enumerate(zip(*values.tolist())):
            if p >= 1.0 and r >= 1.0:
                targets[k] = empties[k]
            elif p > 0.0 or r > 0.0:
                between.append(k)
        if between:
            targets[between] = layering.blend_targets(targets[None, between], empties[None, between],
                                                      values[0, between], values[1, between])[0]
        return targets

    def _ground_under(self, targets, to_world, to_character, moved):
        """(heights [2], normals [2 of (x, y, z)]) of the ground under the two foot targets, character space; where no
        ground lies under a foot: the action's own ground (height 0, +Z), and the live status says so. The transforms
        are taken as lists when the armature moved (else last tick's), and a foot whose target did not move since the
        last cast (a locked foot, a planted one) takes that cast's hit again: the tick is Python floats and at most
        two rays."""
        if moved or self.frames is None:
            self.frames = (to_world[:3].tolist(), to_character[:3].tolist())
            self.last_cast = [None, None]
        (ax, ay, az, at), (bx, by, bz, bt), (cx, cy, cz, ct) = self.frames[0]
        scale = self.height * math.sqrt(az * az + bz * bz + cz * cz)   # a rig height in world units
        hits = [None, None]
        for i, point in enumerate(targets[3:5, :3, 3].tolist()):         # FOOT_TARGETS
            last = self.last_cast[i]
            if last is not None and last[0] == point:
                hits[i] = last[1]
                continue
            x, y, z = point
            world = (ax * x + ay * y + az * z + at, bx * x + by * y + bz * z + bt, cx * x + cy * y + cz * z + ct)
            hits[i] = self._character_hit(world, self.ground.cast_rows([world], 2.0 * scale)[0])
            self.last_cast[i] = (point, hits[i])
        if hits[0] is None or hits[1] is None:      # no ground under a foot: the action's own ground there
            self.note = ("no ground under either foot: both keep the action's height" if hits == [None, None] else
                         f"no ground under the {'left' if hits[0] is None else 'right'} foot: it keeps the action's "
                         "height")
            hits = [(0.0, _UP) if hit is None else hit for hit in hits]
        elif self.note:
            self.note = ""
        return [hits[0][0], hits[1][0]], [hits[0][1], hits[1][1]]

    def _character_hit(self, world, hit):
        """A world-space ray hit (height, normal) under the world point `world` (from above the ground to two rig
        heights below) as (height, normal) in character space, or None."""
        if hit is None:
            return None
        (ax, ay, az, _), (bx, by, bz, _), (cx, cy, cz, ct) = self.frames[1]
        (x, y, _z), (top, (nx, ny, nz)) = world, hit
        n = (ax * nx + ay * ny + az * nz, bx * nx + by * ny + bz * nz, cx * nx + cy * ny + cz * nz)
        length = math.sqrt(n[0] * n[0] + n[1] * n[1] + n[2] * n[2])
        return cx * x + cy * y + cz * top + ct, (n[0] / length, n[1] / length, n[2] / length)
