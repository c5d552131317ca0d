"""Hips reach: with the root free, move the hips so every pinned limb can reach its target.

The prior (model/prior.py) places a free root where the motion it learned from would put it. A target the arm alone
cannot reach (a hand on the floor in front of the toes, far forward, overhead) is beyond that motion: this stage moves
the root, as a person bends at the hips and the knees, just as far as the pinned limbs need.

Each limb is a point on the body (its *anchor*: the shoulder for a hand, the hip joint for a foot, the head itself)
at a fixed place in the hips' frame (the model's mean pose), and a reach: REACH of the limb's length (LEG_REACH for a
leg; none for the head), and for an arm or the head a share of the spine's length more (the spine bends; the legs'
anchors are fixed in the hips, so their weight W is LEG, as the head's, the arms' ARM). The root moves by a
translation t, a roll r about the body's forward axis and a bend b about its left-right axis (both level, through
the root's position) that minimise

    sum over pinned limbs  W^2 max(0, |anchor - target| - reach)^2 / h^2           a limb must reach
    + over pinned feet     LEG^2 max(0, CROUCH * leg - |anchor - target|)^2 / h^2   a knee folds only so far
    + MOVE * |t|^2 / h^2 + BEND * (b^2 + r^2)                                  move as little as that allows

(h the rig's standing height; the prior gave the root's heading and twist; with the network's anchors the head
has no reach: it must be on its target, the bend costs HEAD_BEND and the root does not roll: rolled, the VR case's
body leaned after the head, 6.44 -> 6.46 cm on unseen Bandai clips), by damped Gauss-Newton with a
trust region and halved steps (a step is taken only where it lowers the cost) from where the prior put the root:
where every limb reaches, nothing moves and the prior stands; as a target leaves reach the hips follow it
continuously, so a dragged hand moves the body smoothly. The spine's own bend and the limbs' landing stay the
refinement's (refine.py). The anchors come from the mean pose, or better from a first solve of the network
(free_targets.FreeTargets.step: where its spine put the shoulders and the head). The crouch bounds the hip-foot
distance, not the height: a foot raised in a kick or on the floor leaves the hips free to stay low (a height bound
held them CROUCH legs above a raised foot, and the standing foot missed by up to 46 cm on an unseen dance). The roll
tilts the pelvis away from a foot kicked high to the side (with a bend alone the stage left a pinned hand 3-8 cm
and the feet 2 cm short over 17 frames of an unseen dance).
Pure NumPy; no bpy.
"""

import numpy as np

from ..geometry import kinematics
from ..geometry.rotations import axis_angle_to_matrix
from ..skeleton.roles import ROLE_INDEX

REACH = 0.97          # an arm or the head's chain reaches this share of its length (a straight limb cannot land)
LEG_REACH = 0.99      # a leg this share (the hips rise onto straight legs for a hand overhead)
CROUCH = 0.45         # a hip joint stays at least this share of the leg's length from its foot's target
MOVE = 1.0            # cost of moving the root by the rig's height
BEND = 0.1            # cost of a radian of forward / backward bend of the root
HEAD_BEND = 1.0       # ... with the head pinned where a network's pose holds it (the head then leads the body,
                      # and the hips tilting under it tilts every joint: unseen Bandai styles 7.17 -> 6.83 cm)
LEG, ARM = 30.0, 10.0     # weight of a leg's / an arm's or the head's excess against the costs of moving
SLACK = 0.25          # share of the spine's length the spine adds to the arms' and the head's reach (it bends;
                      # the anchors are where the mean pose holds them, the legs' are fixed in the hips) ...
POSED_SLACK = np.array([0.05, 0.05, 0.0, 0.0, 0.0])   # ... and with the anchors where a solve of the network put
                                                      # them (the head there is where the network put it)
ITERATIONS = 20
MAX_MOVE = 0.1        # the largest move of one step, in rig heights
MAX_BEND = 0.3        # the largest bend of one step, radians
HALVINGS = 6          # a step that does not lower the cost is halved at most this often
FORWARD, BACKWARD = 1.6, 0.4      # radians: how far the root bends forward and back at most
ROLL = 0.8            # radians: how far it rolls to either side at most
DAMPING = 1e-3
# (target slot in the six targets, anchor role, the roles whose bone lengths make the reach)
LIMBS = ((1, "LeftArm", ("LeftArm", "LeftForeArm", "LeftHand")),
         (2, "RightArm", ("RightArm", "RightForeArm", "RightHand")),
         (3, "LeftThigh", ("LeftThigh", "LeftShin", "LeftFoot")),
         (4, "RightThigh", ("RightThigh", "RightShin", "RightFoot")),
         (5, "Head", ("Head",)))         # the head itself: only the spine's bend (SLACK) brings it further
