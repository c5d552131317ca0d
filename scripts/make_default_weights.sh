#!/usr/bin/env bash
# Reproduce the model shipped in weights/, end to end (about 35 minutes on 2 cores, most of it the training budget):
#   1. the demo rig (seed 0) with its standard procedural clips plus REACH_CLIPS (96) clips of hands reaching all around
#      the body (front, side, overhead, low, across, behind; `create-demo-rig --reach-clips`);
#   2. the CMU motion capture (free for any use; credit: CMU Graphics Lab Motion Capture Database, mocap.cs.cmu.edu,
#      created with funding from NSF EIA-0196217) retargeted onto that rig: $MOCAP/cmu and $MOCAP/cmu-more, 37 takes.
#      Never the Bandai data (non-commercial);
#   3. extract, train (seed 0, at most EPOCHS epochs or TIME_LIMIT seconds of training, whichever ends first; the rig's
#      own clips, procedural, are OWN_SHARE of every epoch), export to ONNX;
#   4. evaluate on the held-out demo actions of seed 1 (next to Blender's IK constraint, 2 refinement iterations) and
#      run the reach sweep (benchmarks/reach_sweep.py) with the new model;
# then copy the checkpoint (with its target prior), the ONNX exports with the sidecar, and the figures into weights/.
# (The shipped weights/demo.npz predates the priors: its prior and its clip prior were added by scripts/add_prior.py
# on the same dataset, 600 s each, the clip prior with --clip; both trained again so on 2026-11-30, on lengths
# (prior.LOSS), then `nik.py export` to weights/demo.onnx; and again as ensembles of two, `--members 2 --seconds 1200`
# (each member as many steps as the one before). A model this script trains now has both, of two members each.)
# Needs ../shared/mocap (MOCAP=... to point elsewhere); the tests never do.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=${OUT:-out/weights}
mocap=${MOCAP:-../shared/mocap}
reach_clips=${REACH_CLIPS:-96}
epochs=${EPOCHS:-300}
time_limit=${TIME_LIMIT:-1800}
own_share=${OWN_SHARE:-0.75}
for folder in "$mocap/cmu" "$mocap/cmu-more"; do
    [ -d "$folder" ] || { echo "make_default_weights: error: $folder does not exist (set MOCAP)" >&2; exit 1; }
done
mkdir -p "$out"
rig="$out/train.blend"
nik() { "$py" scripts/nik.py "$@"; }
started=$(date +%s)
nik create-demo-rig --seed 0 --reach-clips "$reach_clips" --save "$rig"
nik import-bvh "$mocap/cmu" --scale 0.01 --blend "$rig" --armature NeuralIK_Demo --save "$rig"
nik import-bvh "$mocap/cmu-more" --scale 0.01 --blend "$rig" --armature NeuralIK_Demo --save "$rig"
nik extract --blend "$rig" --armature NeuralIK_Demo --out "$out/dataset.npz"
nik train --dataset "$out/dataset.npz" --out "$out" --epochs "$epochs" --time-limit "$time_limit" --seed 0 \
    --own-share "$own_share"
nik export --blend "$rig" --armature NeuralIK_Demo --model "$out/model.npz" --out "$out/model.onnx"
nik create-demo-rig --seed 1 --save "$out/heldout.blend"
nik evaluate --blend "$out/heldout.blend" --armature NeuralIK_Demo --model "$out/model.npz" --refine 2 \
    --json "$out/evaluation.json"
"$py" benchmarks/reach_sweep.py --model "$out/model.npz" --json "$out/reach_sweep.json"
cp "$out/model.npz" weights/demo.npz
cp "$out/model.onnx" weights/demo.onnx
cp "$out/model.prior.onnx" weights/demo.prior.onnx      # the target prior (#33), trained in the same run
cp "$out/model.clip_prior.onnx" weights/demo.clip_prior.onnx   # and the clip prior (Bake's free feet)
cp "$out/model.json" weights/demo.json
cp "$out/metrics.json" weights/demo_metrics.json
"$py" - "$out/evaluation.json" weights/demo_evaluation.json <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
summary = {key: report[key] for key in ("methods", "fps", "rig_height_m", "refine_iterations")}
summary["results"] = {method: {k: v for k, v in result.items() if k != "per_action"}
                      for method, result in report["results"].items()}
json.dump(summary, open(sys.argv[2], "w"), indent=1)
PY
echo "weights/ updated from $out in $(( $(date +%s) - started )) s"
