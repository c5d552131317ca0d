"""Every CLI command on bad input, as a user runs it (a separate process): exactly one line on stderr,
`nik <command>: error: <reason>`, nothing on stdout, no traceback, a non-zero exit, and nothing written."""

import os
import subprocess
import sys

import pytest
from conftest import REPO

NIK = os.path.join(REPO, "scripts", "nik.py")


def nik(cwd, *args):
    return subprocess.run([sys.executable, NIK, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A folder of inputs, good and bad: a real .blend with the demo rig, and files that only look like inputs."""
    folder = tmp_path_factory.mktemp("cli_inputs")
    made = nik(str(folder), "create-demo-rig", "--save", "demo.blend")
    assert made.returncode == 0, made.stderr
    (folder / "empty.blend").write_bytes(b"")
    (folder / "text.blend").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (folder / "cut.blend").write_bytes((folder / "demo.blend").read_bytes()[:4000])
    (folder / "gzip.blend").write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 64)
    (folder / "text.npz").write_text("not a zip\n")
    (folder / "cut.npz").write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    (folder / "empty.npz").write_bytes(b"")
    (folder / "text.onnx").write_text("not a model\n")
    (folder / "a_folder").mkdir()
    (folder / "a_folder" / "note.txt").write_text("no bvh here")
    (folder / "broken_bvh").mkdir()
    (folder / "broken_bvh" / "cut.bvh").write_text("HIERARCHY\nROOT Hips\n{\n")
    (folder / "a_file").write_text("x")
    return folder


def _listing(folder):
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, dirs, files in os.walk(folder) for name in dirs + files)


CASES = [
    # extract: missing, empty, foreign, truncated and compressed-looking .blend; a folder; unknown armature; outputs
    ("extract", ["--blend", "missing.blend", "--out", "out.npz"], "missing.blend does not exist"),
    ("extract", ["--blend", "{inputs}/empty.blend", "--out", "out.npz"], "is empty"),
    ("extract", ["--blend", "{inputs}/text.blend", "--out", "out.npz"], "is not a .blend file"),
    ("extract", ["--blend", "{inputs}/cut.blend", "--out", "out.npz"], "failed"),
    ("extract", ["--blend", "{inputs}/gzip.blend", "--out", "out.npz"], "not supported"),
    ("extract", ["--blend", "{inputs}/a_folder", "--out", "out.npz"], "is a folder"),
    ("extract", ["--blend", "{inputs}/demo.blend", "--armature", "Nobody", "--out", "out.npz"], "no armature called"),
    ("extract", ["--blend", "{inputs}/demo.blend", "--out", "{inputs}/a_folder"], "is a folder"),
    ("extract", ["--blend", "{inputs}/demo.blend", "--out", "no/such/dir/out.npz"], "does not exist"),
    # train: the dataset missing, empty, foreign, truncated or a folder; bad numbers; an output that is a file
    ("train", ["--dataset", "missing.npz", "--out", "run"], "does not exist"),
    ("train", ["--dataset", "{inputs}/empty.npz", "--out", "run"], "is empty"),
    ("train", ["--dataset", "{inputs}/text.npz", "--out", "run"], "is not a dataset"),
    ("train", ["--dataset", "{inputs}/cut.npz", "--out", "run"], "cut.npz is not a readable .npz file (truncated or corrupt)"),
    ("train", ["--dataset", "{inputs}/a_folder", "--out", "run"], "is a folder"),
    ("train", ["--dataset", "{inputs}/cut.npz", "--out", "{inputs}/a_file"], "is a file"),
    ("train", ["--dataset", "x.npz", "--out", "run", "--epochs", "abc"], "--epochs"),
    ("train", ["--dataset", "x.npz", "--out", "run", "--epochs", "0"], "--epochs"),
    ("train", ["--dataset", "x.npz", "--out", "run", "--lr", "-1"], "--lr"),
    ("train", ["--dataset", "x.npz", "--out", "run", "--lr", "nan"], "--lr"),
    ("train", ["--dataset", "x.npz", "--out", "run", "--batch", "1"], "--batch"),
    ("train", ["--dataset", "x.npz", "--out", "run", "--time-limit", "-5"], "--time-limit"),
    ("train", ["--dataset", "x.npz", "--out", "run", "--own-share", "1.5"], "--own-share"),
    ("train", ["--dataset", "x.npz", "--out", "run", "--limb-mix", "-1"], "--limb-mix"),
    ("train", ["--out", "run"], "--dataset"),
    ("train", ["--dataset", "x.npz", "--out", "run", "--no-such-option", "3"], "unrecognized arguments: --no-such-option 3"),
    # import-bvh: no folder, a file, a folder without .bvh files, only broken files, a bad scale
    ("import-bvh", ["no/such/folder", "--save", "out.blend"], "does not exist"),
    ("import-bvh", ["{inputs}/a_file", "--save", "out.blend"], "is a file"),
    ("import-bvh", ["{inputs}/a_folder", "--save", "out.blend"], ".bvh"),
    ("import-bvh", ["{inputs}/broken_bvh", "--save", "out.blend"], "cut.bvh"),
    ("import-bvh", ["{inputs}/a_folder", "--scale", "0"], "--scale"),
    ("import-bvh", ["{inputs}/a_folder", "--save", "no/such/dir/out.blend"], "does not exist"),
    # export: no armature, foreign or missing model, output that is a folder or not .onnx
    ("export", ["--out", "out.onnx"], "armature"),
    ("export", ["--blend", "{inputs}/demo.blend", "--model", "{inputs}/text.npz", "--out", "out.onnx"], "is not a model"),
    ("export", ["--blend", "{inputs}/demo.blend", "--model", "{inputs}/text.onnx", "--out", "out.onnx"],
     "text.onnx is not a readable ONNX file (truncated or corrupt)"),
    ("export", ["--blend", "{inputs}/demo.blend", "--model", "missing.npz", "--out", "out.onnx"], "does not exist"),
    ("export", ["--blend", "{inputs}/demo.blend", "--out", "{inputs}/a_folder"], "is a folder"),
    ("export", ["--blend", "{inputs}/demo.blend", "--out", "out.txt"], ".onnx"),
    # bake: unknown action, bad numbers, a foreign .blend
    ("bake", ["--blend", "{inputs}/demo.blend", "--source-action", "nope", "--save", "out.blend"], "no action called"),
    ("bake", ["--blend", "{inputs}/demo.blend", "--refine", "-1", "--save", "out.blend"], "--refine"),
    ("bake", ["--blend", "{inputs}/demo.blend", "--start", "20", "--end", "10", "--save", "out.blend"], "before"),
    ("bake", ["--blend", "{inputs}/text.blend", "--save", "out.blend"], "is not a .blend file"),
    # bake on the ground and with pins: no such ground, a ground that is not a mesh, influences out of range
    ("bake", ["--blend", "{inputs}/demo.blend", "--source-action", "walk_slow_01", "--ground", "Nothing",
              "--save", "out.blend"], "no object or collection called 'Nothing'"),
    ("bake", ["--blend", "{inputs}/demo.blend", "--source-action", "walk_slow_01", "--ground", "NeuralIK_Demo",
              "--save", "out.blend"], "is not a mesh (armature)"),
    ("bake", ["--blend", "{inputs}/demo.blend", "--influence", "right_hand=1.5", "--save", "out.blend"],
     "--influence: 1.5 must be at most 1.0"),
    ("bake", ["--blend", "{inputs}/demo.blend", "--influence", "tail=1", "--save", "out.blend"],
     "--influence: 'tail=1' is not TARGET=P[,R]"),
    # evaluate: nothing to evaluate, a missing folder, a foreign model, an unknown action
    ("evaluate", ["--json", "out.json"], "--blend"),
    ("evaluate", ["--bvh-folder", "no/such/folder", "--json", "out.json"], "does not exist"),
    ("evaluate", ["--blend", "{inputs}/demo.blend", "--model", "{inputs}/cut.npz", "--json", "out.json"],
     "cut.npz is not a readable .npz file (truncated or corrupt)"),
    ("evaluate", ["--blend", "{inputs}/demo.blend", "--actions", "nope", "--json", "out.json"], "nope"),
    ("evaluate", ["--blend", "{inputs}/demo.blend", "--max-files", "x"], "--max-files"),
    # a pin the clip would silently keep: an influence on a target the file does not have
    ("bake", ["--blend", "{inputs}/demo.blend", "--source-action", "walk_slow_01", "--influence", "right_hand=1",
              "--save", "out.blend"], "NeuralIK_Demo has no right hand target: Create Targets first"),
    # free targets: all six, an unknown one, a free foot with Lock Feet, a free target with an influence
    ("bake", ["--blend", "{inputs}/demo.blend", "--free", "root,left_hand,right_hand,left_foot,right_foot,head",
              "--save", "out.blend"], "--free: all six targets free: pin at least one"),
    ("bake", ["--blend", "{inputs}/demo.blend", "--free", "root,tail", "--save", "out.blend"],
     "--free: 'root,tail' is not a list of targets"),
    ("bake", ["--blend", "{inputs}/demo.blend", "--source-action", "walk_slow_01", "--free", "left_foot",
              "--lock-feet", "--save", "out.blend"], "Lock Feet holds the feet where the clip plants them"),
    ("bake", ["--blend", "{inputs}/demo.blend", "--source-action", "walk_slow_01", "--free", "head",
              "--influence", "head=1", "--save", "out.blend"], "the head is free, but its influences pin it"),
    ("evaluate", ["--blend", "{inputs}/demo.blend", "--free", "head,tail", "--json", "out.json"], "--free"),
    # create-targets: no such .blend or armature, nowhere to save
    ("create-targets", ["--blend", "missing.blend", "--save", "out.blend"], "missing.blend does not exist"),
    ("create-targets", ["--blend", "{inputs}/demo.blend", "--armature", "Nobody", "--save", "out.blend"],
     "no armature called"),
    ("create-targets", ["--blend", "{inputs}/demo.blend", "--save", "no/such/dir/out.blend"], "does not exist"),
    # train-starter: no such .blend or armature, a bad time, broken starter files, an output that is a file
    ("train-starter", ["--blend", "missing.blend", "--out", "run"], "missing.blend does not exist"),
    ("train-starter", ["--blend", "{inputs}/demo.blend", "--armature", "Nobody", "--out", "run"], "no armature called"),
    ("train-starter", ["--blend", "{inputs}/demo.blend", "--out", "run", "--time-limit", "0"], "--time-limit"),
    ("train-starter", ["--blend", "{inputs}/demo.blend", "--out", "run", "--starter-motion", "{inputs}/cut.npz"],
     "the starter motion cannot be read: cut.npz is not a readable .npz file"),
    ("train-starter", ["--blend", "{inputs}/demo.blend", "--out", "run", "--starter-network", "{inputs}/text.npz"],
     "is not a starter network"),
    ("train-starter", ["--blend", "{inputs}/demo.blend", "--out", "{inputs}/a_file"], "is a file"),
    # create-demo-rig and demo: bad numbers, outputs that cannot be written
    ("create-demo-rig", ["--seed", "-1"], "--seed"),
    ("create-demo-rig", ["--reach-clips", "501"], "--reach-clips"),
    ("create-demo-rig", ["--save", "no/such/dir/demo.blend"], "does not exist"),
    ("demo", ["--out", "{inputs}/a_file"], "is a file"),
    ("demo", ["--epochs", "0"], "--epochs"),
    ("demo", ["--time-limit", "inf"], "--time-limit"),
]


@pytest.mark.parametrize("command, args, words", CASES,
                         ids=[f"{c}-{i}" for i, (c, _a, _w) in enumerate(CASES)])
def test_bad_input_is_one_line_nothing_written(inputs, tmp_path, command, args, words):
    assert words, "a row names the words its message must hold"
    work = tmp_path / "work"
    work.mkdir()
    before, inputs_before = _listing(work), _listing(inputs)
    run = nik(str(work), command, *[a.replace("{inputs}", str(inputs)) for a in args])
    assert run.returncode != 0
    assert run.stdout == "", run.stdout[-2000:]
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr[-3000:]
    assert lines[0].startswith(f"nik {command}: error: ") and words in lines[0], lines[0]
    assert "Traceback" not in run.stderr and "error: Error" not in lines[0]
    assert _listing(work) == before and _listing(inputs) == inputs_before      # nothing written, nothing made
