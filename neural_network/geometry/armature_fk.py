"""Blender's pose evaluation of an armature's own bones, in NumPy, for many frames at once.

Extraction reads the channel values of the bones on the mapped chain (and their ancestors) for every frame of many
actions and needs each bone's armature-space pose, the same formula Blender uses:

    pose_j = pose_parent @ (rest_parent^-1 @ rest_j) @ basis_j

Arrays keep the frames on the LAST axis ("structure of arrays": a quaternion batch is (4, K, N)): every product is a
few multiply-adds over long contiguous vectors, one batched step per depth of the hierarchy, and no Python loop
over frames or bones. Rotations are chained as quaternions (rest bone matrices are rigid, so the links are pure
rotations), which is exact when the pose has no scale; scaled poses use the matrix form (`forward_scaled`).
"""

from dataclasses import dataclass

import numpy as np

from .rotations import matrix_to_quaternion

# Frames per step of the chain. Every step works in a few scratch arrays of this many frames, made once per chain
# and written with `out=`: fresh pages from the OS cost more than the arithmetic on them, so the kernels allocate
# nothing per step and the scratch stays in cache.
FRAME_BLOCK = 512


def compute_dtype(a):
    """float32 for float32 input (extraction: Blender's keys and pose are float32), float64 otherwise."""
    return np.float32 if a.dtype == np.float32 else np.float64


def quaternion_product(a, b):
    """Hamilton product a (x) b of (4, ...) quaternion batches (w, x, y, z first)."""
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    out = np.empty(np.broadcast_shapes(a.shape, b.shape), np.result_type(compute_dtype(a), compute_dtype(b)))
    np.multiply(aw, bw, out=out[0])
    out[0] -= ax * bx
    out[0] -= ay * by
    out[0] -= az * bz
    np.multiply(aw, bx, out=out[1])
    out[1] += ax * bw
    out[1] += ay * bz
    out[1] -= az * by
    np.multiply(aw, by, out=out[2])
    out[2] -= ax * bz
    out[2] += ay * bw
    out[2] += az * bx
    np.multiply(aw, bz, out=out[3])
    out[3] += ax * by
    out[3] -= ay * bx
    out[3] += az * bw
    return out


def conjugate(q):
    """(4, ...) -> the inverse rotation of unit quaternions."""
    out = -q
    out[0] = q[0]
    return out


def left_matrices(q):
    """(4, K) constant quaternions -> (4, 4, K) matrices M with M[:, :, k] @ c == q[:, k] (x) c."""
    w, x, y, z = q
    return np.array([[w, -x, -y, -z], [x, w, -z, y], [y, z, w, -x], [z, -y, x, w]])


def constant_product(constant_left, b, out=None, tmp=None):
    """q_k (x) b[:, k] for constant quaternions given as left_matrices (4, 4, K) and b (4, K, N); out and tmp:
    optional (4, K, N) arrays to write into (no allocation)."""
    m = constant_left[:, :, :, None]
    out = np.multiply(m[:, 0], b[0], out=out)
    tmp = np.empty(out.shape, out.dtype) if tmp is None else tmp
    for j in (1, 2, 3):
        np.multiply(m[:, j], b[j], out=tmp)
        out += tmp
    return out


def normalized(q, out=None):
    """Unit quaternions as Blender makes them before use: q / |q|, and identity for a zero quaternion (into `out`
    when given; temporaries the size of one component)."""
    with np.errstate(over="ignore", invalid="ignore"):   # absurd keys overflow to inf; extraction refuses them later
        norm = q[0] * q[0]
        for i in (1, 2, 3):
            norm += q[i] * q[i]
    np.sqrt(norm, out=norm)
    zero = norm < 1e-12
    some_zero = zero.any()
    if some_zero:
        norm[zero] = 1.0
    out = np.divide(q, norm, out=out)
    if some_zero:
        out[0][zero] = 1.0
    return out


