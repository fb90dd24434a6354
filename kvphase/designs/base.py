"""What post-hoc designs return, the one method they override, and attention over the result."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvphase.designs.windows import masked_softmax


@dataclass(frozen=True)
class CompressedKV:
    """A compressed cache and what each query may read from it.

    `visible` is (n_query, n_entries) when all heads share one selection, or
    (n_query, n_kv_head, n_entries) when each KV head (GQA group) selects its own.
    """

    keys: np.ndarray  # (n_entries, n_kv_head, head_dim)
    values: np.ndarray  # (n_entries, n_kv_head, head_dim)
    visible: np.ndarray  # (n_query, n_entries) or (n_query, n_kv_head, n_entries), bool
    first_position: np.ndarray  # (n_entries,) first position an entry covers
    last_position: np.ndarray  # (n_entries,) last position an entry covers

    @property
    def n_entries(self) -> int:
        return self.keys.shape[0]


class PostHocDesign:
    """A compression applied after the fact to a model's own K/V (no trained compressor).

    Subclasses are frozen dataclasses; they override `compress` and nothing else.
    """

    def compress(
        self,
        queries: np.ndarray,  # (n_query, n_head, head_dim), used by query-dependent selection
        keys: np.ndarray,  # (n_keys, n_kv_head, head_dim), row i is position i
        values: np.ndarray,  # (n_keys, n_kv_head, head_dim)
        query_positions: np.ndarray | None = None,  # (n_query,), default the last n_query positions
    ) -> CompressedKV:
        raise NotImplementedError


def default_query_positions(n_query: int, n_keys: int, query_positions: np.ndarray | None) -> np.ndarray:
    """The positions of the queries: given, or the last n_query key positions (a prompt scored at once)."""
    if query_positions is None:
        return np.arange(n_keys - n_query, n_keys)  # (n_query,)
    positions = np.asarray(query_positions, dtype=np.int64)  # (n_query,)
    if positions.shape != (n_query,):
        raise ValueError(f"expected query_positions of shape ({n_query},), got {positions.shape}")
    if positions.size and (positions.min() < 0 or positions.max() >= n_keys):
        raise ValueError(f"expected query positions in [0, {n_keys}), got {positions.min()}..{positions.max()}")
    return positions


def attend(queries: np.ndarray, cache: CompressedKV, scale: float | None = None) -> np.ndarray:
    """Softmax attention of each query over the entries it may see (GQA: head h reads KV head h // group).

    A query that sees no entry gets a zero output rather than NaN.
    """
    n_query, n_head, head_dim = queries.shape
    n_kv_head = cache.keys.shape[1]
    if n_head % n_kv_head:
        raise ValueError(f"expected n_head to be a multiple of n_kv_head, got {n_head} and {n_kv_head}")
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    group = n_head // n_kv_head
    kv_of_head = np.arange(n_head) // group  # (n_head,)

    k = cache.keys[:, kv_of_head, :]  # (n_entries, n_head, head_dim)
    v = cache.values[:, kv_of_head, :]  # (n_entries, n_head, head_dim)
    logits = np.einsum("qhd,ehd->qhe", queries, k) * scale  # (n_query, n_head, n_entries)

    visible = cache.visible  # (n_query, n_entries) or (n_query, n_kv_head, n_entries)
    if visible.ndim == 2:
        visible = visible[:, None, :]  # (n_query, 1, n_entries)
    else:
        visible = visible[:, kv_of_head, :]  # (n_query, n_head, n_entries)
    weights = masked_softmax(logits, visible)  # (n_query, n_head, n_entries)
    return np.einsum("qhe,ehd->qhd", weights, v)  # (n_query, n_head, head_dim)
