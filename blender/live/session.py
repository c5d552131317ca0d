"""Run IK sessions: which armatures go live together, the session that drives them (kept in state.live_sessions for
the panel), stopping every session, and the six target empties a live armature follows.

The modal operator owns the timer; everything it does per start, tick and stop is here or in blender/live/tick.py.
"""

import bpy
import numpy as np

from ... import state
from ...neural_network.skeleton.roles import EFFECTOR_ROLES, ROLE_INDEX
from ..errors import LiveError
from ..models import model_group, model_of, rig_of
from ..rig import pose_read
from ..rig.armatures import armature_to_use
from .motion import LAYER_SLOTS
from .tick import TARGET_LABELS, TARGET_SLOTS, LiveTick, missing_targets, playing_action


class LiveSession:
    """A running Run IK: the tick, why it stopped, and the timer. Kept in state.live_sessions for the panel."""

    def __init__(self, tick):
        self.tick = tick
        self.stop_reason = ""
        self.stopped = False
        self.timer = None

    @property
    def names(self):
        return [c.name for c in self.tick.characters]

    def stop(self, reason=""):
        if self.stopped:
            return
        self.stopped = True
        self.stop_reason = reason
        self.tick.stop()
        for name in self.names:
            if state.live_sessions.get(name) is self:
                del state.live_sessions[name]

    def timing_us(self):
        return self.tick.timing_us()

    def tick_stats(self):
        """Tick time for the panel: mean and p99 in microseconds (and milliseconds), and the tick count."""
        mean, p99 = self.tick.timing_us()
        return {"mean_us": mean, "p99_us": p99, "mean_ms": mean / 1000, "p99_ms": p99 / 1000,
                "ticks": len(self.tick.times), "status": self.tick.messages()}


def stop_all(reason):
    for session in {id(s): s for s in state.live_sessions.values()}.values():
        session.stop(reason)


def live_entries(context):
    """Every armature of the scene with a usable model and all six targets, or an action (the active one must
    qualify)."""
    active = armature_to_use(context, LiveError)
    entries, models = [], {}
    for obj in [active] + [o for o in context.scene.objects if o.type == "ARMATURE" and o is not active]:
        if obj.name in state.live_sessions:
            if obj is active:
                raise LiveError(f"{obj.name} is already live")
            continue
        try:
            missing = missing_targets(obj)
            if missing and playing_action(obj) is None:      # with an action, a target without an empty follows it
                raise LiveError(f"{obj.name} has no {', '.join(missing)} target: use Create Targets first")
            model, data = model_of(obj)
        except LiveError:
            if obj is active:
                raise
            continue
        group = model_group(obj)
        model = models.setdefault(group, model) if group else model   # same file: one model, one batched call
        entries.append((obj, model, data))
    return entries


def start_session(context):
    """Build the tick of the scene's live armatures, start it and register the session; returns the LiveSession."""
    tick = LiveTick(live_entries(context))
    tick.start()
    session = LiveSession(tick)
    for name in session.names:
        state.live_sessions[name] = session
    return session


def place_targets(context, obj):
    """Put the armature's six target empties (root, hands, feet, head) on its current pose, creating the missing ones
    in the collection '<armature> IK Targets'; returns that collection. A target it creates drives the rig fully
    (both layer influences 1, also while an action plays): the user made it to move the rig with; lower them to let
    the action have that target back."""
    rig = rig_of(obj)
    matrices = pose_read.armature_pose_matrices(obj, rig)
    world = np.array(obj.matrix_world, np.float64)
    roles = [ROLE_INDEX["Hips"]] + list(EFFECTOR_ROLES)
    collection_name = f"{obj.name} IK Targets"
    collection = bpy.data.collections.get(collection_name)
    if collection is None:
        collection = bpy.data.collections.new(collection_name)
        context.scene.collection.children.link(collection)
    size = 0.06 * rig.skeleton.height / max(rig.scale, 1e-9)
    settings = obj.neural_ik
    for slot, layer_slot, label, role in zip(TARGET_SLOTS, LAYER_SLOTS, TARGET_LABELS, roles):
        m = world @ matrices[role]
        m[:3, :3] /= np.linalg.norm(m[:3, :3], axis=0)
        empty = getattr(settings, slot)
        if empty is None:
            empty = bpy.data.objects.new(f"{obj.name} {label} target", None)
            empty.empty_display_type = "PLAIN_AXES" if role else "CIRCLE"
            collection.objects.link(empty)
            setattr(settings, slot, empty)
            layer = getattr(settings, layer_slot)
            layer.position = layer.rotation = 1.0
        empty.empty_display_size = size * (4 if role == 0 else 1)
        empty.matrix_world = _matrix(m)
    return collection


def _matrix(m):
    from mathutils import Matrix

    return Matrix(np.asarray(m).tolist())
