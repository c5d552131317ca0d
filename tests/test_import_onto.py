"""Importing BVH clips by name pattern, and onto an armature that already holds clips of the same skeleton."""

import pytest
from conftest import BANDAI, need_mocap


def test_files_exclude_and_onto_active(empty_scene):
    import bpy

    folder = need_mocap(BANDAI)
    bpy.ops.neural_ik.import_bvh_folder(directory=folder, global_scale=0.01, files="walk_normal_001,run_normal",
                                        exclude="dataset-2")
    rig = bpy.context.scene.neural_ik.armature
    first = sorted(a.name for a in bpy.data.actions)
    assert first == ["dataset-1_run_normal_001", "dataset-1_walk_normal_001"]   # dataset-2 excluded
    bones = {b.name: tuple(b.head_local) for b in rig.data.bones}

    bpy.ops.neural_ik.import_bvh_folder(directory=folder, global_scale=0.01, files="dataset-1_bow_tired_001",
                                        onto_active=True)
    assert [o.name for o in bpy.data.objects if o.type == "ARMATURE"] == [rig.name]   # no second armature
    assert sorted(a.name for a in bpy.data.actions) == sorted(first + ["dataset-1_bow_tired_001"])
    assert {b.name: tuple(b.head_local) for b in rig.data.bones} == bones            # the rig itself is untouched
    assert rig.animation_data.action.name in first                                    # its assigned action too

    with pytest.raises(RuntimeError, match="matches"):
        bpy.ops.neural_ik.import_bvh_folder(directory=folder, files="no_such_clip", onto_active=True)
