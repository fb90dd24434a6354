"""Shared pieces of every chunked design: window layout, visibility masks, top-k, rounding.

Position convention used by all designs: the key/value arrays hold one sequence from
position 0 (row i is the token at position i); queries name their own positions. A
design's windows start at `start` and repeat every `stride` tokens. Tokens before
`start` belong to no window: every design keeps them exact and visible to all later
queries (a short uncompressed prefix). With `start=0`, llama.cpp's layout, there are none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CACHE_DTYPES = ("f16", "f32")


def check_positive(owner: str, **values: int) -> None:
    """Raise ValueError naming the first value that is not a positive integer."""
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{owner}: expected {name} to be a positive integer, got {value!r}")


def check_non_negative(owner: str, **values: int) -> None:
    """Raise ValueError naming the first value that is not an integer >= 0."""
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{owner}: expected {name} to be an integer >= 0, got {value!r}")


def check_cache_dtype(owner: str, cache_dtype: str) -> None:
    if cache_dtype not in CACHE_DTYPES:
        raise ValueError(f"{owner}: expected cache_dtype to be one of {CACHE_DTYPES}, got {cache_dtype!r}")


def check_shape(owner: str, name: str, array: np.ndarray, expected: tuple) -> None:
    """Compare a shape with an expected one; None in `expected` matches any size."""
    shape = np.shape(array)
    ok = len(shape) == len(expected) and all(e is None or e == s for e, s in zip(expected, shape))
    if not ok:
        wanted = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ")"
        raise ValueError(f"{owner}: expected {name} of shape {wanted}, got {shape}")


def round_to_cache(x: np.ndarray, cache_dtype: str) -> np.ndarray:
    """What a value reads back as after llama.cpp stores it in a cache of `cache_dtype`.

    llama.cpp's set_rows/cpy into an F16 cache rounds to nearest even (ggml_fp32_to_fp16),
    the same rounding as numpy's float16 cast; get_rows widens back to F32 exactly.
    """
    x = np.asarray(x, dtype=np.float32)
    if cache_dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    return x


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """Softmax as ggml_soft_max on the CPU; -inf entries get weight 0.

    exp(x - max) in F32, the sum accumulated in double, then scaled by the F32 reciprocal
    (ggml_compute_forward_soft_max_f32), so results match llama.cpp's CPU to the last bit
    more often than a plain division would.
    """
    x = np.asarray(x, dtype=np.float32)
    peak = np.max(x, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0).astype(np.float32)
    e = np.exp(x - peak)
    total = np.sum(e, axis=axis, keepdims=True, dtype=np.float64)
    return (e * (1.0 / total).astype(np.float32)).astype(np.float32)


def masked_softmax(scores: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """Attention weights: softmax over the last axis of the entries `visible` marks
    (broadcast against `scores`); a row that sees nothing gets all-zero weights, not NaN.

    The one masked softmax of attention (`designs.attend`, the reference model's dense and
    compressed attention); `softmax` above is ggml's, for pooling inside a design."""
    weights = np.where(visible, scores, -np.inf)  # (..., n_entries), a new array
    peak = weights.max(axis=-1, keepdims=True)  # (..., 1)
    weights -= np.where(np.isfinite(peak), peak, 0.0)
    np.exp(weights, out=weights)
    total = weights.sum(axis=-1, keepdims=True)  # (..., 1)
    weights /= np.where(total > 0, total, 1.0)
    return weights  # (..., n_entries)


