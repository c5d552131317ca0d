"""The head stage (neural_network/ik/head_reach.py) for one character, in Blender's own math library (mathutils).

HeadReach.solve is the head stage: projected Gauss-Newton over the spine joints below a point (the neck's base with a
two-bone neck chain, else the head), vectorised in NumPy over characters, used by bake, evaluation and every batch,
and the reference for this module. At one character each of its steps is dozens of NumPy calls (a forward pass of
every slot of the chain layout, the Jacobian, the active set's solves) at a NumPy call's cost each, whatever the size.
LiveHeadReach.solve mirrors it step by step for one character: the same start (the pose pulled inside the limits, or
the memory's start and its pull toward the network's pose), the same Jacobian, active set, step-size control and
stopping rules, with the same constants (imported from head_reach.py). What differs is the arithmetic:

- the forward pass covers only the joints' slots and the point (the spine, up to `point_slot`), each a mathutils 4x4
  product, and the Jacobian's 3x3 blocks are mathutils products (float32);
- the deltas d, the limits and the clamps are Python floats (double precision), so a joint clamped onto its limit sits
  exactly on it, as in NumPy, and the active set sees it;
- the joints' quaternions are read and written in Python floats too (q's own deltas, the mean pose turned by d): the
  reach assist runs next (in NumPy, see live/refine.py) on the pose the deltas say, and the stage often leaves the
  spine nearly straight with the neck's base at the edge of its reach, where a float32 rounding decides its checks;
- the normal matrix J W J^T is formed and its 3x3 system solved in Python floats (its damping can be a few millionths
  of its largest entry: formed in float32, its rounding sent the joints ~4e-5 rad from NumPy's in one solve, and a
  memory carried that tick to tick onto another of the spines that reach);
- the memory's pull is added to the step in Python floats, so a spine pulled all the way back lands exactly on the
  network's pose and the memory settles, as in NumPy.

HeadReach's rows for the head's own turn (a rig without a two-bone neck chain) have no twin here: the live refiner
covers only rigs whose five chains are all two-bone chains (MathutilsRefiner.covers), the neck's included.

So the point lands where NumPy's does to about a micrometre, and the joints agree to ~1e-5 rad (float32 positions and
Jacobian); tests/test_live_head.py holds the two together. Needs Blender (mathutils); no bpy.
"""

import math

import numpy as np
from mathutils import Matrix, Quaternion, Vector

from ...neural_network.geometry.quaternion_math import axis_angle_quaternion, quaternion_axis_angle, quaternion_product
from ...neural_network.ik.head_reach import (
    ACTIVE_SET_PASSES,
    FOLLOW_ITERATIONS,
    HEAD_ITERATIONS,
    HEAD_TOLERANCE,
    MAX_TURN,
    NECK_AIM,
    SMALLEST_TURN,
    STALLED,
)


def _right_jacobian(x, y, z):
    """rotations.right_jacobian of the axis-angle (x, y, z) as a mathutils 3x3: I - a [d]x + b [d]x^2, with
    [d]x^2 = d d^T - |d|^2 I."""
    theta2 = x * x + y * y + z * z
    if theta2 < 1e-8:
        a, b = 0.5 - theta2 / 24.0, 1.0 / 6.0 - theta2 / 120.0
    else:
        theta = math.sqrt(theta2)
        a, b = (1.0 - math.cos(theta)) / theta2, (theta - math.sin(theta)) / (theta2 * theta)
    diagonal = 1.0 - b * theta2
    bxy, bxz, byz = b * x * y, b * x * z, b * y * z
    return Matrix(((diagonal + b * x * x, a * z + bxy, bxz - a * y),
                   (bxy - a * z, diagonal + b * y * y, a * x + byz),
                   (a * y + bxz, byz - a * x, diagonal + b * z * z)))


def _skew(v):
    """[v]x as a mathutils 3x3 (v a Vector): [v]x w = v x w."""
    x, y, z = v
    return Matrix(((0.0, -z, y), (z, 0.0, -x), (-y, x, 0.0)))


