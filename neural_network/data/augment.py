"""Left/right mirror augmentation: every training frame also as its mirror image (a left-handed wave becomes a
right-handed one), which doubles the variety of poses the network sees from the same clips.

The motion is reflected in character space across the vertical plane x = 0 (S = diag(-1, 1, 1)): any vertical
plane gives a physically valid motion, and the network's inputs are taken in a heading-aligned root frame anyway.
Left and right roles swap (m: the swap). A bone's frame maps onto its partner's through a fixed improper matrix T_j
(`mirror_frames`: fitted to the rig's offsets and the data's mean pose, since BVH rest poses are not symmetric), so
that the mirrored pose has orientations G'_m(j) = S G_j T_j. Local rotations are read back from the mirrored
orientations through the rig's own links (a BVH rest pose may hold the left leg up and the right leg down, so the
mirror of a left local rotation is not a conjugate of it). Since T_j T_m(j) = I, mirroring twice is the identity.

Positions of the mirrored pose come from FK of its rotations through the rig's offsets, so they are exactly what the
network can reach; they equal the mirrored positions up to the rig's own asymmetry. A rig whose partner bones differ
by more than `MAX_ASYMMETRY` of its height (or with a role mapped on one side only) is not mirrored: `mirror_check`
says why.
"""

from dataclasses import dataclass

import numpy as np

from ..geometry import kinematics
from ..geometry.rotations import axis_angle_to_matrix, chordal_mean, matrix_to_axis_angle
from ..skeleton.roles import EFFECTOR_ROLES, NUM_ROLES, ROLES
from .dataset import Dataset, training_inputs
from .features import root_frame

REFLECT = np.diag([-1.0, 1.0, 1.0])     # S: the mirror plane of the motion, x = 0 in character space
MAX_ASYMMETRY = 0.01                    # largest partner-offset difference allowed, as a fraction of the rig's height
MIRROR_SUFFIX = " (mirrored)"


def _partner(name):
    if name.startswith("Left"):
        return "Right" + name[4:]
    if name.startswith("Right"):
        return "Left" + name[5:]
    return name


MIRROR_ROLES = np.array([ROLES.index(_partner(name)) for name in ROLES])   # m(j): role j's left/right partner


@dataclass
class Mirror:
    """The fixed matrices of one rig's mirror map, or the reason it cannot be mirrored (`reason`)."""
    skeleton: object
    frames: np.ndarray = None       # (23, 3, 3) T_j, improper; identity where unmapped
    asymmetry: float = 0.0          # largest |T_p^T o_j - o_m(j)| over mapped roles, metres
    reason: str = ""                # empty when the rig can be mirrored

    @property
    def ok(self):
        return not self.reason


