"""`kvphase sweep MODEL --stride all`: one run per stride a file declares, then their comparison.

DeepSeek-V4 declares several compress ratios (4 for CSA layers, 128 for HCA layers:
`CompressionSpec.params["strides"]`); glm5-next, minimax-m3 and trained models declare one.
Each stride's run is the folder `kvphase sweep --stride S` writes, except that from
LARGE_STRIDE on its residues span one period (M = S) instead of two: at S = 128, 2S
residues of 32 targets would be 8192 targets, too many for a laptop.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence, Union

from kvphase.errors import PlanError
from kvphase.gguf.modelinfo import ModelInfo

ALL = "all"
LARGE_STRIDE = 32  # from this stride on, `--stride all` takes M = S: one period, half the targets of M = 2S


def parse_stride(text: Optional[str]) -> Union[int, str, None]:
    """--stride as given: None (the file's own), a whole number (checked by the plan), or ALL;
    PlanError for anything else."""
    if text is None:
        return None
    if text.strip().lower() == ALL:
        return ALL
    try:
        return int(text)
    except ValueError:
        raise PlanError(f"--stride must be a whole number (the stride S) or 'all', got {text[:40]!r}") from None


def declared_strides(info: ModelInfo) -> list[int]:
    """Every stride the file declares, smallest first; PlanError naming the architecture when it
    declares no compression (a control run takes one --stride S)."""
    spec = info.compression
    strides = spec.params.get("strides") or ([spec.stride] if spec.stride else [])
    if not spec.compressed or not strides:
        raise PlanError(f"--stride all: {info.path.name} is a {info.architecture} model, which declares no KV-cache "
                        "compression, so it has no stride to sweep; give --stride S for a control run")
    return sorted(int(s) for s in strides)


def modulus_for(stride: int, modulus: Optional[int]) -> Optional[int]:
    """--modulus as given, or, for a stride of LARGE_STRIDE or more, the stride itself (None: the
    sweep's default, 2S)."""
    if modulus is not None or stride < LARGE_STRIDE:
        return modulus
    return stride


def planned_dip(per_residue: int, modulus: int) -> float:
    """The one-residue dip (points) that a balanced design of `per_residue` targets per residue
    detects with 80% power at any accuracy: `statistics.power.per_residue_for_dip` solved for the dip."""
    from kvphase.statistics.power import POWER, balanced_power, smallest_dip  # scipy: imported when used

    if balanced_power(per_residue, modulus, 1.0) < POWER:
        return math.inf  # not even a residue falling from 100% to 0% is found 80% of the time
    return 100 * smallest_dip(lambda dip: balanced_power(per_residue, modulus, dip), 1.0, POWER)


def comparison_dir(run_dirs: Sequence[Path], strides: Sequence[int]) -> Path:
    """Where the runs' comparison goes: beside them, named as the first run with `-S<stride>`
    replaced by `-strides` (reports/<model>-<task>-strides-L<context>...)."""
    first = Path(run_dirs[0])
    tag = f"-S{strides[0]}-"
    name = first.name.replace(tag, "-strides-", 1) if tag in first.name else f"{first.name}-strides"
    return first.parent / name


__all__ = ["ALL", "LARGE_STRIDE", "parse_stride", "declared_strides", "modulus_for", "planned_dip", "comparison_dir"]