def _normal_matrix(blocks):
    """The upper triangle (h00, h01, h02, h11, h12, h22) of H = sum_j B_j B_j^T for mathutils 3x3 blocks B_j, in Python
    floats: formed in float32 its rounding would be amplified by the square of J's condition number (the damping
    added to it can be a few millionths of its largest entry), formed in double from J's float32 entries only by the
    condition number itself."""
    h00 = h01 = h02 = h11 = h12 = h22 = 0.0
    for (x0, x1, x2), (y0, y1, y2), (z0, z1, z2) in blocks:
        h00 += x0 * x0 + x1 * x1 + x2 * x2
        h01 += x0 * y0 + x1 * y1 + x2 * y2
        h02 += x0 * z0 + x1 * z1 + x2 * z2
        h11 += y0 * y0 + y1 * y1 + y2 * y2
        h12 += y0 * z0 + y1 * z1 + y2 * z2
        h22 += z0 * z0 + z1 * z1 + z2 * z2
    return h00, h01, h02, h11, h12, h22


def _solve(normal, damping, r):
    """(H + damping I)^-1 r for H given by its upper triangle (see _normal_matrix) and a Vector r, in Python floats
    (Cramer's rule: the adjugate over the determinant)."""
    h00, h01, h02, h11, h12, h22 = normal
    h00, h11, h22 = h00 + damping, h11 + damping, h22 + damping
    a00, a01, a02 = h11 * h22 - h12 * h12, h02 * h12 - h01 * h22, h01 * h12 - h02 * h11
    a11, a12, a22 = h00 * h22 - h02 * h02, h01 * h02 - h00 * h12, h00 * h11 - h01 * h01
    det = h00 * a00 + h01 * a01 + h02 * a02
    x, y, z = r
    return Vector(((a00 * x + a01 * y + a02 * z) / det, (a01 * x + a11 * y + a12 * z) / det,
                   (a02 * x + a12 * y + a22 * z) / det))


