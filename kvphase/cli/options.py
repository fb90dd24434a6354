"""Checks shared by several commands' options, run while the options are parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kvphase.defaults import DEFAULT_GPU_LAYERS, gpu_layer_count  # the library's rule, which the API applies too

GPU_LAYERS = typer.Option(str(DEFAULT_GPU_LAYERS), "--gpu-layers", metavar="N", parser=gpu_layer_count, help="llama.cpp: layers to "
                          "offload to a GPU (a build with CUDA, Metal or Vulkan), -1 or 'all' for every layer; a CPU "
                          "build runs every layer on the CPU and says so.")


def own_folder(value: Optional[Path]) -> Optional[Path]:
    """--out / OUT must name a folder of the run's own (`sweep.options.check_own_folder`)."""
    from kvphase.sweep.options import check_own_folder

    check_own_folder(value)
    return value
