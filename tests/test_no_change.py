"""Nothing of the user's changes that should not (issue 7, part 4), on motion capture the project makes itself (a BVH
file written from the demo rig by Blender's exporter, tests/demo_bvh.py) imported with the add-on's own Import BVH
Folder, then Extract, Train (1 epoch), Export, Evaluate, a Run IK session
that was stopped, and Bake, each between two hashes of the whole file (test_bad_input.file_state: every action's
keys, bones, object transforms and modes, pose channels, assigned actions and slots, the add-on's settings, scene
frame and range). Only the documented changes may appear:

- Extract: the scene's dataset path points at the new file;
- Train: the armature's model becomes the new checkpoint (its model path);
- Export, Evaluate, a stopped Run IK: nothing;
- Bake: one new action `<source>.nik`, assigned to the armature (so the pose shown is the baked one).
"""

import os

from test_bad_input import changed_parts, file_state

FILE = "walk_normal_03.bvh"


def test_each_operator_changes_only_what_it_documents(demo_bvh, empty_scene, tmp_path):
    import bpy
    from live_helpers import Event, StandInContext, runner_reporting_to

    folder = tmp_path / "bvh"
    folder.mkdir()
    os.symlink(demo_bvh.path(FILE), folder / FILE)
    assert bpy.ops.neural_ik.import_bvh_folder(directory=str(folder), global_scale=0.01) == {"FINISHED"}
    obj = bpy.context.active_object
    source = os.path.splitext(FILE)[0]
    assert obj.type == "ARMATURE" and obj.animation_data.action.name == source
    bpy.context.scene.frame_set(40)          # a frame of the user's, which nothing may move
    tag = f"settings {obj.name}"

    def step(name, call, allowed=()):
        before = file_state()
        result = call()
        after = file_state()
        assert changed_parts(before, after) == sorted(allowed), f"{name} changed more than it documents"
        return result

    dataset = tmp_path / "walk.npz"
    step("Extract", lambda: bpy.ops.neural_ik.extract(filepath=str(dataset)), allowed=("scene settings",))
    assert bpy.context.scene.neural_ik.dataset_path == str(dataset)

    out = tmp_path / "training"
    out.mkdir()
    step("Train", lambda: bpy.ops.neural_ik.train(filepath=str(dataset), directory=str(out), epochs=1), allowed=(tag,))
    assert obj.neural_ik.model_path == str(out / "model.npz")

    step("Export", lambda: bpy.ops.neural_ik.export_onnx(filepath=str(tmp_path / "walk.onnx")))
    assert (tmp_path / "walk.onnx").stat().st_size > 0

    step("Evaluate", lambda: bpy.ops.neural_ik.evaluate(armature=obj.name, actions=source, model_path=obj.neural_ik.model_path,
                                                        refine_iterations=1, baseline=True, poles=False))

    bpy.ops.neural_ik.create_targets()       # Create Targets adds the empties Run IK follows (a change of its own)
    obj.neural_ik.target_right_hand.location.x += 0.1     # the user moves a target: the rig has something to do

    def run_and_stop():
        context = StandInContext()
        runner = runner_reporting_to([])()
        assert runner.invoke(context, Event("NONE")) == {"RUNNING_MODAL"}
        for _ in range(3):
            runner.last_tick = 0.0
            assert runner.modal(context, Event("TIMER")) == {"RUNNING_MODAL"}
        assert changed_parts(before_run, file_state()) == [f"assigned {obj.name}", f"pose {obj.name}"]   # it did drive
        return runner.modal(context, Event("ESC"))

    before_run = file_state()
    assert step("Run IK, stopped", run_and_stop) == {"CANCELLED"}

    step("Bake", lambda: bpy.ops.neural_ik.bake(source_action=source, refine_iterations=1),
         allowed=(f"action {source}.nik", f"assigned {obj.name}", f"pose {obj.name}"))
    assert obj.animation_data.action.name == f"{source}.nik"
    assert bpy.context.scene.frame_current == 40
