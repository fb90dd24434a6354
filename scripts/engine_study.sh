#!/usr/bin/env bash
# The engine-layout study (issue 18): DeepSeek-V4's CSA trained by kvphase in deepseek4's own
# file layout, its disjoint variant and its dense twin, GLM-5.3's k-pool in glm5-next's own layout
# and its dense twin (SEEDS, default 0 1 2), every model trained
# into reports/trained/engine/<name>-seed<k>/ (resumable: re-running continues), then swept
# twice with the standard protocol: through llama.cpp itself (`kvphase sweep FILE`, the
# default for these files) and through the numpy reference (`--backend reference`) on the
# same weights, then quantized to Q8_0 and Q4_0 (the gguf package's quantizers) and swept
# through llama.cpp again; one comparison of the llama.cpp sweeps and the agreement table
# (scripts/engine_agreement.py).
#
#     bash scripts/engine_study.sh [STEPS] [CONFIG ...]      # JOBS=2 trainings at a time, SEEDS="0 1 2"
#
# STEPS: default (or "-") the layout's own default of `kvphase train` (1000 steps of 32 sequences for the
# csa designs, 2000 for the glm designs). reports/trained/engine/ holds:
#     SEEDS="0 1 2" bash scripts/engine_study.sh - csa-dense
#     SEEDS="0 1 2 3 4" bash scripts/engine_study.sh - csa-disjoint csa
#     SEEDS=0 bash scripts/engine_study.sh - glm-dense
#     SEEDS="0 1 2" bash scripts/engine_study.sh - glm-kpool
# and glm-kpool-top4-seed0 (`kvphase train glm-kpool --top-k 4`, swept through llama.cpp) by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
KV=${KV:-.venv/bin/kvphase}
STEPS=${1:--}; shift || true
JOBS=${JOBS:-2}
SEEDS=${SEEDS:-0 1 2}
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"  # one core per training
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(csa-disjoint csa csa-dense)
one() {  # design seed: train, then sweep through llama.cpp and through the reference
  local out="reports/trained/engine/$1-seed$2"
  local steps=(); [ "$STEPS" = "-" ] || steps=(--steps "$STEPS")
  "$KV" train "$1" "$out" "${steps[@]}" --seed "$2" --quiet > /dev/null
  [ -f "$out/sweep/summary.json" ] || "$KV" sweep "$out/model.gguf" --out "$out/sweep" --threads 1 --quiet > /dev/null
  [ -f "$out/sweep-reference/summary.json" ] ||
    "$KV" sweep "$out/model.gguf" --out "$out/sweep-reference" --backend reference --quiet > /dev/null
  for q in Q8_0 Q4_0; do
    [ -f "$out/sweep-$q/summary.json" ] && continue
    .venv/bin/python scripts/quantize_model.py "$out/model.gguf" "$q" "$out/model-$q.gguf"
    "$KV" sweep "$out/model-$q.gguf" --out "$out/sweep-$q" --threads 1 --quiet > /dev/null
  done
  echo "$1 seed $2: $(sed -n 3p "$out/sweep/report.md")"
}
export -f one; export KV STEPS
for seed in $SEEDS; do for name in "${CONFIGS[@]}"; do echo "$name $seed"; done; done |
  xargs -P "$JOBS" -L 1 bash -c 'one "$0" "$1"'
"$KV" compare reports/trained/engine/*/sweep --out reports/trained/engine/comparison
.venv/bin/python scripts/engine_agreement.py
