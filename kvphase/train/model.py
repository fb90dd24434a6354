"""The JAX mirror of kvphase's trained models, for training only.

GPT-2 blocks (pre-LayerNorm, learned absolute positions, tanh-GELU feed-forward, biases)
as llama.cpp's `gpt2` architecture computes them (src/models/gpt2.cpp), whose attention
reads a chunked-compressed cache:

- "dense": causal attention over every token (the control; llama.cpp runs the export);
- "gated": windows of S tokens starting every S tokens from a per-(layer, head) offset
  become one entry whose key and value are pooled with per-channel softmax(k W_gate +
  ape[phase]) weights (the DeepSeek-V4 compressor / GLM k-pool pooling), plus the
  `local_window` most recent tokens exactly;
- "meanpool": the same with a uniform gate;
- "rolling": gated's pooling over the S tokens ending at every position (windows one token
  apart, no boundaries, one entry per token: no compression), plus the same local window:
  gated's twin without the chunking, so it shares the one-layer shortcut (a record's key and
  value in one entry) at every phase alike;
- "cowa": CoWindow Attention head slices, no pooling: each head reads the local window and
  its own slices of L = S tokens (slice j to head j mod H, boundaries moved by the
  per-head offsets), so every position is read by exactly one head;
- "kpool": GLM-5.3's selection: windows pooled as in "gated" serve as indexer keys, each
  query reads the tokens of its `top_k` best-scoring complete windows plus the local
  window. The top-k is not differentiable; the pooling gate is trained by distillation:
  a KL term pulls the indexer's softmax over windows towards the attention mass the
  query's heads put on each window's tokens (stop-gradient), as DeepSeek trains its
  lightning indexer. Pooled keys are the model's own keys (no separate indexer
  projection): said plainly in docs/training.md.

The numpy truth is `kvphase/designs/gatedpool.py` (with stride 1 for "rolling"; and `meanpool.py`, `kpool.py`, `cowindow.py`) run by
`kvphase/reference/gpt2.py`; tests/train/test_train.py checks this forward equals it to 1e-4.
Arrays are (batch, ...) throughout; shape comments name the axes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from kvphase.designs.cowindow import slice_boundaries, slice_owner
from kvphase.gguf.trained import GATED_DESIGNS, window_step
from kvphase.train.config import TrainConfig

LN_EPS = 1e-5  # gpt2.attention.layer_norm_epsilon of the export


def init_params(config: TrainConfig, n_vocab: int, seed: int) -> dict:
    """GPT-2 initialisation (normal 0.02, residual projections scaled by 1/sqrt(2 * layers)).

    The output matrix is the token embedding (tied, as GPT-2): copying a value from the
    context to the answer then needs no learned map between two vocabularies, which
    shortens the plateau before retrieval by an order of magnitude (measured)."""
    rng = np.random.default_rng([seed, 0])
    d, f, hd = config.d_model, 4 * config.d_model, config.head_dim

    def normal(*shape, scale=0.02):
        return jnp.asarray(rng.normal(0.0, scale, size=shape), dtype=jnp.float32)

    def zeros(*shape):
        return jnp.zeros(shape, jnp.float32)

    proj = 0.02 / math.sqrt(2 * config.layers)
    blocks = []
    for _ in range(config.layers):
        block = {
            "ln1_g": jnp.ones(d), "ln1_b": zeros(d),
            "w_qkv": normal(d, 3 * d), "b_qkv": zeros(3 * d),
            "w_o": normal(d, d, scale=proj), "b_o": zeros(d),
            "ln2_g": jnp.ones(d), "ln2_b": zeros(d),
            "w_up": normal(d, f), "b_up": zeros(f),
            "w_down": normal(f, d, scale=proj), "b_down": zeros(d),
        }
        if config.design in GATED_DESIGNS or config.gate_steps:
            block["gate"] = normal(config.heads, hd, hd, scale=1.0 / math.sqrt(hd))  # (heads, hd, hd)
            block["ape"] = zeros(config.heads, config.stride, hd)  # (heads, S, hd) per-phase gate bias
        blocks.append(block)
    return {
        "wte": normal(n_vocab, d), "wpe": sinusoids(config.n_positions, d, scale=0.02),
        "blocks": blocks,
        "lnf_g": jnp.ones(d), "lnf_b": zeros(d),
    }


def sinusoids(n_positions: int, d: int, scale: float):
    """Position embeddings initialised as the Transformer's sinusoids (still learned): nearby
    positions start out similar, so attention to the previous token is found early instead
    of after a long plateau."""
    pos = np.arange(n_positions)[:, None]  # (n_positions, 1)
    freq = 1.0 / 10000 ** (np.arange(0, d, 2) / d)  # (d/2,)
    table = np.concatenate([np.sin(pos * freq), np.cos(pos * freq)], axis=1)  # (n_positions, d)
    return jnp.asarray(scale * np.sqrt(2) * table, dtype=jnp.float32)


def layer_norm(x, g, b):
    mean = x.mean(-1, keepdims=True)  # (..., 1)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)  # (..., 1)
    return (x - mean) / jnp.sqrt(var + LN_EPS) * g + b  # (..., d)


def masked_softmax(scores, visible):
    """Softmax over the last axis where visible; rows that see nothing get zeros."""
    scores = jnp.where(visible, scores, -jnp.inf)
    peak = jnp.max(scores, axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    e = jnp.where(visible, jnp.exp(scores - peak), 0.0)
    total = e.sum(-1, keepdims=True)
    return e / jnp.where(total > 0, total, 1.0)


def pooled_windows(k, v, block, starts, config: TrainConfig):
    """Pool every complete window of S tokens (one every S tokens; "rolling": every token) into entries per (sequence, head).

    k, v: (B, H, T, hd); starts: (B, H) window offset. Returns pooled keys and values
    (B, H, nw, hd), each window's last position (B, H, nw) and whether it is complete.
    """
    s, t = config.stride, k.shape[2]
    step = window_step(config.design, s)
    nw = (t - s) // step + 1
    first = starts[:, :, None] + step * jnp.arange(nw)[None, None, :]  # (B, H, nw)
    last = first + s - 1  # (B, H, nw)
    members = jnp.clip(first[..., None] + jnp.arange(s), 0, t - 1)  # (B, H, nw, S)
    flat = members.reshape(*members.shape[:2], nw * s, 1)  # (B, H, nw*S, 1)
    kw = jnp.take_along_axis(k, flat, axis=2).reshape(*members.shape, -1)  # (B, H, nw, S, hd)
    vw = jnp.take_along_axis(v, flat, axis=2).reshape(*members.shape, -1)  # (B, H, nw, S, hd)
    if config.design == "meanpool":
        logits = jnp.zeros_like(kw)  # (B, H, nw, S, hd)
    else:
        content = jnp.einsum("bhnsd,hde->bhnse", kw, block["gate"])  # (B, H, nw, S, hd)
        logits = content + block["ape"][None, :, None, :, :]  # (B, H, nw, S, hd)
    w = jax.nn.softmax(logits, axis=3)  # (B, H, nw, S, hd)
    return (w * kw).sum(3), (w * vw).sum(3), last, last <= t - 1


def attention(q, k, v, block, starts, config: TrainConfig):
    """One layer's attention; q, k, v: (B, H, T, hd), starts: (B, H). Returns (out (B, H, T, hd), aux loss)."""
    t, scale = q.shape[2], 1.0 / math.sqrt(config.head_dim)
    pos = jnp.arange(t)  # (T,)
    causal = pos[None, :] <= pos[:, None]  # (T, T)
    raw_scores = jnp.einsum("bhtd,bhud->bhtu", q, k) * scale  # (B, H, T, T)
    if config.design == "dense":
        return jnp.einsum("bhtu,bhud->bhtd", masked_softmax(raw_scores, causal), v), 0.0
    if config.design == "cowa":
        return jnp.einsum("bhtu,bhud->bhtd", masked_softmax(raw_scores, cowa_seen(starts, t, config)), v), 0.0
    pk, pv, last, complete = pooled_windows(k, v, block, starts, config)
    pool_seen = (last[:, :, None, :] <= pos[None, None, :, None]) & complete[:, :, None, :]  # (B, H, T, nw)
    recent = causal & (pos[:, None] - pos[None, :] < config.local_window)  # (T, T)
    prefix = (pos[None, None, None, :] < starts[:, :, None, None]) & causal  # (B, H, T, T)
    raw_seen = recent[None, None] | prefix  # (B, H, T, T)
    if config.design == "kpool":
        return kpool_attention(q, k, v, raw_scores, pk, last, pool_seen, raw_seen, starts, config)
    pool_scores = jnp.einsum("bhtd,bhnd->bhtn", q, pk) * scale  # (B, H, T, nw)
    weights = masked_softmax(
        jnp.concatenate([pool_scores, raw_scores], -1), jnp.concatenate([pool_seen, raw_seen], -1)
    )  # (B, H, T, nw + T)
    nw = pk.shape[2]
    out = jnp.einsum("bhtn,bhnd->bhtd", weights[..., :nw], pv) + jnp.einsum("bhtu,bhud->bhtd", weights[..., nw:], v)
    return out, 0.0


