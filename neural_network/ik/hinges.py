"""Knees as hinges at the refinement's start: each knee's turn off its bend axis is taken out before the closed form.

Why: a knee bends about one axis. Where a model's limits say so (one axis far wider than the other two: a BVH rig's
three-axis knee as mocap moves it), a network on unseen motion still gives the knee a sideways turn or twist of a few
degrees, and the two-bone closed form, which bends about the limb's current plane, carries it further: on the Bandai
rig's held-out clips most of the joint-frames that the refinement takes past the model's limits beyond the clip were
knees (docs/results.md, "Joint limits beyond the clip"). Closing the two narrow axes first puts the limb's plane where
the hinge is; the closed form then lands the foot from there. The network's own output is untouched (it learned to
place the feet with those turns: closing them in its limits made the network alone worse), so this is a step of the
refinement only.

A knee's delta from the mean pose is conj(mean) * q (the refiner's joint limits are per axis of its axis-angle); its
two narrow axes are set to 0. Rigs whose knee limits show no clear hinge (the widest range less than HINGE_RATIO times
the next) keep their knees as they are. Pure NumPy; no bpy.
"""

import numpy as np

from ..geometry.quaternion_math import (
    axis_angle_quaternion,
    multiply_quaternions,
    quaternion_axis_angle,
    quaternion_product,
)
from ..geometry.rotations import axis_angle_to_quaternion, quaternion_to_axis_angle
from ..skeleton.roles import ROLE_INDEX

HINGE_RATIO = 2.0      # a knee is a hinge where its widest limit range is this many times the next widest
KNEES = ("LeftShin", "RightShin")


class Hinges:
    """The knees of one rig and model that are hinges: their roles, mean-pose rotations and bend axes."""

    def __init__(self, role_mask, mean_quaternions, limit_low, limit_high):
        roles, keep = [], []
        for name in KNEES:
            j = ROLE_INDEX[name]
            span = np.asarray(limit_high[j], np.float64) - np.asarray(limit_low[j], np.float64)
            order = np.argsort(span)
            if role_mask[j] and span[order[2]] >= HINGE_RATIO * max(span[order[1]], 1e-9):
                roles.append(j)
                keep.append(np.arange(3) == order[2])
        self.roles = np.array(roles, np.int64)
        self.keep = np.array(keep, np.float64).reshape(len(roles), 3)
        mean = np.asarray(mean_quaternions, np.float64)[self.roles]
        self.mean, self.mean_conjugate = mean, mean * np.array([1.0, -1.0, -1.0, -1.0])
        # one character's knees in Python floats (the live tick: NumPy calls cost more than the arithmetic)
        self.one = [(int(j), tuple(m), tuple(c), int(np.argmax(k)))
                    for j, m, c, k in zip(self.roles, self.mean.tolist(), self.mean_conjugate.tolist(), self.keep)]

    @property
    def active(self):
        return len(self.roles) > 0

    def close(self, q):
        """The knees of q (K, 23, 4) local quaternions, in place, turned about their bend axis only."""
        if len(q) == 1:
            row = q[0]
            for j, mean, conjugate, axis in self.one:
                bend = quaternion_axis_angle(quaternion_product(conjugate, row[j].tolist()))[axis]
                row[j] = quaternion_product(mean, axis_angle_quaternion(tuple(bend if i == axis else 0.0
                                                                                for i in range(3))))
            return
        delta = quaternion_to_axis_angle(multiply_quaternions(self.mean_conjugate, q[:, self.roles]))
        q[:, self.roles] = multiply_quaternions(self.mean, axis_angle_to_quaternion(delta * self.keep))
