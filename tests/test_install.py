"""The extension as a user gets it: built by Blender's own extension tool, installed from the Linux zip, enabled, and
driven from the installed copy with its bundled ONNX Runtime.

This pytest process already has the checkout registered as the add-on `neural_ik`, so the installed copy runs in a
child process with its own BLENDER_USER_RESOURCES: the two copies (and two onnxruntime versions) never meet. The
child is this file run as a script; it prints one JSON line of facts, which the tests below check.

Two children, as a user would do it: the first installs the zip (enable_on_install) and saves the preferences; the
second is Blender started again on the same user folder, which enables the installed extension and drives it. The
restart matters here: in the session that installs, Blender appends the extensions' site-packages to the END of
sys.path, behind the venv's own (newer) onnxruntime; at start-up it puts them BEFORE the interpreter's
site-packages, so the bundled onnxruntime 1.18.1 is the one imported, as it is inside Blender.

Building downloads the wheels into ./wheels once (PyPI must be reachable the first time); re-runs reuse them.
"""

import importlib
import json
import os
import subprocess
import sys
import time
import traceback
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = "bl_ext.user_default.neural_ik"
BAKE_FRAMES = (1, 5)

# ---- the child process: install, enable and drive the installed copy ----------------------------------------


def _operator(name):
    import bpy

    if not hasattr(bpy.types, f"NEURAL_IK_OT_{name}"):
        return None
    return getattr(bpy.ops.neural_ik, name)


def _step(facts, name, run):
    """Run one step; record 'ok', 'missing: <why>' or 'error: <message>' under facts['steps'][name]."""
    try:
        outcome = run()
    except Exception as exc:   # the message goes to the parent test, which fails with it
        facts["steps"][name] = f"error: {type(exc).__name__}: {str(exc).strip()}"
        facts.setdefault("tracebacks", {})[name] = traceback.format_exc()
        return False
    facts["steps"][name] = "ok" if outcome is None else outcome
    return facts["steps"][name] == "ok"


def module_facts(facts):
    import bpy

    module = sys.modules.get(MODULE)
    facts["module_file"] = getattr(module, "__file__", None)
    facts["enabled"] = MODULE in bpy.context.preferences.addons
    facts["wheels_site"] = os.path.join(bpy.utils.user_resource("EXTENSIONS"), ".local")
    if module is not None:
        folder = os.path.dirname(module.__file__)
        facts["installed_files"] = sorted(
            os.path.relpath(os.path.join(root, f), folder) for root, _dirs, files in os.walk(folder) for f in files
            if "__pycache__" not in root)
    return module


def install(zip_path):
    """First start: install the zip from disk, enabled, and save the preferences as Blender does on quit."""
    import bpy

    facts = {}
    started = time.perf_counter()
    bpy.ops.extensions.package_install_files(filepath=zip_path, repo="user_default", enable_on_install=True)
    facts["install_seconds"] = time.perf_counter() - started
    module_facts(facts)
    bpy.ops.wm.save_userpref()
    return facts


