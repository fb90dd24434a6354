"""The JAX mirror of DeepSeek-V4's compressed attention as llama.cpp's `deepseek4` computes it.

Every layer is one `build_attention_impl` of src/models/deepseek4.cpp at compress ratio 4
(CSA) in the minimal configuration that makes the rest of the architecture exact
identities (../shared/notes/llama-cpp-minimal-configs.md): hyper-connections with four
identical streams, one routed expert beside the shared one, no hash routing, an indexer
whose top-k keeps every block. What is left, and trained here:

- low-rank q (q_a, RMSNorm, q_b) with a weightless per-head RMSNorm; one K = V head
  (RMSNorm'd); RoPE (NORM mode, adjacent pairs) on the last `n_rot` channels of both;
- the overlapped compressor: per channel, softmax(W_gate a + ape[pos % 4]) over 8 rows (the
  previous block's first half of W_kv a, the block's own second half), RMSNorm, RoPE at the
  block's first position; block b is visible once 4b + 3 <= t;
- attention over [sink, visible blocks, the sliding window of `local_window` tokens], the
  output roped back by the query's position, then the low-rank output projection;
- a SwiGLU feed-forward (the routed and the shared expert: one SwiGLU split in two at export).

Designs: "csa" (the overlapped compressor), "csa-disjoint" (the previous block's rows at
weight 0: a plain S = 4 gated pool) and "csa-dense", the twin: a window that covers every
position, and compressed entries that are exactly zero (compressor norm weight 0), so every
query reads every token exactly and the entries only add exp(0) per visible block to the
denominator, the same for every target at a given query position; its first `hint_steps`
also train the induction hint (`induction_hint`), without which it never learned the task.
(Compress ratio 0 on every layer, the plain dense layout, kills llama.cpp 0.3.36 with
SIGFPE: it needs at least one ratio-4 layer; measured.) The export is `kvphase/train/export_deepseek4.py`;
tests/test_train_csa.py checks this forward equals llama.cpp's on the exported file.
Arrays are (batch, ...) throughout; shape comments name the axes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from kvphase.train.config import TrainConfig

RATIO = 4  # deepseek4's CSA ratio: the only stride its overlapped compressor has
RMS_EPS = 1e-6  # deepseek4.attention.layer_norm_rms_epsilon of the export
ROPE_BASE = 10000.0  # rope.freq_base and compress_rope_freq_base: a short context wants fast rotations
ROPE_SHARE = 2  # RoPE turns the last half of each head (a quarter or all of it: no retrieval within 2000 steps, measured)
NORM_INIT = 4.0  # kv_norm and comp_norm at start: q is normed without a weight, so these set how sharp attention
# can get; at 1 no seed learned the retrieval in 3000 steps, at 8 none moved off chance (measured)
PREV_ROWS_INIT = -4.0  # csa: the previous block's rows start at e^-4 of the gate weight; at 0 (each entry a blur of
# 8 tokens) no retrieval appeared in 1000 steps, at -4 it did within 500 and the overlap opens as it trains (measured)
MASKED = -1e30  # a gate logit of weight exactly 0 (llama.cpp's -inf would give NaN gradients)


def rope_dims(config: TrainConfig) -> int:
    """Channels RoPE rotates (the last n_rot of a head): half the head."""
    return config.head_dim // ROPE_SHARE


def window(config: TrainConfig) -> int:
    """sliding_window: the local window, or for the dense twin every position the model embeds."""
    return config.n_positions if config.design == "csa-dense" else config.local_window


def init_params(config: TrainConfig, n_vocab: int, seed: int) -> dict:
    """Normal 0.02 weights, residual outputs scaled by 1/sqrt(2 layers), norms at one (the K = V
    head's at NORM_INIT), sinks at zero, gate biases at zero (the previous block's rows at
    PREV_ROWS_INIT). The output matrix is the embedding (tied in training, copied at export),
    which shortens the plateau before retrieval as it does for `gated`."""
    rng = np.random.default_rng([seed, 0])
    d, hd, h = config.d_model, config.head_dim, config.heads
    f = 2 * d  # per expert: routed + shared = 4 d, GPT-2's feed-forward width

    def normal(*shape, scale=0.02):
        return jnp.asarray(rng.normal(0.0, scale, size=shape), dtype=jnp.float32)

    proj = 0.02 / math.sqrt(2 * config.layers)
    blocks = []
    for _ in range(config.layers):
        block = {
            "attn_norm": jnp.ones(d), "q_a": normal(d, d), "q_a_norm": jnp.ones(d), "q_b": normal(d, h * hd),
            "kv": normal(d, hd), "kv_norm": jnp.full(hd, NORM_INIT), "sinks": jnp.zeros(h),
            "o_a": normal(h * hd, d), "o_b": normal(d, d, scale=proj),
            "ffn_norm": jnp.ones(d), "w_gate": normal(d, 2 * f), "w_up": normal(d, 2 * f),
            "w_down": normal(2 * f, d, scale=proj),
        }
        if config.design != "csa-dense":
            block["comp_kv"] = normal(d, 2 * hd)
            block["comp_gate"] = normal(d, 2 * hd)
            block["comp_ape"] = jnp.zeros((RATIO, 2 * hd)).at[:, :hd].set(PREV_ROWS_INIT)  # (4, 2 hd) per-phase gate bias
            block["comp_norm"] = jnp.full(hd, NORM_INIT)
        blocks.append(block)
    return {"wte": normal(n_vocab, d), "blocks": blocks, "out_norm": jnp.ones(d)}


def rms(x, weight=None):
    """ggml_rms_norm (times weight): x / sqrt(mean(x^2) + eps)."""
    x = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + RMS_EPS)
    return x if weight is None else x * weight


def rope(x, positions, n_rot: int, inverse: bool = False):
    """ggml_rope_ext (NORM mode: adjacent pairs) on the last n_rot channels of x (..., T, hd) at
    positions (T,); `inverse` is ggml_rope_ext_back."""
    if n_rot == 0:
        return x
    half = n_rot // 2
    theta = positions[:, None] * ROPE_BASE ** (-2.0 * jnp.arange(half) / n_rot)  # (T, half)
    cos, sin = jnp.cos(theta), jnp.sin(theta) * (-1.0 if inverse else 1.0)  # (T, half)
    nope, a, b = x[..., :-n_rot], x[..., -n_rot::2], x[..., -n_rot + 1 :: 2]  # (..., T, hd - n_rot), (..., T, half) x2
    turned = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(a.shape[:-1] + (n_rot,))  # (..., T, n_rot)
    return jnp.concatenate([nope, turned], axis=-1)  # (..., T, hd)


def compressed_entries(a, block, config: TrainConfig):
    """One entry per complete block of 4 tokens: a (B, T, d) -> (B, nb, hd) and its first position (nb,)."""
    b, t, hd = a.shape[0], a.shape[1], config.head_dim
    nb = t // RATIO
    first = RATIO * jnp.arange(nb)  # (nb,)
    if config.design == "csa-dense":
        return jnp.zeros((b, nb, hd)), first
    kv = (a @ block["comp_kv"])[:, : nb * RATIO].reshape(b, nb, RATIO, 2 * hd)  # (B, nb, 4, 2hd)
    phase_bias = block["comp_ape"]  # (4, 2hd)
    if config.design == "csa-disjoint":
        phase_bias = phase_bias.at[:, :hd].set(MASKED)
    gate = ((a @ block["comp_gate"])[:, : nb * RATIO].reshape(b, nb, RATIO, 2 * hd) + phase_bias)  # (B, nb, 4, 2hd)
    prev_kv = jnp.concatenate([jnp.zeros_like(kv[:, :1, :, :hd]), kv[:, :-1, :, :hd]], axis=1)  # (B, nb, 4, hd)
    prev_gate = jnp.concatenate([jnp.full_like(gate[:, :1, :, :hd], MASKED), gate[:, :-1, :, :hd]], axis=1)
    rows_kv = jnp.concatenate([prev_kv, kv[..., hd:]], axis=2)  # (B, nb, 8, hd)
    rows_gate = jnp.concatenate([prev_gate, gate[..., hd:]], axis=2)  # (B, nb, 8, hd)
    pooled = (jax.nn.softmax(rows_gate, axis=2) * rows_kv).sum(2)  # (B, nb, hd)
    return rope(rms(pooled, block["comp_norm"]), first, rope_dims(config)), first


def attention(a, block, config: TrainConfig):
    """One layer's attention output (B, T, d) from its normed input a (B, T, d), and the log-weight
    of every query on every token (B, H, T, T), which only the induction hint reads."""
    b, t, _ = a.shape
    h, hd, n_rot = config.heads, config.head_dim, rope_dims(config)
    pos = jnp.arange(t)  # (T,)
    q = rms((rms(a @ block["q_a"], block["q_a_norm"]) @ block["q_b"]).reshape(b, t, h, hd))  # (B, T, H, hd)
    q = rope(q.transpose(0, 2, 1, 3), pos, n_rot)  # (B, H, T, hd)
    kv = rope(rms(a @ block["kv"], block["kv_norm"]), pos, n_rot)  # (B, T, hd): K = V
    scale = 1.0 / math.sqrt(hd)
    raw_scores = jnp.einsum("bhtd,bud->bhtu", q, kv) * scale  # (B, H, T, T)
    raw_seen = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < window(config))  # (T, T)
    scores = [jnp.broadcast_to(block["sinks"][None, :, None, None], (b, h, t, 1)), jnp.where(raw_seen, raw_scores, -jnp.inf)]
    entries, first = compressed_entries(a, block, config)  # (B, nb, hd), (nb,)
    entry_seen = first[None, :] + RATIO - 1 <= pos[:, None]  # (T, nb)
    entry_scores = jnp.einsum("bhtd,bnd->bhtn", q, entries) * scale  # (B, H, T, nb)
    scores.insert(1, jnp.where(entry_seen, entry_scores, -jnp.inf))
    values = [entries, kv]
    scores = jnp.concatenate(scores, -1)  # (B, H, T, 1 + n_keys): sink, entries, tokens
    weights = jax.nn.softmax(scores, axis=-1)[..., 1:]  # (B, H, T, n_keys): the sink reads nothing
    out = jnp.einsum("bhtk,bkd->bhtd", weights, jnp.concatenate(values, axis=1))  # (B, H, T, hd)
    out = rope(out, pos, n_rot, inverse=True).transpose(0, 2, 1, 3).reshape(b, t, h * hd)  # (B, T, H hd)
    return out @ block["o_a"] @ block["o_b"], jax.nn.log_softmax(scores, axis=-1)[..., -t:]  # (B, T, d), (B, H, T, T)


def induction_hint(first_log_weights, last_log_weights, tokens, config: TrainConfig):
    """The hint the first `hint_steps` train beside the answers (TrainConfig.hint_steps): the
    induction circuit a model with no pooled entries needs and, in this layout, did not find by
    itself (csa-dense: more than a dozen recipes, up to 5000 steps; reports/README.md). Minus the mean
    log-weight of layer 0's first head on the previous token, and of every last-layer head, at
    each question row, on the token after the question's key in the context (the asked
    record's value). Both targets follow from the tokens alone and are the same at every phase.
    first_log_weights, last_log_weights: (B, H, T, T); tokens: (B, T)."""
    previous = jnp.diagonal(first_log_weights[:, 0], offset=-1, axis1=1, axis2=2)  # (B, T - 1): row t + 1 on t
    rows, c = config.query_rows, config.context
    key_seen = tokens[:, None, : c - 1] == tokens[:, rows, None]  # (B, Q, c - 1): where the asked key sits
    after_key = jnp.pad(key_seen, ((0, 0), (0, 0), (1, 0)))  # (B, Q, c): the token after it
    on_value = jnp.where(after_key[:, None], last_log_weights[:, :, rows, :c], 0.0).sum(-1)  # (B, H, Q)
    return -(previous.mean() + on_value.mean())


def feed_forward(x, block):
    """The residual stream after a block's SwiGLU feed-forward (B, T, d), RMS-normed first."""
    m = rms(x, block["ffn_norm"])  # (B, T, d)
    return x + (jax.nn.silu(m @ block["w_gate"]) * (m @ block["w_up"])) @ block["w_down"]  # (B, T, d)


