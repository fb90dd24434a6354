"""CoWindow Attention (CoWA) head slices: each head reads its own slice of the history, exactly.

History is cut into slices by position and the slices are dealt out to the H heads in
turn, so every position is read by exactly one head (plus every head's `local_window`
most recent tokens). With fixed boundaries, slice j = positions [jL, (j+1)L) and head h
reads the slices with j mod H == h: the mask repeats every H*L positions, and a token's
slot in its slice (position mod L) is the phase the paper asks about, at head level.

Boundaries can move per head: head h's slices start at h*L + offsets[h] (mod H*L), with
each offset in [0, L); head h then reads up to the next head's boundary, so the heads
still partition the history (slices of unequal length when offsets differ). Offsets all
zero give the fixed slices; per-head offsets are the staggered fix, offsets drawn per
context the randomized one. `slice_owner` works on numpy and JAX arrays alike, so the
training mirror (`kvphase/train/model.py`) computes the very same partition.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvphase.designs.base import CompressedKV, PostHocDesign, default_query_positions
from kvphase.designs.windows import causal_mask, check_non_negative, check_positive, local_mask


def slice_boundaries(offsets, slice_length: int):
    """First position of every head's slice within one period of H*L: h*L + offsets[h].

    offsets (..., H) numpy or JAX, each in [0, L) -> (..., H), increasing along the last axis."""
    n_heads = offsets.shape[-1]
    return slice_length * np.arange(n_heads) + offsets  # (..., H)


def slice_owner(positions, boundaries, period: int):
    """The head that owns each position: the last head whose boundary lies at or before it in
    its period; positions before head 0's boundary belong to the previous period's last head.

    positions (T,), boundaries (..., H) -> (..., T); numpy or JAX arrays."""
    n_heads = boundaries.shape[-1]
    in_period = positions % period  # (T,)
    passed = (in_period[:, None] >= boundaries[..., None, :]).sum(-1)  # (..., T) boundaries at or before
    return (passed - 1) % n_heads  # (..., T)


@dataclass(frozen=True)
class CoWindow(PostHocDesign):
    """One head of CoWA: exact local tokens plus the positions of its own slices (no pooling)."""

    slice_length: int  # L: tokens per slice (the slice period is n_heads * L)
    n_heads: int  # H: heads that share the history, one slice each in turn
    head: int  # which of the H heads this is
    offsets: tuple[int, ...] = ()  # per head boundary offset in [0, L); () means all zero (fixed slices)
    local_window: int = 0  # most recent tokens this head also reads, whoever owns them

    def __post_init__(self) -> None:
        check_positive("CoWindow", slice_length=self.slice_length, n_heads=self.n_heads)
        check_non_negative("CoWindow", head=self.head, local_window=self.local_window)
        if self.head >= self.n_heads:
            raise ValueError(f"CoWindow: expected head < n_heads = {self.n_heads}, got {self.head}")
        if self.offsets and len(self.offsets) != self.n_heads:
            raise ValueError(f"CoWindow: expected {self.n_heads} offsets (one per head), got {len(self.offsets)}")
        if any(not 0 <= o < self.slice_length for o in self.offsets):
            raise ValueError(f"CoWindow: expected offsets in [0, {self.slice_length}), got {list(self.offsets)}")

    @property
    def period(self) -> int:
        """Positions after which the partition repeats: H * L."""
        return self.n_heads * self.slice_length

    def owners(self, n_keys: int) -> np.ndarray:
        """The head that owns each position 0..n_keys-1."""
        offsets = np.asarray(self.offsets or (0,) * self.n_heads)  # (H,)
        return slice_owner(np.arange(n_keys), slice_boundaries(offsets, self.slice_length), self.period)  # (n_keys,)

    def visible(self, query_positions: np.ndarray, n_keys: int) -> np.ndarray:
        """Key j readable by the query at p: causal, and recent or in this head's slices."""
        own = self.owners(n_keys)[None, :] == self.head  # (1, n_keys)
        recent = local_mask(query_positions, n_keys, self.local_window)  # (n_query, n_keys)
        return recent | (own & causal_mask(query_positions, n_keys))  # (n_query, n_keys)

    def compress(self, queries, keys, values, query_positions=None) -> CompressedKV:
        n_keys = keys.shape[0]
        positions = default_query_positions(queries.shape[0], n_keys, query_positions)  # (n_query,)
        token_pos = np.arange(n_keys)  # (n_keys,)
        return CompressedKV(keys, values, self.visible(positions, n_keys), token_pos, token_pos)
