#!/usr/bin/env bash
# Issue 43's ablation of DeepSeek-V4's compressed attention, trained by kvphase and swept through
# llama.cpp: each cell is `kvphase train csa` with one set of ingredients, 3 seeds, every model swept
# at residues mod 8 (the published profile's modulus). Resumable: a finished training or sweep is kept.
#
#   scripts/deepseek4_ablation.sh CELL [SEED...]     (seeds default to 0 1 2; one core per call)
#
# Cells (reports/trained/ds4-ablation/CELL-seedN):
#   ctx64           `kvphase train csa` at its defaults (the engine study's csa, retrained here)
#   ctx128          overlapped compressor, every entry read, 128-token context
#   ctx256          the same at 256 tokens (1200 steps: still learning at the end)
#   ctx256-long     the same, 3000 steps
#   ctx128-top4     + the lightning indexer selecting 4 entries (trained by distillation)
#   ctx256-top4-hca  + HCA: layers at ratios 4, 128 (one CSA layer, one HCA), 256-token context
#   ctx256-top4-hca3 layers at ratios 4, 128, 4: HCA between two CSA layers
#   ctx256-hca-long  layers at ratios 4, 128, every entry read, 3000 steps
# The study ran seeds 0-2 of ctx64 and ctx128, 0-3 of ctx128-top4, seed 0 of the 256-token cells.
set -euo pipefail
cd "$(dirname "$0")/.."
KVPHASE=${KVPHASE:-.venv/bin/kvphase}
OUT=reports/trained/ds4-ablation
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"  # one core per training
cell=${1:?usage: scripts/deepseek4_ablation.sh CELL [SEED...]}
shift
case "$cell" in
  ctx64) design=csa; opts=() ;;
  ctx128) design=csa; opts=(--context 128 --steps 2000) ;;
  ctx256) design=csa; opts=(--context 256 --steps 1200) ;;
  ctx256-long) design=csa; opts=(--context 256 --steps 3000) ;;
  ctx256-hca-long) design=csa; opts=(--context 256 --steps 3000 --ratios 4,128) ;;
  ctx128-top4) design=csa; opts=(--context 128 --steps 2000 --top-k 4) ;;
  ctx256-top4-hca) design=csa; opts=(--context 256 --steps 1000 --top-k 4 --ratios 4,128) ;;
  ctx256-top4-hca3) design=csa; opts=(--context 256 --steps 1200 --top-k 4 --layers 3 --ratios 4,128,4) ;;
  *) echo "deepseek4_ablation: unknown cell $cell" >&2; exit 2 ;;
esac
for seed in "${@:-0 1 2}"; do
  for s in $seed; do
    run="$OUT/$cell-seed$s"
    "$KVPHASE" train "$design" "$run" "${opts[@]}" --seed "$s" --quiet
    "$KVPHASE" sweep "$run/model.gguf" --modulus 8 --per-residue 128 --out "$run/sweep" --quiet
  done
done
