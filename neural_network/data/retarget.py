"""Retargeting through the role maps: motion of one skeleton carried onto another in character space. Pure NumPy.

Why: the network learns from the motion on the user's rig, and most motion (mocap libraries) is on other skeletons,
with other rest poses (A-pose, T-pose, a BVH's arbitrary rest where every joint sits at zero rotation), bone rolls
and axis conventions. None of that may leak into the result, so each side gets a *calibration*: for every mapped
role a canonical frame in the bone's own local axes, K_j = [primary, secondary, third]:

- primary: the bone's direction, i.e. the head of its next mapped role in the chain seen from the bone (averaged
  over the motion, else from the rest: whatever the rest pose is); for the hips the body's up (hips to neck); for
  end bones (hand, head, toe, a foot without toe) the parent's
  direction seen from the bone, averaged over the rig's motion (a foot without toe: its own rest tail axis);
- secondary: the hips' lateral axis (thigh to thigh); at elbows and knees the hinge axis (upper x lower bone
  direction, averaged over the motion where the limb bends: the same anatomical axis on every rig); elsewhere the
  parent's secondary axis carried into the bone by the mean parent-to-bone rotation of the motion (the rig's
  typical pose has no twist between them); for the clavicles, which point along the chest's lateral axis, the
  chest's third (forward) axis.
- spine and neck bones (Spine, Spine1, Spine2, NeckLower, NeckUpper) instead take their parent's frame carried in by
  the rig's mean parent-to-bone rotation: in its typical posture each is the hips' frame, so what carries over is how
  the source departs from its own typical posture, and each rig keeps its own bends (CMU's short waist bone sits
  kinked forward, a DAZ spine stands straight: copying bone directions would put one rig's kinks on the other).

A role's canonical world frame at a frame is A_j = W_j K_j (W_j: the bone's character-space orientation). The
retarget gives the target's bone the source's canonical frame: W_t,j = W_s,k K_s,k K_t,j^T (k: the source role
that corresponds to j: the same role, except that the top spine bone (the chest) and the lowest correspond across
rigs with different spine counts). So limb directions are carried over exactly and rolls through anatomy. A spine or
neck role the source lacks takes its rig's typical bend, other target roles the source lacks stay at rest relative
to their parent; source roles the target lacks are dropped (their children take their world orientation). The hips
trajectory is scaled by the ratio of leg lengths.
"""

from dataclasses import dataclass

import numpy as np

from ..geometry.rotations import chordal_mean
from ..skeleton.roles import NUM_ROLES, ROLE_INDEX, ROLES
from ..skeleton.skeleton import nearest_mapped_parents

_R = ROLE_INDEX
SPINE = (_R["Spine"], _R["Spine1"], _R["Spine2"])
NECK = (_R["NeckLower"], _R["NeckUpper"])
# Chain children that give a role its direction, nearest first.
_CHAIN = {
    _R["Hips"]: ("NeckLower", "NeckUpper", "Head", "Spine2", "Spine1", "Spine"),    # the body's up, not a short bone
    _R["Spine"]: ("Spine1", "Spine2", "NeckLower", "NeckUpper", "Head"),
    _R["Spine1"]: ("Spine2", "NeckLower", "NeckUpper", "Head"),
    _R["Spine2"]: ("NeckLower", "NeckUpper", "Head"),
    _R["NeckLower"]: ("NeckUpper", "Head"),
    _R["NeckUpper"]: ("Head",),
}
for _side in ("Left", "Right"):
    _CHAIN[_R[_side + "Shoulder"]] = (_side + "Arm",)
    _CHAIN[_R[_side + "Arm"]] = (_side + "ForeArm",)
    _CHAIN[_R[_side + "ForeArm"]] = (_side + "Hand",)
    _CHAIN[_R[_side + "Thigh"]] = (_side + "Shin",)
    _CHAIN[_R[_side + "Shin"]] = (_side + "Foot",)
    _CHAIN[_R[_side + "Foot"]] = (_side + "ToeBase",)
