"""DeepSeek-V4 compressed attention: the ratio-4 overlapped compressor with its lightning
indexer (CSA) and the ratio-128 compressor (HCA).

Follows src/models/deepseek4.cpp (`build_attention_impl`,
`build_overlap_compressed_kv_from_state`, `build_hca_compressed_kv_from_state`,
`build_lid_top_k`, `build_top_k_mask`, `build_csa_lid_attention`, `build_hca_attention`)
and `dsv4_build_comp_plan` in src/llama-kv-cache-dsv4.cpp (llama-cpp-python 0.3.36):

- Blocks are absolute: block b covers positions [b*ratio, (b+1)*ratio); a token's gate bias
  is row `pos % ratio` of `attn_compressor_ape` (`*_state_score_ape` = W_gate x + ape row).
- HCA (ratio 128): per channel, softmax of the gate logits over the block's 128 tokens,
  weighted sum of W_kv x (`hca_state_compress`: llama.cpp gives five nodes that name, in graph
  order the gathered kv and gate rows (RESHAPE), the pooled entry (CONT), the normed (MUL) and
  the roped (ROPE) one).
- CSA / indexer (ratio 4, "overlapped"): W_kv x and the gate have 2d channels. Block b
  mixes 8 rows per channel: the first d channels of the previous block's 4 tokens and the
  last d channels of its own 4 tokens; block 0's previous half is a zero row with a -inf
  gate. Softmax over the 8 rows per channel (`csa_state_compress` / `lid_state_compress`).
- Then RMSNorm with `attn_compressor_norm` (the MUL node of that name), RoPE at the
  block's first position on the last n_rot channels (the ROPE node), and the compressed cache
  store (type_k, F16 by default). Blocks are visible to a query at p when b < (p+1)//ratio.
- CSA: the lightning indexer scores visible blocks as sum_h w_h relu(q_h . k_b) with
  w = W_proj x / sqrt(d * H) (`lid_weights`, `lid_score_masked`) and keeps the top
  `indexer.top_k` (`lid_top_k`, unordered in llama.cpp); attention reads those blocks plus
  the raw sliding window of n_swa tokens (`csa_lid_kq_mask`). HCA reads every visible
  block plus the raw window (`hca_kq_mask`).

The Hadamard rotation llama.cpp applies to the indexer's q and k (`lid_q_rot`,
`lid_state_compress_rot`) is orthonormal and applied to both, so it leaves scores unchanged
up to F32 rounding; this reference omits it. RoPE follows ggml's rope_yarn: with YaRN scaling
(`Yarn`) the low-frequency pairs are interpolated and the high-frequency ones extrapolated.

F16 (`cache_dtype="f16"`, llama.cpp's default type_k): the compressor state (`*_state_kv`,
`*_state_score`, llama_dsv4_comp_state) is always F32 and the pooling, RMSNorm and RoPE run in
F32, so the finished entry (the ROPE node, `finished`) is not rounded. The one rounding is the
store: `cpy_k` (ggml_set_rows) into the F16 compressed cache (`store`), and that happens *after*
llama.cpp's Hadamard rotation (`*_state_compress_rot`) where the cache has one. Rounding does not
commute with the rotation, so `entries` takes the rotation and applies it before rounding, and the
indexer's q must then be rotated too (`lid_q_rot`): in the rotated basis the scores are
sum_h w_h relu(q_rot . round(rot(k))), which unrotated F32 q and keys no longer reproduce.
The fused lightning indexer (ggml_lightning_indexer, cparams.fused_lid, on by default on the CPU)
widens the F16 keys and keeps q in F32; the unfused path's ggml_mul_mat(F16 k, F32 q) converts q
to F16 on the CPU (vec_dot_type of F16 is F16): `indexer_scores(round_queries=True)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kvphase.designs.base import default_query_positions
from kvphase.designs.windows import (WindowLayout, ambiguous_top_k, check_cache_dtype, check_non_negative,
                                     check_positive, check_shape, local_mask, prefix_mask, round_to_cache, rows_to_mask,
                                     softmax, top_k_indices)
from kvphase.errors import PlanError
from kvphase.gguf.keys import Keys

CSA_RATIO = 4  # llama.cpp: the overlapped compressor with an indexer exists only at ratio 4
HCA_RATIO = 128


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """ggml_rms_norm times weight (build_norm LLM_NORM_RMS): x / sqrt(mean(x^2) + eps) * weight."""
    x = np.asarray(x, dtype=np.float32)  # (n, d)
    mean_square = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)  # (n, 1)
    return (x / np.sqrt(mean_square + np.float32(eps)) * weight).astype(np.float32)  # (n, d)


@dataclass(frozen=True)
class Yarn:
    """YaRN's parameters as ggml_rope_ext takes them (`ext_factor` 0 turns the ramp off)."""

    ext_factor: float  # weight of the extrapolation ramp; llama.cpp sets 1 for rope.scaling.type = yarn
    n_ctx_orig: int  # rope.scaling.original_context_length
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attn_factor: float = 1.0  # multiplies cos and sin (deepseek4 passes 1 / (1 + 0.1 ln(1/freq_scale)))

    def correction_dims(self, n_rot: int, freq_base: float) -> tuple[float, float]:
        """ggml_rope_yarn_corr_dims: the rotary dimensions where the ramp starts and ends."""

        def dim(beta: float) -> np.float32:
            ratio = np.float32(self.n_ctx_orig) / (np.float32(beta) * np.float32(2) * np.float32(np.pi))
            return np.float32(n_rot) * np.log(ratio) / (np.float32(2) * np.log(np.float32(freq_base)))

        return max(0.0, float(np.floor(dim(self.beta_fast)))), min(n_rot - 1.0, float(np.ceil(dim(self.beta_slow))))

    def ramp(self, n_pairs: int, n_rot: int, freq_base: float) -> np.ndarray:
        """rope_yarn_ramp times ext_factor for pair i (dimension i0 = 2i): 1 extrapolates, 0 interpolates."""
        low, high = self.correction_dims(n_rot, freq_base)
        y = (np.arange(n_pairs, dtype=np.float32) - np.float32(low)) / np.float32(max(0.001, high - low))  # (n_pairs,)
        return ((1 - np.clip(y, 0, 1)) * np.float32(self.ext_factor)).astype(np.float32)  # (n_pairs,)

    @staticmethod
    def boost(freq_scale: float) -> np.float32:
        """The magnitude correction rope_yarn applies with the ramp on: 1 + 0.1 ln(1 / freq_scale)."""
        return np.float32(1) + np.float32(0.1) * np.log(np.float32(1) / np.float32(freq_scale))

    def magnitude(self, freq_scale: float) -> np.float32:
        """rope_yarn's mscale: attn_factor, times `boost` when the ramp is on."""
        if self.ext_factor == 0:
            return np.float32(self.attn_factor)
        return np.float32(self.attn_factor) * self.boost(freq_scale)


