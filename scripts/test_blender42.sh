#!/usr/bin/env bash
# Run the test suite under Blender 4.2 LTS (the bpy==4.2.0 wheel, Python 3.11) in a venv of its own.
#
#   scripts/test_blender42.sh [pytest arguments]        e.g. scripts/test_blender42.sh tests/test_rig_io.py -x
#
# The venv (default ./.venv42, or $VENV42) is made once and re-used; ./.venv (Blender 5.0.1) is never touched.
# It gets bpy==4.2.0 plus requirements.txt without its bpy line (NumPy stays 1.26: bpy 4.2 is built against
# NumPy 1.x) and pytest + hypothesis from requirements-dev.txt (not ruff or fake-bpy-module: the latter ships
# a stub `bpy` package that would shadow the real one). A wheel already downloaded into $BPY42_WHEELS
# (default /tmp/bpy42) is used instead of downloading the ~520 MB wheel again.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV42:-.venv42}"
WHEELS="${BPY42_WHEELS:-/tmp/bpy42}"
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  python3.11 -m venv "$VENV"
fi

requirements="$(mktemp)"
trap 'rm -f "$requirements"' EXIT
{
  echo "bpy==4.2.0"
  grep -Ev '^\s*(#|$|bpy==)' requirements.txt
  grep -E '^(pytest|hypothesis)==' requirements-dev.txt
} > "$requirements"

# Every pin already installed at its version: nothing to ask the package index.
pins_installed='
import sys
from importlib.metadata import PackageNotFoundError, version

pins = [line.strip().split("==") for line in open(sys.argv[1]) if "==" in line]
try:
    sys.exit(0 if all(version(name) == wanted for name, wanted in pins) else 1)
except PackageNotFoundError:
    sys.exit(1)
'
if "$PY" -c "$pins_installed" "$requirements"; then
  echo "venv $VENV is up to date"
else
  find_links=()
  if [ -d "$WHEELS" ]; then find_links=(--find-links "$WHEELS"); fi
  "$PY" -m pip install -q --disable-pip-version-check "${find_links[@]}" -r "$requirements"
fi
"$PY" -c "import bpy, numpy; assert bpy.app.version[:2] == (4, 2), bpy.app.version_string; \
print('Blender', bpy.app.version_string, '| NumPy', numpy.__version__)"

start=$(date +%s)
status=0
"$PY" -m pytest -q -p no:cacheprovider -rs "$@" || status=$?
echo "Blender 4.2 suite: $(( $(date +%s) - start )) s, exit status $status"
exit "$status"
