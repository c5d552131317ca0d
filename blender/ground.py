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

from .errors import LiveError

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
        self.trees, self.to_local, self.normal_to_world = [], [], []
        self.top = -np.inf
        for obj in objects:
            evaluated = obj.evaluated_get(depsgraph)
            world = evaluated.matrix_world.copy()
            mesh = evaluated.data
            co = np.empty(3 * len(mesh.vertices))
            mesh.vertices.foreach_get("co", co)
            if len(co):
                w = np.array(world, np.float64)
                self.top = max(self.top, float((co.reshape(-1, 3) @ w[2, :3] + w[2, 3]).max()))
            self.trees.append(BVHTree.FromObject(evaluated, depsgraph))
            self.to_local.append(world.inverted_safe())
            self.normal_to_world.append(world.to_3x3().inverted_safe().transposed())

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
        """(heights (N,), normals (N, 3)) in world space of the highest ground over each world point (N, 3), or
        under it by at most `below`; NaN where there is none."""
        points = np.asarray(points, np.float64)
        heights = np.full(len(points), np.nan)
        normals = np.full((len(points), 3), np.nan)
        for tree, to_local, to_world_normal in zip(self.trees, self.to_local, self.normal_to_world):
            for i, p in enumerate(points):
                height = self.top + 0.01
                start = to_local @ Vector((p[0], p[1], height))
                direction = (to_local.to_3x3() @ DOWN)
                scale = direction.length
                reach = max(height - (p[2] - below), 0.0)
                hit, normal, _index, _distance = tree.ray_cast(start, direction / scale, reach * scale)
                if hit is None:
                    continue
                z = (to_local.inverted_safe() @ hit).z
                if not z <= heights[i]:          # NaN or lower: this hit is the highest so far
                    n = to_world_normal @ normal
                    n.normalize()
                    if n.z < 0:                    # a face seen from below: its other side faces up
                        n.negate()
                    heights[i], normals[i] = z, n
        return heights, normals
