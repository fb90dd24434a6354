"""The JAX mirror of DeepSeek-V4's compressed attention as llama.cpp's `deepseek4` computes it.

Every layer is one `build_attention_impl` of src/models/deepseek4.cpp at its compress ratio
(`--ratios`: 4 is CSA, 128 HCA, 0 the window alone) in the minimal configuration that makes the
rest of the architecture exact identities (../shared/notes/llama-cpp-minimal-configs.md):
hyper-connections with four identical streams, one routed expert beside the shared one, no hash
routing. What is left, and trained here:

- low-rank q (q_a, RMSNorm, q_b) with a weightless per-head RMSNorm; one K = V head
  (RMSNorm'd); RoPE (NORM mode, adjacent pairs) on the last `n_rot` channels of both;
- CSA's overlapped compressor: per channel, softmax(W_gate a + ape[pos % 4]) over 8 rows (the
  previous block's first half of W_kv a, the block's own second half), RMSNorm, RoPE at the
  block's first position; block b is visible once 4b + 3 <= t. HCA's is the same over the 128
  rows of its own block alone;
- CSA's lightning indexer (`build_lid_top_k`), with `indexer_top_k` set: its own overlapped
  compressor gives each block an indexer key (`indexer_key_length` wide), a query's score of
  a block is sum_h w_h relu(q_h . k), w = W_proj a / sqrt(di Hi), q = W_q qr (both roped as
  the attention's; the Hadamard rotations cancel), and the attention reads only the top-k
  blocks (ties as llama.cpp's CPU partial sort breaks them). Without it every block is read
  and the file's indexer weights are zero. The top-k is not differentiable: the indexer is
  distilled as glm5.py's is (KL from the heads' attention mass per block, its inputs
  detached), under dense reading for `dense_steps` steps, then with the attention sparse;
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
tests/train/test_train_csa.py checks this forward equals llama.cpp's on the exported file.
Arrays are (batch, ...) throughout; shape comments name the axes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from kvphase.designs.windows import rows_to_mask, top_k_indices
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
INDEXER_HEADS = 2  # deepseek4.attention.indexer.head_count of a model with a trained top-k
INDEXER_PREFIX = "idx_"  # the lightning indexer's weights: the only ones --init may add to a source that read every entry


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
    for ratio in config.layer_ratios:
        block = {
            "attn_norm": jnp.ones(d), "q_a": normal(d, d), "q_a_norm": jnp.ones(d), "q_b": normal(d, h * hd),
            "kv": normal(d, hd), "kv_norm": jnp.full(hd, NORM_INIT), "sinks": jnp.zeros(h),
            "o_a": normal(h * hd, d), "o_b": normal(d, d, scale=proj),
            "ffn_norm": jnp.ones(d), "w_gate": normal(d, 2 * f), "w_up": normal(d, 2 * f),
            "w_down": normal(2 * f, d, scale=proj),
        }
        if config.design != "csa-dense" and ratio:
            block.update(compressor_params(normal, ratio, d, hd, "comp_", NORM_INIT))
        if config.indexer_top_k and ratio == RATIO:
            di = indexer_key_length(hd)
            block.update(compressor_params(normal, ratio, d, di, INDEXER_PREFIX, 1.0))
            block.update({INDEXER_PREFIX + "q": normal(d, INDEXER_HEADS * di),
                          INDEXER_PREFIX + "proj": normal(d, INDEXER_HEADS, scale=1.0)})
        blocks.append(block)
    return {"wte": normal(n_vocab, d), "blocks": blocks, "out_norm": jnp.ones(d)}


def compressor_params(normal, ratio: int, d: int, width: int, prefix: str, norm: float) -> dict:
    """One compressor's weights (`comp_` the attention's, `idx_` the indexer's): ratio 4 overlaps, so its
    kv and gate are two halves wide, the previous block's half starting at PREV_ROWS_INIT."""
    halves = 2 if ratio == RATIO else 1
    ape = jnp.zeros((ratio, halves * width))  # (ratio, halves width) per-phase gate bias
    if halves == 2:
        ape = ape.at[:, :width].set(PREV_ROWS_INIT)
    return {prefix + "kv": normal(d, halves * width), prefix + "gate": normal(d, halves * width),
            prefix + "ape": ape, prefix + "norm": jnp.full(width, norm)}


def indexer_key_length(head_dim: int) -> int:
    """A multiple of 64 (the indexer's Hadamard rotation) other than the head width: llama.cpp
    0.3.36 dies with SIGFPE on a deepseek4 file without a ratio-128 layer whose head width
    equals its indexer key length (measured with head widths 16, 64 and 128)."""
    return 128 if head_dim == 64 else 64


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


