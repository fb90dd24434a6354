"""MiniMax-M3 sparse attention (MSA): per-GQA-group block top-k over position blocks.

Follows the sparse branch of `llama_model_minimax_m3::graph::graph` in
src/models/minimax-m3.cpp (batch path: `msa_bs`, `msa_bsf`, `msa_block_mask`, `msa_mask4`),
`llm_graph_input_msa::set_input` (the local-block bias) and
`llama_kv_cache_msa_context::set_input_pos_mask` in src/llama-kv-cache-msa.cpp:

1. indexer q (one head per KV head / GQA group) and k (one head) after RMSNorm and RoPE;
   k is stored in the indexer cache (F16 by default) and read back;
2. token score = q_h . k_j, unscaled, -inf for future (or masked) positions;
3. block score `msa_bs` = max over the block's positions (blocks are pos // block_size);
4. `msa_bsf` = block score + 1e30 on the query's own block and the `local_blocks - 1`
   blocks before it, so those always rank first;
5. the top min(top_k, n_blocks) blocks per head (`ggml_top_k`, unordered);
6. each head group attends to the tokens of its blocks, causally (`msa_mask4`, 0 / -inf).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvphase.designs.base import default_query_positions
from kvphase.designs.windows import (WindowLayout, ambiguous_top_k, causal_mask, check_cache_dtype, check_non_negative,
                                     check_positive, check_shape, prefix_mask, round_to_cache, rows_to_mask,
                                     top_k_indices)

LOCAL_BIAS = np.float32(1e30)  # llm_graph_input_msa::set_input


@dataclass(frozen=True)
class MSASelection:
    """Every stage of one MSA block selection, named after llama.cpp's tensors."""

    block_scores: np.ndarray  # (n_query, n_head, n_blocks) `msa_bs`
    biased_scores: np.ndarray  # (n_query, n_head, n_blocks) `msa_bsf`
    top_blocks: np.ndarray  # (n_query, n_head, k) top-k block ids, descending, -1 padding
    visible: np.ndarray  # (n_query, n_head, n_keys) bool, True where `msa_mask4` is 0
    ambiguous: np.ndarray  # (n_query, n_head) bool: a tie at the top-k boundary


@dataclass(frozen=True)
class MSA:
    """MiniMax-M3 block sparse attention selection (src/models/minimax-m3.cpp)."""

    block_size: int  # minimax-m3.attention.indexer.block_size
    top_k: int  # blocks kept per head: minimax-m3.attention.indexer.top_k
    local_blocks: int  # always-kept recent blocks: minimax-m3.attention.indexer.local_blocks
    start: int = 0  # position where block 0 starts; llama.cpp: 0 (blocks are pos // block_size)
    cache_dtype: str = "f16"  # indexer cache type: indexer keys are rounded to it

    def __post_init__(self) -> None:
        check_positive("MSA", block_size=self.block_size, top_k=self.top_k)
        check_non_negative("MSA", local_blocks=self.local_blocks, start=self.start)
        check_cache_dtype("MSA", self.cache_dtype)

    @property
    def layout(self) -> WindowLayout:
        return WindowLayout(window=self.block_size, stride=self.block_size, start=self.start)

    def n_blocks(self, n_keys: int) -> int:
        """Blocks covering positions [start, n_keys), the last one possibly incomplete (llama.cpp pads n_pos)."""
        return max(0, -(-(n_keys - self.start) // self.block_size))

    def block_scores(self, queries: np.ndarray, keys: np.ndarray, query_positions: np.ndarray) -> np.ndarray:
        """`msa_bs`: max over each block's causally visible positions of q_h . k_j (unscaled)."""
        n_query, n_head, d = np.shape(queries)
        check_shape("MSA", "keys", keys, (None, d))
        n_keys = len(keys)
        k = round_to_cache(keys, self.cache_dtype)  # (n_keys, d)
        token = np.einsum("thd,jd->thj", np.asarray(queries, np.float32), k)  # (n_query, n_head, n_keys)
        token = np.where(causal_mask(query_positions, n_keys)[:, None, :], token, -np.inf)  # (n_query, n_head, n_keys)

        n_blocks = self.n_blocks(n_keys)
        # llama.cpp pads the position axis to whole blocks with -inf (`pos_mask`)
        n_pos = self.start + n_blocks * self.block_size
        padded = np.full((n_query, n_head, n_pos), -np.inf, np.float32)  # (n_query, n_head, n_pos)
        padded[..., :n_keys] = token
        blocks = padded[..., self.start :].reshape(n_query, n_head, n_blocks, self.block_size)
        # blocks: (n_query, n_head, n_blocks, block_size)
        return blocks.max(axis=-1, initial=-np.inf)  # (n_query, n_head, n_blocks)

    def local_bias(self, query_positions: np.ndarray, n_blocks: int) -> np.ndarray:
        """1e30 on the query's block L and blocks L-1 .. L-local_blocks+1 (those >= 0), else 0."""
        q = np.asarray(query_positions)  # (n_query,)
        own = np.where(q >= self.start, (q - self.start) // self.block_size, -1)  # (n_query,)
        b = np.arange(n_blocks)[None, :]  # (1, n_blocks)
        near = (b <= own[:, None]) & (own[:, None] - b < self.local_blocks)  # (n_query, n_blocks)
        return np.where(near, LOCAL_BIAS, np.float32(0))  # (n_query, n_blocks)

    def visible(self, top_blocks: np.ndarray, query_positions: np.ndarray, n_keys: int) -> np.ndarray:
        """`msa_mask4` as a mask: tokens of the selected blocks, causally, plus the prefix before `start`."""
        n_blocks = self.n_blocks(n_keys)
        chosen = rows_to_mask(top_blocks, n_blocks)  # (n_query, n_head, n_blocks)
        # a spare always-False column stands for "no block" (positions before start)
        chosen = np.concatenate([chosen, np.zeros(chosen.shape[:-1] + (1,), bool)], axis=-1)  # (n_query, n_head, n_blocks + 1)
        position = np.arange(n_keys)  # (n_keys,)
        block_of = np.where(position >= self.start, (position - self.start) // self.block_size, n_blocks)  # (n_keys,)
        in_chosen = chosen[..., block_of]  # (n_query, n_head, n_keys)
        causal = causal_mask(query_positions, n_keys)[:, None, :]  # (n_query, 1, n_keys)
        prefix = prefix_mask(query_positions, n_keys, self.start)[:, None, :]  # (n_query, 1, n_keys)
        return (in_chosen & causal) | prefix  # (n_query, n_head, n_keys)

    def forward(
        self,
        queries: np.ndarray,  # (n_query, n_head, d) indexer q after norm and RoPE, one head per KV head
        keys: np.ndarray,  # (n_keys, d) indexer k after norm and RoPE, row i is position i
        query_positions: np.ndarray | None = None,  # (n_query,), default the last n_query positions
    ) -> MSASelection:
        """Run every stage; the result holds each intermediate for stage-by-stage comparison."""
        n_keys = len(keys)
        positions = default_query_positions(np.shape(queries)[0], n_keys, query_positions)  # (n_query,)
        scores = self.block_scores(queries, keys, positions)  # (n_query, n_head, n_blocks)
        biased = scores + self.local_bias(positions, scores.shape[-1])[:, None, :]  # (n_query, n_head, n_blocks)
        top = top_k_indices(biased, self.top_k)  # (n_query, n_head, k)
        return MSASelection(
            block_scores=scores,
            biased_scores=biased,
            top_blocks=top,
            visible=self.visible(top, positions, n_keys),
            ambiguous=ambiguous_top_k(biased, self.top_k),
        )
