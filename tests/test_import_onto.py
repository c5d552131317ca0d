"""Importing BVH clips by name pattern, and onto an armature that already holds clips of the same skeleton (on BVH
files written from the demo rig by Blender's exporter, tests/demo_bvh.py)."""

import pytest


def test_files_exclude_and_onto_active(demo_bvh, empty_scene):
    import bpy

    folder = demo_bvh.folder
    bpy.ops.neural_ik.import_bvh_folder(directory=folder, global_scale=0.01, files="walk_normal,run_easy",
                                        exclude="_04")
    rig = bpy.context.scene.neural_ik.armature
    first = sorted(a.name for a in bpy.data.actions)
    assert first == ["run_easy_01", "walk_normal_03"]          # walk_normal_04 excluded
    bones = {b.name: tuple(b.head_local) for b in rig.data.bones}

    bpy.ops.neural_ik.import_bvh_folder(directory=folder, global_scale=0.01, files="idle_stand_01",
                                        onto_active=True)
    assert [o.name for o in bpy.data.objects if o.type == "ARMATURE"] == [rig.name]   # no second armature
    assert sorted(a.name for a in bpy.data.actions) == sorted(first + ["idle_stand_01"])
    assert {b.name: tuple(b.head_local) for b in rig.data.bones} == bones            # the rig itself is untouched
    assert rig.animation_data.action.name in first                                    # its assigned action too

    with pytest.raises(RuntimeError, match="matches"):
        bpy.ops.neural_ik.import_bvh_folder(directory=folder, files="no_such_clip", onto_active=True)
