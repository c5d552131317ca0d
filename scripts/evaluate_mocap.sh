#!/usr/bin/env bash
# Train on real motion capture and evaluate on held-out clips, side by side with Blender's IK constraint.
#
#   bash scripts/evaluate_mocap.sh bandai|cmu|cmu+bandai|daz|daz+bandai|starter [out-folder]
#
# Held out of training entirely (unseen styles and motions); the evaluation uses 10 (Bandai) / 3 (CMU) of them.
# cmu+bandai: the CMU rig's 8 training clips plus all 280 Bandai files retargeted onto it, trained for 10 minutes
# (TIME_LIMIT seconds), evaluated on the same 3 held-out CMU clips as `cmu`.
# daz: the DAZ-style test rig (scripts/make_daz_proxy.py) with 2 CMU clips as its own (005_01, 006_02) and a CMU
# library retargeted onto it: the other 6 files of cmu/ and the 26 of cmu-more/ (other takes of the same people),
# 10 minutes; the same 3 held-out CMU clips. daz+bandai: the same library plus the 280 Bandai files.
# LIBRARY=auto|always|never: the trainer's --library (default: its own, auto); with TIME_LIMIT set, training runs
# until that limit (epochs unbounded), so runs with and without a library get the same time. SEED=N: the trainer's
# --seed (which own clip validates, the initialisation, the batches; default 0): one held-out figure moves ~0.1 cm
# with it, so the README gives means over seeds 0-4 where it compares runs.
# starter: the DAZ-style test rig with no clips at all, Train Starter Model (train-starter, TIME_LIMIT or 300 s in all)
# from the starter motion without the 3 held-out CMU clips (built here) and the shipped starter network (trained
# without them); evaluated on the same 3 CMU clips and on 10 Bandai clips of other people and styles.
# Reads ../shared/mocap (never copied); writes only into the out folder (default out/<set>).
set -euo pipefail
cd "$(dirname "$0")/.."
set_name=${1:?usage: evaluate_mocap.sh bandai|cmu|cmu+bandai|daz|daz+bandai|starter [out-folder]}
out=${2:-out/$set_name}
py=${PYTHON:-.venv/bin/python}
bandai_evaluate="dataset-1_bow_tired_001,dataset-1_walk_tired_001,dataset-1_run_tired_001,dataset-1_byebye_tired_001,\
dataset-1_punch_normal_001,dataset-1_dance-short_normal_001,dataset-1_respond_normal_001,\
dataset-2_wave-both-hands_youthful_001,dataset-2_raise-up-left-hand_youthful_001,dataset-2_run_youthful_001"
case "$set_name" in
  bandai)
    folder=../shared/mocap/bandai
    held_out="_tired_,_youthful_,punch,respond,dance"
    evaluate="$bandai_evaluate"
    ;;
  starter)
    folder=../shared/mocap/cmu
    held_out="005_10,006_01,006_14"
    mkdir -p "$out"
    start=$(date +%s)
    "$py" scripts/make_daz_proxy.py --folder "$folder" --own "" --save "$out/train.blend"
    "$py" scripts/make_starter_motion.py --folder "$folder" --folder ../shared/mocap/cmu-more --exclude "$held_out" \
      --out "$out/starter_motion.npz"
    "$py" scripts/nik.py train-starter --blend "$out/train.blend" --out "$out" --time-limit "${TIME_LIMIT:-300}" \
      --seed "${SEED:-0}" --starter-motion "$out/starter_motion.npz" ${NETWORK:+--starter-network "$NETWORK"} \
      --save "$out/train.blend"
    trained=$(date +%s)
    for clips in cmu bandai; do
      if [ $clips = cmu ]; then files="$held_out"; else files="$bandai_evaluate"; fi
      "$py" scripts/nik.py evaluate --blend "$out/train.blend" --bvh-folder "../shared/mocap/$clips" --files "$files" \
        --model "$out/model.npz" --refine 3 --json "$out/evaluation_$clips.json"
    done
    echo "train-starter: $((trained - start)) s with the proxy and the motion; evaluation: $(( $(date +%s) - trained )) s"
    exit 0
    ;;
  cmu|cmu+bandai|daz|daz+bandai)
    folder=../shared/mocap/cmu
    held_out="005_10,006_01,006_14"
    evaluate="$held_out"
    ;;
  *) echo "evaluate_mocap.sh: unknown set $set_name (bandai, cmu, cmu+bandai, daz or daz+bandai)" >&2; exit 2 ;;
esac
mkdir -p "$out"
start=$(date +%s)
train_args=()
if [ "${set_name%+bandai}" = daz ]; then
  own=005_01,006_02
  "$py" scripts/make_daz_proxy.py --folder "$folder" --own "$own" --save "$out/train.blend"
  "$py" scripts/nik.py import-bvh "$folder" --scale 0.01 --exclude "$held_out,$own" --blend "$out/train.blend" \
    --save "$out/train.blend"
  if [ -d ../shared/mocap/cmu-more ]; then
    "$py" scripts/nik.py import-bvh ../shared/mocap/cmu-more --scale 0.01 --exclude "$held_out" \
      --blend "$out/train.blend" --save "$out/train.blend"
  fi
else
  "$py" scripts/nik.py import-bvh "$folder" --scale 0.01 --exclude "$held_out" --save "$out/train.blend"
fi
if [ "$set_name" = cmu+bandai ] || [ "$set_name" = daz+bandai ]; then
  "$py" scripts/nik.py import-bvh ../shared/mocap/bandai --scale 0.01 --blend "$out/train.blend" --save "$out/train.blend"
fi
if [ "$set_name" != bandai ] && [ "$set_name" != cmu ]; then      # the library sets: 10 minutes
  train_args=(--time-limit "${TIME_LIMIT:-600}")
fi
if [ -n "${TIME_LIMIT:-}" ]; then
  train_args=(--time-limit "$TIME_LIMIT" --epochs 100000)
fi
if [ -n "${LIBRARY:-}" ]; then
  train_args+=(--library "$LIBRARY")
fi
if [ -n "${SEED:-}" ]; then
  train_args+=(--seed "$SEED")
fi
"$py" scripts/nik.py extract --blend "$out/train.blend" --out "$out/dataset.npz"
"$py" scripts/nik.py train --dataset "$out/dataset.npz" --out "$out" "${train_args[@]}"
trained=$(date +%s)
"$py" scripts/nik.py evaluate --blend "$out/train.blend" --bvh-folder "$folder" --files "$evaluate" \
  --model "$out/model.npz" --refine 4 --json "$out/evaluation.json" --svg "$out/evaluation.svg"
echo "import + extract + train: $((trained - start)) s; evaluation: $(( $(date +%s) - trained )) s"
