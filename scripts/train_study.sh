#!/usr/bin/env bash
# The trained-models study (issue 8): the dense control, the gated compressor and its offset
# fixes at S = 4, meanpool and kpool, and the capacity question (per-head staggering with
# 2, 4 and 8 heads against S = 4), three seeds each, every model trained into reports/trained/<name>-seed<k>/
# (resumable: re-running continues) and swept with the standard protocol (`kvphase sweep FILE`
# with no options: 256 targets per residue), then one comparison of the final sweeps.
#
#     bash scripts/train_study.sh [STEPS] [CONFIG ...]      # JOBS=2 trainings at a time, SEEDS="0 1 2"
#
# CONFIG is a name below (default: all). About 3 CPU-minutes per model at 1500 steps.
set -euo pipefail
cd "$(dirname "$0")/.."
KV=${KV:-.venv/bin/kvphase}
STEPS=${1:-1500}; shift || true
JOBS=${JOBS:-2}
SEEDS=${SEEDS:-0 1 2}
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"  # one core per training
declare -A OPTIONS=(
  [dense]="dense"
  [dense-L3]="dense --layers 3"  # a third layer, 10000 steps: the lever that moved the control furthest (issue 19 item 2)
  [dense-long]="dense"  # the control at 20000 steps (issue 19 item 2): does a longer schedule alone make it retrieve?
  [gated]="gated"
  [gated-stagger-layer]="gated --stagger layer"
  [gated-stagger-head]="gated --stagger head"
  [gated-stagger-layer-head]="gated --stagger layer_head"
  [gated-offsets-random]="gated --offsets random"
  [gated-offsets-jitter]="gated --offsets jitter"
  [meanpool]="meanpool --gate-steps 0"  # uniform pooling from scratch (the first study; now not the default)
  [meanpool-gated-start]="meanpool"  # the default: gated's trained gate for the first 1000 of 3000 steps, then uniform (issue 19 item 1)
  [kpool]="kpool"
  [gated-stagger-head-h2]="gated --stagger head --heads 2"
  [gated-stagger-head-h8]="gated --stagger head --heads 8"
  [gated-stagger-head-h8-d128]="gated --stagger head --heads 8 --d-model 128"  # 8 heads of 16 channels: width apart from count
  [gated-L256]="gated --context 256"  # 256-token contexts (issue 19 item 3): about 13 minutes each, 2 at a time
  [gated-S8-L256]="gated --stride 8 --context 256"  # S = 8, where 8 residue groups can be depth-matched
  [gated-L256-long]="gated --context 256"  # S = 4 at 3000 steps: the S = 8 schedule, so the two strides compare at one schedule
  [gated-S8-L256-long]="gated --stride 8 --context 256"  # the same at 3000 steps: seeds 1-2 sat on a plateau at 1500 (about 25 minutes each)
  [cowa]="cowa"  # CoWA head slices (issue 19): L = 2 tokens to each of 2 heads in turn
  [cowa-stagger-head]="cowa --stagger head"
  [cowa-offsets-random]="cowa --offsets random"
  # the induction warm-up (issue 19 item 2): 2000 steps of a repeated run of words, then 6000 of pairs; the
  # planner cannot place depth-matched targets in 16 or 32 tokens, so these report held-out accuracy, no sweep
  [dense-copy-L16]="dense --context 16 --stride 2 --copy-steps 2000"
  [dense-L16]="dense --context 16 --stride 2"  # the same 8000 steps without the warm-up
  [gated-S2-L16]="gated --context 16 --stride 2"  # the compressed model it is compared with
  [dense-copy-L32]="dense --context 32 --stride 2 --copy-steps 2000"
  [dense-copy]="dense --copy-steps 2000"  # at the task's 64 tokens
  [glm-msa]="glm-msa"  # MiniMax-M3's MSA block selection in glm5-next's layout, run by the reference (issue 19 item 1)
  [rolling]="rolling"  # gated's pooling at every position (no chunk boundaries): the dense twin that retrieves (issue 19 item 2)
)
declare -A NO_SWEEP=([dense-copy-L16]=1 [dense-L16]=1 [gated-S2-L16]=1 [dense-copy-L32]=1)
declare -A STEPS_OF=(  # designs that need a longer schedule than STEPS (reports/README.md says why)
  [cowa]=6000 [cowa-stagger-head]=6000 [cowa-offsets-random]=6000 [dense-long]=20000 [gated-S8-L256-long]=3000 [gated-L256-long]=3000 [dense-L3]=10000
  [dense-copy-L16]=8000 [dense-L16]=8000 [dense-copy-L32]=8000 [dense-copy]=8000 [meanpool-gated-start]=3000 [glm-msa]=2000
)
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(dense gated gated-stagger-layer gated-stagger-head gated-stagger-layer-head
                                     gated-offsets-random gated-offsets-jitter meanpool kpool
                                     gated-stagger-head-h2 gated-stagger-head-h8 gated-stagger-head-h8-d128 gated-L256 gated-L256-long gated-S8-L256 gated-S8-L256-long dense-L3 cowa cowa-stagger-head
                                     cowa-offsets-random dense-copy-L16 dense-L16 gated-S2-L16 dense-copy-L32 dense-copy rolling meanpool-gated-start glm-msa)
one() {  # name seed: train, then sweep
  local out="reports/trained/$1-seed$2"
  # shellcheck disable=SC2086
  "$KV" train ${OPTIONS[$1]} "$out" --steps "${STEPS_OF[$1]:-$STEPS}" --seed "$2" --quiet > /dev/null
  if [ -n "${NO_SWEEP[$1]:-}" ]; then echo "$1 seed $2: $(sed -n 3p "$out/report.md")"; return; fi
  [ -f "$out/sweep/summary.json" ] || "$KV" sweep "$out/model.gguf" --out "$out/sweep" --quiet > /dev/null
  echo "$1 seed $2: $(head -c 300 "$out/sweep/report.md" | sed -n 3p)"
}
export -f one; export KV STEPS
export OPTIONS_DECL; OPTIONS_DECL="$(declare -p OPTIONS); $(declare -p STEPS_OF); $(declare -p NO_SWEEP)"
for seed in $SEEDS; do for name in "${CONFIGS[@]}"; do echo "$name $seed"; done; done |
  xargs -P "$JOBS" -L 1 bash -c 'eval "$OPTIONS_DECL"; one "$0" "$1"'
"$KV" compare reports/trained/*/sweep --out reports/trained/comparison
"${PYTHON:-.venv/bin/python}" scripts/train_study_figure.py reports/trained
