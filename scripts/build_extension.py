"""Build the installable extension: one zip per platform, with ONNX Runtime bundled as wheels.

    python scripts/build_extension.py [--output-dir build] [--offline]

The manifest (`blender_manifest.toml`, key `wheels`) is the one place the pins live. This script reads the wheel
file names from it, downloads each missing one into ./wheels with
`pip download --no-deps --only-binary=:all: --python-version 3.11 --platform <tag>` (a cache: re-runs download
nothing), checks pip delivered exactly the named file, then runs Blender's own extension tool (the one inside the
bpy module, so the zip is what Blender itself would build): `validate` with Blender's valid-tags list,
`build --split-platforms`, and `validate` again on every zip. Nothing is edited by hand.
"""

import argparse
import glob
import importlib.util
import os
import subprocess
import sys
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join(REPO, "blender_manifest.toml")
PYTHON_VERSION = "3.11"   # Blender 4.2 to 5.0

# pip treats manylinux tags literally: list every glibc level a wheel may carry, newest first (Blender 4.2+ needs
# glibc 2.28, so nothing newer is allowed).
LINUX_TAGS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
MACOS_TAGS = ("macosx_11_0_arm64", "macosx_11_0_universal2")


class BuildError(Exception):
    """A build step failed; the message says which and why."""


def blender_tools():
    """(blender_ext.py, tags.py) from the installed bpy module."""
    spec = importlib.util.find_spec("bpy")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("the bpy module is not installed in this Python (pip install bpy==5.0.1)")
    bpy_dir = list(spec.submodule_search_locations)[0]
    for version_dir in sorted(glob.glob(os.path.join(bpy_dir, "[0-9]*.[0-9]*")), reverse=True):
        tool = os.path.join(version_dir, "scripts", "addons_core", "bl_pkg", "cli", "blender_ext.py")
        tags = os.path.join(version_dir, "scripts", "modules", "_bpy_internal", "extensions", "tags.py")
        if os.path.isfile(tool) and os.path.isfile(tags):
            return tool, tags
    raise BuildError(f"Blender's extension tool was not found under {bpy_dir}")


def manifest_wheels():
    """Wheel paths the manifest lists, relative to the repository."""
    with open(MANIFEST, "rb") as handle:
        manifest = tomllib.load(handle)
    return [os.path.normpath(path) for path in manifest.get("wheels", [])]


def wheel_request(filename):
    """(requirement, pip platform options) for a wheel file name such as onnx-1.16.2-cp311-cp311-win_amd64.whl."""
    parts = filename[:-len(".whl")].split("-")
    if len(parts) < 5:
        raise BuildError(f"{filename} is not a wheel file name")
    name, version, python_tag, abi_tag, platform_tag = parts[0], parts[1], parts[-3], parts[-2], parts[-1]
    requirement = f"{name}=={version}"
    if platform_tag == "any":
        return requirement, ["--platform", "any"]
    if "linux" in platform_tag:
        platforms = LINUX_TAGS
    elif platform_tag.startswith("macosx"):
        platforms = MACOS_TAGS
    else:
        platforms = tuple(platform_tag.split("."))
    options = ["--implementation", python_tag[:2], "--abi", abi_tag]
    for tag in platforms:
        options += ["--platform", tag]
    return requirement, options


def download_wheels(offline=False):
    """Make sure every wheel the manifest names is in ./wheels; returns their absolute paths."""
    paths = []
    for relative in manifest_wheels():
        path = os.path.join(REPO, relative)
        paths.append(path)
        if os.path.isfile(path):
            continue
        if offline:
            raise BuildError(f"{relative} is missing and --offline was given")
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        requirement, options = wheel_request(os.path.basename(path))
        print(f"downloading {os.path.basename(path)}", flush=True)
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                   "--only-binary=:all:", "--python-version", PYTHON_VERSION, *options, requirement, "--dest", folder]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(f"pip could not download {requirement}: {result.stderr.strip().splitlines()[-1:]}")
        if not os.path.isfile(path):
            got = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, f"{requirement.split('==')[0]}-*.whl")))
            raise BuildError(f"pip delivered {got} for {requirement}, not {os.path.basename(path)}: "
                             "update the file name in blender_manifest.toml")
    return paths


def run_tool(tool, *args):
    result = subprocess.run([sys.executable, tool, *args], cwd=REPO, capture_output=True, text=True)
    output = (result.stdout + result.stderr).strip()
    if result.returncode != 0:
        raise BuildError(f"blender_ext.py {args[0]} failed:\n{output}")
    return output


def build(output_dir=None, offline=False):
    """Download the wheels, validate, build one zip per platform, validate each zip. Returns {platform: zip path}."""
    output_dir = os.path.abspath(output_dir or os.path.join(REPO, "build"))
    os.makedirs(output_dir, exist_ok=True)
    download_wheels(offline=offline)
    tool, tags = blender_tools()
    run_tool(tool, "validate", "--valid-tags", tags, REPO)
    with open(MANIFEST, "rb") as handle:
        manifest = tomllib.load(handle)
    expected = {platform: os.path.join(output_dir, f"{manifest['id']}-{manifest['version']}-{platform.replace('-', '_')}.zip")
                for platform in manifest["platforms"]}
    for path in expected.values():
        if os.path.exists(path):
            os.unlink(path)
    run_tool(tool, "build", "--source-dir", REPO, "--output-dir", output_dir, "--split-platforms", "--valid-tags", tags)
    for platform, path in expected.items():
        if not os.path.isfile(path):
            raise BuildError(f"the extension tool did not write the {platform} zip {path}")
        run_tool(tool, "validate", "--valid-tags", tags, path)
    return expected


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default=os.path.join(REPO, "build"), help="where the zips go (default ./build)")
    parser.add_argument("--offline", action="store_true", help="fail instead of downloading a missing wheel")
    args = parser.parse_args(argv)
    try:
        zips = build(args.output_dir, offline=args.offline)
    except BuildError as exc:
        print(f"build_extension: {exc}", file=sys.stderr)
        return 1
    for platform, path in zips.items():
        print(f"{platform:12s} {os.path.getsize(path) / 1e6:6.1f} MB  {os.path.relpath(path, os.getcwd())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
