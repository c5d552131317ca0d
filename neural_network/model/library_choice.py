"""Own style first: whether a motion library helps the user's own clips is measured, not assumed.

A rig with a dozen clips of its own trains on thousands of retargeted library frames when the user adds a BVH
library. The library widens what the network can reach, but it can also pull the inner joints (spine, shoulders,
elbows, knees) toward the library's way of moving. So with `library = "auto"` (the default) and library motion in
the dataset, training runs twice, into two folders of the output folder:

    own clips only/      the own clips alone (with a time limit: OWN_TIME_SHARE of it)
    with the library/    own clips and library (LIBRARY_TIME_SHARE of the limit; own clips weighted by own_share)

With fewer than own_validation_min (4) own clips there is no own-only run: their validation is the last stretch of
each, too close to what trains to judge reach, and two clips alone miss unseen motion by 17.8 cm on the DAZ-style rig
(against 2.45 with a library); the library run takes the whole limit, and the report says why.

Both are validated on the same frames of the user's own clips (the trainer's split does not depend on the
library), so they compare like with like, by two measures: the network alone's best score (effector + inner, what
early stopping uses) and what Run IK shows, the network's pose refined (REFINE_ITERATIONS, the evaluation's) onto the
frames' own effector targets, judged at the inner joints (spine, neck, shoulders, elbows, knees: the refinement lands
the effectors either way, and the inner joints are the style). Own style first: the library run is kept only when it
is better by both. Either measure alone chose the library once on the CMU rig + Bandai where the own clips do better
on unseen clips of the same people (the score: 6.20 against 6.80, unseen inner joints 1.68 cm against 1.48-1.66 for
the own clips alone; the refined inner joints, on another seed's validation clip: 1.03 against 1.10, unseen 1.79
against 1.58); both together kept the own clips on every seed measured (docs/results.md).

With a time limit, the one kept then trains on for the rest of it (Trainer.train_on), so it has most of
the time whichever it is (an own-only run cut to a quarter of 10 minutes lost to the library, although a full one
wins on unseen clips of the same people), and no run stops early: on a single 216-frame validation clip a plateau of
a few seconds is noise, and early stops had cut the own-only run at 168 of its 210 s and its train-on at 312 of 390 s.
The one kept becomes the output folder's model.npz, and metrics.json and the panel say which was kept and both
figures. "always" and "never" train once, as asked.
Pure NumPy; no bpy.
"""

import dataclasses
import json
import os
import shutil

import numpy as np

from ..data.files import atomic_write_bytes, save_json
from ..ik.refine import Refiner
from ..skeleton.roles import EFFECTOR_ROLES, INNER_ROLES
from .trainer import METRICS_FILE, MODEL_FILE, PLOT_FILE, Cancelled, Trainer, TrainResult, score, validates_whole_own_clips

OWN_TIME_SHARE = 0.35              # of a time-limited run: the own clips alone first ...
LIBRARY_TIME_SHARE = 0.35          # ... then with the library; the one kept trains on for the rest of the limit
FOLDERS = {"own": "own clips only", "library": "with the library"}
REFINE_ITERATIONS = 4              # the refinement the verdict applies (as scripts/evaluate_mocap.sh evaluates)


def needs_choice(dataset, config):
    """True when training runs both ways: library motion and own clips in the dataset, and library "auto"."""
    own = dataset.own_action_mask()
    return config.library == "auto" and bool(own.any() and not own.all())


def train(dataset, config, out_dir, progress=None, resume=False, on_epoch=None, start_from=None):
    """Train on `dataset` into `out_dir` as config.library says (see the module's docstring); returns the kept run's
    TrainResult. Its paths are the output folder's (model.npz, metrics.json, loss.svg). start_from: a Model every run
    starts from (Trainer)."""
    if not needs_choice(dataset, config):
        return Trainer(dataset, config, out_dir, progress, resume=resume, on_epoch=on_epoch, start_from=start_from).run()
    limit = config.time_limit
    own_clips = int(dataset.own_action_mask().sum())
    kinds, note = ("own", "library"), ""
    if not validates_whole_own_clips(own_clips, config):    # their last stretches cannot judge reach: no own-only run
        kinds = ("library",)
        note = (f"{own_clips} own clip{'s are' if own_clips != 1 else ' is'} too few to judge the library without it "
                "(only their last stretches validate): Library > Leave Out trains them alone")
    shares = {"own": OWN_TIME_SHARE, "library": LIBRARY_TIME_SHARE if len(kinds) == 2 else 1.0}
    results, trainers = {}, {}
    for kind in kinds:
        folder = os.path.join(out_dir, FOLDERS[kind])
        os.makedirs(folder, exist_ok=True)
        run_config = dataclasses.replace(config, library="never" if kind == "own" else "always",
                                         time_limit=shares[kind] * limit, patience=0 if limit else config.patience,
                                         started=0.0 if results else config.started)
        try:
            trainer = Trainer(dataset, run_config, folder, progress, resume=resume, on_epoch=on_epoch,
                              start_from=start_from)
        except Cancelled:
            if not results:                 # nothing trained yet: as a single run's cancel
                raise
            break                           # cancelled between the runs: the first one's result stands
        trainer.phase = FOLDERS[kind]
        trainers[kind], results[kind] = trainer, trainer.run()
        if results[kind].stopped == "cancelled":
            break
    refined = {kind: refined_inner_cm(r.model, trainers[kind].val) for kind, r in results.items()}
    left = limit - sum(r.seconds for r in results.values())
    if limit and len(results) == 2 and left > 1.0 and not any(r.stopped == "cancelled" for r in results.values()):
        kind = better(results, refined)
        trainers[kind].phase = f"{FOLDERS[kind]}, trained on"
        results[kind] = trainers[kind].train_on(results[kind].seconds + left)
        refined[kind] = refined_inner_cm(results[kind].model, trainers[kind].val)      # the other run is as it was
    return _keep_better(results, refined, out_dir, progress, note)