_CHAIN = {j: tuple(_R[n] for n in names) for j, names in _CHAIN.items()}
# Hinges: (upper role, lower role); both get the hinge axis (upper x lower direction) as their secondary axis.
HINGES = tuple((_R[s + a], _R[s + b]) for s in ("Left", "Right") for a, b in (("Arm", "ForeArm"), ("Thigh", "Shin")))
_HINGE_OF = {j: h for h in HINGES for j in h}
FEET = (_R["LeftFoot"], _R["RightFoot"])
CLAVICLES = (_R["LeftShoulder"], _R["RightShoulder"])
MIN_BEND = 0.05          # mean |sin| of a hinge's bend below which the motion does not say its axis


def _unit(v, eps=1e-9):
    v = np.asarray(v, np.float64)
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return np.where(n > eps, v / np.maximum(n, eps), np.nan)


def _frame(primary, secondary, fallback):
    """Columns [p, s', p x s'] with s' the part of `secondary` across p (`fallback` where that part is small)."""
    p = _unit(primary)
    s = secondary - np.dot(secondary, p) * p
    if np.linalg.norm(s) < 0.3 * max(np.linalg.norm(secondary), 1e-12):
        s = fallback - np.dot(fallback, p) * p
    s = _unit(s)
    return np.stack([p, s, np.cross(p, s)], axis=-1)


@dataclass
class Calibration:
    """One side of a retarget, in character space (metres, +Z up)."""
    mask: np.ndarray              # (23,) bool
    frames: np.ndarray            # (23, 3, 3) K_j: canonical axes in the bone's local axes (identity unmapped)
    rest_rotations: np.ndarray    # (23, 3, 3) the mapped bones' rest orientations
    rest_positions: np.ndarray    # (23, 3) their rest heads
    leg_length: float             # thigh + shin, mean of both sides
    planted_height: float = None  # how high the ankles sit when a foot is planted (None: the motion does not say)
    bridges: np.ndarray = None    # (23, 3, 3) bone frame of j in its mapped parent's bone frame with the bones in
                                  # between as the target keys them (the hips: its frame in character space with the
                                  # bones above it keyed); None: their rest (rest_p^T rest_j, rest_hips)
    offsets: np.ndarray = None    # (23, 3) head of j in its mapped parent's bone frame, the same way (metres)

    def __post_init__(self):
        if self.bridges is None:
            self.bridges = rest_bridges(self.mask, self.rest_rotations)
        if self.offsets is None:
            self.offsets = rest_offsets(self.mask, self.rest_rotations, self.rest_positions)

    @property
    def parents(self):
        return nearest_mapped_parents(self.mask)

    def to_json(self):
        return {"mask": [bool(m) for m in self.mask], "frames": self.frames.tolist(),
                "rest_rotations": self.rest_rotations.tolist(), "rest_positions": self.rest_positions.tolist(),
                "leg_length": float(self.leg_length),
                "planted_height": None if self.planted_height is None else float(self.planted_height),
                "bridges": self.bridges.tolist(), "offsets": self.offsets.tolist()}

    @classmethod
    def from_json(cls, data):
        """Raises ValueError (KeyError, TypeError) for data that is not a calibration."""
        arrays = {name: np.asarray(data[name], np.float64) for name in
                  ("frames", "rest_rotations", "rest_positions", "bridges", "offsets")}
        shapes = {"frames": (NUM_ROLES, 3, 3), "rest_rotations": (NUM_ROLES, 3, 3), "rest_positions": (NUM_ROLES, 3),
                  "bridges": (NUM_ROLES, 3, 3), "offsets": (NUM_ROLES, 3)}
        mask = np.asarray(data["mask"], bool)
        if mask.shape != (NUM_ROLES,) or any(arrays[k].shape != v for k, v in shapes.items()) or \
                not all(np.all(np.isfinite(a)) for a in arrays.values()):
            raise ValueError("not a calibration of the 23 roles")
        height = data.get("planted_height")
        return cls(mask, arrays["frames"], arrays["rest_rotations"], arrays["rest_positions"],
                   float(data["leg_length"]), None if height is None else float(height), arrays["bridges"],
                   arrays["offsets"])


