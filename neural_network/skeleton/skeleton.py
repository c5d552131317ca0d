"""The mapped chain of a rig: which roles exist, who their parent is, and the fixed parts of each joint.

A Skeleton is all forward kinematics needs to know about a rig, in *character space*: the armature's own space,
turned so that +Z is up and scaled to metres (the rig reader does that turn once). For each mapped role j with
nearest mapped ancestor p:

    R_j = R_p @ bridge_j @ L_j          (L_j: the bone's own pose rotation, Blender's matrix_basis)
    x_j = x_p + R_p @ offset_j          (x: head position)

bridge_j is the rest rotation from p's bone to j's bone including any unmapped bones in between (a pelvis,
a hip joint, a twist bone) at their default pose; offset_j is j's head in p's posed frame. When in-between bones
move in the data, datasets carry per-frame bridges and offsets and FK takes them instead of these defaults.
"""

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from .roles import NUM_ROLES, ROLE_INDEX, ROLE_PARENTS, ROLES

# The bones whose lengths add up to a standing height: a leg (thigh, shin, ankle) and the spine up to the head
STANDING_CHAINS = (("LeftThigh", "LeftShin", "LeftFoot"), ("Spine", "Spine1", "Spine2", "NeckLower", "NeckUpper", "Head"))


def nearest_mapped_parents(role_mask):
    """For each role, the nearest ancestor in ROLE_PARENTS that is mapped (-1 for none or unmapped roles)."""
    parents = np.full(NUM_ROLES, -1, dtype=np.int64)
    for j in range(NUM_ROLES):
        if not role_mask[j]:
            continue
        p = ROLE_PARENTS[j]
        while p >= 0 and not role_mask[p]:
            p = ROLE_PARENTS[p]
        parents[j] = p
    return parents


@dataclass
class Skeleton:
    bone_names: tuple          # 23 bone names, "" where the rig lacks the role
    offsets: np.ndarray        # (23, 3) metres, head of j in its mapped parent's frame
    bridges: np.ndarray        # (23, 3, 3) rest rotation from the mapped parent's frame to j's
    rest_rotations: np.ndarray  # (23, 3, 3) each mapped bone's rest orientation in character space
    rest_positions: np.ndarray  # (23, 3) each mapped bone's rest head in character space
    name: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.bone_names = tuple(self.bone_names)
        if len(self.bone_names) != NUM_ROLES:
            raise ValueError(f"a skeleton needs {NUM_ROLES} role entries, got {len(self.bone_names)}")
        self.offsets = np.asarray(self.offsets, dtype=np.float64).reshape(NUM_ROLES, 3)
        self.bridges = np.asarray(self.bridges, dtype=np.float64).reshape(NUM_ROLES, 3, 3)
        self.rest_rotations = np.asarray(self.rest_rotations, dtype=np.float64).reshape(NUM_ROLES, 3, 3)
        self.rest_positions = np.asarray(self.rest_positions, dtype=np.float64).reshape(NUM_ROLES, 3)

    @property
    def role_mask(self):
        return np.array([bool(n) for n in self.bone_names])

    @property
    def parents(self):
        return nearest_mapped_parents(self.role_mask)

    @property
    def height(self):
        """Standing height in metres, the measure every threshold scales with: the leg chain's and the spine chain's
        bone lengths added, so it does not depend on the pose. (A rest pose's extent is no measure: a BVH rig's rest
        pose may fold the legs along the spine; Bandai's is 13 cm tall.) At least 0.1."""
        mask, total = self.role_mask, 0.0
        for chain in STANDING_CHAINS:
            total += sum(float(np.linalg.norm(self.offsets[ROLE_INDEX[r]])) for r in chain if mask[ROLE_INDEX[r]])
        return max(total, 0.1)

    def levels(self):
        """Mapped non-hips roles grouped by depth, so FK can run one batched step per level."""
        parents, mask = self.parents, self.role_mask
        depth = np.zeros(NUM_ROLES, dtype=np.int64)
        for j in range(1, NUM_ROLES):
            if mask[j] and parents[j] >= 0:
                depth[j] = depth[parents[j]] + 1
        out = []
        for d in range(1, int(depth.max()) + 1 if mask.any() else 1):
            idx = np.where(mask & (depth == d))[0]
            if len(idx):
                out.append((idx, parents[idx]))
        return out

    def fingerprint(self):
        """Identifies a rig by its mapped bones and proportions (millimetres), not by its pose or file name."""
        payload = json.dumps({"bones": self.bone_names, "offsets": np.round(self.offsets * 1000).astype(int).tolist()})
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def to_json(self):
        return {
            "name": self.name,
            "bone_names": list(self.bone_names),
            "offsets": self.offsets.tolist(),
            "bridges": self.bridges.tolist(),
            "rest_rotations": self.rest_rotations.tolist(),
            "rest_positions": self.rest_positions.tolist(),
            "fingerprint": self.fingerprint(),
            "roles": list(ROLES),
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, data):
        if not isinstance(data, dict):
            raise ValueError(f"a skeleton must be a JSON object, not {type(data).__name__}")
        if list(data.get("roles", ROLES)) != list(ROLES):
            raise ValueError("skeleton was saved with a different role list")
        skel = cls(
            bone_names=data["bone_names"],
            offsets=data["offsets"],
            bridges=data["bridges"],
            rest_rotations=data["rest_rotations"],
            rest_positions=data["rest_positions"],
            name=data.get("name", ""),
            extra=data.get("extra", {}),
        )
        for arr in (skel.offsets, skel.bridges, skel.rest_rotations, skel.rest_positions):
            if not np.all(np.isfinite(arr)):
                raise ValueError("skeleton holds non-finite numbers")
        return skel