def refined_inner_cm(model, data, iterations=REFINE_ITERATIONS, chunk=4096, units_to_cm=100.0):
    """Inner-joint MPJPE (cm) of `model` on validation rows (trainer.TrainingArrays) as Run IK poses them: the
    network's pose (clamped to its limits) refined until the effectors reach the rows' own effector targets."""
    refiner = Refiner(model.skeleton, model.mean_pose, model.limit_low, model.limit_high)
    inner = [j for j in INNER_ROLES if model.skeleton.role_mask[j]]
    if not inner or len(data) == 0:
        return 0.0
    eff, total = list(EFFECTOR_ROLES), 0.0
    for start in range(0, len(data), chunk):
        part = slice(start, start + chunk)
        if data.bridges is not None:           # in-between bones that move (a pelvis between the hips and thighs)
            refiner.set_links(data.bridges[part], data.offsets[part])
        _, pose, _ = refiner.refine(model.solve_local(data.inputs[part]), data.hips_rotation[part],
                                    data.hips_position[part], data.positions[part][:, eff],
                                    data.global_rotations[part][:, eff], iterations)
        error = np.linalg.norm(pose.positions[:, inner] - data.positions[part][:, inner], axis=-1)
        total += float(error.sum())
    return total / (len(data) * len(inner)) * units_to_cm


def better(results, refined):
    """The kind kept: "library" only when its run beats the own clips alone on the own clips' validation by both
    measures, the refined inner joints (`refined`: {kind: cm}) and the network alone's score; else "own" (or the only
    kind that ran)."""
    if len(results) == 1:
        return next(iter(results))
    scores = {kind: score(r.metrics) if r.metrics else float("inf") for kind, r in results.items()}
    wins = refined["library"] < refined["own"] and scores["library"] < scores["own"]
    return "library" if wins else "own"


def _keep_better(results, refined, out_dir, progress, note=""):
    """Copy the kept run's files (see better) into out_dir and say so."""
    kept = better(results, refined)
    result = results[kept]
    paths = {"model": os.path.join(out_dir, MODEL_FILE), "metrics": os.path.join(out_dir, METRICS_FILE),
             "plot": os.path.join(out_dir, PLOT_FILE)}
    for key in ("model", "plot"):
        if os.path.exists(result.paths[key]):
            with open(result.paths[key], "rb") as source:
                atomic_write_bytes(paths[key], lambda target, source=source: shutil.copyfileobj(source, target))
    report = library_report(results, refined, kept, note)
    summary = dict(_load_metrics(result.paths["metrics"]))
    summary["library"] = report
    save_json(paths["metrics"], summary)
    if progress is not None:
        progress.message = report["said"]
        progress.checkpoint_path = paths["model"]
        progress.plot_path = paths["plot"]
        progress.library = report["said"]
    return TrainResult(result.model, result.metrics, result.history, result.stopped, sum(r.seconds for r in
                       results.values()), paths)


def library_report(results, refined, kept, note=""):
    """What metrics.json and the panel say: each run's figures on the own clips' validation (the two measures that
    choose: refined inner joints and the network alone's best score), which was kept (and `note`: why only one run
    trained)."""
    runs = {FOLDERS[kind]: {"refined_inner_mpjpe_cm": refined[kind],
                            "inner_mpjpe_cm": r.metrics.get("inner_mpjpe_cm"),
                            "effector_cm_mean": r.metrics.get("effector_cm_mean"),
                            "score": score(r.metrics) if r.metrics else None, "seconds": round(r.seconds, 1),
                            "stopped": r.stopped} for kind, r in results.items()}
    parts = [f"{name}: inner joints {run['refined_inner_mpjpe_cm']:.2f} cm refined, effector + inner "
             f"{run['score']:.2f} cm alone" for name, run in runs.items() if run["score"] is not None]
    said = f"kept {FOLDERS[kept]} (your clips' validation; {'; '.join(parts)})"
    if len(runs) == 2:
        said += ". The library is kept only when it is better by both"
    if note:
        said += f". {note}"
    rule = (f"the library only when better on the own clips both refined ({REFINE_ITERATIONS} iterations, inner-joint "
            "MPJPE) and alone (score)") if len(runs) == 2 else note
    return {"choice": "auto", "kept": FOLDERS[kept], "runs": runs, "said": said, "judged_by": rule}


def _load_metrics(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