def pooled(a, block, prefix: str, ratio: int, width: int, disjoint: bool = False):
    """A compressor's pooled entries (B, nb, width), one per complete block of `ratio` tokens: per channel,
    softmax(W_gate a + ape[pos % ratio]) over the block's rows; at ratio 4 over 8 rows, the previous
    block's first half and the block's own second half (`disjoint`: the previous rows at weight 0)."""
    b, t = a.shape[0], a.shape[1]
    nb, halves = t // ratio, 2 if ratio == RATIO else 1
    kv = (a @ block[prefix + "kv"])[:, : nb * ratio].reshape(b, nb, ratio, halves * width)  # (B, nb, ratio, halves w)
    phase_bias = block[prefix + "ape"]  # (ratio, halves w)
    if disjoint and halves == 2:
        phase_bias = phase_bias.at[:, :width].set(MASKED)
    gate = (a @ block[prefix + "gate"])[:, : nb * ratio].reshape(b, nb, ratio, halves * width) + phase_bias  # as kv
    if halves == 1:
        return (jax.nn.softmax(gate, axis=2) * kv).sum(2)  # (B, nb, w)
    prev_kv = jnp.concatenate([jnp.zeros_like(kv[:, :1, :, :width]), kv[:, :-1, :, :width]], axis=1)  # (B, nb, 4, w)
    prev_gate = jnp.concatenate([jnp.full_like(gate[:, :1, :, :width], MASKED), gate[:, :-1, :, :width]], axis=1)
    rows_kv = jnp.concatenate([prev_kv, kv[..., width:]], axis=2)  # (B, nb, 8, w)
    rows_gate = jnp.concatenate([prev_gate, gate[..., width:]], axis=2)  # (B, nb, 8, w)
    return (jax.nn.softmax(rows_gate, axis=2) * rows_kv).sum(2)  # (B, nb, w)


def compressed_entries(a, block, config: TrainConfig, ratio: int):
    """The attention's compressed entries (B, nb, hd), normed and roped at each block's first position,
    and those positions (nb,); csa-dense's are exactly zero, a window-only layer has none."""
    b, t, hd = a.shape[0], a.shape[1], config.head_dim
    nb = t // ratio if ratio else 0
    first = ratio * jnp.arange(nb)  # (nb,)
    if config.design == "csa-dense" or not ratio:
        return jnp.zeros((b, nb, hd)), first
    entries = pooled(a, block, "comp_", ratio, hd, disjoint=config.design == "csa-disjoint")  # (B, nb, hd)
    return rope(rms(entries, block["comp_norm"]), first, rope_dims(config)), first


def indexer_scores(a, qr, block, config: TrainConfig, first, seen):
    """The lightning indexer's score of every (query, ratio-4 entry) (B, T, nb), -inf where the query does
    not see the block (`build_lid_top_k`): sum over its heads of w_h relu(q_h . k_b), w = W_proj a /
    sqrt(di Hi), q = W_q qr and k the indexer's own overlapped compressor's entry, both roped as the
    attention's are. first (nb,): the blocks' first positions; seen (B, T, nb): the blocks each query sees."""
    b, t, _ = a.shape
    di, n_rot = block["idx_norm"].shape[0], rope_dims(config)
    keys = rope(rms(pooled(a, block, "idx_", RATIO, di), block["idx_norm"]), first, n_rot)  # (B, nb, di)
    iq = (qr @ block["idx_q"]).reshape(b, t, INDEXER_HEADS, di).transpose(0, 2, 1, 3)  # (B, Hi, T, di)
    iq = rope(iq, jnp.arange(t), n_rot)  # (B, Hi, T, di)
    w = (a @ block["idx_proj"]) / math.sqrt(di * INDEXER_HEADS)  # (B, T, Hi)
    score = jnp.einsum("bht,bhtn->btn", w.transpose(0, 2, 1), jax.nn.relu(jnp.einsum("bhtd,bnd->bhtn", iq, keys)))
    return jnp.where(seen, score, -jnp.inf)  # (B, T, nb)


def top_k_choice(scores, k: int):
    """The entries llama.cpp's ggml_top_k keeps (B, T, nb), ties as its CPU partial sort breaks them;
    -inf (not yet complete) never. Host code under jit: the choice is not differentiable."""
    return jax.pure_callback(_llamacpp_top_k, jax.ShapeDtypeStruct(scores.shape, jnp.bool_),
                             jax.lax.stop_gradient(scores), k)


def _llamacpp_top_k(scores: np.ndarray, k: int) -> np.ndarray:
    scores = np.asarray(scores)
    return rows_to_mask(top_k_indices(scores, int(k), ties="llama.cpp"), scores.shape[-1])


def indexer_kl(scores, mass):
    """KL(mass || softmax of the indexer's scores), both over the entries a query sees, averaged over the
    queries that see any; scores (B, T, n) with -inf where unseen, mass (B, T, n) >= 0, not normalised."""
    seen = jnp.isfinite(scores)  # (B, T, n)
    mass = jnp.where(seen, mass, 0.0)
    target = mass / jnp.maximum(mass.sum(-1, keepdims=True), 1e-9)  # (B, T, n)
    logp = jax.nn.log_softmax(jnp.where(seen, scores, -1e9), axis=-1)  # (B, T, n)
    kl = (target * (jnp.log(jnp.maximum(target, 1e-9)) - logp)).sum(-1)  # (B, T)
    has = seen.any(-1)  # (B, T)
    return jnp.where(has, kl, 0.0).sum() / jnp.maximum(has.sum(), 1)


