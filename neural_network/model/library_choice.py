"""Own style first: whether a motion library helps the user's own clips is measured, not assumed.

A rig with a dozen clips of its own trains on thousands of retargeted library frames when the user adds a BVH
library. The library widens what the network can reach, but it can also pull the inner joints (spine, shoulders,
elbows, knees) toward the library's way of moving. So with `library = "auto"` (the default) and library motion in
the dataset, training runs twice, into two folders of the output folder:

    own clips only/      the own clips alone, for OWN_TIME_SHARE of the time limit (they are few: they converge fast)
    with the library/    own clips and library, for the rest of it (own clips weighted by own_share, as always)

Both are validated on the same frames of the user's own clips (the trainer's split does not depend on the
library), so their best scores compare like with like. The better one becomes the output folder's model.npz, and
metrics.json and the panel say which was kept and both figures. "always" and "never" train once, as asked.
Pure NumPy; no bpy.
"""

import dataclasses
import json
import os
import shutil

from ..data.files import atomic_write_bytes, save_json
from .trainer import METRICS_FILE, MODEL_FILE, PLOT_FILE, Cancelled, Trainer, TrainResult, score

OWN_TIME_SHARE = 0.25              # of a time-limited run: the own clips alone (the library run takes the rest)
FOLDERS = {"own": "own clips only", "library": "with the library"}


def needs_choice(dataset, config):
    """True when training runs both ways: library motion and own clips in the dataset, and library "auto"."""
    own = dataset.own_action_mask()
    return config.library == "auto" and bool(own.any() and not own.all())


def train(dataset, config, out_dir, progress=None, resume=False, on_epoch=None):
    """Train on `dataset` into `out_dir` as config.library says (see the module's docstring); returns the kept run's
    TrainResult. Its paths are the output folder's (model.npz, metrics.json, loss.svg)."""
    if not needs_choice(dataset, config):
        return Trainer(dataset, config, out_dir, progress, resume=resume, on_epoch=on_epoch).run()
    limit = config.time_limit
    results = {}
    for kind in ("own", "library"):
        folder = os.path.join(out_dir, FOLDERS[kind])
        os.makedirs(folder, exist_ok=True)
        spent = sum(r.seconds for r in results.values())
        time_limit = (OWN_TIME_SHARE * limit if kind == "own" else max(limit - spent, 1.0)) if limit else 0.0
        run_config = dataclasses.replace(config, library="never" if kind == "own" else "always", time_limit=time_limit)
        try:
            trainer = Trainer(dataset, run_config, folder, progress, resume=resume, on_epoch=on_epoch)
        except Cancelled:
            if not results:                 # nothing trained yet: as a single run's cancel
                raise
            break                           # cancelled between the runs: the first one's result stands
        trainer.phase = FOLDERS[kind]
        results[kind] = trainer.run()
        if results[kind].stopped == "cancelled":
            break
    return _keep_better(results, out_dir, progress)


def _keep_better(results, out_dir, progress):
    """Copy the better run's files (by its best score on the own clips' validation) into out_dir and say so."""
    scores = {kind: score(r.metrics) if r.metrics else float("inf") for kind, r in results.items()}
    kept = min(scores, key=scores.get)
    result = results[kept]
    paths = {"model": os.path.join(out_dir, MODEL_FILE), "metrics": os.path.join(out_dir, METRICS_FILE),
             "plot": os.path.join(out_dir, PLOT_FILE)}
    for key in ("model", "plot"):
        if os.path.exists(result.paths[key]):
            with open(result.paths[key], "rb") as source:
                atomic_write_bytes(paths[key], lambda target, source=source: shutil.copyfileobj(source, target))
    report = library_report(results, kept)
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


def library_report(results, kept):
    """What metrics.json and the panel say: each run's best figures on the own clips' validation, which was kept."""
    runs = {FOLDERS[kind]: {"inner_mpjpe_cm": r.metrics.get("inner_mpjpe_cm"),
                            "effector_cm_mean": r.metrics.get("effector_cm_mean"),
                            "score": score(r.metrics) if r.metrics else None, "seconds": round(r.seconds, 1),
                            "stopped": r.stopped} for kind, r in results.items()}
    parts = [f"{name}: inner {run['inner_mpjpe_cm']:.2f} cm, effector {run['effector_cm_mean']:.2f} cm"
             for name, run in runs.items() if run["inner_mpjpe_cm"] is not None]
    said = f"kept {FOLDERS[kept]} (own clips' validation; {'; '.join(parts)})"
    kept_inner = runs[FOLDERS[kept]]["inner_mpjpe_cm"]
    own_inner = runs.get(FOLDERS["own"], {}).get("inner_mpjpe_cm")
    # kept for its better score, worse at the inner joints (the style): not preferred in silence
    loses = kept == "library" and kept_inner is not None and own_inner is not None and kept_inner > own_inner
    if loses:
        said += (f". The library costs {kept_inner - own_inner:.2f} cm at the inner joints (your style) for its "
                 "reach: Library > Leave Out keeps your clips alone")
    return {"choice": "auto", "kept": FOLDERS[kept], "runs": runs, "said": said, "library_loses_inner_joints": loses}


def _load_metrics(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