def rope(
    x: np.ndarray,  # (n, d)
    positions: np.ndarray,  # (n,)
    n_rot: int,
    freq_base: float,
    offset: int = 0,
    neox: bool = False,
    freq_scale: float = 1.0,
    yarn: Yarn | None = None,
) -> np.ndarray:
    """ggml_rope_ext on channels [offset, offset + n_rot) (ggml_rope_set_offset).

    NORM mode (DeepSeek) rotates adjacent pairs (2i, 2i+1); NEOX rotates (i, i + n_rot/2).
    theta_i = freq_scale * pos * freq_base^(-2i/n_rot), built as ggml_rope_cache_init does on the
    CPU: theta_0 = pos, then theta_{i+1} = theta_i * powf(freq_base, -2/n_rot) in F32. A closed-form
    power differs by a few F32 ulps of theta, which at position p is an error of about p * 1e-7.
    With `yarn` (rope_yarn), pair i mixes that interpolated angle with the unscaled one by the
    ramp, and cos and sin are scaled by its magnitude.
    """
    x = np.asarray(x, dtype=np.float32)
    out = x.copy()  # (n, d)
    half = n_rot // 2
    theta_scale = np.float32(freq_base) ** np.float32(-2.0 / n_rot)
    extrap = np.empty((len(x), half), dtype=np.float32)  # (n, half)
    step = np.asarray(positions, np.float32)  # (n,)
    for i in range(half):
        extrap[:, i] = step
        step = (step * theta_scale).astype(np.float32)
    theta = (np.float32(freq_scale) * extrap).astype(np.float32)  # (n, half), rope_yarn's theta_interp
    scale = np.float32(1) if yarn is None else yarn.magnitude(freq_scale)
    if yarn is not None and yarn.ext_factor != 0:
        mix = yarn.ramp(half, n_rot, freq_base)  # (half,)
        theta = (theta * (1 - mix) + extrap * mix).astype(np.float32)  # (n, half)
    cos = (np.cos(theta) * scale).astype(np.float32)  # (n, half)
    sin = (np.sin(theta) * scale).astype(np.float32)  # (n, half)
    section = x[:, offset : offset + n_rot]  # (n, n_rot)
    if neox:
        a, b = section[:, :half], section[:, half:]  # (n, half)
        out[:, offset : offset + half] = a * cos - b * sin
        out[:, offset + half : offset + n_rot] = a * sin + b * cos
    else:
        a, b = section[:, 0::2], section[:, 1::2]  # (n, half)
        out[:, offset : offset + n_rot : 2] = a * cos - b * sin
        out[:, offset + 1 : offset + n_rot : 2] = a * sin + b * cos
    return out  # (n, d)


