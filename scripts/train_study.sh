#!/usr/bin/env bash
# The trained-models study (issue 8): each design and each fix at S = 4, three seeds, each
# model trained into reports/trained/<name>-seed<k>/ (resumable: re-running continues), then
# swept with the standard protocol, then one comparison of the final sweeps.
#
#     bash scripts/train_study.sh [STEPS]
#
# About 27 models; at the default size count on several CPU-minutes each on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
KV=${KV:-.venv/bin/kvphase}
STEPS=${1:-1500}
run() {  # name, then kvphase train options
  local name=$1; shift
  for seed in 0 1 2; do
    local out="reports/trained/${name}-seed${seed}"
    "$KV" train "$@" "$out" --steps "$STEPS" --seed "$seed" --quiet
    "$KV" sweep "$out/model.gguf" --out "$out/sweep" --quiet
  done
}
run dense dense
run gated gated
run meanpool meanpool
run kpool kpool
run gated-stagger-layer gated --stagger layer
run gated-stagger-head gated --stagger head
run gated-stagger-layer-head gated --stagger layer_head
run gated-offsets-random gated --offsets random
run gated-offsets-jitter gated --offsets jitter
"$KV" compare reports/trained/*/sweep --out reports/trained/comparison