def mean_orientations(dataset, max_rows=20000):
    """(23, 3, 3) chordal mean orientation of each role's bone in the heading-aligned root frame (x: right thigh to
    left thigh), over at most max_rows evenly spaced frames."""
    step = max(1, len(dataset) // max_rows)
    positions = np.nan_to_num(np.asarray(dataset.arrays["positions"][::step], np.float64))
    hips = np.asarray(dataset.arrays["hips_rotation"][::step], np.float64)
    local = axis_angle_to_matrix(np.asarray(dataset.arrays["rotations"][::step], np.float64))
    links = {k: None if dataset.arrays.get(k) is None else np.asarray(dataset.arrays[k][::step], np.float64)
             for k in ("bridges", "offsets")}
    pose = kinematics.forward(dataset.skeleton, local, hips, positions[:, 0], links["bridges"], links["offsets"])
    _, R_root = root_frame(positions, hips)
    rel = np.swapaxes(R_root, -1, -2)[:, None] @ pose.rotations
    return np.stack([chordal_mean(rel[:, j]) for j in range(NUM_ROLES)])


def _improper_fit(K):
    """The improper orthogonal T maximising tr(T^T K) (Procrustes with det T = -1)."""
    U, _, Vt = np.linalg.svd(K)
    D = np.diag([1.0, 1.0, -np.linalg.det(U @ Vt)])
    return U @ D @ Vt


def mirror_frames(skeleton, mean_orientation):
    """T_j for every mapped role, from the rig's offsets and the data's mean pose.

    BVH rigs give no symmetric rest pose to read this from (the Bandai rig rests with its left arm along the spine
    and its right arm the other way), so T_j is fitted: it must carry each child's offset onto its partner's
    (T_p^T o_c = o_m(c): positions), and map the mean orientation of the bone onto its partner's mean orientation
    mirrored (A_m(j) = S A_j T_j, in the root frame: this fixes the roll about the bone's own axis, which no offset
    sees). A bone that is its own partner (hips, spine, neck, head) gets a plane reflection, so T_j T_j = I; a left bone
    gets the best improper fit and its right partner the transpose, so mirroring twice is exactly the identity.
    """
    mask, parents = skeleton.role_mask, skeleton.parents
    offsets = skeleton.offsets
    S = REFLECT
    frames = np.tile(np.eye(3), (NUM_ROLES, 1, 1))
    for j in np.where(mask)[0]:
        m = MIRROR_ROLES[j]
        if ROLES[j].startswith("Right"):
            continue
        A_j, A_m = mean_orientation[j], mean_orientation[m]
        children = [c for c in range(NUM_ROLES) if mask[c] and parents[c] == j and np.linalg.norm(offsets[c]) > 1e-9]
        if m == j:
            lateral = [c for c in children if MIRROR_ROLES[c] != c and ROLES[c].startswith("Left")]
            if lateral:
                normal = sum(offsets[c] - offsets[MIRROR_ROLES[c]] for c in lateral)
            else:
                normal = A_j.T @ np.array([1.0, 0.0, 0.0])
            for c in children:
                if MIRROR_ROLES[c] == c:
                    axis = offsets[c] / np.linalg.norm(offsets[c])
                    normal = normal - (normal @ axis) * axis
            normal = normal / max(np.linalg.norm(normal), 1e-12)
            frames[j] = np.eye(3) - 2.0 * np.outer(normal, normal)
        else:
            K = A_j.T @ S @ A_m
            for c in children:
                o, o_m = offsets[c], offsets[MIRROR_ROLES[c]]
                K = K + 1e6 * np.outer(o, o_m) / max(np.linalg.norm(o) * np.linalg.norm(o_m), 1e-12)
            frames[j] = _improper_fit(K)
            frames[m] = frames[j].T
    return frames


def mirror_check(dataset, max_asymmetry=MAX_ASYMMETRY):
    """The rig's Mirror (T_j per role, fitted on this dataset) and how far the rig is from symmetric; `reason` is
    set when it cannot or should not be mirrored."""
    skeleton = dataset.skeleton
    mask = skeleton.role_mask
    if not np.array_equal(mask, mask[MIRROR_ROLES]):
        missing = [ROLES[j] for j in range(NUM_ROLES) if mask[j] and not mask[MIRROR_ROLES[j]]]
        return Mirror(skeleton, reason=f"roles mapped on one side only: {', '.join(missing)}")
    parents = skeleton.parents
    if not all(parents[MIRROR_ROLES[j]] == (MIRROR_ROLES[parents[j]] if parents[j] >= 0 else -1)
               for j in range(NUM_ROLES) if mask[j]):
        return Mirror(skeleton, reason="the left and right chains are linked differently")
    if not any(mask[j] and MIRROR_ROLES[j] != j for j in range(NUM_ROLES)):
        return Mirror(skeleton, reason="no left/right pair of bones is mapped")
    frames = mirror_frames(skeleton, mean_orientations(dataset))
    asymmetry = 0.0
    for j in np.where(mask)[0]:
        p = parents[j]
        if p < 0:
            continue
        mirrored = frames[p].T @ skeleton.offsets[j]
        asymmetry = max(asymmetry, float(np.linalg.norm(mirrored - skeleton.offsets[MIRROR_ROLES[j]])))
    mirror = Mirror(skeleton, frames, asymmetry)
    limit = max_asymmetry * skeleton.height
    if asymmetry > limit:
        mirror.reason = (f"left and right sides differ by up to {asymmetry * 100:.1f} cm "
                         f"(more than {limit * 100:.1f} cm)")
    return mirror


def mirror_pose(mirror, local_rotations, hips_rotation, hips_position, bridges=None, offsets=None):
    """Mirror image of poses: (N, 23, 3, 3) local rotations, (N, 3, 3) hips orientation, (N, 3) hips head and optional
    per-frame links -> the same for the mirrored motion (links None where none were given).

    Orientations are mirrored (G'_m(j) = S G_j T_j) and turned back into local rotations through the links FK will
    use (the mirrored per-frame links, or the rig's own), so FK of the result has exactly the mirrored orientations,
    and its positions differ from the mirrored positions only by the rig's own asymmetry."""
    skeleton = mirror.skeleton
    mask, parents = skeleton.role_mask, skeleton.parents
    T = mirror.frames.astype(np.float64)
    m = MIRROR_ROLES
    local = np.asarray(local_rotations, np.float64)
    bridges = None if bridges is None else np.asarray(bridges, np.float64)
    offsets = None if offsets is None else np.asarray(offsets, np.float64)
    hips_rotation = np.asarray(hips_rotation, np.float64)
    hips_position = np.asarray(hips_position, np.float64)
    G = kinematics.forward(skeleton, local, hips_rotation, hips_position, bridges, offsets).rotations
    G_new = REFLECT @ G[:, m] @ T[m]
    hips = G_new[:, 0]
    # Moving links: mirror each link's motion about its rest value (in the parent's frame), and apply it to the
    # partner's own rest link, so frames whose links do not move keep the rig's bridges and offsets exactly.
    source_parent = np.where(parents >= 0, parents, 0)[m]
    Tp = T[source_parent]
    Tpt = np.swapaxes(Tp, -1, -2)
    rest_bridges, rest_offsets = skeleton.bridges, skeleton.offsets
    new_bridges = None if bridges is None else (
        Tpt @ bridges[:, m] @ np.swapaxes(rest_bridges[m], -1, -2) @ Tp @ rest_bridges)
    new_offsets = None if offsets is None else (
        rest_offsets + np.einsum("kab,nkb->nka", Tpt, offsets[:, m] - rest_offsets[m]))
    links = skeleton.bridges[None] if new_bridges is None else new_bridges
    new_local = np.tile(np.eye(3), (len(local), NUM_ROLES, 1, 1))
    for k in np.where(mask)[0]:
        if k == 0:     # the hips' local rotation does not enter FK: keep its fixed parent transform H L^T
            new_local[:, 0] = local[:, 0] @ np.swapaxes(hips_rotation, -1, -2) @ hips
            continue
        parent = G_new[:, parents[k]]
        new_local[:, k] = np.swapaxes(links[:, k], -1, -2) @ np.swapaxes(parent, -1, -2) @ G_new[:, k]
    return new_local, hips, hips_position @ REFLECT, new_bridges, new_offsets


def mirror_dataset(dataset, mirror):
    """A Dataset of the mirrored frames only: left/right roles, contacts and ground swapped, inputs rebuilt with the
    dataset's own input references, actions renamed "<name> (mirrored)"."""
    mask = dataset.skeleton.role_mask
    arrays = dataset.arrays
    local = axis_angle_to_matrix(np.asarray(arrays["rotations"], np.float64))
    local[:, ~mask] = np.eye(3)
    local, hips, hips_pos, bridges, offsets = mirror_pose(mirror, local, arrays["hips_rotation"], arrays["hips_position"],
                                                          arrays.get("bridges"), arrays.get("offsets"))
    local[:, ~mask] = np.eye(3)
    pose = kinematics.forward(dataset.skeleton, local, hips, hips_pos, bridges, offsets)
    positions = pose.positions.copy()
    positions[:, ~mask] = np.nan
    contacts = np.ascontiguousarray(arrays["contacts"][:, ::-1])
    ground = np.ascontiguousarray(arrays["ground"][:, ::-1])
    inputs = training_inputs(dataset.feature_spec, np.nan_to_num(positions), pose.rotations[:, list(EFFECTOR_ROLES)],
                             hips, ground, contacts, arrays["phase"], arrays["task"])
    rotations = matrix_to_axis_angle(local)
    rotations[:, ~mask] = 0.0
    names = arrays["action_names"]
    out = dict(arrays)
    out.update(inputs=inputs, rotations=rotations.astype(np.float32), positions=positions.astype(np.float32),
               hips_rotation=hips.astype(np.float32), hips_position=hips_pos.astype(np.float32),
               contacts=contacts, ground=ground, action_names=np.array([str(n) + MIRROR_SUFFIX for n in names]))
    if bridges is not None:
        out.update(bridges=bridges.astype(np.float32), offsets=offsets.astype(np.float32))
    return Dataset(out, dict(dataset.meta), dataset.skeleton, dataset.feature_spec)


def with_mirror(dataset, mirror=None):
    """The dataset followed by its mirror image (actions of the copy numbered after the originals, so frame pairs
    never cross between them), and the Mirror (whose `reason` says why the dataset came back unchanged)."""
    mirror = mirror or mirror_check(dataset)
    if not mirror.ok:
        return dataset, mirror
    return dataset.appended(mirror_dataset(dataset, mirror)), mirror
