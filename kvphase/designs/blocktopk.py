"""Block top-k selection with mean-pooled keys (Quest / MoBA style), plus exact local tokens.

Each complete block of `block_size` tokens is represented by the mean of its keys; every
KV head (GQA group) scores the blocks with its query heads and attends to the raw tokens
of its `top_k` best complete blocks, the `local_window` most recent tokens, and the
prefix before `start`. Keys and values are not changed, only which ones are read.
It is not a llama.cpp design; it lets a llama-family model be compressed post hoc.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvphase.designs.base import CompressedKV, PostHocDesign, default_query_positions
from kvphase.designs.windows import (WindowLayout, check_non_negative, check_positive, local_mask, prefix_mask,
                                     rows_to_mask, top_k_indices)


@dataclass(frozen=True)
class BlockTopK(PostHocDesign):
    """Per-KV-head top-k of complete blocks by q . mean(K_block), over raw tokens.

    Block score for KV head g = mean over its query heads of q_h . mean(K_block) / sqrt(d);
    ties go to the earlier block.
    """

    block_size: int  # tokens per block (W = S)
    top_k: int  # blocks each query selects per KV head
    local_window: int = 0  # most recent tokens each query also sees exactly
    start: int = 0  # position where block 0 starts (stagger / randomize this)

    def __post_init__(self) -> None:
        check_positive("BlockTopK", block_size=self.block_size, top_k=self.top_k)
        check_non_negative("BlockTopK", local_window=self.local_window, start=self.start)

    @property
    def layout(self) -> WindowLayout:
        return WindowLayout(window=self.block_size, stride=self.block_size, start=self.start)

    def block_scores(self, queries: np.ndarray, keys: np.ndarray, query_positions: np.ndarray) -> np.ndarray:
        """Scores of every complete block per query and KV head; -inf for blocks ending after the query."""
        n_query, n_head, head_dim = queries.shape
        n_kv_head = keys.shape[1]
        if n_head % n_kv_head:
            raise ValueError(f"BlockTopK: expected n_head to be a multiple of n_kv_head, got {n_head} and {n_kv_head}")
        n_blocks = self.layout.n_complete(keys.shape[0])
        block_keys = keys[self.layout.members(n_blocks)].mean(axis=1)  # (n_blocks, n_kv_head, head_dim)
        group = n_head // n_kv_head
        grouped = queries.reshape(n_query, n_kv_head, group, head_dim)  # (n_query, n_kv_head, group, head_dim)
        dots = np.einsum("tgzd,bgd->tgb", grouped, block_keys)  # (n_query, n_kv_head, n_blocks), summed over the group
        scores = dots / (group * np.sqrt(head_dim))  # (n_query, n_kv_head, n_blocks)
        seen = self.layout.window_visible(query_positions, n_blocks)  # (n_query, n_blocks)
        return np.where(seen[:, None, :], scores, -np.inf)  # (n_query, n_kv_head, n_blocks)

    def compress(self, queries, keys, values, query_positions=None) -> CompressedKV:
        n_keys, n_kv_head, _ = keys.shape
        positions = default_query_positions(queries.shape[0], n_keys, query_positions)  # (n_query,)
        scores = self.block_scores(queries, keys, positions)  # (n_query, n_kv_head, n_blocks)
        chosen = top_k_indices(scores, self.top_k)  # (n_query, n_kv_head, top_k)

        n_blocks = scores.shape[-1]
        block_seen = rows_to_mask(chosen, n_blocks)  # (n_query, n_kv_head, n_blocks)
        block_tokens = self.layout.members(n_blocks).reshape(-1)  # (n_blocks * block_size,)
        in_chosen = np.zeros((len(positions), n_kv_head, n_keys), dtype=bool)  # (n_query, n_kv_head, n_keys)
        in_chosen[..., block_tokens] = np.repeat(block_seen, self.block_size, axis=-1)
        recent = local_mask(positions, n_keys, self.local_window)  # (n_query, n_keys)
        always = recent | prefix_mask(positions, n_keys, self.start)  # (n_query, n_keys)

        token_pos = np.arange(n_keys)  # (n_keys,)
        return CompressedKV(
            keys=keys,  # (n_keys, n_kv_head, head_dim)
            values=values,  # (n_keys, n_kv_head, head_dim)
            visible=in_chosen | always[:, None, :],  # (n_query, n_kv_head, n_keys)
            first_position=token_pos,  # (n_keys,)
            last_position=token_pos,  # (n_keys,)
        )
