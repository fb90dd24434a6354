"""Checks shared by several commands' options, run while the options are parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kvphase.errors import PlanError

ALL_LAYERS = -1  # llama.cpp's n_gpu_layers for "every layer"
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


GPU_LAYERS = typer.Option("0", "--gpu-layers", metavar="N", parser=gpu_layer_count, help="llama.cpp: layers to "
                          "offload to a GPU (a build with CUDA, Metal or Vulkan), -1 or 'all' for every layer; a CPU "
                          "build runs every layer on the CPU and says so.")


def given(value, default):
    """An option's value, or the default when the option was not given (0 is a given value)."""
    return default if value is None else value


def with_gpu_layers(plan, gpu_layers: int):
    """The plan with --gpu-layers in its backend options (only when above 0, so a CPU plan's
    config.json is what it always was); a warning when this llama.cpp build cannot offload."""
    from dataclasses import replace

    if not gpu_layers:
        return plan
    if plan.backend != "llama.cpp":
        raise PlanError(f"--gpu-layers applies to the llama.cpp backend only, not {plan.backend}")
    from kvphase.engines.llamacpp import gpu_offload_note

    note = gpu_offload_note(gpu_layers)
    if note:
        typer.echo(f"Warning: {note}", err=True)
    return replace(plan, backend_options={**plan.backend_options, "gpu_layers": gpu_layers})


def own_folder(value: Optional[Path]) -> Optional[Path]:
    """--out / OUT must name a folder of the run's own: "" and "." (the current folder) would mix
    the run's files with whatever is there."""
    if value is not None and Path(value) == Path("."):
        raise PlanError(f"the run folder {str(value)!r} is the current folder; name a folder for the run (e.g. --out run1)")
    return value
