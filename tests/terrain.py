"""Ground meshes for tests and measurements: a slope, a staircase and a bumpy field, built with bpy in the scene,
each rising along the direction a clip travels."""

import numpy as np


def _mesh_object(name, vertices, faces):
    import bpy

    mesh = bpy.data.meshes.new(name)
    mesh.from_pydata([tuple(v) for v in vertices], [], [tuple(f) for f in faces])
    mesh.update()
    obj = bpy.data.objects.new(name, mesh)
    bpy.context.scene.collection.objects.link(obj)
    return obj


def _grid(heights, forward, side, size=30.0, cells=300):
    """A square grid of `cells` x `cells` quads, `size` m wide, centred on the origin; height(u, v) where u runs
    along `forward` and v along `side` (unit 2-D vectors)."""
    t = np.linspace(-size / 2, size / 2, cells + 1)
    u, v = np.meshgrid(t, t, indexing="ij")
    xy = u[..., None] * forward + v[..., None] * side
    z = heights(u, v)
    vertices = np.concatenate([xy, z[..., None]], axis=-1).reshape(-1, 3)
    i = np.arange(cells)[:, None] * (cells + 1) + np.arange(cells)[None, :]
    faces = np.stack([i, i + cells + 1, i + cells + 2, i + 1], axis=-1).reshape(-1, 4)
    return vertices, faces


def slope(forward, degrees=15.0, start=0.3):
    """A plane rising `degrees` along `forward` from `start` m ahead of the origin (flat before it)."""
    forward = np.asarray(forward, np.float64)[:2] / np.linalg.norm(forward[:2])
    side = np.array([-forward[1], forward[0]])
    rise = np.tan(np.radians(degrees))
    # the slope's foot is rounded over 10 cm so its surface has no crease
    vertices, faces = _grid(lambda u, v: rise * np.logaddexp(0.0, (u - start) / 0.05) * 0.05, forward, side)
    return _mesh_object("GroundSlope", vertices, faces)


def steps(forward, rise=0.15, tread=0.6, start=0.3, count=40):
    """A staircase of `count` steps of `rise` m up and `tread` m deep along `forward`, from `start` m ahead."""
    import bmesh
    import bpy

    forward = np.asarray(forward, np.float64)[:2] / np.linalg.norm(forward[:2])
    side = np.array([-forward[1], forward[0]])
    bm = bmesh.new()
    width = 4.0

    def box(u0, u1, top):
        corners = []
        for u, v, z in ((u0, -width, 0), (u1, -width, 0), (u1, width, 0), (u0, width, 0)):
            corners.append((u, v, z))
        verts = []
        for z in (-0.01, top):
            for u, v, _ in corners:
                xy = u * forward + v * side
                verts.append(bm.verts.new((xy[0], xy[1], z)))
        b, t = verts[:4], verts[4:]
        bm.faces.new(t)
        for k in range(4):
            bm.faces.new((b[k], b[(k + 1) % 4], t[(k + 1) % 4], t[k]))

    box(-6.0, start, 0.0)
    for k in range(count):
        box(start + k * tread, start + (k + 1) * tread, rise * (k + 1))
    mesh = bpy.data.meshes.new("GroundSteps")
    bm.to_mesh(mesh)
    bm.free()
    obj = bpy.data.objects.new("GroundSteps", mesh)
    bpy.context.scene.collection.objects.link(obj)
    return obj


def bumps(forward, amplitude=0.05, wavelength=0.9):
    """A field of smooth bumps of +-`amplitude` m."""
    forward = np.asarray(forward, np.float64)[:2] / np.linalg.norm(forward[:2])
    side = np.array([-forward[1], forward[0]])
    k = 2 * np.pi / wavelength
    vertices, faces = _grid(lambda u, v: amplitude * np.sin(k * u) * np.cos(k * v * 0.8), forward, side)
    return _mesh_object("GroundBumps", vertices, faces)
