"""The layout's rules, read from the source: the core never imports Blender, arrows point down, no import cycles
(function-level imports included), no operator calls another operator."""

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTSIDE = {"tests", "scripts", "benchmarks", "docs", "weights", "build", "out", "wheels"}
LAYERS = {"operators": 2, "panels": 2, "blender": 1, "neural_network": 0}   # a module imports its own layer or lower


def package_modules():
    """{dotted name relative to the package: path} for every module of the add-on."""
    found = {}
    for folder, dirs, files in os.walk(REPO):
        rel = os.path.relpath(folder, REPO)
        top = rel.split(os.sep)[0]
        if rel != "." and (top in OUTSIDE or top.startswith(".")):
            dirs[:] = []
            continue
        for name in files:
            if name.endswith(".py"):
                parts = os.path.normpath(os.path.join(rel, name))[:-3].split(os.sep)
                parts = [p for p in (parts[:-1] if parts[-1] == "__init__" else parts) if p != "."]
                found[".".join(parts)] = os.path.join(folder, name)
    return found


MODULES = package_modules()


def imports_of(name):
    """(project modules imported anywhere in module `name`, external top-level packages it imports)."""
    path = MODULES[name]
    package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
    package = [p for p in package if p]
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = package[:len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            for alias in node.names:
                candidate = ".".join(base + [alias.name])
                target = candidate if candidate in MODULES else ".".join(base)
                if target in MODULES and target != name:
                    inside.add(target)
        elif isinstance(node, ast.ImportFrom) and node.module:
            outside.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            outside.update(alias.name.split(".")[0] for alias in node.names)
    return inside, outside


def test_the_package_has_its_layers():
    tops = {name.split(".")[0] for name in MODULES if name}
    assert {"operators", "panels", "blender", "neural_network"} <= tops
    assert len([n for n in MODULES if n.startswith("neural_network.")]) > 20


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("neural_network")))
def test_the_core_never_imports_blender(name):
    inside, outside = imports_of(name)
    assert not outside & {"bpy", "mathutils", "bpy_extras", "addon_utils", "bmesh", "gpu", "blf"}, name
    assert all(t.startswith("neural_network") for t in inside), (name, sorted(inside))


def test_arrows_point_down():
    wrong = []
    for name in MODULES:
        layer = LAYERS.get(name.split(".")[0])
        if layer is None:
            continue
        for target in imports_of(name)[0]:
            target_layer = LAYERS.get(target.split(".")[0])
            if target_layer is not None and target_layer > layer:
                wrong.append(f"{name} -> {target}")
            if name.startswith("operators") and target.startswith("panels") or \
                    name.startswith("panels") and target.startswith("operators"):
                wrong.append(f"{name} -> {target}")
    assert not wrong, wrong


BLENDER_LEVELS = {"workflows": 2, "live": 1, "rig": 0}     # inside blender/: workflows -> live -> rig, never back


def test_blender_side_groups_point_down():
    """blender/'s groups: a workflow may use the live tick and the rig readers, the live tick the rig readers, the rig
    readers neither (the shared errors, models and progress modules sit beside them)."""
    wrong = []
    for name in MODULES:
        parts = name.split(".")
        if parts[0] != "blender" or len(parts) < 3 or parts[1] not in BLENDER_LEVELS:
            continue
        for target in imports_of(name)[0]:
            other = target.split(".")
            if other[0] == "blender" and len(other) > 2 and other[1] in BLENDER_LEVELS and \
                    BLENDER_LEVELS[other[1]] > BLENDER_LEVELS[parts[1]]:
                wrong.append(f"{name} -> {target}")
    assert {n.split(".")[1] for n in MODULES if n.startswith("blender.") and n.count(".") >= 2} >= set(BLENDER_LEVELS)
    assert not wrong, wrong


def test_no_import_cycles():
    graph = {name: imports_of(name)[0] for name in MODULES}
    state, cycles = {}, []

    def visit(node, path):
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


def test_no_operator_calls_another_operator():
    calls = []
    for name, path in MODULES.items():
        if name.split(".")[0] not in ("operators", "blender", "neural_network") and name not in ("properties", "state"):
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Attribute) and node.attr == "neural_ik" and \
                    isinstance(node.value, ast.Attribute) and node.value.attr == "ops":
                calls.append(f"{name}:{node.lineno}")
    assert not calls, calls
