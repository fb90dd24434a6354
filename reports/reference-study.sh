#!/usr/bin/env bash
# The post-hoc compression study on SmolLM2-135M through the numpy reference model
# (see reports/README.md). Every run resumes if interrupted; re-running skips finished work.
#   bash reports/reference-study.sh        (about an hour on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
KV=".venv/bin/kvphase"
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}
COMMON=(--backend reference --context 512 --per-residue 32 --padding prefix --seed 0 --quiet)
BUDGET=64     # tokens a query may select under the selection designs, at every stride
LOCAL=16      # exact recent tokens every design keeps

run() {  # run NAME STRIDE DESIGN [OPTIONS...]
  local name=$1 stride=$2 design=$3; shift 3
  echo "== $name"
  "$KV" sweep --stride "$stride" --design "$design" "${COMMON[@]}" --out "reports/reference/$name" "$@"
}

run dense 4 dense
for S in 4 8; do
  run "blocktopk-S$S" $S blocktopk -o block_size=$S -o top_k=$((BUDGET / S)) -o local_window=$LOCAL
  run "kpool-S$S" $S kpool -o kpool=$S -o top_k=$BUDGET   # its incomplete tail is its local window
  run "meanpool-S$S" $S meanpool -o window=$S -o stride=$S -o local_window=$LOCAL
done

# The mitigations, applied to the design with the largest gap.
worst=$(.venv/bin/python - <<'PY'
import json, pathlib
gaps = {p.parent.name: json.loads(p.read_text())["gap"] for p in pathlib.Path("reports/reference").glob("*-S*/summary.json")
        if "-stagger" not in p.parent.name and "-random" not in p.parent.name}
print(max(gaps, key=gaps.get))
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
run "$worst-stagger-layer" "$stride" "$design" "${opts[@]}" -o stagger=layer
run "$worst-stagger-head" "$stride" "$design" "${opts[@]}" -o stagger=head
run "$worst-randomize" "$stride" "$design" "${opts[@]}" -o randomize=true

"$KV" compare reports/reference/* --out reports/reference-comparison
