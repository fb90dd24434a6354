"""Numpy references of chunked KV-cache compression designs, one small dataclass per file.

Two kinds:

- llama.cpp mirrors (`kpool`, `dsv4`, `msa`): hyperparameters from the GGUF file, one
  method per stage named after the llama.cpp tensor it reproduces, and a `forward` that
  runs all stages and returns every intermediate, so `kvphase validate` can compare
  stage by stage with captured tensors.
- post-hoc designs (`meanpool`, `blocktopk`, `cowindow`): applied to any model's own K/V by the
  reference transformer through `compress(queries, keys, values, query_positions)`,
  the one method a new post-hoc design overrides; `attend` runs attention over the result.

`heldphase` (a trained gate with one phase held at its mean, the knockout probe's slot
ablation) is a design too, but no run names it, so `DESIGNS` leaves it out.

Every design carries `start`, the position where its first window starts, so staggered or
randomized offsets can be expressed. See CONTRIBUTING.md for adding a design.
"""

from kvphase.designs.base import CompressedKV, PostHocDesign, attend
from kvphase.designs.blocktopk import BlockTopK
from kvphase.designs.cowindow import CoWindow
from kvphase.designs.dsv4 import DSV4, DSV4Selection
from kvphase.designs.gatedpool import GatedPool, GatedTopK
from kvphase.designs.heldphase import HeldPhaseGate, HeldPhaseTopK
from kvphase.designs.kpool import KPool, KPoolSelection
from kvphase.designs.meanpool import MeanPool
from kvphase.designs.msa import MSA, MSASelection
from kvphase.designs.windows import WindowLayout

DESIGNS: dict[str, type] = {
    "kpool": KPool,
    "dsv4": DSV4,
    "msa": MSA,
    "meanpool": MeanPool,
    "blocktopk": BlockTopK,
    "gatedpool": GatedPool,
    "gatedtopk": GatedTopK,
    "cowindow": CoWindow,
}

__all__ = [
    "DESIGNS",
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
    "WindowLayout",
    "attend",
]
