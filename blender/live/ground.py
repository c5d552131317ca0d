"""The ground under the feet: rays cast down through BVH trees of the evaluated ground meshes.

An armature's settings name a Ground object (a mesh) and / or a Ground Collection (its meshes). `Ground` builds one
`mathutils.bvhtree.BVHTree` per mesh from its evaluated geometry (modifiers, shape keys) once, in the mesh's own
space; `cast` turns world points into each mesh's space, casts straight down from above the ground's highest point,
and keeps the highest hit that is not more than `below` under the point (a clip made on flat ground may stand far
below or above the terrain it is fitted to). `stale(depsgraph)` says whether an update touched a ground mesh (its
geometry or its transform), so a live session rebuilds only then. Heights and normals come back in world space, NaN
where no mesh lies under a point.
"""

import bpy
import numpy as np
from mathutils import Vector
from mathutils.bvhtree import BVHTree

from ..errors import LiveError

DOWN = Vector((0.0, 0.0, -1.0))


def ground_objects(settings):
    """The meshes an armature's settings call ground (object first, then the collection's, each once); raises
    LiveError for a ground that is not a mesh or a collection with no mesh."""
    objects = []
    obj = settings.ground_object
    if obj is not None:
        if obj.type != "MESH":
            raise LiveError(f"the ground {obj.name!r} is not a mesh ({obj.type.lower()})")
        objects.append(obj)
    collection = settings.ground_collection
    if collection is not None:
        meshes = [o for o in collection.all_objects if o.type == "MESH" and o not in objects]
        if not meshes and obj is None:
            raise LiveError(f"the ground collection {collection.name!r} holds no mesh")
        objects += meshes
    return objects


class Ground:
    """BVH trees of ground meshes (see the module's docstring)."""

    def __init__(self, objects, depsgraph):
        self.names = {o.name for o in objects}
        self.meshes = {o.data.name for o in objects}
        self.trees = []          # per mesh: (tree, world -> local, local -> world, normals to world, down, its scale)
        self.top = -np.inf       # the highest vertex of them all (world Z): rays start just above it
        for obj in objects:
            evaluated = obj.evaluated_get(depsgraph)
            world = evaluated.matrix_world.copy()
            co = np.empty(3 * len(evaluated.data.vertices))
            evaluated.data.vertices.foreach_get("co", co)
            if len(co):
                w = np.array(world, np.float64)
                self.top = max(self.top, float((co.reshape(-1, 3) @ w[2, :3] + w[2, 3]).max()))
            to_local = world.inverted_safe()
            down = to_local.to_3x3() @ DOWN
            self.trees.append((BVHTree.FromObject(evaluated, depsgraph), to_local, world,
                               world.to_3x3().inverted_safe().transposed(), down.normalized(), down.length))

    @classmethod
    def of(cls, settings, depsgraph):
        """The Ground of an armature's settings, or None where it names none."""
        objects = ground_objects(settings)
        return cls(objects, depsgraph) if objects else None

    def stale(self, depsgraph):
        """True when a depsgraph update changed a ground mesh's geometry or transform."""
        for update in depsgraph.updates:
            original = getattr(update.id, "original", update.id)
            if isinstance(original, bpy.types.Object) and original.name in self.names and (
                    update.is_updated_geometry or update.is_updated_transform):
                return True
            if isinstance(original, bpy.types.Mesh) and original.name in self.meshes and update.is_updated_geometry:
                return True
        return False

    def cast(self, points, below):
        """(heights (N,), normals (N, 3)) in world space of the highest ground over each world point (N, 3), or under
        it by at most `below`; NaN where there is none."""
        points = np.asarray(points, np.float64)
        heights = np.full(len(points), np.nan)
        normals = np.full((len(points), 3), np.nan)
        for i, hit in enumerate(self.cast_rows(points.tolist(), below)):
            if hit is not None:
                heights[i], normals[i] = hit
        return heights, normals

    def cast_rows(self, points, below):
        """`cast` for a few world points as [(x, y, z)]: per point (height, (nx, ny, nz)) or None (a live tick's two
        feet: no arrays to make)."""
        out = [None] * len(points)
        start = self.top + 0.01
        for tree, to_local, to_world, to_world_normal, direction, scale in self.trees:
            for i, (x, y, z) in enumerate(points):
                reach = max(start - (z - below), 0.0)
                hit, normal, _index, _distance = tree.ray_cast(to_local @ Vector((x, y, start)), direction, reach * scale)
                if hit is None:
                    continue
                top = (to_world @ hit).z
                if out[i] is None or top > out[i][0]:         # the highest hit so far
                    n = to_world_normal @ normal
                    n.normalize()
                    if n.z < 0:                    # a face seen from below: its other side faces up
                        n.negate()
                    out[i] = (top, tuple(n))
        return out
