"""GLM5-Next (GLM-5.3-Flash) k-pool lightning indexer.

Follows `llama_model_glm5_next::graph::build_kpool_select` in
src/models/glm5-next.cpp and `set_input_kpool` / `kpool_layout_update` in
src/llama-memory-hybrid-idx.cpp (llama.cpp vendored in llama-cpp-python 0.3.36):

1. per token: key = LayerNorm(W_k x) with weight and bias (`indexer_k`), gate = W_g x
   (`indexer_gate`); both are written to the indexer cache (F16 by default) and read back;
2. per complete pool of `kpool` consecutive positions from the sequence's first position:
   logits = gate + ape[phase] (ape is `blk.N.indexer_compressor_ape`, one row per phase),
   softmax over the pool's kpool tokens separately for every channel, pooled key =
   sum over the pool of softmax * key (`indexer_pool_k_new`); the pooled key is stored in
   the cache again and read back (`indexer_pool_k`);
3. score(query t, pool i) = sum_h w_h relu(q_h . pooled_i), w = W_proj x / sqrt(d * H)
   (`indexer_weights`), -inf for pools that end after t (`indexer_score`);
4. the top `top_k // kpool` visible pools, by descending score (`indexer_top_k`);
5. the query sees the member tokens of its selected pools plus, with
   `kpool_select_tail`, the incomplete tail of its own pool (`indexer_sel`, or
   `indexer_sel_idx` on llama.cpp's gather path).

A query that completes a pool has no tail: its own pool must win a top-k slot to be seen.

`PostHocKPool` runs the same selection on any model's own queries and keys (the reference backend's
"kpool" design): equal indexer weights, a uniform pooling gate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kvphase.designs.base import CompressedKV, default_query_positions
from kvphase.designs.windows import (WindowLayout, ambiguous_top_k, check_cache_dtype, check_non_negative,
                                     check_positive, check_shape, prefix_mask, round_to_cache, rows_to_mask, softmax,
                                     tail_positions, top_k_indices)


@dataclass(frozen=True)
class KPoolSelection:
    """Every stage of one k-pool indexer pass, named after llama.cpp's tensors."""

    pool_keys_new: np.ndarray  # (n_pool, d) `indexer_pool_k_new`: pooled keys before the cache
    pool_keys: np.ndarray  # (n_pool, d) `indexer_pool_k`: pooled keys read back from the cache
    scores: np.ndarray  # (n_query, n_pool) `indexer_score`, -inf where the pool ends after the query
    top_pools: np.ndarray  # (n_query, n_top) `indexer_top_k`, descending score, -1 for dead slots
    selected: np.ndarray  # (n_query, n_sel) `indexer_sel_idx` as positions, -1 for dead slots
    visible: np.ndarray  # (n_query, n_keys) bool, True where `indexer_sel` is 0
    ambiguous: np.ndarray  # (n_query,) bool, a score tie at the top-k boundary makes the set non-unique