def probe(work_dir):
    """Second start: enable the installed extension and drive it."""
    import bpy  # noqa: I001  (bpy first: it puts Blender's own modules such as addon_utils on sys.path)
    import addon_utils
    import numpy as np

    facts = {"steps": {}, "numpy": np.__version__}
    addon_utils.enable(MODULE, default_set=True, handle_error=lambda exc: facts.setdefault("enable_error", str(exc)))
    module = module_facts(facts)
    if module is None:
        return facts

    import onnx
    import onnxruntime

    facts["onnxruntime"] = [onnxruntime.__version__, onnxruntime.__file__]
    facts["onnx"] = [onnx.__version__, onnx.__file__]
    training = importlib.import_module(MODULE + ".blender.workflows.training")
    facts["training_folder"] = training.default_output_directory(os.path.join(work_dir, "dataset.npz"))

    scene = bpy.context.scene
    settings = scene.neural_ik
    armature = {}

    def create_demo_rig():
        op = _operator("create_demo_rig")
        if op is None:
            return "missing: neural_ik.create_demo_rig is not registered"
        op()
        obj = settings.armature or bpy.context.view_layer.objects.active
        assert obj is not None and obj.type == "ARMATURE", "no armature after create_demo_rig"
        armature["obj"] = obj
        facts["demo_rig"] = {"bones": len(obj.data.bones), "actions": len(bpy.data.actions),
                             "mapped": sum(1 for item in obj.neural_ik.bone_map if item.bone)}

    def create_targets():
        op = _operator("create_targets")
        if op is None:
            return "missing: neural_ik.create_targets is not registered"
        op()
        targets = {name: getattr(armature["obj"].neural_ik, f"target_{name}")
                   for name in ("root", "left_hand", "right_hand", "left_foot", "right_foot", "head")}
        facts["targets"] = sorted(name for name, target in targets.items() if target is not None)

    def ensure_model():
        """The demo rig's model: the shipped default when the installed copy has one, else a 2-epoch model trained
        here with the installed extract and train operators (recorded, so the tests can tell which)."""
        models = sys.modules[MODULE + ".blender.models"]
        errors = sys.modules[MODULE + ".blender.errors"]
        obj = armature["obj"]
        bpy.context.view_layer.objects.active = obj
        try:
            models.model_of(obj)
            facts["model_source"] = "shipped"
            return None
        except errors.LiveError as exc:
            facts["no_model_reason"] = str(exc)
        if _operator("extract") is None or _operator("train") is None:
            return "missing: no shipped model and neural_ik.extract/train are not registered"
        dataset = os.path.join(work_dir, "demo.npz")
        _operator("extract")(filepath=dataset)
        _operator("train")(filepath=dataset, directory=work_dir, epochs=2)
        models.model_of(obj)
        facts["model_source"] = "trained in the test"

    def one_tick():
        live_session = sys.modules[MODULE + ".blender.live.session"]
        live = sys.modules[MODULE + ".blender.live.tick"]
        obj = armature["obj"]
        bpy.context.view_layer.objects.active = obj
        # What Run IK does on its first timer event (timers never fire in the bpy module): build the tick from the
        # scene's live entries, start it, tick once.
        tick = live.LiveTick(live_session.live_entries(bpy.context))
        tick.start()
        before = np.array([list(pb.matrix_basis.to_quaternion()) for pb in obj.pose.bones])
        hand = obj.neural_ik.target_left_hand
        hand.location.z += 0.15
        bpy.context.view_layer.update()
        tick.tick(scene)
        bpy.context.view_layer.update()
        after = np.array([list(pb.matrix_basis.to_quaternion()) for pb in obj.pose.bones])
        facts["tick"] = {"engines": [solver.engine_name for solver, _c, _t in tick.groups],
                         "pose_changed_deg": float(np.degrees(
                             2 * np.arccos(np.clip(np.abs((before * after).sum(1)), 0, 1))).max()),
                         "mean_us": tick.timing_us()[0]}
        tick.stop()
        hand.location.z -= 0.15

    def bake():
        op = _operator("bake")
        if op is None:
            return "missing: neural_ik.bake is not registered"
        obj = armature["obj"]
        bpy.context.view_layer.objects.active = obj
        actions_before = set(bpy.data.actions)
        op(frame_start=BAKE_FRAMES[0], frame_end=BAKE_FRAMES[1])
        new = [a for a in bpy.data.actions if a not in actions_before]
        action = new[0] if new else (obj.animation_data.action if obj.animation_data else None)
        assert action is not None, "bake wrote no action"
        from bpy_extras import anim_utils

        frames = set()
        for slot in getattr(action, "slots", [None]):    # Blender 4.2: no slots, the action holds the curves
            bag = anim_utils.action_get_channelbag_for_slot(action, slot) if slot is not None else action
            if bag is None:
                continue
            for fcurve in bag.fcurves:
                frames.update(int(round(k.co[0])) for k in fcurve.keyframe_points)
        facts["bake"] = {"action": action.name, "new_action": bool(new), "frames": sorted(frames)}

    def export_onnx():
        op = _operator("export_onnx")
        if op is None:
            return "missing: neural_ik.export_onnx is not registered"
        bpy.context.view_layer.objects.active = armature["obj"]
        path = os.path.join(work_dir, "exported.onnx")
        op(filepath=path)
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        inputs = session.get_inputs()[0]
        x = np.zeros([d if isinstance(d, int) else 1 for d in inputs.shape], np.float32)
        y = session.run(None, {inputs.name: x})[0]
        facts["export"] = {"bytes": os.path.getsize(path), "output_shape": list(y.shape),
                           "finite": bool(np.isfinite(y).all())}

    if _step(facts, "create_demo_rig", create_demo_rig) and _step(facts, "create_targets", create_targets) \
            and _step(facts, "model", ensure_model):
        _step(facts, "one_tick", one_tick)
        _step(facts, "bake", bake)
        _step(facts, "export_onnx", export_onnx)
    facts["user_files"] = sorted(os.listdir(work_dir))
    after = {}
    module_facts(after)
    facts["installed_files_after"] = after["installed_files"]
    return facts


