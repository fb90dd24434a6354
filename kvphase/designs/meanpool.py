"""Uniform mean pooling of K and V per window, plus a local window of exact recent tokens.

The simplest chunked compressor: every complete window of `window` tokens (one every
`stride` tokens from `start`) becomes one entry whose key and value are the plain means
of its tokens' keys and values; this is the kpool/DSV4 compressor with a uniform gate.
It is not a llama.cpp design; it lets a llama-family model be compressed post hoc.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvphase.designs.base import CompressedKV, PostHocDesign, default_query_positions
from kvphase.designs.windows import WindowLayout, check_non_negative, check_positive, local_mask, prefix_mask


@dataclass(frozen=True)
class MeanPool(PostHocDesign):
    """Mean-pooled windows (visible once complete) + exact local tokens + the prefix before `start`.

    Entries are the pooled windows followed by every raw token; a raw token is visible
    when it is among the query's `local_window` most recent positions or before `start`.
    With window = stride = 1 and local_window = 0 this is dense causal attention.
    """

    window: int  # tokens per pooled entry (W)
    stride: int  # tokens between window starts (S)
    local_window: int = 0  # most recent tokens each query also sees exactly
    start: int = 0  # position where window 0 starts (stagger / randomize this)

    def __post_init__(self) -> None:
        check_positive("MeanPool", window=self.window, stride=self.stride)
        check_non_negative("MeanPool", local_window=self.local_window, start=self.start)

    @property
    def layout(self) -> WindowLayout:
        return WindowLayout(window=self.window, stride=self.stride, start=self.start)

    def pool_weights(self, window_keys: np.ndarray) -> np.ndarray:
        """How much each token of a window weighs in its entry: uniform here (a trained gate in GatedPool)."""
        return np.full_like(window_keys, 1.0 / self.window)  # (n_windows, window, n_kv_head, head_dim)

    def compress(self, queries, keys, values, query_positions=None) -> CompressedKV:
        n_keys = keys.shape[0]
        positions = default_query_positions(queries.shape[0], n_keys, query_positions)  # (n_query,)
        n_windows = self.layout.n_complete(n_keys)
        members = self.layout.members(n_windows)  # (n_windows, window)

        weights = self.pool_weights(keys[members])  # (n_windows, window, n_kv_head, head_dim)
        pooled_k = (weights * keys[members]).sum(axis=1)  # (n_windows, n_kv_head, head_dim)
        pooled_v = (weights * values[members]).sum(axis=1)  # (n_windows, n_kv_head, head_dim)
        window_seen = self.layout.window_visible(positions, n_windows)  # (n_query, n_windows)
        token_seen = local_mask(positions, n_keys, self.local_window) | prefix_mask(
            positions, n_keys, self.start
        )  # (n_query, n_keys)

        token_pos = np.arange(n_keys)  # (n_keys,)
        return CompressedKV(
            keys=np.concatenate([pooled_k, keys], axis=0),  # (n_windows + n_keys, n_kv_head, head_dim)
            values=np.concatenate([pooled_v, values], axis=0),  # (n_windows + n_keys, n_kv_head, head_dim)
            visible=np.concatenate([window_seen, token_seen], axis=1),  # (n_query, n_windows + n_keys)
            first_position=np.concatenate([self.layout.first_positions(n_windows), token_pos]),  # (n_entries,)
            last_position=np.concatenate([self.layout.last_positions(n_windows), token_pos]),  # (n_entries,)
        )