def quaternion_matrices(q, out=None):
    """(4, ...) unit quaternions -> (3, 3, ...) rotation matrices (into `out` when given)."""
    w, x, y, z = q
    out = np.empty((3, 3) + q.shape[1:], compute_dtype(q)) if out is None else out
    x2, y2, z2 = x + x, y + y, z + z
    xx, yy, zz = x * x2, y * y2, z * z2
    np.subtract(1.0, yy + zz, out=out[0, 0])
    np.subtract(1.0, xx + zz, out=out[1, 1])
    np.subtract(1.0, xx + yy, out=out[2, 2])
    for (i, j), (a, b2), (c, d2) in (((0, 1), (x, y2), (w, z2)), ((0, 2), (x, z2), (w, y2)), ((1, 2), (y, z2), (w, x2))):
        ab = a * b2
        cd = c * d2
        if (i, j) == (0, 2):
            np.add(ab, cd, out=out[0, 2])
            np.subtract(ab, cd, out=out[2, 0])
        else:
            np.subtract(ab, cd, out=out[i, j])
            np.add(ab, cd, out=out[j, i])
    return out


_AXIS = {"X": 1, "Y": 2, "Z": 3}


def euler_quaternions(angles, order):
    """(3, ...) Euler angles (x, y, z, as Blender stores them) -> (4, ...) quaternions; order "XYZ" applies X first
    (R = Rz @ Ry @ Rx, Blender's convention)."""
    half = 0.5 * angles
    c, s = np.cos(half), np.sin(half)
    out = None
    for axis in order:                    # q = q_third (x) q_second (x) q_first
        i = "XYZ".index(axis)
        q = np.zeros((4,) + angles.shape[1:], compute_dtype(angles))
        q[0] = c[i]
        q[_AXIS[axis]] = s[i]
        out = q if out is None else quaternion_product(q, out)
    return out


def axis_angle_quaternions(values):
    """(4, ...) Blender axis-angle channels (angle, axis x, y, z) -> (4, ...) quaternions (zero axis: identity)."""
    angle, axis = values[0], values[1:]
    length = np.sqrt(np.sum(axis * axis, axis=0))
    unit = axis / np.where(length > 1e-12, length, 1.0) * (length > 1e-12)
    half = 0.5 * angle
    return np.concatenate([np.cos(half)[None], np.sin(half) * unit])


def quaternion_axis_angles(q):
    """(4, ...) unit quaternions -> (3, ...) axis-angle with the angle in [0, pi] (the rotation's own sign).

    v * f with f = sign(w) 2 atan2(|v|, |w|) / |v| (2 sign(w) / |w| for a vanishing |v|): every temporary has the
    size of one component, and float32 input stays float32."""
    w, v = q[0], q[1:]
    s = np.sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2])
    aw = np.abs(w)
    small = s < 1e-8
    f = np.arctan2(s, aw)
    f *= 2.0
    f /= np.maximum(s, 1e-8)
    if small.any():
        f[small] = 2.0 / np.maximum(aw[small], 1e-8)
    np.negative(f, out=f, where=w < 0)
    return v * f