# ---- the tests (parent process) ----------------------------------------------------------------------------

if __name__ != "__main__":
    import pytest

    sys.path.insert(0, os.path.join(REPO, "scripts"))

    @pytest.fixture(scope="module")
    def zips(tmp_path_factory):
        import build_extension

        try:
            return build_extension.build(str(tmp_path_factory.mktemp("build")))
        except build_extension.BuildError as exc:
            if "could not download" in str(exc):
                pytest.skip(f"the wheels could not be downloaded (PyPI unreachable?): {exc}")
            raise

    def child(*args, user, work):
        env = dict(os.environ, BLENDER_USER_RESOURCES=str(user))
        result = subprocess.run([sys.executable, os.path.abspath(__file__), *args], cwd=str(work), env=env,
                                capture_output=True, text=True, timeout=600)
        lines = [line for line in result.stdout.splitlines() if line.startswith("NEURAL_IK_FACTS ")]
        assert result.returncode == 0 and lines, f"child {args[0]} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        return json.loads(lines[-1][len("NEURAL_IK_FACTS "):])

    @pytest.fixture(scope="module")
    def installed(zips, tmp_path_factory):
        """Facts from two child processes on one fresh user folder: install the Linux zip, then restart and use it."""
        user = tmp_path_factory.mktemp("blender_user")
        work = tmp_path_factory.mktemp("work")
        first = child("install", zips["linux-x64"], user=user, work=work)
        facts = child("use", str(work), user=user, work=work)
        facts["install"] = first
        facts["_user"], facts["_work"] = str(user), str(work)
        return facts

    def step(installed, name):
        outcome = installed["steps"].get(name)
        assert outcome is not None, f"{name} did not run: an earlier step failed ({installed['steps']})"
        assert outcome == "ok", f"{name}: {outcome}\n{installed.get('tracebacks', {}).get(name, '')}"

    def test_zips_hold_the_addon_and_only_their_platform_wheels(zips):
        import bpy

        expected_wheels = {"linux-x64": "manylinux", "windows-x64": "win_amd64", "macos-arm64": "macosx"}
        # Blender 4.2's extension tool maps a universal2 wheel to "macos-universal2", so its macos-arm64 zip gets
        # none of them (release zips are built with the bpy 5.0.1 of requirements.txt, whose tool places them).
        old_tool = bpy.app.version < (5, 0, 0)
        for platform, path in zips.items():
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
                manifest = archive.read("blender_manifest.toml").decode()
            assert "__init__.py" in names and "neural_network/model/model.py" in names and "panels/main.py" in names
            for dev in ("tests/", "benchmarks/", "scripts/", "docs/", ".venv/", ".git/", ".ci/", "build/"):
                assert not any(n.startswith(dev) for n in names), f"{platform} zip contains {dev}"
            wheels = [n for n in names if n.endswith(".whl")]
            assert f'platforms = ["{platform}"]' in manifest
            if old_tool and platform == "macos-arm64":
                continue
            assert {w.split("/")[-1].split("-")[0] for w in wheels} == {"onnxruntime", "onnx", "protobuf"}
            for wheel in wheels:
                assert wheel.endswith("none-any.whl") or expected_wheels[platform] in wheel, (platform, wheel)
        if old_tool:
            pytest.skip(f"the macos-arm64 zip's wheels: Blender {bpy.app.version_string}'s extension tool does not "
                        "place universal2 wheels (the other zips were checked)")

    def test_installed_copy_is_enabled_from_the_user_folder(installed):
        for facts in (installed["install"], installed):
            assert facts["enabled"], f"the extension is not enabled: {facts.get('enable_error')}"
            module_file = os.path.realpath(facts["module_file"])
            assert module_file.startswith(os.path.realpath(installed["_user"])), module_file
            assert not module_file.startswith(os.path.realpath(REPO) + os.sep)
            assert "blender_manifest.toml" in facts["installed_files"]
            assert not any(f.startswith(("tests", "scripts", "benchmarks", "docs")) for f in facts["installed_files"])

    def test_training_writes_into_the_extension_user_folder(installed):
        folder = os.path.realpath(installed["training_folder"])
        assert folder.startswith(os.path.realpath(installed["_user"])) and folder.endswith("training"), folder
        assert "extensions" in folder and not folder.startswith(os.path.realpath(installed["_work"])), folder

    def test_bundled_onnxruntime_is_the_one_loaded(installed):
        site = os.path.realpath(installed["wheels_site"])
        version, path = installed["onnxruntime"]
        assert version == "1.18.1" and os.path.realpath(path).startswith(site), installed["onnxruntime"]
        version, path = installed["onnx"]
        assert version == "1.16.2" and os.path.realpath(path).startswith(site), installed["onnx"]
        assert installed["numpy"].startswith("1.26"), "Blender's NumPy"

    def test_demo_rig_targets_tick_bake_from_installed_copy(installed):
        step(installed, "create_demo_rig")
        rig = installed["demo_rig"]
        assert rig["bones"] >= 15 and rig["mapped"] >= 15, rig
        step(installed, "create_targets")
        assert {"left_hand", "right_hand", "left_foot", "right_foot", "head"} <= set(installed["targets"])
        step(installed, "model")
        shipped = [f"weights/{n}" for n in os.listdir(os.path.join(REPO, "weights")) if n.endswith((".npz", ".onnx"))]
        if shipped:         # the checkout ships a model: the zip carries it and the demo rig runs it
            assert set(shipped) <= set(installed["installed_files"]), shipped
            assert installed["model_source"] == "shipped", installed.get("no_model_reason")
        step(installed, "one_tick")
        tick = installed["tick"]
        assert tick["pose_changed_deg"] > 0.01, tick
        assert all("onnx" in engine.lower() for engine in tick["engines"]), tick
        step(installed, "bake")
        frames = installed["bake"]["frames"]
        assert set(range(BAKE_FRAMES[0], BAKE_FRAMES[1] + 1)) <= set(frames), installed["bake"]

    def test_nothing_is_written_into_the_installed_extension(installed):
        step(installed, "bake")
        assert installed["installed_files_after"] == installed["installed_files"]

    def test_export_onnx_runs_in_bundled_runtime(installed):
        step(installed, "export_onnx")
        export = installed["export"]
        assert export["finite"] and export["output_shape"][-1] == 69, export


if __name__ == "__main__":
    if sys.argv[1] == "install":
        _facts = install(os.path.abspath(sys.argv[2]))
    else:
        _facts = probe(os.path.abspath(sys.argv[2]))
    print("NEURAL_IK_FACTS " + json.dumps(_facts, default=str), flush=True)
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from addon_loader import exit_crashes_after_python, exit_process

    if exit_crashes_after_python():   # the Blender 4.2 module would crash on its way out
        exit_process(0)
