#!/usr/bin/env bash
# The mechanism probes of the engine-layout study (issue 18) on trained deepseek4 files, through
# llama.cpp's own graph: static gates, the gate weights real contexts use, head and gate-slot
# knockouts, flip and gate cycling; flip and cycle also through the numpy reference on the same
# weights. Each probe writes reports/trained/engine/<name>-seed<k>/probes/<probe>/ and is
# skipped when its report exists (re-running finishes what is missing).
#
#     bash scripts/engine_probes.sh [NAME-seedK ...]      # default: csa-disjoint-seed0 csa-seed0
set -euo pipefail
cd "$(dirname "$0")/.."
KV=${KV:-.venv/bin/kvphase}
RUNS=("$@")
[ ${#RUNS[@]} -gt 0 ] || RUNS=(csa-disjoint-seed0 csa-seed0)
probe() {  # folder, then the command's arguments after the model
  local out="$dir/probes/$1"; shift
  [ -f "$out/report.md" ] || "$KV" "$@" --out "$out" > /dev/null
  echo "$name $(basename "$out"): $(sed -n 3p "$out/report.md" | cut -c1-200)"
}
for name in "${RUNS[@]}"; do
  dir="reports/trained/engine/$name"; model="$dir/model.gguf"
  probe gates gates "$model"
  probe gate-activations gate-activations "$model" --threads 1
  probe knockout knockout "$model" --per-residue 64 --threads 1
  probe knockout-slots knockout "$model" --slots --per-residue 64 --threads 1
  probe flip flip "$model" --targets 32 --threads 1
  probe flip-reference flip "$model" --targets 32 --backend reference
  probe cycle cycle "$model" --k 1 --per-residue 64 --threads 1
  probe cycle-reference cycle "$model" --k 1 --per-residue 64 --backend reference
done
