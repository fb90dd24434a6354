"""Numpy references of chunked KV-cache compression designs, one small dataclass per file.

Two kinds:

- llama.cpp mirrors (`kpool`, `dsv4`, `msa`): hyperparameters from the GGUF file, one
  method per stage named after the llama.cpp tensor it reproduces, and a `forward` that
  runs all stages and returns every intermediate, so `kvphase validate` can compare
  stage by stage with captured tensors.
- post-hoc designs (`meanpool`, `blocktopk`, `cowindow`): applied to any model's own K/V by the
  reference transformer through `compress(queries, keys, values, query_positions)`,
  the one method a new post-hoc design overrides; `attend` runs attention over the result.

`DESIGNS` is the one registry of the designs a run can name (kvpress's `PRESS_REGISTRY`): each entry a
`Design`, with `for_stride` where the reference backend runs it post hoc (`kvphase sweep --backend reference
--design NAME`: the options a sweep of that stride gives it). `heldphase` (a trained gate with one phase held
at its mean, the knockout probe's slot ablation) is a design too, but no run names it, so `DESIGNS` leaves it out.

Every design carries `start`, the position where its first window starts, so staggered or
randomized offsets can be expressed. See CONTRIBUTING.md for adding a design.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

from kvphase.designs.base import CompressedKV, PostHocDesign, attend
from kvphase.designs.blocktopk import BlockTopK
from kvphase.designs.cowindow import CoWindow
from kvphase.designs.dsv4 import DSV4, DSV4Selection
from kvphase.designs.gatedpool import GatedPool, GatedTopK
from kvphase.designs.heldphase import HeldPhaseGate, HeldPhaseTopK
from kvphase.designs.kpool import KPool, KPoolSelection, PostHocKPool
from kvphase.designs.meanpool import MeanPool
from kvphase.designs.msa import MSA, MSASelection
from kvphase.designs.windows import WindowLayout

REFERENCE_TOP_K = 16  # blocks (or pools) a query may select, by default, when a sweep runs a design post hoc

WEIGHTS = "it needs weights a llama-family model lacks"


@dataclass(frozen=True)
class Design:
    """A design a run can name: its class and, where the reference backend runs it post hoc on any model's
    own K/V, `for_stride` (the options a sweep of that stride gives it; the sweep's `--option`s override them)."""

    cls: type  # the design's frozen dataclass
    for_stride: Optional[Callable[[int], dict]] = None  # stride -> options; None: not run post hoc
    options: tuple[str, ...] = ()  # the options `--option` may set; (): the fields of `cls`
    build: Optional[Callable[..., object]] = None  # options -> what the reference wraps; None: `cls(**options)`
    refusal: str = WEIGHTS  # why the reference backend does not run it post hoc

    @property
    def post_hoc(self) -> bool:
        return self.for_stride is not None

    @property
    def option_names(self) -> tuple[str, ...]:
        return self.options or tuple(field.name for field in dataclasses.fields(self.cls))

    def make(self, **options):
        """The design of these options (ValueError or TypeError where it rejects them)."""
        return (self.build or self.cls)(**options)


DESIGNS: dict[str, Design] = {
    "meanpool": Design(MeanPool, for_stride=lambda stride: {"window": stride, "stride": stride}),
    "blocktopk": Design(BlockTopK, for_stride=lambda stride: {"block_size": stride, "top_k": REFERENCE_TOP_K}),
    "kpool": Design(KPool, for_stride=lambda stride: {"kpool": stride, "top_k": REFERENCE_TOP_K * stride},
                    options=("kpool", "top_k", "select_tail", "start"), build=PostHocKPool.of),
    "dsv4": Design(DSV4),
    "msa": Design(MSA),
    "gatedpool": Design(GatedPool),
    "gatedtopk": Design(GatedTopK),
    "cowindow": Design(CoWindow, refusal="its heads share one partition of the history, set by per-head offsets, "
                                          "where the reference moves each head's window start on its own"),
}

__all__ = [
    "DESIGNS",
    "Design",
    "BlockTopK",
    "CoWindow",
    "CompressedKV",
    "DSV4",
    "DSV4Selection",
    "GatedPool",
    "GatedTopK",
    "HeldPhaseGate",
    "HeldPhaseTopK",
    "KPool",
    "KPoolSelection",
    "MSA",
    "MSASelection",
    "MeanPool",
    "PostHocDesign",
    "PostHocKPool",
    "REFERENCE_TOP_K",
    "WindowLayout",
    "attend",
]
