"""Prove the numpy reference designs equal to llama.cpp's compressed attention on a real model.

llama.cpp evaluates a seeded random prompt several times, each with a different batch
split (one prefill; pools/blocks that straddle a batch boundary; small decode batches that
take llama.cpp's gather path). `capture` records the compression's intermediate tensors;
the reference design of the model's family recomputes them from the captured inputs, and
each layer reports how far the two are apart:

- compressed keys (k-pool pooled keys; deepseek4's compressed entries, pooled and finished, and
  its compressed caches as read back, plus the per-token gate logits with the per-phase bias):
  max / mean absolute difference;
- indexer scores: max / mean absolute difference, judged relative to the largest score;
- selected sets (pools or blocks, and the tokens they expose): exact agreement, and
  agreement up to exact score ties at the top-k boundary (llama.cpp's top-k is not stable).

Masks are not graph nodes and never reach the callback; the reference rebuilds them from
positions. A fresh single-sequence context puts position p in cache cell p, which is how
cell indices in `indexer_sel` / `indexer_sel_idx` are read as positions.

One checker per family, mirroring `kvphase.designs`: `kpool.py`, `msa.py`, `dsv4.py`, on
the shared base in `common.py`; `report.py` holds what is measured, `options.py` the command's
options and defaults (no numpy) and `run.py` the entry.
"""

from importlib import import_module

_EXPORTS = {"DSV4Check": "dsv4", "KPoolCheck": "kpool", "MSACheck": "msa", "Diff": "report", "LayerCheck": "report",
            "ValidationReport": "report", "Tolerances": "options", "CACHE_TYPES": "options", "FAMILIES": "run",
            "default_splits": "run", "validate_model": "run", "validate_file": "run"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """PEP 562: each name imported from its module when first asked for, so that the command line's
    start (which reads `validate.options`' defaults) loads no checker."""
    if name in _EXPORTS:
        return getattr(import_module(f"kvphase.validate.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'kvphase.validate' has no attribute {name!r}")