def attention(a, block, config: TrainConfig, ratio: int = RATIO, sparse: bool = True):
    """One layer's attention output (B, T, d) from its normed input a (B, T, d), the log-weight of every
    query on every token (B, H, T, T), which only the induction hint reads, and the indexer's
    distillation loss (0 without an indexer). `sparse`: read only the entries the indexer selects."""
    b, t, _ = a.shape
    h, hd, n_rot = config.heads, config.head_dim, rope_dims(config)
    pos = jnp.arange(t)  # (T,)
    qr = rms(a @ block["q_a"], block["q_a_norm"])  # (B, T, d)
    q = rms((qr @ block["q_b"]).reshape(b, t, h, hd))  # (B, T, H, hd)
    q = rope(q.transpose(0, 2, 1, 3), pos, n_rot)  # (B, H, T, hd)
    kv = rope(rms(a @ block["kv"], block["kv_norm"]), pos, n_rot)  # (B, T, hd): K = V
    scale = 1.0 / math.sqrt(hd)
    raw_scores = jnp.einsum("bhtd,bud->bhtu", q, kv) * scale  # (B, H, T, T)
    raw_seen = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < window(config))  # (T, T)
    entries, first = compressed_entries(a, block, config, ratio)  # (B, nb, hd), (nb,)
    entry_seen = jnp.broadcast_to(first[None, :] + ratio - 1 <= pos[:, None], (b, t, len(first)))  # (B, T, nb)
    entry_scores = jnp.einsum("bhtd,bnd->bhtn", q, entries) * scale  # (B, H, T, nb)
    sinks = jnp.broadcast_to(block["sinks"][None, :, None, None], (b, h, t, 1))  # (B, H, T, 1)

    def scores_reading(seen):  # (B, H, T, 1 + nb + T): sink, entries, tokens
        return jnp.concatenate([sinks, jnp.where(seen[:, None], entry_scores, -jnp.inf),
                                jnp.where(raw_seen, raw_scores, -jnp.inf)], -1)

    scores = scores_reading(entry_seen)  # (B, H, T, 1 + n_keys): every visible entry
    aux = 0.0
    if "idx_q" in block:
        index = indexer_scores(jax.lax.stop_gradient(a), jax.lax.stop_gradient(qr), block, config, first,
                               entry_seen)  # (B, T, nb)
        dense_mass = jax.nn.softmax(scores, axis=-1)[..., 1 : 1 + len(first)].sum(1)  # (B, T, nb): heads summed
        aux = indexer_kl(index, jax.lax.stop_gradient(dense_mass))
        if sparse:
            scores = scores_reading(entry_seen & top_k_choice(index, config.indexer_top_k))  # (B, H, T, 1 + n_keys)
    weights = jax.nn.softmax(scores, axis=-1)[..., 1:]  # (B, H, T, n_keys): the sink reads nothing
    out = jnp.einsum("bhtk,bkd->bhtd", weights, jnp.concatenate([entries, kv], axis=1))  # (B, H, T, hd)
    out = rope(out, pos, n_rot, inverse=True).transpose(0, 2, 1, 3).reshape(b, t, h * hd)  # (B, T, H hd)
    return out @ block["o_a"] @ block["o_b"], jax.nn.log_softmax(scores, axis=-1)[..., -t:], aux  # (B, T, d), (B, H, T, T)


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


def forward(params, tokens, starts, config: TrainConfig, sparse: bool = True):
    """Hidden states after the output norm (B, T, d) and the auxiliary loss: the indexers' distillation,
    plus the induction hint while `hint_steps` is on; `starts` is unused (deepseek4's blocks are
    absolute: pos // ratio)."""
    x = params["wte"][tokens]  # (B, T, d): no position embedding
    log_weights, aux = [], 0.0
    for block, ratio in zip(params["blocks"], config.layer_ratios):
        out, layer_log_weights, layer_aux = attention(rms(x, block["attn_norm"]), block, config, ratio, sparse)
        x = feed_forward(x + out, block)  # (B, T, d)
        log_weights.append(layer_log_weights)
        aux = aux + layer_aux
    if config.hint_steps:
        aux = aux + induction_hint(log_weights[0], log_weights[-1], tokens, config)
    return rms(x, params["out_norm"]), aux


def query_logits(params, tokens, starts, rows, config: TrainConfig, sparse: bool = True, body=None):
    """Logits at the question rows (B, queries, n_vocab) and the auxiliary loss. `body`: the layout's
    forward, where another layout reads out through the tied embedding as this one does (glm5-next)."""
    hidden, aux = (body or forward)(params, tokens, starts, config, sparse)  # (B, T, d)
    return hidden[:, rows] @ params["wte"].T, aux  # (B, queries, n_vocab)


def logits(params, tokens, config: TrainConfig, body=None):
    """Logits at every position (B, T, n_vocab): what llama.cpp's exported file computes."""
    hidden, _ = (body or forward)(params, tokens, None, config)
    return hidden @ params["wte"].T