FEET = (2, 3)         # rows of LIMBS that are legs
_UP = np.array([0.0, 0.0, 1.0])


class HipsReach:
    """The hips stage of one rig: its limbs' anchors in the hips' frame and their reaches."""

    def __init__(self, anchors, reaches, carried, lateral, height):
        self.anchors = anchors        # (5, 3) in the hips' frame (the root target's)
        self.reaches = reaches        # (5,) REACH (LEG_REACH) of each limb's length
        self.carried = carried        # (5,) the spine's length for the arms and the head (it bends them further), 0
        self.lateral = lateral        # (3,) the body's left-right axis in the hips' frame
        self.height = height

    @classmethod
    def for_model(cls, model):
        skeleton = model.skeleton
        pose = kinematics.forward(skeleton, np.asarray(model.mean_pose, np.float64)[None], np.eye(3)[None],
                                  np.zeros((1, 3)))
        positions = pose.positions[0]
        mask = skeleton.role_mask
        anchors, reaches = np.zeros((len(LIMBS), 3)), np.zeros(len(LIMBS))
        for row, (_slot, anchor, chain) in enumerate(LIMBS):
            anchors[row] = positions[ROLE_INDEX[anchor]]
            mapped = [positions[ROLE_INDEX[r]] for r in chain if mask[ROLE_INDEX[r]]]
            reaches[row] = float(sum(np.linalg.norm(b - a) for a, b in zip(mapped[:-1], mapped[1:])))
        spine = np.linalg.norm(positions[ROLE_INDEX["Hips"]] - positions[ROLE_INDEX["LeftArm"]])
        carried = np.zeros(len(LIMBS))
        carried[[0, 1, 4]] = spine                 # the arms and the head ride on the spine
        lateral = anchors[2] - anchors[3]
        lateral /= max(np.linalg.norm(lateral), 1e-9)
        reaches *= np.where(np.isin(np.arange(len(LIMBS)), FEET), LEG_REACH, REACH)
        return cls(anchors, reaches, carried, lateral, skeleton.height)

    def anchors_of(self, positions, root):
        """(K, 5, 3) the anchors in the root's frame where joint positions (K, 23, 3) put them."""
        roles = [ROLE_INDEX[anchor] for _slot, anchor, _chain in LIMBS]
        offset = np.asarray(positions, np.float64)[:, roles] - root[:, None, :3, 3]
        return np.einsum("kba,kmb->kma", root[:, :3, :3], offset)

    def place(self, targets, pinned, start=None, anchors=None, tight=False, roll=True):
        """(K, 4, 4) root transforms moved so the pinned limbs reach (see the module docstring). targets (K, 6, 4, 4)
        with the root as the prior placed it; pinned (6,) bool; start: (K, 5) (move, bend, roll) to start from (last
        tick's), or None; anchors: (K, 5, 3) the anchors in the root's frame as a pose puts them (the network's: its
        spine bent), else the mean pose's; tight: no slack at all (a solve from these anchors missed a pinned target);
        roll=False: no roll. Also returns the (K, 5) solution, for the next call's start."""
        targets = np.asarray(targets, np.float64)
        k = len(targets)
        rows = [row for row, (slot, _a, _c) in enumerate(LIMBS) if pinned[slot]]
        root = targets[:, 0]
        u = np.zeros((k, 5)) if start is None else np.array(start, np.float64)
        if not rows:
            return root.copy(), u
        slots = [LIMBS[row][0] for row in rows]
        goal = targets[:, slots][..., :3, 3]                    # (K, m, 3)
        slack = np.full(len(LIMBS), SLACK) if anchors is None else POSED_SLACK * (not tight)
        reach = self.reaches[rows] + slack[rows] * self.carried[rows]
        feet = np.array([row in FEET for row in rows])
        weight = np.where(feet | (np.array(rows) == 4), LEG, ARM) / self.height
        h = self.height
        # the turns: a roll about the body's forward axis, then a bend about its left-right axis (both on the ground),
        # through the root's position
        side = root[:, :3, :3] @ self.lateral
        side[:, 2] = 0.0
        side /= np.maximum(np.linalg.norm(side, axis=-1, keepdims=True), 1e-9)
        ahead = np.stack([side[:, 1], -side[:, 0], np.zeros(k)], axis=-1)       # side x up: level, across the side
        local = self.anchors[None, rows] if anchors is None else np.asarray(anchors, np.float64)[:, rows]
        arm0 = np.einsum("kab,kmb->kma", root[:, :3, :3], np.broadcast_to(local, (k, len(rows), 3)))   # unturned
        # a limb of no reach (the head where the network's pose holds it) must put its anchor on its target: its
        # residual is the offset's three components, the same cost as the offset's length but smooth where it
        # vanishes (Gauss-Newton on a length zig-zags about zero: 20 iterations where these take one or two)
        points = np.nonzero(reach <= 0.0)[0]
        move_weight, bend_weight = np.sqrt(MOVE) / h, np.sqrt(HEAD_BEND if len(points) else BEND)
        regularise = np.zeros((k, 5, 5))
        regularise[:, :3, :3] = np.eye(3) * move_weight
        regularise[:, 3, 3] = regularise[:, 4, 4] = bend_weight
        crouch = CROUCH / LEG_REACH * reach
        # a turn about a unit axis a (Rodrigues): R x = c x + s (a x x) + (1 - c)(a . x) a, and a x (R x) =
        # c (a x x) + s ((a . x) a - x); the roll's products with the anchors are fixed, the bend's follow the roll
        sides, aheads = side[:, None], ahead[:, None]
        across0 = _cross(aheads, arm0)
        along0 = (arm0 * aheads).sum(-1, keepdims=True) * aheads
        rolls = roll and not len(points)        # a pinned head leads the body: the hips do not roll under it
        unrolled = (_cross(sides, arm0), (arm0 * sides).sum(-1, keepdims=True) * sides)    # the bend's, no roll
        base = root[:, None, :3, 3] - goal
        m = len(rows)
        not_feet = ~feet
        extra = slice(m, m + 2 * len(points))
        size = m + 2 * len(points) + 5

        def residuals(u):
            """(r (K, m + 2p + 5), J (K, m + 2p + 5, 5)) at u: per limb its excess (weighted; a limb of no reach, p of
            them, its offset's x there and its y and z after the limbs), then the costs (new arrays)."""
            c, s = np.cos(u[:, 3])[:, None, None], np.sin(u[:, 3])[:, None, None]
            if rolls:
                cr, sr = np.cos(u[:, 4])[:, None, None], np.sin(u[:, 4])[:, None, None]
                rolled = cr * (arm0 - along0) + sr * across0 + along0
                across, along = _cross(sides, rolled), (rolled * sides).sum(-1, keepdims=True) * sides
            else:
                rolled, (across, along) = arm0, unrolled
            arm = c * (rolled - along) + s * across + along
            offset = base + u[:, None, :3] + arm
            distance = np.sqrt((offset * offset).sum(-1))
            n = offset / np.maximum(distance, 1e-9)[..., None]
            over = np.maximum(distance - reach, 0.0)
            under = np.maximum(crouch - distance, 0.0)
            under[:, not_feet] = 0.0
            out_r, out_J = np.empty((k, size)), np.empty((k, size, 5))
            out_r[:, :m] = (over + under) * weight
            out_r[:, -5:-2] = u[:, :3] * move_weight
            out_r[:, -2:] = u[:, 3:] * bend_weight
            out_J[:, -5:] = regularise
            # per limb: d distance / d t = n, d distance / d bend = (side x arm) . n, d distance / d roll =
            # ((the bent forward axis) x arm) . n, signed as the residual grows (a crouch shrinks the distance: minus)
            bending = c * across + s * (along - rolled)
            grad = out_J[:, :m]
            reaching = (over > 0)[..., None]
            spins = np.zeros(n.shape[:-1] + (2,))
            spins[..., 0] = (bending * n).sum(-1)
            if rolls:         # the bent forward axis: c ahead + s (side x ahead) = c ahead - s up (both level, square)
                rolling = _cross(c * aheads - s * _UP, arm)
                spins[..., 1] = (rolling * n).sum(-1)
            grad[..., :3] = n * reaching
            grad[..., 3:] = spins * reaching
            crouching = under > 0
            if crouching.any():
                grad[crouching, :3] = -n[crouching]
                grad[crouching, 3:] = -spins[crouching]
            grad *= weight[:, None]
            if len(points):
                w = weight[points]
                out_r[:, points] = offset[:, points, 0] * w
                out_r[:, extra] = (offset[:, points, 1:] * w[:, None]).transpose(0, 2, 1).reshape(k, -1)
                point_J = np.zeros((k, len(points), 3, 5))
                point_J[..., [0, 1, 2], [0, 1, 2]] = 1.0
                point_J[..., 3] = bending[:, points]
                if rolls:
                    point_J[..., 4] = rolling[:, points]
                point_J *= w[:, None, None]
                out_J[:, points] = point_J[:, :, 0]
                out_J[:, extra] = point_J[:, :, 1:].transpose(0, 2, 1, 3).reshape(k, -1, 5)
            return out_r, out_J

        low, high = np.array([-BACKWARD, -ROLL * rolls]), np.array([FORWARD, ROLL * rolls])
        u[:, 4] = np.clip(u[:, 4], low[1], high[1])     # (last tick's roll, where it may not roll now)
        fixed = np.zeros((k, 5), bool)
        fixed[:, 4] = not rolls                 # a turn with no room: kept out of every step

        def solve(normal, gradient, held):
            """The Gauss-Newton step with the parameters `held` (K, 5) kept where they are."""
            if (held == held[0]).all():              # one set for every character: the others' system alone
                free = np.nonzero(~held[0])[0]
                step = np.zeros((k, 5))
                step[:, free] = np.linalg.solve(normal[:, free[:, None], free], gradient[:, free])[..., 0]
                return step
            kept = ~held
            reduced = normal * (kept[:, :, None] & kept[:, None, :]) + held[:, :, None] * np.eye(5)
            return np.linalg.solve(reduced, gradient * kept[..., None])[..., 0]

        r, J = residuals(u)
        cost = (r * r).sum(axis=1)
        for _ in range(ITERATIONS):
            if cost.max() < 1e-18:               # every limb reaches and nothing moved: the prior stands
                break
            Jt = np.swapaxes(J, 1, 2)
            normal, gradient = Jt @ J + DAMPING * np.eye(5), Jt @ r[..., None]
            step = solve(normal, gradient, fixed)
            # a turn on its bound that the step would take past it is held there, the rest solved without it (else
            # the clipped trial is no Gauss-Newton step, no halving lowers the cost, and the root stops short of
            # where the rest alone goes)
            held = fixed.copy()
            held[:, 3:] |= ((u[:, 3:] <= low) & (step[:, 3:] > 0.0)) | ((u[:, 3:] >= high) & (step[:, 3:] < 0.0))
            if (held != fixed).any():
                step = solve(normal, gradient, held)
            if np.abs(step).max() < 1e-9:
                break
            # a trust region (the hinges change where they bite, so long steps overshoot), then halved until the
            # cost falls (the characters that found no such step keep theirs)
            scale = np.minimum(1.0, np.minimum(MAX_MOVE * h / np.maximum(np.linalg.norm(step[:, :3], axis=-1), 1e-12),
                                               MAX_BEND / np.maximum(np.abs(step[:, 3:]).max(axis=-1), 1e-12)))
            moving = np.ones(k, bool)
            for _halving in range(HALVINGS):
                trial = u - step * scale[:, None]
                trial[:, 3:] = np.clip(trial[:, 3:], low, high)
                r_trial, J_trial = residuals(trial)
                cost_trial = (r_trial * r_trial).sum(axis=1)
                better = moving & (cost_trial < cost)
                u[better], r[better], J[better], cost[better] = trial[better], r_trial[better], J_trial[better], \
                    cost_trial[better]
                moving &= ~better
                if not moving.any():
                    break
                scale = np.where(moving, 0.5 * scale, scale)
            if moving.all() or np.abs(step * scale[:, None]).max() < 1e-7:
                break
        out = root.copy()
        turn = axis_angle_to_matrix(side * u[:, 3:4])
        if rolls and u[:, 4].any():
            turn = turn @ axis_angle_to_matrix(ahead * u[:, 4:5])
        out[:, :3, :3] = turn @ root[:, :3, :3]
        out[:, :3, 3] = root[:, :3, 3] + u[:, :3]
        return out, u


def _cross(a, b):
    """a x b over the last axis (broadcast): np.cross without its axis handling, which cost a third of the stage."""
    a0, a1, a2 = a[..., 0], a[..., 1], a[..., 2]
    b0, b1, b2 = b[..., 0], b[..., 1], b[..., 2]
    return np.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)
