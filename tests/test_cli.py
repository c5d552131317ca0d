"""The command line as a user runs it: a separate process, one line and a non-zero exit on any error."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

NIK = os.path.join(REPO, "scripts", "nik.py")


def nik(*args, timeout=600):
    return subprocess.run([sys.executable, NIK, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_demo_runs_the_whole_main_job(tmp_path):
    """demo rig -> extract -> train -> export -> evaluate, with a tiny training budget."""
    out = tmp_path / "demo"
    run = nik("demo", "--out", str(out), "--epochs", "2", "--time-limit", "20", "--no-baseline")
    assert run.returncode == 0, run.stderr[-2000:]
    for name in ("dataset.npz", "model.npz", "model.onnx", "model.json", "metrics.json", "loss.svg",
                 "evaluation.json", "evaluation.svg"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert "network + refinement" in run.stdout
    results = json.loads((out / "evaluation.json").read_text())["results"]
    refined, network = results["refined"], results["network"]
    # 27 unseen clips after 2 epochs: the network alone misses by centimetres (6.4 cm mean), refinement lands the
    # effectors: 95% within 1 mm (0.29 mm measured), 0.07 mm on average (a few frames out of reach miss by up to 6 mm)
    assert network["effector_cm"]["mean"] > 1.0
    assert refined["effector_cm"]["p95"] < 0.1 and refined["effector_cm"]["mean"] < 0.05
    assert (out / "loss.svg").read_text(encoding="utf-8").startswith("<?xml")


def test_train_takes_the_own_clip_share_and_limb_mix(tmp_path):
    """`--own-share` and `--limb-mix` reach the trainer (the panel's Own Clips Share and Limb Mix), and the run says
    what it used."""
    from synthetic import synthetic_dataset

    path = tmp_path / "dataset.npz"
    synthetic_dataset(frames_per_action=20, actions=4).save(str(path))
    run = nik("train", "--dataset", str(path), "--out", str(tmp_path / "run"), "--epochs", "1", "--own-share", "0.6",
              "--limb-mix", "1.5")
    assert run.returncode == 0, run.stderr[-2000:]
    settings = json.loads((tmp_path / "run" / "metrics.json").read_text())["settings"]
    assert settings["own_share"] == pytest.approx(0.6) and settings["limb_mix"] == pytest.approx(1.5)


@pytest.mark.parametrize("args, words", [
    (("train", "--dataset", "missing.npz", "--out", "x"), "does not exist"),
    (("extract", "--blend", "missing.blend"), "does not exist"),
    (("import-bvh", "no/such/folder"), "does not exist"),
    (("export", "--out", "x.onnx"), "armature"),
])
def test_errors_are_one_line_and_a_non_zero_exit(tmp_path, args, words):
    run = nik(*args)
    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if line.startswith("nik ")]
    assert len(lines) == 1 and words in lines[0], run.stderr[-2000:]
    assert "Traceback" not in run.stderr


def test_every_command_has_help():
    listing = nik("--help")
    assert listing.returncode == 0
    for command in ("demo", "create-demo-rig", "import-bvh", "extract", "train", "train-starter", "export", "bake",
                    "evaluate", "create-targets"):
        assert command in listing.stdout
        assert nik(command, "--help").returncode == 0


def test_import_onto_a_blend_counts_the_files_it_imported(demo_bvh, tmp_path):
    """import-bvh --blend says how many clips this import added, not how many actions the file holds."""
    first, second = tmp_path / "one.blend", tmp_path / "two.blend"
    run = nik("import-bvh", demo_bvh.folder, "--scale", "0.01", "--files", "walk_normal_*", "--save", str(first))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "imported 2 actions" in run.stdout, run.stdout
    run = nik("import-bvh", demo_bvh.folder, "--scale", "0.01", "--files", "run_easy_01", "--blend", str(first),
              "--save", str(second))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "imported 1 action onto" in run.stdout and "(2 were there)" in run.stdout, run.stdout


def test_create_targets_then_a_pinned_bake_headless(tmp_path):
    """What the panel does, headless: create-targets adds the six empties (saved with the file); a bake of a clip then
    pins the right hand to its empty and gives the other five back to the clip (influence 0)."""
    demo, targets, baked = tmp_path / "demo.blend", tmp_path / "targets.blend", tmp_path / "baked.blend"
    assert nik("create-demo-rig", "--save", str(demo)).returncode == 0
    run = nik("create-targets", "--blend", str(demo), "--frame", "5", "--save", str(targets))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "created 6 targets on 'NeuralIK_Demo'" in run.stdout, run.stdout
    others = [f"{t}=0" for t in ("root", "left_hand", "left_foot", "right_foot", "head")]
    run = nik("bake", "--blend", str(targets), "--source-action", "walk_normal_03", "--influence", "right_hand=1",
              *[a for o in others for a in ("--influence", o)], "--save", str(baked))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "baked 'walk_normal_03.nik'" in run.stdout


def test_bake_with_free_targets_headless(tmp_path):
    """`bake --free root,head` on the demo rig (the shipped model has its prior): the file saved with the new action
    and the Free settings as given, the clip left as it was."""
    demo, baked = tmp_path / "demo.blend", tmp_path / "baked.blend"
    assert nik("create-demo-rig", "--save", str(demo)).returncode == 0
    run = nik("bake", "--blend", str(demo), "--source-action", "walk_normal_03", "--free", "root,head", "--refine", "3",
              "--save", str(baked))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "baked 'walk_normal_03.nik'" in run.stdout
    check = nik("bake", "--blend", str(baked), "--source-action", "walk_normal_03", "--free",
                "root,left_hand,right_hand,left_foot,right_foot,head")
    assert check.returncode != 0 and "pin at least one" in check.stderr