@dataclass(frozen=True)
class DSV4Selection:
    """What each query reads in one DSV4 compressed layer."""

    scores: np.ndarray | None  # (n_query, n_blocks) `lid_score_masked` (CSA), None for HCA
    top_blocks: np.ndarray | None  # (n_query, k) `lid_top_k` as a descending list, -1 padding; None for HCA
    raw_visible: np.ndarray  # (n_query, n_keys) bool: raw sliding window (+ prefix before `start`)
    block_visible: np.ndarray  # (n_query, n_blocks) bool: compressed entries read
    ambiguous: np.ndarray  # (n_query,) bool: a tie at the top-k boundary (always False for HCA)


@dataclass(frozen=True)
class DSV4:
    """One DeepSeek-V4 compressed layer (src/models/deepseek4.cpp).

    ratio 4 is CSA (overlapped compressor + lightning indexer top-k), any other ratio
    behaves as HCA (plain compressor, every visible block read); llama.cpp has 4 and 128.
    """

    ratio: int  # deepseek4.attention.compress_ratios[layer]: 4 (CSA) or 128 (HCA)
    n_swa: int  # raw sliding window: deepseek4.attention.sliding_window
    top_k: int = 512  # compressed blocks the CSA indexer keeps: deepseek4.attention.indexer.top_k
    start: int = 0  # position where block 0 starts; llama.cpp: 0 (blocks are pos // ratio)
    cache_dtype: str = "f16"  # compressed cache type_k: entries are rounded to it

    def __post_init__(self) -> None:
        check_positive("DSV4", ratio=self.ratio, n_swa=self.n_swa, top_k=self.top_k)
        check_non_negative("DSV4", start=self.start)
        check_cache_dtype("DSV4", self.cache_dtype)
        if self.ratio < 2:
            raise ValueError(f"DSV4: expected ratio >= 2 (llama.cpp uses 4 and 128), got {self.ratio}")

    @property
    def is_csa(self) -> bool:
        """Overlapped compressor with an indexer: llama.cpp ties both to ratio 4."""
        return self.ratio == CSA_RATIO

    @property
    def layout(self) -> WindowLayout:
        """The blocks' own tokens (the overlapped compressor also reads the block before)."""
        return WindowLayout(window=self.ratio, stride=self.ratio, start=self.start)

    # -- compressor -----------------------------------------------------------------------

    def gate_logits(self, gate: np.ndarray, ape: np.ndarray) -> np.ndarray:
        """`*_state_score_ape`: W_gate x plus the ape row of each token's phase (pos - start) % ratio.

        gate: (n_tokens, C) with C = 2d for CSA/indexer, d for HCA; ape: (ratio, C) as numpy reads it.
        """
        gate = np.asarray(gate, dtype=np.float32)  # (n_tokens, C)
        check_shape("DSV4", "ape", ape, (self.ratio, gate.shape[1]))
        phase = (np.arange(gate.shape[0]) - self.start) % self.ratio  # (n_tokens,)
        return gate + np.asarray(ape, dtype=np.float32)[phase]  # (n_tokens, C)

    def pool(self, kv: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """The pooled `*_state_compress` (its CONT node): per-channel softmax-weighted sum over each complete block.

        kv, logits: (n_tokens, C) for every position from 0 (`*_state_kv`, `*_state_score_ape`).
        """
        kv, logits = np.asarray(kv, np.float32), np.asarray(logits, np.float32)
        check_shape("DSV4", "logits", logits, kv.shape)
        members = self.layout.members(self.layout.n_complete(kv.shape[0]))  # (n_blocks, ratio)
        weights = self.pool_weights(logits)  # (n_blocks, ratio or 2*ratio, d)
        if not self.is_csa:
            return np.sum(weights * kv[members], axis=1, dtype=np.float32)  # (n_blocks, d)
        d = kv.shape[1] // 2
        prev = members - self.ratio  # (n_blocks, ratio)
        prev_kv = np.where((prev >= self.start)[:, :, None], kv[np.maximum(prev, 0), :d], 0.0)  # (n_blocks, ratio, d)
        rows_kv = np.concatenate([prev_kv, kv[members, d:]], axis=1)  # (n_blocks, 2*ratio, d)
        return np.sum(weights * rows_kv, axis=1, dtype=np.float32)  # (n_blocks, d)

    def pool_weights(self, logits: np.ndarray) -> np.ndarray:
        """Each row's per-channel weight in its complete block's entry (softmax over the block):
        (n_blocks, ratio, C) for HCA; for CSA (n_blocks, 2 * ratio, C / 2), the previous block's
        rows (first C / 2 channels; weight 0 before `start`) then the block's own (last C / 2).
        Row j of block b sits at position first_rows(n_blocks)[b] + j."""
        logits = np.asarray(logits, np.float32)
        members = self.layout.members(self.layout.n_complete(logits.shape[0]))  # (n_blocks, ratio)
        if not self.is_csa:
            return softmax(logits[members], axis=1)  # (n_blocks, ratio, d)
        d = logits.shape[1] // 2
        # the previous block's first d channels; before `start` a -inf gate
        prev = members - self.ratio  # (n_blocks, ratio)
        exists = (prev >= self.start)[:, :, None]  # (n_blocks, ratio, 1)
        prev_logit = np.where(exists, logits[np.maximum(prev, 0), :d], -np.inf)  # (n_blocks, ratio, d)
        rows_logit = np.concatenate([prev_logit, logits[members, d:]], axis=1)  # (n_blocks, 2*ratio, d)
        return softmax(rows_logit, axis=1)  # (n_blocks, 2*ratio, d)

    def first_rows(self, n_blocks: int) -> np.ndarray:
        """The position of row 0 of each block's `pool_weights`: (n_blocks,), the previous block's for CSA."""
        return self.layout.first_positions(n_blocks) - (self.ratio if self.is_csa else 0)  # (n_blocks,)

    def block_positions(self, n_blocks: int) -> np.ndarray:
        """RoPE position of each compressed entry: its block's first position (`state_write_pos`)."""
        return self.layout.first_positions(n_blocks)  # (n_blocks,)

    def finished(
        self,
        kv: np.ndarray,  # (n_tokens, C) `*_state_kv`
        gate: np.ndarray,  # (n_tokens, C) `*_state_score`
        ape: np.ndarray,  # (ratio, C) `attn_compressor_ape` / `indexer_compressor_ape`
        norm_weight: np.ndarray,  # (d,) `attn_compressor_norm` / `indexer_compressor_norm`
        norm_eps: float,  # deepseek4.attention.layer_norm_rms_epsilon
        rope_fn: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,  # (x, positions) -> x
    ) -> np.ndarray:
        """The finished entries before the cache (the ROPE `*_state_compress` node): pool, RMSNorm,
        RoPE (if given), all in F32; no cache rounding."""
        pooled = self.pool(kv, self.gate_logits(gate, ape))  # (n_blocks, d)
        normed = rms_norm(pooled, norm_weight, norm_eps)  # (n_blocks, d)
        if rope_fn is not None:
            normed = rope_fn(normed, self.block_positions(len(normed)))  # (n_blocks, d)
        return normed  # (n_blocks, d)

    def store(self, x: np.ndarray) -> np.ndarray:
        """What `cpy_k` (ggml_set_rows into the compressed cache of type_k) reads back as; a new array."""
        return np.array(round_to_cache(x, self.cache_dtype), dtype=np.float32)  # same shape as x, never x itself

    def entries(
        self,
        finished: np.ndarray,  # (n_blocks, d) what `finished` returns
        rotate_fn: Callable[[np.ndarray], np.ndarray] | None = None,  # `*_state_compress_rot`, x -> x
    ) -> np.ndarray:
        """Compressed cache entries as read back: the finished entries, the cache's rotation (if given), `store`."""
        x = finished if rotate_fn is None else rotate_fn(finished)  # (n_blocks, d)
        return self.store(x)  # (n_blocks, d)

    # -- selection --------------------------------------------------------------------------

    def indexer_scores(
        self,
        queries: np.ndarray,  # (n_query, n_head, d_idx) `lid_q_rope` (or `lid_q_rot`)
        weights: np.ndarray,  # (n_query, n_head) `lid_weights`, already scaled
        index_keys: np.ndarray,  # (n_blocks, d_idx) indexer entries (see `entries`)
        query_positions: np.ndarray,  # (n_query,)
        round_queries: bool = False,  # unfused indexer: the F16-cache mul_mat converts q to the cache type
    ) -> np.ndarray:
        """`lid_score_masked`: sum_h w_h relu(q_h . k_b), -inf for blocks not complete at the query.

        q and the keys must be in the same basis: with an F16 cache, both rotated (`lid_q_rot` and the
        cache as read back), since the keys were rounded after the rotation.
        """
        n_query, n_head, d = np.shape(queries)
        check_shape("DSV4", "weights", weights, (n_query, n_head))
        check_shape("DSV4", "index_keys", index_keys, (None, d))
        q = np.asarray(queries, np.float32)  # (n_query, n_head, d)
        if round_queries:
            q = round_to_cache(q, self.cache_dtype)  # (n_query, n_head, d)
        kq = np.einsum("thd,bd->thb", q, np.asarray(index_keys, np.float32))  # (n_query, n_head, n_blocks)
        score = np.sum(np.maximum(kq, 0) * np.asarray(weights, np.float32)[:, :, None], axis=1)  # (n_query, n_blocks)
        seen = self.layout.window_visible(query_positions, len(index_keys))  # (n_query, n_blocks)
        return np.where(seen, score, -np.inf).astype(np.float32)  # (n_query, n_blocks)

    def raw_window(self, query_positions: np.ndarray, n_keys: int) -> np.ndarray:
        """The uncompressed tokens each query reads: its last n_swa tokens (and any prefix
        before `start`), (n_query, n_keys) bool."""
        positions = np.asarray(query_positions)  # (n_query,)
        return local_mask(positions, n_keys, self.n_swa) | prefix_mask(positions, n_keys, self.start)

    def select(
        self,
        query_positions: np.ndarray,  # (n_query,)
        n_keys: int,
        n_blocks: int,
        scores: np.ndarray | None = None,  # (n_query, n_blocks) `lid_score_masked`, CSA only
    ) -> DSV4Selection:
        """Raw window and compressed blocks each query reads (`csa_lid_kq_mask` / `hca_kq_mask`)."""
        positions = np.asarray(query_positions)  # (n_query,)
        raw = self.raw_window(positions, n_keys)  # (n_query, n_keys)
        complete = self.layout.window_visible(positions, n_blocks)  # (n_query, n_blocks)
        if not self.is_csa:
            none = np.zeros(len(positions), dtype=bool)  # (n_query,)
            return DSV4Selection(None, None, raw, complete, none)
        if scores is None:
            raise ValueError("DSV4: expected indexer scores for a ratio-4 (CSA) layer, got None")
        check_shape("DSV4", "scores", scores, (len(positions), n_blocks))
        top = top_k_indices(scores, self.top_k, ties="llama.cpp")  # (n_query, min(top_k, n_blocks)): its partial sort
        chosen = rows_to_mask(top, n_blocks) & complete  # (n_query, n_blocks)
        return DSV4Selection(scores, top, raw, chosen, ambiguous_top_k(scores, self.top_k))

    def forward(
        self,
        n_keys: int,
        query_positions: np.ndarray | None = None,  # (n_query,), default all n_keys positions
        n_blocks: int | None = None,  # default every complete block of n_keys tokens
        queries: np.ndarray | None = None,  # (n_query, n_head, d_idx), CSA only
        weights: np.ndarray | None = None,  # (n_query, n_head), CSA only
        index_keys: np.ndarray | None = None,  # (n_blocks, d_idx), CSA only
    ) -> DSV4Selection:
        """The whole selection: indexer scores (CSA) then `select`."""
        n_query = n_keys if query_positions is None else len(query_positions)
        positions = default_query_positions(n_query, n_keys, query_positions)  # (n_query,)
        n_blocks = self.layout.n_complete(n_keys) if n_blocks is None else n_blocks
        scores = None
        if self.is_csa:
            if queries is None or weights is None or index_keys is None:
                raise ValueError("DSV4: expected queries, weights and index_keys for a ratio-4 (CSA) layer")
            scores = self.indexer_scores(queries, weights, index_keys[:n_blocks], positions)  # (n_query, n_blocks)
        return self.select(positions, n_keys, n_blocks, scores)


# --------------------------------------------------------------------------- llama.cpp math around the design


def hadamard(n: int) -> np.ndarray:
    """llama.cpp's orthonormal Walsh-Hadamard matrix (`ggml_gen_hadamard`, src/llama-kv-cache.cpp)."""
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h * np.float32(1.0 / np.sqrt(n))).astype(np.float32)  # (n, n), symmetric


