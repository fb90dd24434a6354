"""Checks shared by several commands' options, run while the options are parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kvphase.errors import PlanError

GPU_LAYERS = typer.Option(0, "--gpu-layers", min=0, max=2**31 - 1, metavar="N", help="llama.cpp: layers to offload to a GPU (a "
                          "build with CUDA, Metal or Vulkan); a CPU build runs every layer on the CPU and says so.")


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
