"""Load this checkout as the `neural_ik` add-on package inside Blender or the bpy module (scripts and tests).

Blender installs extensions as `bl_ext.<repo>.neural_ik`; here the checkout itself is the package, under the
name `neural_ik`, so the add-on's relative imports work the same way.
"""

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "neural_ik"


def isolate_user_resources():
    """Point Blender's config and extension cache at a temporary folder (call before `import bpy`)."""
    if "BLENDER_USER_RESOURCES" not in os.environ:
        folder = tempfile.mkdtemp(prefix="neural_ik_blender_")
        os.environ["BLENDER_USER_RESOURCES"] = folder
        atexit.register(shutil.rmtree, folder, ignore_errors=True)


def load_package():
    """Import the checkout as the package `neural_ik` (without registering it)."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    spec = importlib.util.spec_from_file_location(
        PACKAGE, os.path.join(REPO, "__init__.py"), submodule_search_locations=[REPO])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
    return module


def load_addon():
    """Import and register the add-on once per process; returns the package."""
    isolate_user_resources()
    import bpy  # noqa: F401  (Blender must be loaded before the package registers)

    package = load_package()
    if not getattr(package, "_registered_by_loader", False):
        package.register()
        package._registered_by_loader = True
    return package


def exit_crashes_after_python():
    """True for the Blender 4.x bpy module (not Blender itself): after Python has shut down, its C++ exit code
    frees the data of registered Python classes and properties with callbacks, and asks for an interpreter that is
    gone (SIGSEGV in PyGILState_Ensure from bpy_class_free, ~SpaceType). 4.2.0 does; 5.0.1 does not."""
    bpy = sys.modules.get("bpy")
    return bpy is not None and not bpy.app.binary_path and bpy.app.version < (5, 0, 0)


def exit_process(code=0):
    """End the process with `code`: sys.exit, except where exit_crashes_after_python(), where Python's own exit
    work (atexit handlers, flushed streams) is done here and the process leaves before Blender's crashing part."""
    if not exit_crashes_after_python():
        sys.exit(code)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