def rest_bridges(mask, rest_rotations):
    """(23, 3, 3) rest_p^T rest_j per mapped role j with mapped parent p (the hips: its rest; identity unmapped)."""
    parents = nearest_mapped_parents(mask)
    out = np.broadcast_to(np.eye(3), (NUM_ROLES, 3, 3)).copy()
    for j in np.where(mask)[0]:
        p = parents[j]
        out[j] = rest_rotations[j] if p < 0 else rest_rotations[p].T @ rest_rotations[j]
    return out


def rest_offsets(mask, rest_rotations, rest_positions):
    """(23, 3) R_p^T (x_j - x_p) at rest per mapped role j with mapped parent p (zero elsewhere)."""
    parents = nearest_mapped_parents(mask)
    out = np.zeros((NUM_ROLES, 3))
    for j in np.where(mask)[0]:
        p = parents[j]
        if p >= 0:
            out[j] = rest_rotations[p].T @ (rest_positions[j] - rest_positions[p])
    return out


def heads(calibration, world, hips_position):
    """(N, 23, 3) heads of the rig's mapped roles (NaN elsewhere) from world orientations (N, 23, 3, 3) and the hips'
    positions (N, 3), through the calibration's offsets."""
    parents = calibration.parents
    out = np.full(np.shape(world)[:2] + (3,), np.nan)
    out[:, 0] = hips_position
    for j in np.where(calibration.mask)[0]:
        p = parents[j]
        if p >= 0:
            out[:, j] = out[:, p] + world[:, p] @ calibration.offsets[j]
    return out


def lift(source, target, rotations, hips_position):
    """How far to raise the hips of motion carried from `source` so the target's planted ankles stand where its own
    motion puts them (its planted height): measured on the carried motion (rotations (N, 23, 3, 3), hips (N, 3) of
    the source: a library's pooled frames), since proportions between hips, thighs and ankles differ between rigs.
    0 when the target's planted height is unknown."""
    if target.planted_height is None:
        return 0.0
    _, world, hips = retarget(source, target, rotations, hips_position, lift_by=0.0)
    carried = planted_height(heads(target, world, hips))
    return 0.0 if carried is None else target.planted_height - carried


def _leg_length(mask, rest_positions):
    lengths = []
    for side in ("Left", "Right"):
        t, s, f = _R[side + "Thigh"], _R[side + "Shin"], _R[side + "Foot"]
        if mask[t] and mask[s] and mask[f]:
            x = rest_positions
            lengths.append(np.linalg.norm(x[s] - x[t]) + np.linalg.norm(x[f] - x[s]))
    if not lengths:
        raise ValueError("a retarget needs thigh, shin and foot on at least one side")
    return float(np.mean(lengths))


def planted_height(positions):
    """How high the lower ankle sits when a foot is planted: the 5th percentile over frames of the lower foot head
    (positions (N, 23, 3), character space); None without feet."""
    feet = np.asarray(positions, np.float64)[:, list(FEET), 2]
    lowest = np.nanmin(feet, axis=1) if feet.size else np.array([])
    lowest = lowest[np.isfinite(lowest)]
    return float(np.percentile(lowest, 5)) if len(lowest) else None