def cowa_seen(starts, t: int, config: TrainConfig):
    """CoWA's mask (B, H, T, T): causal, and among the local window or in the head's own slices,
    the slice boundaries moved by the per-head offsets `starts` (B, H) (`designs/cowindow.py`)."""
    pos = jnp.arange(t)  # (T,)
    boundaries = slice_boundaries(starts, config.stride)  # (B, H)
    owner = slice_owner(pos, boundaries, config.heads * config.stride)  # (B, T)
    own = owner[:, None, :] == jnp.arange(config.heads)[None, :, None]  # (B, H, T) key u owned by head h
    causal = pos[None, :] <= pos[:, None]  # (T, T)
    recent = causal & (pos[:, None] - pos[None, :] < config.local_window)  # (T, T)
    return recent[None, None] | (own[:, :, None, :] & causal[None, None])  # (B, H, T, T)


def kpool_attention(q, k, v, raw_scores, pk, last, pool_seen, raw_seen, starts, config: TrainConfig):
    """Top-k window selection by pooled keys; attention over the selected windows' tokens."""
    s, t = config.stride, q.shape[2]
    index = jnp.einsum("bhtd,bhnd->bhtn", jax.lax.stop_gradient(q), pk)  # (B, H, T, nw)
    masked = jnp.where(pool_seen, jax.lax.stop_gradient(index), -jnp.inf)  # (B, H, T, nw)
    n_top = min(config.top_k, index.shape[-1])
    kth = jax.lax.top_k(masked, n_top)[0][..., -1:]  # (B, H, T, 1)
    chosen = pool_seen & (masked >= kth)  # (B, H, T, nw)
    pos = jnp.arange(t)  # (T,)
    window_of = jnp.where(pos[None, None] >= starts[..., None], (pos[None, None] - starts[..., None]) // s, -1)  # (B, H, T)
    member = window_of[:, :, None, :] == jnp.arange(index.shape[-1])[None, None, :, None]  # (B, H, nw, T)
    token_chosen = jnp.einsum("bhtn,bhnu->bhtu", chosen.astype(jnp.float32), member.astype(jnp.float32)) > 0
    seen = raw_seen | (token_chosen & (pos[None, :] <= pos[:, None]))  # (B, H, T, T)
    weights = masked_softmax(raw_scores, seen)  # (B, H, T, T)
    out = jnp.einsum("bhtu,bhud->bhtd", weights, v)
    # distillation: the indexer's distribution over complete windows vs the attention mass on them
    dense = jax.lax.stop_gradient(masked_softmax(raw_scores, pos[None, :] <= pos[:, None]))  # (B, H, T, T)
    mass = jnp.einsum("bhtu,bhnu->bhtn", dense, member.astype(jnp.float32))  # (B, H, T, nw)
    mass = jnp.where(pool_seen, mass, 0.0)
    mass = mass / jnp.maximum(mass.sum(-1, keepdims=True), 1e-9)
    logp = jax.nn.log_softmax(jnp.where(pool_seen, index, -1e9), axis=-1)  # gradients reach the gate only through pk
    has = pool_seen.any(-1)  # (B, H, T)
    kl = jnp.where(has, (mass * (jnp.log(jnp.maximum(mass, 1e-9)) - logp)).sum(-1), 0.0)
    return out, kl.sum() / jnp.maximum(has.sum(), 1)


def forward(params, tokens, starts, config: TrainConfig):
    """Hidden states after the final LayerNorm (B, T, d) and the summed auxiliary loss.

    starts: (B, layers, H) window offsets (ignored by "dense")."""
    b, t = tokens.shape
    h, hd = config.heads, config.head_dim
    x = params["wte"][tokens] + params["wpe"][:t][None]  # (B, T, d)
    aux = 0.0
    for il, block in enumerate(params["blocks"]):
        a = layer_norm(x, block["ln1_g"], block["ln1_b"])  # (B, T, d)
        qkv = a @ block["w_qkv"] + block["b_qkv"]  # (B, T, 3d)
        q, k, v = (qkv[..., i * config.d_model : (i + 1) * config.d_model].reshape(b, t, h, hd).transpose(0, 2, 1, 3) for i in range(3))  # (B, H, T, hd)
        out, layer_aux = attention(q, k, v, block, starts[:, il], config)  # (B, H, T, hd)
        aux = aux + layer_aux
        x = x + out.transpose(0, 2, 1, 3).reshape(b, t, config.d_model) @ block["w_o"] + block["b_o"]  # (B, T, d)
        m = layer_norm(x, block["ln2_g"], block["ln2_b"])  # (B, T, d)
        m = jax.nn.gelu(m @ block["w_up"] + block["b_up"], approximate=True)  # (B, T, 4d)
        x = x + m @ block["w_down"] + block["b_down"]  # (B, T, d)
    return layer_norm(x, params["lnf_g"], params["lnf_b"]), aux


def query_logits(params, tokens, starts, rows, config: TrainConfig):
    """Logits at the question rows (B, queries, n_vocab) and the auxiliary loss."""
    hidden, aux = forward(params, tokens, starts, config)  # (B, T, d)
    return hidden[:, rows] @ params["wte"].T, aux  # (B, queries, n_vocab)


def draw_starts(config: TrainConfig, rng: np.random.Generator, n_seq: int) -> np.ndarray:
    """Window offsets (n_seq, layers, heads): fixed by the stagger, or drawn per sequence."""
    fixed = np.broadcast_to(np.array(config.starts(), dtype=np.int32), (n_seq, config.layers, config.heads))
    if config.offsets == "random":
        return rng.integers(config.stride, size=(n_seq, config.layers, config.heads)).astype(np.int32)
    if config.offsets == "jitter":
        shared = rng.integers(config.stride, size=(n_seq, 1, 1))
        return np.broadcast_to(shared, fixed.shape).astype(np.int32).copy()
    return fixed.copy()
