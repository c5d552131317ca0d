"""Tests run against real Blender: the bpy wheel (bpy==5.0.1), with Blender's user folders in a temporary place."""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from addon_loader import isolate_user_resources, load_package  # noqa: E402

isolate_user_resources()
# The real motion capture (../shared/mocap); NEURAL_IK_MOCAP points elsewhere (a missing folder: run as a fresh clone)
MOCAP = os.path.normpath(os.environ.get("NEURAL_IK_MOCAP") or os.path.join(REPO, "..", "shared", "mocap"))
BANDAI = os.path.join(MOCAP, "bandai")
CMU = os.path.join(MOCAP, "cmu")

load_package()   # makes `neural_ik` importable; registering needs bpy and happens in the `addon` fixture
_session = {}


def need_mocap(folder=MOCAP):
    if not os.path.isdir(folder):
        pytest.skip(f"real motion capture not found at {folder}")
    return folder


def pytest_collection_modifyitems(config, items):
    """Without the real motion capture, the tests marked `mocap` (extras on the real files: every behaviour they
    check also has a test on data the tests make) are deselected, not skipped, and the summary says so."""
    if os.path.isdir(MOCAP):
        return
    extras = [item for item in items if item.get_closest_marker("mocap")]
    if extras:
        config.hook.pytest_deselected(items=extras)
        items[:] = [item for item in items if not item.get_closest_marker("mocap")]
        _session["real_file_extras"] = len(extras)


def pytest_terminal_summary(terminalreporter):
    if _session.get("real_file_extras"):
        terminalreporter.write_line(f"{_session['real_file_extras']} tests on the real motion capture deselected: "
                                    f"none at {MOCAP} (set NEURAL_IK_MOCAP to its folder to run them)")


def pytest_sessionfinish(session, exitstatus):
    _session["exit_status"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """With the Blender 4.2 bpy module, leave with pytest's exit status before Blender's exit code crashes on the
    add-on's classes (a SIGSEGV after Python has shut down; see addon_loader.exit_crashes_after_python)."""
    from addon_loader import exit_crashes_after_python, exit_process

    if "exit_status" in _session and exit_crashes_after_python():
        exit_process(_session["exit_status"])


@pytest.fixture(scope="session")
def addon():
    """The add-on, registered once in this process."""
    from addon_loader import load_addon

    return load_addon()


@pytest.fixture(scope="session")
def demo_bvh(addon, tmp_path_factory):
    """A folder of BVH files written from the demo rig's actions by Blender's own exporter (tests/demo_bvh.py):
    motion capture the project makes itself, for tests of general behaviour. Link the files, never edit them."""
    from demo_bvh import export_demo_bvh

    return export_demo_bvh(tmp_path_factory.mktemp("demo_bvh"))


@pytest.fixture(scope="session")
def other_skeletons(addon, tmp_path_factory):
    """Folders of BVH files of other skeletons (a Bandai-like and a CMU-like library) written by Blender's exporter
    from rigs built in the test (tests/other_skeletons.py). Link the files, never edit them."""
    from other_skeletons import export_other_skeletons

    return export_other_skeletons(tmp_path_factory.mktemp("other_skeletons"))


# a test on both the made libraries and the real ones: @pytest.mark.parametrize("libraries", MADE_AND_REAL, indirect=True)
MADE_AND_REAL = (pytest.param("made", id="made"), pytest.param("real", id="real", marks=pytest.mark.mocap))


@pytest.fixture
def libraries(request):
    """The Bandai and CMU libraries (OtherSkeletons) by the test's parameter: "made" (the other_skeletons fixture) or
    "real" (../shared/mocap)."""
    if request.param == "real":
        from other_skeletons import BvhLibrary, OtherSkeletons

        return OtherSkeletons(BvhLibrary.of(need_mocap(BANDAI)), BvhLibrary.of(need_mocap(CMU)))
    return request.getfixturevalue("other_skeletons")


@pytest.fixture
def empty_scene(addon):
    """An empty scene with the add-on registered (Blender's own factory state, not a mock)."""
    import bpy

    bpy.ops.wm.read_homefile(use_empty=True, use_factory_startup=True)
    return bpy.context.scene


@pytest.fixture(scope="session")
def rigify_file(addon, tmp_path_factory):
    """A Rigify rig generated once per session from Blender's human meta-rig, saved to a .blend (tests open it)."""
    from rigify_helpers import generate_rigify

    path = tmp_path_factory.mktemp("rigify") / "rigify.blend"
    generate_rigify(path)
    return path


@pytest.fixture
def rigify_rig(rigify_file):
    """The generated Rigify rig, freshly opened (the active object)."""
    from rigify_helpers import open_rigify

    return open_rigify(rigify_file)
