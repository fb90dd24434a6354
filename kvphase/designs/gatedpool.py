"""Gated pooling per window, plus a local window: the compressor of kvphase's trained models.

Every complete window of `window` tokens (one every `stride` tokens from `start`)
becomes one entry whose key and value are the window's keys and values weighted, per
channel, by softmax over the window's tokens of a content term plus a per-phase bias:

    logits[i, c] = (k_i @ gate)[c] + ape[i, c]        (i: the token's slot in its window)

This is the shape of DeepSeek-V4's compressor (`build_compressor` in
src/models/deepseek4.cpp: softmax over the window of gate + ape, per channel) and of
GLM-5.3's k-pool pooling (`indexer_compressor_ape`), with the content term read from the
token's key instead of a separate projection of the hidden state. With `gate` and
`ape` at zero it is `MeanPool`, which it extends; entries, visibility and the local
window are MeanPool's. The JAX training code (`kvphase/train/model.py`) mirrors it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvphase.designs.base import CompressedKV, default_query_positions
from kvphase.designs.meanpool import MeanPool
from kvphase.designs.windows import causal_mask, check_shape, rows_to_mask, softmax, top_k_indices


@dataclass(frozen=True, eq=False)
class GatedPool(MeanPool):
    """MeanPool whose per-window weights come from a trained gate and per-phase bias."""

    gate: np.ndarray | None = None  # (n_kv_head, head_dim, head_dim): content term k @ gate[h]
    ape: np.ndarray | None = None  # (window, n_kv_head, head_dim): bias of each slot (phase)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gate is None or self.ape is None:
            raise ValueError("GatedPool: expected a gate and an ape (use MeanPool for a uniform gate)")
        n_kv_head, head_dim = np.shape(self.gate)[0], np.shape(self.gate)[-1]
        check_shape("GatedPool", "gate", self.gate, (n_kv_head, head_dim, head_dim))
        check_shape("GatedPool", "ape", self.ape, (self.window, n_kv_head, head_dim))

    def pool_weights(self, window_keys: np.ndarray) -> np.ndarray:
        content = np.einsum("nwhd,hde->nwhe", window_keys, self.gate)  # (n_windows, window, n_kv_head, head_dim)
        return softmax(content + self.ape[None], axis=1)  # (n_windows, window, n_kv_head, head_dim)


@dataclass(frozen=True, eq=False)
class GatedTopK(GatedPool):
    """GLM-5.3-style selection over gated windows: each query reads, token by token, the
    `top_k` complete windows whose pooled key scores highest against it (q . pooled key,
    summed over the query heads of the KV head), plus the local window and the prefix.

    The pooled keys act only as indexer keys, the way k-pool's pooled `indexer_k` do
    (`build_kpool_select`, src/models/glm5-next.cpp); attention reads raw tokens.
    Score ties at the k-th place go to the lower window index (`top_k_indices`).
    """

    top_k: int = 1  # windows each query reads in full

    def compress(self, queries, keys, values, query_positions=None) -> CompressedKV:
        n_keys = keys.shape[0]
        positions = default_query_positions(queries.shape[0], n_keys, query_positions)  # (n_query,)
        pooled = super().compress(queries, keys, values, positions)
        n_windows = pooled.n_entries - n_keys
        scores = np.einsum("qgd,whd->qw", queries, pooled.keys[:n_windows])  # (n_query, n_windows)
        scores = np.where(pooled.visible[:, :n_windows], scores, -np.inf)  # (n_query, n_windows)
        chosen = rows_to_mask(top_k_indices(scores, self.top_k), n_windows)  # (n_query, n_windows)
        members = np.zeros((n_windows, n_keys), dtype=bool)  # (n_windows, n_keys)
        members[np.arange(n_windows)[:, None], self.layout.members(n_windows)] = True
        read = (chosen.astype(np.int32) @ members.astype(np.int32)) > 0  # (n_query, n_keys)
        visible = pooled.visible[:, n_windows:] | (read & causal_mask(positions, n_keys))  # (n_query, n_keys)
        token_pos = np.arange(n_keys)  # (n_keys,)
        return CompressedKV(keys, values, visible, token_pos, token_pos)