@dataclass(frozen=True)
class WindowLayout:
    """Windows of `window` tokens starting every `stride` tokens from position `start`.

    Window k covers positions [start + k*stride, start + k*stride + window). A window is
    complete once its last position exists; only complete windows become cache entries.
    """

    window: int  # tokens per window (W)
    stride: int  # tokens between consecutive window starts (S)
    start: int = 0  # position where window 0 starts

    def __post_init__(self) -> None:
        check_positive("WindowLayout", window=self.window, stride=self.stride)
        check_non_negative("WindowLayout", start=self.start)

    def n_complete(self, n_positions: int) -> int:
        """How many windows lie wholly inside positions [0, n_positions)."""
        room = n_positions - self.start - self.window
        return 0 if room < 0 else room // self.stride + 1

    def first_positions(self, n_windows: int) -> np.ndarray:
        return self.start + self.stride * np.arange(n_windows)  # (n_windows,)

    def last_positions(self, n_windows: int) -> np.ndarray:
        return self.first_positions(n_windows) + self.window - 1  # (n_windows,)

    def members(self, n_windows: int) -> np.ndarray:
        """Positions of each window's tokens, in order."""
        return self.first_positions(n_windows)[:, None] + np.arange(self.window)[None, :]  # (n_windows, window)

    def phase(self, positions: np.ndarray) -> np.ndarray:
        """(t - start) mod stride; negative (before start) positions get -1."""
        positions = np.asarray(positions)
        return np.where(positions >= self.start, (positions - self.start) % self.stride, -1)  # (n,)

    def n_visible(self, query_positions: np.ndarray) -> np.ndarray:
        """Complete windows a query at position p may see: those whose last position is <= p."""
        q = np.asarray(query_positions)  # (n_query,)
        room = q + 1 - self.start - self.window  # (n_query,)
        return np.where(room < 0, 0, room // self.stride + 1)  # (n_query,)

    def window_visible(self, query_positions: np.ndarray, n_windows: int) -> np.ndarray:
        """Causal window mask: window k visible to query p iff its last position <= p."""
        last = self.last_positions(n_windows)  # (n_windows,)
        return last[None, :] <= np.asarray(query_positions)[:, None]  # (n_query, n_windows)


def causal_mask(query_positions: np.ndarray, n_keys: int) -> np.ndarray:
    """Key position j visible to query p iff j <= p."""
    return np.arange(n_keys)[None, :] <= np.asarray(query_positions)[:, None]  # (n_query, n_keys)


def local_mask(query_positions: np.ndarray, n_keys: int, local_window: int) -> np.ndarray:
    """The `local_window` most recent positions p - local_window < j <= p (llama.cpp's standard SWA)."""
    q = np.asarray(query_positions)[:, None]  # (n_query, 1)
    j = np.arange(n_keys)[None, :]  # (1, n_keys)
    return (j <= q) & (q - j < local_window)  # (n_query, n_keys)


def prefix_mask(query_positions: np.ndarray, n_keys: int, start: int) -> np.ndarray:
    """Positions before `start` (never compressed), causally visible."""
    j = np.arange(n_keys)[None, :]  # (1, n_keys)
    return (j < start) & causal_mask(query_positions, n_keys)  # (n_query, n_keys)


def tail_positions(query_positions: np.ndarray, kpool: int, start: int) -> np.ndarray:
    """The incomplete tail of each query's own pool, as llama.cpp's `tail_idxs`.

    Slot k holds position p - k for k < n_tail = (p - start + 1) mod kpool, else -1; a
    query that completes its pool has no tail (the pool competes in the top-k instead).
    Follows `set_input_kpool` in src/llama-memory-hybrid-idx.cpp.
    """
    q = np.asarray(query_positions)  # (n_query,)
    n_tail = np.where(q >= start, (q - start + 1) % kpool, 0)  # (n_query,)
    k = np.arange(kpool - 1)[None, :]  # (1, kpool - 1)
    return np.where(k < n_tail[:, None], q[:, None] - k, -1)  # (n_query, kpool - 1)


def top_k_indices(scores: np.ndarray, k: int, ties: str = "lower") -> np.ndarray:
    """Indices of the k largest finite scores per row, by descending score; -1 pads rows with fewer.

    Ties: ggml_top_k on the CPU is std::partial_sort (then the first two results swapped),
    and the argsort llama.cpp applies afterwards (std::sort) is not stable either, so among
    equal scores llama.cpp's order is unspecified. Its *set* at the k-th place is fixed by
    libstdc++'s heap selection: `ties="llama.cpp"` reproduces it (`partial_sort_sets`);
    `ties="lower"` breaks them by the lower index, and `ambiguous_top_k` flags the rows where
    the two can differ. -inf entries are never selected here: in llama.cpp they can fill
    unused slots but are masked out afterwards.
    """
    scores = np.asarray(scores, dtype=np.float32)  # (..., n)
    k = min(k, scores.shape[-1])
    if ties == "llama.cpp" and 0 < k < scores.shape[-1]:
        chosen = partial_sort_sets(scores.reshape(-1, scores.shape[-1]), k).reshape(scores.shape[:-1] + (k,))
        ranked = np.argsort(-np.take_along_axis(scores, chosen, axis=-1), axis=-1, kind="stable")  # (..., k)
        order = np.take_along_axis(chosen, ranked, axis=-1)  # (..., k) by descending score
    else:
        order = np.argsort(-scores, axis=-1, kind="stable")[..., :k]  # (..., k)
    picked = np.take_along_axis(scores, order, axis=-1)  # (..., k)
    return np.where(np.isfinite(picked), order, -1)  # (..., k)


def partial_sort_sets(scores: np.ndarray, k: int) -> np.ndarray:
    """The k indices per row that `std::partial_sort(idx, idx + k, idx + n, a > b by score)` keeps
    (libstdc++'s __heap_select: a heap of the first k whose root is the smallest, each later
    index replacing the root only when strictly greater), as ggml_top_k's CPU kernel runs it.
    scores (R, n) -> (R, k) in heap order; vectorised over rows, every step as libstdc++ takes it."""
    rows = np.arange(len(scores))  # (R,)
    heap = np.tile(np.arange(k), (len(scores), 1))  # (R, k) indices into each row
    value = lambda r, i: scores[r, heap[r, i]]  # noqa: E731

    def adjust(r: np.ndarray, hole: int, length: int, new: np.ndarray) -> None:
        """std::__adjust_heap on rows r: sift the hole down by the better child, then push `new` up."""
        top, hole, second = hole, np.full(len(r), hole), np.full(len(r), hole)
        while True:
            go = second < (length - 1) // 2
            if not go.any():
                break
            second = np.where(go, 2 * (second + 1), second)
            right_smaller = go & (value(r, np.minimum(second, length - 1)) > value(r, np.maximum(second - 1, 0)))
            second = np.where(right_smaller, second - 1, second)  # the root side keeps the smaller score
            heap[r, hole] = np.where(go, heap[r, second], heap[r, hole])
            hole = np.where(go, second, hole)
        if length % 2 == 0:
            last = second == (length - 2) // 2
            second = np.where(last, 2 * (second + 1), second)
            heap[r, hole] = np.where(last, heap[r, np.maximum(second - 1, 0)], heap[r, hole])
            hole = np.where(last, second - 1, hole)
        while True:  # std::__push_heap: comp(parent, new) is score[parent] > score[new]
            parent = (hole - 1) // 2
            up = (hole > top) & (scores[r, heap[r, np.maximum(parent, 0)]] > scores[r, new])
            if not up.any():
                break
            heap[r, hole] = np.where(up, heap[r, np.maximum(parent, 0)], heap[r, hole])
            hole = np.where(up, parent, hole)
        heap[r, hole] = new

    for parent in range((k - 2) // 2, -1, -1):  # std::__make_heap
        adjust(rows, parent, k, heap[:, parent].copy())
    for i in range(k, scores.shape[1]):  # std::__heap_select
        r = rows[scores[:, i] > value(rows, 0)]
        if len(r):
            adjust(r, 0, k, np.full(len(r), i))
    return heap


def ambiguous_top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """True where the k-th and (k+1)-th finite scores tie, so the selected set is not unique."""
    scores = np.asarray(scores, dtype=np.float32)  # (..., n)
    if k >= scores.shape[-1] or k < 1:
        return np.zeros(scores.shape[:-1], dtype=bool)  # (...,)
    ranked = -np.sort(-scores, axis=-1)  # (..., n)
    kth, next_ = ranked[..., k - 1], ranked[..., k]  # (...,), (...,)
    return np.isfinite(next_) & (kth == next_)  # (...,)


def rows_to_mask(indices: np.ndarray, n_columns: int) -> np.ndarray:
    """Boolean mask with True at each row's listed column indices (-1 entries ignored)."""
    indices = np.asarray(indices)  # (..., m)
    mask = np.zeros(indices.shape[:-1] + (n_columns + 1,), dtype=bool)  # (..., n_columns + 1)
    np.put_along_axis(mask, np.where(indices < 0, n_columns, indices), True, axis=-1)
    return mask[..., :n_columns]  # (..., n_columns)
