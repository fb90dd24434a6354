"""Whether a path's moved answer is an indexer tie that llama.cpp broke the other way.

A k-pool or lightning indexer keeps the top-k of its scores, and llama.cpp's CPU `top_k`
(`ggml_compute_forward_top_k_f32`, ggml-cpu/ops.cpp) is a `std::partial_sort`, which orders equal
scores by where they sit in the row. Two right paths lay a token's pools out at different slots
(after a sequence copy, glm5-next puts the copy's pools after the context's: `set_input_kpool` in
src/llama-memory-hybrid-idx.cpp), so where scores tie at the boundary of the kept set they may keep
different pools, and everything after that token moves. Random weights tie often: glm5-next's
score is a sum of ReLU'd dot products over two indexer heads, exactly 0 wherever both are negative.

The decision: run the text as one prompt and on the path with the indexer's scores and kept pools
recorded for every token (`engines.selection.IndexerRowsTap`), and walk the tokens in causal order
(position, then layer). Up to the first token whose kept pools differ, both runs' scores must agree
within `SCORE_ROUNDING` of each token's largest score (at least 1; trained indexers score in tens),
and there the pools one run kept and the other did not must score within
twice that token's difference of the edge of the kept set (what rounding can swap; 0 for an exact tie). Then
the two runs saw the same scores and broke a tie differently, and neither engine path is shown
wrong. Anything else (no token's pools differ, a token sees or keeps another number of pools, scores that
moved before the first difference, pools swapped across a clear margin) is not a tie: the path's
FAIL stands.

Through transformers the same decision is made on its own paths: `torch.topk`'s order among equal
scores depends on the row's length (the pools a forward holds), so a forward of another length, as a
micro-batch cut or a query after the context's cache makes, may keep other tied pools. Its indexer's
scores and kept pools are read by hooks on its indexer modules (`validate.transformers_indexer`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import numpy as np

from kvphase.backends.base import TapsGraph

# of a token's largest indexer score (at least 1): about seven times the largest difference measured
# between one prompt and a path before any selection differed (1.4e-3 glm5-next-random, 1.0e-3 the
# trained glm-kpool-top4, 7e-7 deepseek4's csa-top4; three texts after each of four contexts, every path)
SCORE_ROUNDING = 0.01

Selections = dict  # (position, layer) -> (visible scores in slot order (n_visible,), kept units (k,))


@dataclass(frozen=True)
class IndexerTie:
    """The first token whose kept pools differ between one prompt and a path, where both runs'
    scores agreed up to it."""

    layer: int
    position: int
    margin: float  # how far from the edge of the kept set the swapped pools score (one prompt's scores)
    agreement: float  # the largest score difference between the runs up to and at this token
    kept: tuple[int, ...]  # the pools (units from the sequence's first) one prompt kept, ascending
    path_kept: tuple[int, ...]

    def phrase(self, one: str = "as one prompt", other: str = "on the path") -> str:
        return (f"at position {self.position} in layer {self.layer} the indexer kept pools {list(self.kept)} {one} "
                f"and {list(self.path_kept)} {other}, tied within {self.margin:.2g} (both runs' scores "
                f"agree within {self.agreement:.2g} up to there)")

    def to_json(self) -> dict:
        return {"layer": self.layer, "position": self.position, "margin": self.margin,
                "agreement": self.agreement, "kept": list(self.kept), "path_kept": list(self.path_kept)}


def first_tie(one: Selections, other: Selections, rounding: float = SCORE_ROUNDING) -> Optional[IndexerTie]:
    """The tie that explains where two runs' selections first differ, or None when it is not a tie."""
    agreement = 0.0
    for position, layer in sorted(set(one) & set(other)):
        (scores, kept), (other_scores, other_kept) = one[position, layer], other[position, layer]
        if len(scores) != len(other_scores):
            return None  # the token sees another number of pools on the path
        difference = float(np.abs(scores - other_scores).max(initial=0.0))
        if difference > rounding * max(1.0, float(np.abs(scores).max(initial=0.0))):
            return None
        agreement = max(agreement, difference)
        if not np.array_equal(kept, other_kept):
            if len(kept) != len(other_kept):  # a tie swaps pools; it keeps as many
                return None
            margin = swap_margin(scores, kept, other_kept)
            if margin > 2 * difference:  # rounding cannot swap pools this far apart: a top-k gone wrong
                return None
            return IndexerTie(layer, position, margin, agreement, tuple(int(u) for u in kept),
                              tuple(int(u) for u in other_kept))
    return None


def swap_margin(scores: np.ndarray, kept: np.ndarray, other_kept: np.ndarray) -> float:
    """How far from the last kept score (the k-th best of `scores`) the pools that only one of two
    kept sets holds score: 0 for pools tied exactly at the edge."""
    edge = np.sort(scores)[::-1][len(kept) - 1]
    swapped = np.setxor1d(kept, other_kept)  # (n_swapped,)
    return float(np.abs(scores[swapped] - edge).max())


def recorded(backend, run: Callable) -> tuple[np.ndarray, Selections]:
    """`run(backend)`'s result and the indexer selections of every token it decoded: through llama.cpp's
    graph tap, or, for transformers (`records_indexer`), hooks on its indexer modules."""
    if getattr(backend, "records_indexer", False):
        from kvphase.validate.transformers_indexer import indexer_selections

        return indexer_selections(backend, run)
    from kvphase.engines.selection import IndexerRowsTap

    point = backend.tap_point
    kept, point.tap = point.tap, IndexerRowsTap(backend.architecture)
    try:
        result = run(backend)
        return result, point.tap.selections()
    finally:
        point.tap = kept


@contextmanager
def tapped(backend) -> Iterator:
    """The llama.cpp backend with a graph tap (itself, or a twin opened with one and closed after), the
    transformers backend whose indexer it hooks (`records_indexer`), or None for a backend or architecture
    without an indexer kvphase reads."""
    from kvphase.engines.selection import INDEXER_NODES

    if getattr(backend, "records_indexer", False):
        yield backend
        return
    if not isinstance(backend, TapsGraph) or backend.architecture not in INDEXER_NODES:
        yield None
        return
    if backend.tap_point is not None:
        yield backend
        return
    twin = type(backend)(backend.info, n_ctx=backend.n_ctx, n_threads=backend.n_threads,
                         n_batch=backend.n_batch, flash_attn=backend.flash_attn, cache_type=backend.cache_type,
                         n_gpu_layers=backend.n_gpu_layers, head_tap=True)
    try:
        yield twin
    finally:
        twin.close()