@dataclass(frozen=True)
class KPool:
    """GLM5-Next k-pool indexer (`build_kpool_select`, src/models/glm5-next.cpp)."""

    kpool: int  # tokens per pool: glm5-next.attention.indexer.kpool
    top_k: int  # tokens selected: glm5-next.attention.indexer.top_k, i.e. top_k // kpool pools
    select_tail: bool = True  # glm5-next.attention.indexer.kpool_select_tail (llama.cpp default true)
    start: int = 0  # position where pool 0 starts; llama.cpp: the sequence's first position
    cache_dtype: str = "f16"  # indexer cache type: keys, gates and pooled keys are rounded to it

    def __post_init__(self) -> None:
        check_positive("KPool", kpool=self.kpool, top_k=self.top_k)
        check_non_negative("KPool", start=self.start)
        check_cache_dtype("KPool", self.cache_dtype)
        if self.kpool < 2:
            raise ValueError(f"KPool: expected kpool > 1 (llama.cpp asserts it), got {self.kpool}")
        if self.top_k % self.kpool:
            raise ValueError(f"KPool: expected top_k to be a multiple of kpool={self.kpool}, got {self.top_k}")
        if not isinstance(self.select_tail, bool):
            raise ValueError(f"KPool: expected select_tail to be a bool, got {self.select_tail!r}")

    @property
    def layout(self) -> WindowLayout:
        return WindowLayout(window=self.kpool, stride=self.kpool, start=self.start)

    @property
    def n_top_pools(self) -> int:
        return self.top_k // self.kpool

    @property
    def n_selected_slots(self) -> int:
        """Slots per query in `indexer_sel_idx`: the pools' members, then kpool - 1 tail slots."""
        return self.n_top_pools * self.kpool + (self.kpool - 1 if self.select_tail else 0)

    # -- stage 1: per-token keys and weights -------------------------------------------

    @staticmethod
    def key_norm(key_proj: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
        """`indexer_k`: LayerNorm of W_k x with weight and bias (build_norm LLM_NORM, ggml_norm).

        eps is the file's `glm5-next.attention.layer_norm_epsilon`; llama.cpp uses 0 without it.
        """
        x = np.asarray(key_proj, dtype=np.float32)  # (n_tokens, d)
        centered = x - x.mean(axis=-1, keepdims=True, dtype=np.float32)  # (n_tokens, d)
        variance = np.mean(centered * centered, axis=-1, keepdims=True, dtype=np.float32)  # (n_tokens, 1)
        normed = centered / np.sqrt(variance + np.float32(eps))  # (n_tokens, d)
        return (normed * weight + bias).astype(np.float32)  # (n_tokens, d)

    @staticmethod
    def scale_weights(head_weights: np.ndarray, n_embd_indexer: int) -> np.ndarray:
        """`indexer_weights`: W_proj x scaled by 1 / sqrt(n_embd_indexer * n_indexer_head)."""
        w = np.asarray(head_weights, dtype=np.float32)  # (n_tokens, n_head)
        return (w * np.float32(1.0 / np.sqrt(np.float32(n_embd_indexer * w.shape[-1])))).astype(np.float32)

    # -- stage 2: pooled keys -------------------------------------------------------------

    def pool_keys(self, keys: np.ndarray, gates: np.ndarray, ape: np.ndarray) -> np.ndarray:
        """`indexer_pool_k_new` for every complete pool: per-channel softmax(gate + ape) weighted keys.

        keys, gates: `indexer_k`, `indexer_gate` (F32, as computed); they are rounded to the
        cache type first because llama.cpp pools what it reads back from the cache.
        ape: `blk.N.indexer_compressor_ape` as numpy reads it, row p = phase p.
        """
        keys, gates = np.asarray(keys), np.asarray(gates)
        n_tokens, d = keys.shape
        check_shape("KPool", "gates", gates, (n_tokens, d))
        check_shape("KPool", "ape", ape, (self.kpool, d))

        members = self.layout.members(self.layout.n_complete(n_tokens))  # (n_pool, kpool)
        pool_key = round_to_cache(keys, self.cache_dtype)[members]  # (n_pool, kpool, d)
        return np.sum(self.pool_weights(gates, ape) * pool_key, axis=1, dtype=np.float32)  # (n_pool, d)

    def pool_weights(self, gates: np.ndarray, ape: np.ndarray) -> np.ndarray:
        """Each slot's weight in its complete pool, per channel: softmax over the pool of
        gate + ape, (n_pool, kpool, d); slot j of a pool sits at phase (start + j) mod kpool."""
        gates = np.asarray(gates)
        members = self.layout.members(self.layout.n_complete(gates.shape[0]))  # (n_pool, kpool)
        pool_gate = round_to_cache(gates, self.cache_dtype)[members]  # (n_pool, kpool, d)
        logits = pool_gate + np.asarray(ape, dtype=np.float32)[None, :, :]  # (n_pool, kpool, d)
        return softmax(logits, axis=1)  # (n_pool, kpool, d): over the pool, per channel

    def cached(self, pool_keys_new: np.ndarray) -> np.ndarray:
        """`indexer_pool_k`: the pooled keys as read back from the indexer cache.

        llama.cpp scatters `indexer_pool_k_new` into the cache and gathers every pool back
        (`cache_safe`); only when cells are shared between sequences does it use the
        unrounded new keys, a case this single-sequence reference does not model.
        """
        return round_to_cache(pool_keys_new, self.cache_dtype)  # (n_pool, d)

    # -- stage 3: scores --------------------------------------------------------------------

    def scores(
        self,
        queries: np.ndarray,  # (n_query, n_head, d) `indexer_q`
        weights: np.ndarray,  # (n_query, n_head) `indexer_weights`, already scaled
        pool_keys: np.ndarray,  # (n_pool, d) `indexer_pool_k`
        query_positions: np.ndarray,  # (n_query,)
    ) -> np.ndarray:
        """`indexer_score`: sum_h w_h relu(q_h . k_pool), -inf for pools ending after the query."""
        n_query, n_head, d = np.shape(queries)
        check_shape("KPool", "weights", weights, (n_query, n_head))
        check_shape("KPool", "pool_keys", pool_keys, (None, d))
        q = np.asarray(queries, dtype=np.float32)  # (n_query, n_head, d)
        k = np.asarray(pool_keys, dtype=np.float32)  # (n_pool, d)
        kq = np.einsum("thd,pd->thp", q, k)  # (n_query, n_head, n_pool)
        score = np.sum(np.maximum(kq, 0) * np.asarray(weights, np.float32)[:, :, None], axis=1)  # (n_query, n_pool)
        visible = self.layout.window_visible(query_positions, k.shape[0])  # (n_query, n_pool)
        return np.where(visible, score, -np.inf).astype(np.float32)  # (n_query, n_pool)

    # -- stage 4: selection -------------------------------------------------------------------

    def top_pools(self, scores: np.ndarray) -> np.ndarray:
        """`indexer_top_k`: the top top_k // kpool visible pools, descending score, -1 padding.

        Among equal scores at the boundary (ReLU scores tie at exactly 0) the set is the one
        llama.cpp's CPU partial sort keeps (`windows.partial_sort_sets`); `ambiguous_top_k`
        still flags those rows, where another backend's kernel may choose otherwise.
        """
        return top_k_indices(scores, self.n_top_pools, ties="llama.cpp")  # (n_query, n_top)

    def selected_positions(self, top_pools: np.ndarray, query_positions: np.ndarray) -> np.ndarray:
        """`indexer_sel_idx` as positions: each top pool's members in order, then the tail slots."""
        top_pools = np.asarray(top_pools)  # (n_query, n_top)
        members = self.layout.members(max(int(top_pools.max(initial=-1)) + 1, 1))  # (n_pool, kpool)
        pooled = np.where(top_pools[:, :, None] >= 0, members[np.maximum(top_pools, 0)], -1)  # (n_query, n_top, kpool)
        pooled = pooled.reshape(len(top_pools), -1)  # (n_query, n_top * kpool)
        if not self.select_tail:
            return pooled
        tail = tail_positions(query_positions, self.kpool, self.start)  # (n_query, kpool - 1)
        return np.concatenate([pooled, tail], axis=1)  # (n_query, n_sel)

    def visible(self, selected: np.ndarray, query_positions: np.ndarray, n_keys: int) -> np.ndarray:
        """`indexer_sel` as a mask: selected positions plus the uncompressed prefix before `start`."""
        chosen = rows_to_mask(selected, n_keys)  # (n_query, n_keys)
        return chosen | prefix_mask(query_positions, n_keys, self.start)  # (n_query, n_keys)

    # -- all stages ---------------------------------------------------------------------------

    def forward(
        self,
        queries: np.ndarray,  # (n_query, n_head, d) `indexer_q`
        weights: np.ndarray,  # (n_query, n_head) `indexer_weights`
        keys: np.ndarray,  # (n_keys, d) `indexer_k`, row i is position i
        gates: np.ndarray,  # (n_keys, d) `indexer_gate`
        ape: np.ndarray,  # (kpool, d) `blk.N.indexer_compressor_ape`
        query_positions: np.ndarray | None = None,  # (n_query,), default the last n_query positions
    ) -> KPoolSelection:
        """Run every stage; the result holds each intermediate for stage-by-stage comparison."""
        n_keys = np.shape(keys)[0]
        positions = default_query_positions(np.shape(queries)[0], n_keys, query_positions)  # (n_query,)
        pool_keys_new = self.pool_keys(keys, gates, ape)  # (n_pool, d)
        pool_keys = self.cached(pool_keys_new)  # (n_pool, d)
        scores = self.scores(queries, weights, pool_keys, positions)  # (n_query, n_pool)
        top_pools = self.top_pools(scores)  # (n_query, n_top)
        selected = self.selected_positions(top_pools, positions)  # (n_query, n_sel)
        return KPoolSelection(
            pool_keys_new=pool_keys_new,
            pool_keys=pool_keys,
            scores=scores,
            top_pools=top_pools,
            selected=selected,
            visible=self.visible(selected, positions, n_keys),
            ambiguous=ambiguous_top_k(scores, self.n_top_pools),
        )


@dataclass(frozen=True)
class PostHocKPool:
    """GLM5's k-pool selection driven by the model's own attention (no trained indexer).

    The KV head's query heads act as the indexer heads with equal weights, its keys as the
    indexer keys, and the pooling gate is uniform (zero gate and zero ape), so a pool's key
    is the mean of its keys. Selection, tail and prefix follow `designs.kpool.KPool`.
    """

    kpool: KPool

    @classmethod
    def of(cls, **options) -> PostHocKPool:
        """The post-hoc k-pool of `KPool(**options)`, in float32 (no cache to round to)."""
        return cls(KPool(cache_dtype="f32", **options))

    @property
    def start(self) -> int:
        return self.kpool.start

    def with_start(self, start: int) -> PostHocKPool:
        return PostHocKPool(replace(self.kpool, start=start))

    def compress(self, queries, keys, values, query_positions=None) -> CompressedKV:
        n_query, n_group, head_dim = queries.shape  # queries of one KV head: (n_query, n_group, head_dim)
        n_keys = keys.shape[0]
        if keys.shape[1] != 1:
            raise ValueError(f"PostHocKPool: expected the keys of one KV head, got {keys.shape[1]} heads")
        weights = KPool.scale_weights(np.ones((n_query, n_group), np.float32), head_dim)  # (n_query, n_group)
        zeros = np.zeros((n_keys, head_dim), np.float32)  # (n_keys, head_dim)
        ape = np.zeros((self.kpool.kpool, head_dim), np.float32)  # (kpool, head_dim)
        selection = self.kpool.forward(queries, weights, keys[:, 0], zeros, ape, query_positions)
        positions = np.arange(n_keys)  # (n_keys,)
        return CompressedKV(keys, values, selection.visible, positions, positions)