class LiveHeadReach:
    """HeadReach.solve for one character (see the module's docstring), built from a HeadReach and the slots' constants
    of a MathutilsRefiner (its `slots`: per slot (role, parent slot, [bridge | offset] 4x4 or None when unmapped))."""

    def __init__(self, head, slots):
        self.roles = head.joints.tolist()
        self.neck_chain = head.neck_chain
        m = len(self.roles)
        # the chain from the hips to the point: each mapped slot on the way is one of the joints, in order (hips side
        # first), and carries [bridge | offset] @ its mean pose; the point carries its offset alone (its position)
        chain, s = [], int(head.point_slot)
        while s > 0:
            chain.insert(0, s)
            s = slots[s][1]
        joint_slots = head.slots.tolist()
        mapped = [s for s in chain[:-1] if slots[s][2] is not None]
        if mapped != joint_slots or slots[chain[-1]][2] is None:
            raise ValueError("the head stage's joints are not the mapped slots below its point")
        self.mean, self.mean_conjugate = head.mean.tolist(), head.mean_conjugate.tolist()      # (w, x, y, z) floats
        self.constants = [slots[s][2] @ Quaternion(mean).to_matrix().to_4x4() for s, mean in zip(joint_slots, self.mean)]
        self.point_offset = slots[chain[-1]][2].translation.copy()
        self.root_weights = head.root_weights.reshape(m, 3).tolist()
        self.scalings = [Matrix.Diagonal(w) for w in self.root_weights]
        self.low, self.high = head.low.tolist(), head.high.tolist()
        self.damping_squared = float(head.damping_matrix[0, 0])        # times each step's factor `damping`

    def _forward(self, hips, d):
        """(the joints' world 4x4 transforms, the point's position) for deltas d (m lists of 3 floats)."""
        frames, world = [], hips
        for constant, (x, y, z) in zip(self.constants, d):
            world = world @ constant @ Quaternion((x, y, z)).to_matrix().to_4x4()
            frames.append(world)
        return frames, world @ self.point_offset

    def _misses(self, point, target, reach, aim=NECK_AIM):
        """HeadReach._misses (and, with `aim`, _misses_at) for one character: (the point's move to aim at (Vector), how
        far it is off)."""
        e = target - point
        distance = e.length
        if not self.neck_chain:
            return e, distance
        return e * max(0.0, 1.0 - (1.0 - aim) * reach / max(distance, 1e-300)), max(distance - reach, 0.0)

    def _clamped(self, d):
        """Deltas (m rows of 3 floats) pulled inside the limits, per axis (np.minimum(np.maximum(d, low), high))."""
        return [(lx if x < lx else (hx if x > hx else x), ly if y < ly else (hy if y > hy else y),
                 lz if z < lz else (hz if z > hz else z))
                for (x, y, z), (lx, ly, lz), (hx, hy, hz) in zip(d, self.low, self.high)]

    def _on_limits(self, d):
        """(per axis of d: on its low limit, on its high limit), or None when no axis is on one (the usual case: one
        pass)."""
        for (x, y, z), (lx, ly, lz), (hx, hy, hz) in zip(d, self.low, self.high):
            if x <= lx or y <= ly or z <= lz or x >= hx or y >= hy or z >= hz:
                break
        else:
            return None
        return ([(x <= lx, y <= ly, z <= lz) for (x, y, z), (lx, ly, lz) in zip(d, self.low)],
                [(x >= hx, y >= hy, z >= hz) for (x, y, z), (hx, hy, hz) in zip(d, self.high)])

    def _linearised(self, frames, point, d):
        """What a step needs that only a step taken changes: J's 3x3 blocks, the same times the roots of the joints'
        weights (Jf with every axis free) and their normal matrix Jf Jf^T (see _normal_matrix), and which axes of d sit
        on a limit (_on_limits). J's block of joint j: -[point - x_j]x R_j Jr(d_j) = [x_j - point]x R_j Jr(d_j)."""
        blocks = [_skew(frame.translation - point) @ frame.to_3x3() @ _right_jacobian(*row)
                  for frame, row in zip(frames, d)]
        scaled = [block @ scaling for block, scaling in zip(blocks, self.scalings)]
        return blocks, scaled, _normal_matrix(scaled), self._on_limits(d)

    def _step(self, linear, e, point, target, reach, back, damping):
        """One Gauss-Newton step (m tuples of 3 floats) from the linearisation `linear` (see _linearised), toward e, the
        point's move to aim at: W J^T (J W J^T + damping I)^-1 e, with the axes on a limit that it pushes outward taken
        out (up to ACTIVE_SET_PASSES solves) and, with `back` (the memory's pull, m tuples), that pull added and the
        point's target moved by the pull's own move (HeadReach.solve's inner loop)."""
        blocks, scaled, normal, on_limits = linear
        free, scalings, rest = ((True, True, True),) * len(blocks), self.scalings, e
        for active_set_pass in range(ACTIVE_SET_PASSES):
            if back is not None:
                moves = Vector((0.0, 0.0, 0.0))       # the pull's own move of the point
                for block, b_row, f_row in zip(blocks, back, free):
                    moves += block @ Vector([b if f else 0.0 for b, f in zip(b_row, f_row)])
                rest = e - moves
                if self.neck_chain:
                    # pulled toward the network's pose, the neck's base need only stay within the chain's reach
                    rest = self._misses(point + moves, target, reach, 0.0)[0]
            if active_set_pass:                       # Jf: J's columns times the roots of their weights, zero out of it
                scaled = [block @ scaling for block, scaling in zip(blocks, scalings)]
                normal = _normal_matrix(scaled)
            y = _solve(normal, damping * self.damping_squared, rest)
            step = [(scaling @ (block.transposed() @ y)).to_tuple() for block, scaling in zip(scaled, scalings)]
            if back is not None:                      # in Python floats: a full pull lands exactly on q's pose
                step = [tuple(b + x if f else 0.0 for b, x, f in zip(*rows)) for rows in zip(back, step, free)]
            if on_limits is None:
                return step
            outward = [tuple(f and ((lo and x < 0.0) or (hi and x > 0.0)) for x, lo, hi, f in zip(*rows))
                       for rows in zip(step, *on_limits, free)]
            if not any(map(any, outward)):
                return step
            free = [tuple(f and not o for f, o in zip(*rows)) for rows in zip(free, outward)]
            scalings = [Matrix.Diagonal([w if f else 0.0 for w, f in zip(*rows)]) for rows in zip(self.root_weights, free)]
        return step

    def solve(self, quaternions, hips, target, reach, start=None, rate=0.0):
        """HeadReach.solve of one character: lands the point's target `target` (Vector; the head's) from the local
        quaternions `quaternions` (23 lists, the joints' replaced in place), hips its world 4x4 (mathutils), reach the
        neck chain's (unused without one); start (m, 3) deltas or NaN (the memory's, see refine_memory.py) or None,
        rate the memory's. Returns (the point's miss, the deltas d now, q's own clipped to the limits; each (m, 3) as
        NumPy arrays), as HeadReach.solve does for one row."""
        m = len(self.roles)
        own = self._clamped([quaternion_axis_angle(quaternion_product(conjugate, quaternions[role]))
                             for conjugate, role in zip(self.mean_conjugate, self.roles)])
        d = own if start is None else self._clamped(
            [tuple(o if math.isnan(x) else x for x, o in zip(row, o_row)) for row, o_row in zip(start.tolist(), own)])
        pull = None                                   # the first step's move back toward q's pose
        if start is not None and rate > 0.0:
            pull = []
            for (ox, oy, oz), (x, y, z) in zip(own, d):
                bx, by, bz = ox - x, oy - y, oz - z
                share = min(1.0, rate / max(math.sqrt(bx * bx + by * by + bz * bz), 1e-300))
                pull.append((bx * share, by * share, bz * share))
        pulling = pull is not None and any(map(any, pull))
        radius, damping = MAX_TURN, 1.0
        frames, point = self._forward(hips, d)
        e, off = self._misses(point, target, reach)
        final_off, linear = off, None
        remembered = start is not None and not np.isnan(start).any()     # as HeadReach.solve: NaN is no memory
        for _ in range(FOLLOW_ITERATIONS if remembered else HEAD_ITERATIONS):
            if not ((off > HEAD_TOLERANCE and radius > SMALLEST_TURN) or pulling):
                break
            if linear is None:                        # (once per step taken: a smaller step after a refused one reuses it)
                linear = self._linearised(frames, point, d)
            step = self._step(linear, e, point, target, reach, pull if pulling else None, damping)
            scale = min(1.0, radius / max(max(math.hypot(*row) for row in step), 1e-12))
            tried = self._clamped([(x + sx * scale, y + sy * scale, z + sz * scale)
                                   for (x, y, z), (sx, sy, sz) in zip(d, step)])
            frames_tried, point_tried = self._forward(hips, tried)
            e_tried, off_tried = self._misses(point_tried, target, reach)
            # a step that does not bring the point closer is not taken, the next tries a smaller one (the pull's is)
            before, after = e.length_squared, e_tried.length_squared
            better = after < before or pulling or (off_tried <= HEAD_TOLERANCE and off > HEAD_TOLERANCE)
            # a point that stopped coming closer (a target the limits keep out of reach) is as close as it gets
            stalled = better and not pulling and after > STALLED * before
            pulling = False
            if better:
                radius, damping = min(2.0 * radius, MAX_TURN), max(0.1 * damping, 1.0)
                d, final_off = tried, off_tried
                frames, point, e, off, linear = frames_tried, point_tried, e_tried, off_tried, None
            else:
                radius, damping = 0.25 * radius, 100.0 * damping
            if stalled:
                radius = 0.0
        for mean, role, row in zip(self.mean, self.roles, d):
            quaternions[role] = list(quaternion_product(mean, axis_angle_quaternion(row)))
        return final_off, np.array(d).reshape(m, 3), np.array(own).reshape(m, 3)
