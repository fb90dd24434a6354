#!/usr/bin/env bash
# The post-hoc compression study on SmolLM2-135M through the numpy reference model
# (see reports/README.md). Every run resumes if interrupted; re-running skips finished work.
#   bash scripts/reference_study.sh        (about 45 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
KV=".venv/bin/kvphase"
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}
COMMON=(--backend reference --context 512 --padding prefix --seed 0 --quiet)
N=16          # targets per residue under each design (the dense control has 32)
BUDGET=64     # tokens a query may select under the selection designs, at every stride
LOCAL=16      # exact recent tokens every design keeps

run() {  # run NAME STRIDE DESIGN [OPTIONS...]
  local name=$1 stride=$2 design=$3; shift 3
  echo "== $name"
  "$KV" sweep --stride "$stride" --design "$design" "${COMMON[@]}" --per-residue "${PER_RESIDUE:-$N}" \
    --out "reports/reference/$name" "$@"
}

designs() {  # designs STRIDE
  local S=$1
  run "blocktopk-S$S" $S blocktopk -o block_size=$S -o top_k=$((BUDGET / S)) -o local_window=$LOCAL
  run "kpool-S$S" $S kpool -o kpool=$S -o top_k=$BUDGET   # its incomplete tail is its local window
  run "meanpool-S$S" $S meanpool -o window=$S -o stride=$S -o local_window=$LOCAL
}

PER_RESIDUE=32 run dense 4 dense
designs 4
designs 8

# The mitigations, applied to the design with the largest gap.
worst=$(.venv/bin/python - <<'PY'
import json, pathlib
gaps = {p.parent.name: json.loads(p.read_text())["gap"] for p in sorted(pathlib.Path("reports/reference").glob("*-S?/summary.json"))}
print(max(gaps, key=gaps.get))  # the first in name order among equal gaps
PY
)
echo "largest gap: $worst"
config="reports/reference/$worst/config.json"
stride=$(.venv/bin/python -c "import json; print(json.load(open('$config'))['stride'])")
design=$(.venv/bin/python -c "import json; print(json.load(open('$config'))['backend_options']['design'])")
mapfile -t opts < <(.venv/bin/python -c "
import json
for k, v in json.load(open('$config'))['backend_options'].items():
    if k != 'design': print('-o'); print(f'{k}={json.dumps(v)}')")
mitigations() {  # mitigations SUFFIX: the design as it is and under each offset fix
  run "$worst$1" "$stride" "$design" "${opts[@]}"
  run "$worst-stagger-layer$1" "$stride" "$design" "${opts[@]}" -o stagger=layer
  run "$worst-stagger-head$1" "$stride" "$design" "${opts[@]}" -o stagger=head
  run "$worst-randomize$1" "$stride" "$design" "${opts[@]}" -o randomize=true
}
mitigations ""
# Four times the targets for that design and its fixes, so the intervals can separate smaller gaps.
N=64 mitigations "-n64"

# the dense control first: compare gives every design's gap minus its gap, with a bootstrap interval
"$KV" compare reports/reference/dense $(ls -d reports/reference/* | grep -v "/dense$") --out reports/reference-comparison