def calibrate(mask, rest_rotations, rest_positions, rotations=None, positions=None, bridges=None):
    """The Calibration of a rig from its rest (rotations (23, 3, 3), heads (23, 3), character space) and optionally
    its motion: world rotations (N, 23, 3, 3) of the mapped bones (without motion the rest pose is the motion) and
    heads (N, 23, 3) (they say how high the ankles sit on the ground). With heads, bone directions and the hips'
    lateral axis are read from the motion (bones in between, like CMU's pelvis, may move far from their rest);
    without, from the rest. bridges: see Calibration (the target's keyed in-between bones).

    Raises ValueError when the hips or a leg are unmapped (nothing could be carried over)."""
    mask = np.asarray(mask, bool)
    rest_r = np.asarray(rest_rotations, np.float64)
    rest_x = np.asarray(rest_positions, np.float64)
    if not mask[0]:
        raise ValueError("a retarget needs the hips")
    W = rest_r[None] if rotations is None else np.asarray(rotations, np.float64)
    X = rest_x[None] if rotations is None or positions is None else np.asarray(positions, np.float64)
    parents = nearest_mapped_parents(mask)

    def seen_locally(j, vectors):
        """Mean over the motion of world vectors (N, 3) in j's local axes."""
        return _unit(np.einsum("nji,nj->i", W[:, j], vectors) / len(W))

    local = {}
    for j in range(NUM_ROLES):
        if not mask[j]:
            continue
        child = next((c for c in _CHAIN.get(j, ()) if mask[c]), None)
        if child is not None:
            local[j] = seen_locally(j, _unit(X[:, child] - X[:, j]))
    K = np.broadcast_to(np.eye(3), (NUM_ROLES, 3, 3)).copy()

    def seen_from(j, p, axis_of_p):
        """Mean over the motion of parent p's local axis (3,) seen in j's local axes."""
        world = W[:, p] @ axis_of_p                                  # (N, 3)
        return _unit(np.einsum("nji,nj->i", W[:, j], world) / len(W))

    hinge_axis = {}
    for upper, lower in HINGES:
        if not (mask[upper] and mask[lower] and upper in local and lower in local):
            continue
        d_up = W[:, upper] @ local[upper]
        d_low = W[:, lower] @ local[lower]
        cross = np.cross(d_up, d_low)                                # (N, 3) world, |.| = sin(bend)
        if np.mean(np.linalg.norm(cross, axis=-1)) < MIN_BEND:
            continue
        hinge_axis[upper] = _unit(np.einsum("nji,nj->i", W[:, upper], cross))
        hinge_axis[lower] = _unit(np.einsum("nji,nj->i", W[:, lower], cross))

    for j in range(NUM_ROLES):
        if not mask[j]:
            continue
        if j == 0:
            up = local.get(0)
            left, right = _R["LeftThigh"], _R["RightThigh"]
            if mask[left] and mask[right]:
                lateral = seen_locally(0, X[:, left] - X[:, right])
            else:
                lateral = rest_r[0].T @ np.array([1.0, 0.0, 0.0])
            if up is None:
                up = rest_r[0].T @ np.array([0.0, 0.0, 1.0])
            K[0] = _frame(up, lateral, rest_r[0].T @ np.array([0.0, -1.0, 0.0]))
            continue
        p = parents[j]
        if j in SPINE + NECK and p >= 0:
            # the parent's frame carried in by the rig's typical parent-to-bone rotation: in its typical posture every
            # spine and neck bone's canonical frame is the hips', so a rig's own bends (CMU's waist kinked forward,
            # a DAZ spine straight) stay its own and only the motion's departures from the source's typical
            # posture carry over (bone directions would copy one rig's kinks onto the other)
            K[j] = chordal_mean(np.swapaxes(W[:, j], -1, -2) @ W[:, p]) @ K[p]
            continue
        primary = local.get(j)
        if primary is None:
            if j in FEET:
                primary = np.array([0.0, 1.0, 0.0])                  # the foot's own rest tail axis
            else:
                primary = seen_from(j, p, K[p][:, 0])
        secondary = hinge_axis.get(j)
        if j in CLAVICLES:      # they point along the chest's lateral axis: roll from its forward axis
            secondary, fallback = seen_from(j, p, K[p][:, 2]), seen_from(j, p, K[p][:, 0])
        elif secondary is None:
            secondary = seen_from(j, p, K[p][:, 1])
            fallback = seen_from(j, p, K[p][:, 2])
        else:
            fallback = seen_from(j, p, K[p][:, 1])
        K[j] = _frame(primary, secondary, fallback)
    if not np.all(np.isfinite(K)):
        bad = [ROLES[j] for j in range(NUM_ROLES) if not np.all(np.isfinite(K[j]))]
        raise ValueError(f"could not calibrate {', '.join(bad)} (bones of zero length)")
    height = planted_height(positions) if positions is not None else None
    return Calibration(mask, K, rest_r, rest_x, _leg_length(mask, rest_x), height, bridges)


