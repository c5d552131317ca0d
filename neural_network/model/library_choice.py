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
library), so their best scores compare like with like. With a time limit, the better one then trains on for the
rest of it (Trainer.train_on), so the one kept has most of the time whichever it is: on the CMU rig (8 own clips)
with the Bandai library, an own-only run cut to a quarter of 10 minutes lost to the library on the own clips
(score 6.82 against 6.66) although a full own-only run wins there (6.10) and on unseen clips of the same people.
The better one becomes the output folder's model.npz, and metrics.json and the panel say which was kept and both
figures. "always" and "never" train once, as asked.
Pure NumPy; no bpy.
"""

import dataclasses
import json
import os
import shutil

from ..data.files import atomic_write_bytes, save_json
from .trainer import METRICS_FILE, MODEL_FILE, PLOT_FILE, Cancelled, Trainer, TrainResult, score, validates_whole_own_clips

OWN_TIME_SHARE = 0.35              # of a time-limited run: the own clips alone first ...
LIBRARY_TIME_SHARE = 0.35          # ... then with the library; the better one trains on for the rest of the limit
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
                                         time_limit=shares[kind] * limit)
        try:
            trainer = Trainer(dataset, run_config, folder, progress, resume=resume, on_epoch=on_epoch)
        except Cancelled:
            if not results:                 # nothing trained yet: as a single run's cancel
                raise
            break                           # cancelled between the runs: the first one's result stands
        trainer.phase = FOLDERS[kind]
        trainers[kind], results[kind] = trainer, trainer.run()
        if results[kind].stopped == "cancelled":
            break
    left = limit - sum(r.seconds for r in results.values())
    if limit and len(results) == 2 and left > 1.0 and not any(r.stopped == "cancelled" for r in results.values()):
        kind = _better(results)
        trainers[kind].phase = f"{FOLDERS[kind]}, trained on"
        results[kind] = trainers[kind].train_on(results[kind].seconds + left)
    return _keep_better(results, out_dir, progress, note)


def _better(results):
    """The kind ("own" or "library") whose best score on the own clips' validation is lower."""
    scores = {kind: score(r.metrics) if r.metrics else float("inf") for kind, r in results.items()}
    return min(scores, key=scores.get)


def _keep_better(results, out_dir, progress, note=""):
    """Copy the better run's files (by its best score on the own clips' validation) into out_dir and say so."""
    kept = _better(results)
    result = results[kept]
    paths = {"model": os.path.join(out_dir, MODEL_FILE), "metrics": os.path.join(out_dir, METRICS_FILE),
             "plot": os.path.join(out_dir, PLOT_FILE)}
    for key in ("model", "plot"):
        if os.path.exists(result.paths[key]):
            with open(result.paths[key], "rb") as source:
                atomic_write_bytes(paths[key], lambda target, source=source: shutil.copyfileobj(source, target))
    report = library_report(results, kept, note)
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


def library_report(results, kept, note=""):
    """What metrics.json and the panel say: each run's best figures on the own clips' validation, which was kept
    (and `note`: why only one run trained)."""
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
    if note:
        said += f". {note}"
    return {"choice": "auto", "kept": FOLDERS[kept], "runs": runs, "said": said, "library_loses_inner_joints": loses}


def _load_metrics(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
