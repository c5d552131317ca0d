#!/usr/bin/env bash
# Reproduce the model shipped in weights/: the main job on the demo rig (seed 0) with a full training budget,
# then copy the checkpoint, the ONNX export with its sidecar, and the figures into weights/.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=out/weights
"$py" scripts/nik.py demo --out "$out" --seed 0 --epochs 300 --time-limit 0
cp "$out/model.npz" weights/demo.npz
cp "$out/model.onnx" weights/demo.onnx
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
echo "weights/ updated from $out"