def upright_turn(positions):
    """(3, 3) quarter or half turn that stands a motion up: a BVH file written with another up axis than the
    importer assumes comes in lying down. The axis nearest to the mean hips-to-head direction (positions (N, 23, 3))
    goes to +Z; an upright motion gets the identity (its own lean is kept)."""
    x = np.asarray(positions, np.float64)
    up = np.nanmean(x[:, _R["Head"]] - x[:, _R["Hips"]], axis=0)
    if not np.all(np.isfinite(up)) or np.linalg.norm(up) < 1e-9:
        return np.eye(3)
    k = int(np.argmax(np.abs(up)))
    sign = np.sign(up[k])
    if k == 2:
        return np.eye(3) if sign > 0 else np.diag([1.0, -1.0, -1.0])
    turn = np.zeros((3, 3))                     # maps axis k (with its sign) to +Z, +Z to -that axis, keeps the third
    other = 1 - k if k < 2 else 0
    turn[2, k] = sign
    turn[k, 2] = -sign
    turn[other, other] = 1.0
    return turn


def correspondence(source_mask, target_mask):
    """(23,) source role giving each target role its orientation, -1 where the target role stays at rest relative to
    its parent (or is unmapped). Spine and neck bones pair from both ends: lowest with lowest, top with top."""
    source_mask = np.asarray(source_mask, bool)
    target_mask = np.asarray(target_mask, bool)
    out = np.where(source_mask & target_mask, np.arange(NUM_ROLES), -1)
    out[~target_mask] = -1
    for group in (SPINE, NECK):
        src = [j for j in group if source_mask[j]]
        dst = [j for j in group if target_mask[j]]
        for j in group:
            out[j] = -1
        if not src or not dst:
            continue
        pairs = [(dst[0], src[0])]
        if len(dst) > 1 and len(src) > 1:
            pairs.append((dst[-1], src[-1]))
            if len(dst) > 2 and len(src) > 2:
                pairs.append((dst[1], src[1]))
        elif len(dst) > 1 and group is SPINE:       # one source spine bone: it carries the chest
            pairs = [(dst[-1], src[0])]
        for d, s in pairs:
            out[d] = s
    return out


def retarget(source, target, rotations, hips_position, lift_by=None):
    """Target motion from source motion.

    source, target: Calibrations. rotations (N, 23, 3, 3): the source bones' character-space orientations;
    hips_position (N, 3). Returns (local (N, 23, 3, 3): each target role's rotation relative to its nearest mapped
    parent role's bone through the target's bridges (Blender's matrix_basis with the bones in between and above the
    hips as the target keys them); world (N, 23, 3, 3): the target bones' orientations
    (identity where unmapped); hips_position (N, 3)). lift_by: metres added to the hips' height (see `lift`);
    None: the difference of the planted heights, the target's minus the scaled source's."""
    rotations = np.asarray(rotations, np.float64)
    n = rotations.shape[0]
    pairs = correspondence(source.mask, target.mask)
    if pairs[0] < 0:
        raise ValueError("both rigs need the hips mapped")
    world = np.broadcast_to(np.eye(3), (n, NUM_ROLES, 3, 3)).copy()
    local = world.copy()
    parents = target.parents
    bridges = target.bridges
    for j in range(NUM_ROLES):
        if not target.mask[j]:
            continue
        k = pairs[j]
        p = parents[j]
        if k >= 0:
            world[:, j] = rotations[:, k] @ (source.frames[k] @ target.frames[j].T)
            if p < 0:
                local[:, j] = bridges[j].T @ world[:, j]
            else:
                local[:, j] = bridges[j].T @ np.swapaxes(world[:, p], -1, -2) @ world[:, j]
        elif j in SPINE + NECK:             # a spine or neck bone the source lacks: its rig's typical bend
            typical = target.frames[p] @ target.frames[j].T
            world[:, j] = world[:, p] @ typical
            local[:, j] = bridges[j].T @ typical
        else:
            world[:, j] = world[:, p] @ bridges[j]
    scale = target.leg_length / source.leg_length
    hips = scale * np.asarray(hips_position, np.float64)
    if lift_by is not None:
        hips[:, 2] += lift_by
    elif source.planted_height is not None and target.planted_height is not None:
        hips[:, 2] += target.planted_height - scale * source.planted_height
    return local, world, hips