def hadamard_rotate(x: np.ndarray) -> np.ndarray:
    """`llama_mul_mat_hadamard` with the rotation `build_input_k_rot` picks: the largest power of two
    (at least 64) dividing the row width, applied to each chunk of that many channels."""
    x = np.asarray(x, np.float32)  # (n, d)
    d = x.shape[-1]
    n = 64
    while d % (2 * n) == 0:
        n *= 2
    if d % n:
        raise PlanError(f"a Hadamard rotation of width {n} does not divide rows of {d} channels")
    return (x.reshape(-1, n) @ hadamard(n).T).reshape(x.shape).astype(np.float32)  # (n, d)


def dsv4_rope_scaling(fields: dict, arch: str):
    """The RoPE scaling deepseek4.cpp gives its compressed entries, from GGUF metadata as
    llama.cpp reads it (llama_model::load_hparams, llama_context's cparams, default context
    params): freq_scale = 1/rope.scaling.factor unless the type is "none"; for "yarn" the
    ramp is on (ext_factor 1, betas 32 and 1, the original context length) and
    `dsv4_rope_attn_factor` cancels the magnitude correction. Returns (freq_scale, Yarn or None)."""
    kind = str(fields.get(Keys.Rope.SCALING_TYPE.format(arch=arch), "linear")).lower()
    factor = np.float32(fields.get(Keys.Rope.SCALING_FACTOR.format(arch=arch), 0.0) or 0.0)
    freq_scale = float(np.float32(1) / factor) if factor != 0 and kind != "none" else 1.0
    if kind != "yarn":
        return freq_scale, None
    n_ctx_orig = int(fields.get(Keys.Rope.SCALING_ORIG_CTX_LEN.format(arch=arch), 0)
                     or fields.get(Keys.LLM.CONTEXT_LENGTH.format(arch=arch), 0))
    attn_factor = np.float32(1) / Yarn.boost(freq_scale)  # dsv4_rope_attn_factor
    return freq_scale, Yarn(ext_factor=1.0, n_ctx_orig=n_ctx_orig, attn_factor=float(attn_factor))