@dataclass
class BoneChain:
    """The bones one FK runs over, ordered by depth so each depth is a contiguous block of positions.

    bones: indices into the armature's bone list; levels: [(slice of positions, parents' positions or None)].
    link_left (4, 4, K): left-product matrices of the rest link rotations rest_parent^-1 @ rest_j (rest_j for
    roots); link_rotation (K, 3, 3) and link_translation (3, K) the same links as matrices.
    """
    bones: np.ndarray
    levels: list
    link_left: np.ndarray
    link_rotation: np.ndarray
    link_translation: np.ndarray

    @classmethod
    def build(cls, parents, rest_links, bones):
        """parents (B,) of the whole armature, rest_links (B, 4, 4), bones: a set closed under parents."""
        bones = [int(b) for b in bones]
        depth = {}
        for b in sorted(bones, key=lambda b: _depth(parents, b)):
            p = int(parents[b])
            depth[b] = 0 if p < 0 else depth[p] + 1
        ordered = sorted(bones, key=lambda b: (depth[b], b))
        position = {b: k for k, b in enumerate(ordered)}
        levels = []
        for d in range(max(depth.values()) + 1 if depth else 0):
            ks = [position[b] for b in ordered if depth[b] == d]
            rows = slice(ks[0], ks[-1] + 1)
            parent_ks = None if d == 0 else np.array([position[int(parents[ordered[k]])] for k in ks])
            levels.append((rows, parent_ks))
        links = np.asarray(rest_links, np.float64)[ordered]
        link_q = np.moveaxis(matrix_to_quaternion(links[:, :3, :3]), -1, 0)
        return cls(np.array(ordered, dtype=np.int64), levels, left_matrices(link_q), links[:, :3, :3].copy(),
                   np.ascontiguousarray(links[:, :3, 3].T))

    def forward(self, basis_quaternions, locations=None, keep=None):
        """Armature-space pose from each bone's matrix_basis rotation (4, K, N unit quaternions) and locations
        (None, or (positions ks of the bones that have one, values (3, len(ks), N))): rotation matrices
        (3, 3, K, N) and heads (3, K, N), float32 for float32 quaternions (float64 otherwise). keep: positions
        whose rotation matrices are returned ((3, 3, len(keep), N); the others stay in scratch, never written out).
        The rest link and the basis rotation are composed as quaternions for every bone at once; the chain is one
        product of 3 x 4 [rotation | head] blocks per depth, FRAME_BLOCK frames at a time in scratch arrays."""
        k, n = basis_quaternions.shape[1:]
        dtype = compute_dtype(basis_quaternions)
        if keep is None:
            pose = np.empty((3, 4, k, n), dtype)       # [rotation | head]: the two results are views of one array
        else:
            keep = np.asarray(keep, dtype=np.int64)
            matrices, heads = np.empty((3, 3, len(keep), n), dtype), np.empty((3, k, n), dtype)
        link_left, link_rotation, link_translation = self._constants(dtype)
        scratch = self._scratch(dtype)
        if locations is not None:
            ks, loc = locations
            lr = link_rotation[ks].transpose(1, 2, 0)[:, :, :, None]
        for start in range(0, n, FRAME_BLOCK):
            cols = slice(start, min(n, start + FRAME_BLOCK))
            m = cols.stop - cols.start
            q = constant_product(link_left, basis_quaternions[:, :, cols], scratch["q"][..., :m], scratch["q2"][..., :m])
            own = scratch["own"][..., :m]                # [own rotation | step]
            quaternion_matrices(q, own[:, :3])
            own[:, 3] = link_translation[:, :, None]
            if locations is not None:            # link rotation @ location + link translation, bones that have one
                part = scratch["part"][:, :len(ks), :m]
                for i in range(3):
                    np.multiply(lr[:, i], loc[i, :, cols], out=part)
                    own[:, 3, ks] += part
            if keep is None:
                self._chain_block(own, pose[..., cols], scratch, m)
                continue
            block = self._chain_block(own, scratch["pose"][..., :m], scratch, m)
            heads[:, :, cols] = block[:, 3]
            np.take(block[:, :3], keep, axis=2, out=matrices[..., cols], mode="clip")
        return (pose[:, :3], pose[:, 3]) if keep is None else (matrices, heads)

    def _constants(self, dtype):
        """link_left, link_rotation, link_translation in the compute dtype (float32 copies made once)."""
        cache = self.__dict__.setdefault("_by_dtype", {})
        if dtype not in cache:
            cache[dtype] = tuple(np.ascontiguousarray(a, dtype) for a in
                                 (self.link_left, self.link_rotation, self.link_translation))
        return cache[dtype]

    def _scratch(self, dtype):
        """The per-block work arrays of this chain (made once per dtype; FRAME_BLOCK frames)."""
        cache = self.__dict__.setdefault("_scratch_by_dtype", {})
        if dtype not in cache:
            k = len(self.bones)
            widest = max((rows.stop - rows.start for rows, _ in self.levels), default=1)
            b = FRAME_BLOCK
            cache[dtype] = {"q": np.empty((4, k, b), dtype), "q2": np.empty((4, k, b), dtype),
                            "own": np.empty((3, 4, k, b), dtype), "part": np.empty((3, k, b), dtype),
                            "pose": np.empty((3, 4, k, b), dtype),
                            "r": np.empty((3, 3, widest, b), dtype), "h": np.empty((3, widest, b), dtype),
                            "t1": np.empty((3, 4, widest, b), dtype), "t2": np.empty((3, 4, widest, b), dtype)}
        return cache[dtype]

    def _parent_views(self):
        """Per level: how to take the parents' rows without a copy where possible (a slice for consecutive parents,
        a one-row slice for a single parent, else the index array)."""
        views = self.__dict__.get("_parents")
        if views is None:
            views = []
            for _rows, parent_ks in self.levels:
                if parent_ks is None:
                    views.append(None)
                elif np.all(parent_ks == parent_ks[0]):
                    views.append(slice(int(parent_ks[0]), int(parent_ks[0]) + 1))
                elif np.array_equal(parent_ks, np.arange(parent_ks[0], parent_ks[0] + len(parent_ks))):
                    views.append(slice(int(parent_ks[0]), int(parent_ks[0]) + len(parent_ks)))
                else:
                    views.append(parent_ks)
            self.__dict__["_parents"] = views
        return views

    def _chain_block(self, own, pose, scratch, m):
        """The chain for one block of m frames, per depth: [R | h] = [R_p @ own | R_p @ step + h_p] for 3 x 4 blocks
        [own | step], every product written in place."""
        for (rows, _), parents in zip(self.levels, self._parent_views()):
            if parents is None:
                pose[:, :, rows] = own[:, :, rows]
                continue
            w = rows.stop - rows.start
            if isinstance(parents, slice):
                r, h_parent = pose[:, :3, parents], pose[:, 3, parents]
            else:
                r = np.take(pose[:, :3], parents, axis=2, out=scratch["r"][:, :, :w, :m], mode="clip")
                h_parent = np.take(pose[:, 3], parents, axis=1, out=scratch["h"][:, :w, :m], mode="clip")
            t1, t2 = scratch["t1"][:, :, :w, :m], scratch["t2"][:, :, :w, :m]
            o = own[:, :, rows]
            np.multiply(r[:, 0, None], o[None, 0], out=t1)
            np.multiply(r[:, 1, None], o[None, 1], out=t2)
            t1 += t2
            np.multiply(r[:, 2, None], o[None, 2], out=t2)
            out = pose[:, :, rows]
            np.add(t1, t2, out=out)
            out[:, 3] += h_parent
        return pose

    def _chain(self, own, steps, world=None, heads=None):
        world = np.empty_like(own) if world is None else world
        heads = np.empty(steps.shape) if heads is None else heads
        for rows, parent_ks in self.levels:
            if parent_ks is None:
                world[:, :, rows], heads[:, rows] = own[:, :, rows], steps[:, rows]
            else:
                r = world[:, :, parent_ks]
                world[:, :, rows] = product(r, own[:, :, rows])
                v = steps[:, rows]
                heads[:, rows] = heads[:, parent_ks] + r[:, 0] * v[0] + r[:, 1] * v[1] + r[:, 2] * v[2]
        return world, heads

    def forward_scaled(self, basis_matrices, locations):
        """The general form for poses with scale: basis_matrices (3, 3, K, N) = rotation @ scale, locations (3, K, N)
        -> pose 3x3 parts (3, 3, K, N) (with scale) and heads (3, K, N)."""
        lr = self.link_rotation.transpose(1, 2, 0)[:, :, :, None]
        own = product(np.broadcast_to(lr, (3, 3) + basis_matrices.shape[2:]), basis_matrices)
        steps = self.link_translation[:, :, None] + lr[:, 0] * locations[0] + lr[:, 1] * locations[1] + lr[:, 2] * locations[2]
        return self._chain(own, steps)


def product(a, b):
    """(3, 3, ...) @ (3, 3, ...) matrix stacks with the stack axes last."""
    return a[:, 0, None] * b[None, 0] + a[:, 1, None] * b[None, 1] + a[:, 2, None] * b[None, 2]


def _depth(parents, b):
    d = 0
    while parents[b] >= 0:
        b = parents[b]
        d += 1
    return d