def forward(params, tokens, starts, config: TrainConfig):
    """Hidden states after the output norm (B, T, d) and the auxiliary loss: the induction hint
    while `hint_steps` is on, else 0; `starts` is unused (deepseek4's blocks are absolute: pos // 4)."""
    x = params["wte"][tokens]  # (B, T, d): no position embedding
    log_weights = []
    for block in params["blocks"]:
        out, layer_log_weights = attention(rms(x, block["attn_norm"]), block, config)  # (B, T, d), (B, H, T, T)
        x = feed_forward(x + out, block)  # (B, T, d)
        log_weights.append(layer_log_weights)
    aux = induction_hint(log_weights[0], log_weights[-1], tokens, config) if config.hint_steps else 0.0
    return rms(x, params["out_norm"]), aux


def query_logits(params, tokens, starts, rows, config: TrainConfig):
    """Logits at the question rows (B, queries, n_vocab) and the auxiliary loss (0)."""
    hidden, aux = forward(params, tokens, starts, config)  # (B, T, d)
    return hidden[:, rows] @ params["wte"].T, aux  # (B, queries, n_vocab)


def logits(params, tokens, config: TrainConfig):
    """Logits at every position (B, T, n_vocab): what llama.cpp's exported file computes."""
    hidden, _ = forward(params, tokens, None, config)
    return hidden @ params["wte"].T
