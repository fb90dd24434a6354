"""A readable numpy transformer that runs llama-family GGUF weights (Llama, Qwen2, Qwen3;
Mistral's files are `llama` architecture).

In the spirit of nanoGPT's model.py: one file, a config read from GGUF metadata, a shape
comment on every array line. It follows llama.cpp as vendored in llama-cpp-python 0.3.36
(`src/models/llama.cpp`, `src/models/qwen2.cpp`, `src/models/qwen3.cpp`) so its logits
can be checked against llama.cpp's; attention goes through a pluggable policy so a
chunked KV-cache compression design can be applied to a real model post hoc.

Two llama.cpp conventions matter:
- RoPE mode. For `llama` files the converter permutes the rows of Q and K
  (convert_hf_to_gguf.py `LlamaModel.permute`) so that llama.cpp's "normal" RoPE, which
  rotates adjacent pairs (2i, 2i+1), reproduces the Hugging Face half-split rotation.
  Qwen files are not permuted and use NEOX RoPE, pairs (i, i + n_rot/2). Applying the
  rotation in the file's own mode is therefore correct without un-permuting anything.
- Grouped-query attention broadcasts K/V head `h // (n_head / n_head_kv)` to query head
  `h` (ggml_mul_mat broadcasting), so consecutive query heads share a KV head.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence, TypeVar

import numpy as np

from kvphase.designs.windows import masked_softmax
from kvphase.errors import ModelFileError
from kvphase.gguf.header import GGUFHeader, TensorInfo
from kvphase.gguf.keys import Keys
from kvphase.gguf.metadata import Metadata
from kvphase.gguf.limits import LLAMA_MAX_LAYERS
from kvphase.gguf.modelinfo import ModelInfo, as_model_info

Loaded = TypeVar("Loaded")
from kvphase.gguf.tensors import tensor_array

# architecture -> RoPE pairing (llama_model_rope_type in src/llama-model.cpp)
ROPE_NEOX = {"llama": False, "qwen2": True, "qwen3": True}
N_BATCH = 512  # tokens per forward chunk: bounds the (n_head, chunk, n_kv_tokens) score array


@dataclass(frozen=True)
class Config:
    arch: str  # general.architecture, one of ROPE_NEOX
    n_vocab: int  # rows of token_embd
    n_embd: int  # width of the residual stream
    n_layer: int  # transformer blocks
    n_head: int  # query heads
    n_head_kv: int  # key/value heads; n_head // n_head_kv query heads share one (GQA)
    head_dim: int  # width of one head of Q, K and V (attention.key_length, else n_embd / n_head)
    n_rot: int  # leading dimensions of a head that RoPE rotates (rope.dimension_count)
    n_ff: int  # hidden width of the SwiGLU feed-forward
    norm_eps: float  # RMSNorm epsilon
    rope_base: float  # RoPE frequency base (rope.freq_base; 10000 when absent)
    rope_scale: float  # linear position scale, 1 / rope.scaling.factor (1.0 when absent)
    rope_neox: bool  # True: rotate pairs (i, i + n_rot/2) (Qwen); False: pairs (2i, 2i+1) (Llama)
    attn_scale: float  # multiplier of q.k: attention.scale if set, else 1/sqrt(head_dim)
    qk_norm: bool  # per-head RMSNorm of Q and K before RoPE (Qwen3's attn_q_norm/attn_k_norm)
    qkv_bias: bool  # Q, K and V projections carry a bias (Qwen2)
    tied_output: bool  # no output.weight: logits use token_embd (SmolLM2, small Qwens)
    n_ctx_train: int  # training context length (context_length)

    @property
    def n_group(self) -> int:
        """Query heads per KV head."""
        return self.n_head // self.n_head_kv

    @classmethod
    def from_gguf(cls, header: GGUFHeader, tensors: dict[str, TensorInfo]) -> Config:
        meta = Metadata(header)
        arch = meta.text(Keys.General.ARCHITECTURE, "unknown")
        if arch not in ROPE_NEOX:
            raise ModelFileError(f"the reference model runs {sorted(ROPE_NEOX)} architectures, found {arch!r}")

        def count(name: str, default: int | None = None) -> int:
            return meta.integer(name.format(arch=arch), default, low=1)

        def number(name: str, default: float | None = None) -> float:
            return meta.number(name.format(arch=arch), default)

        scaling = meta.text(Keys.Rope.SCALING_TYPE.format(arch=arch), "linear")
        if scaling not in ("none", "linear"):
            raise ModelFileError(f"the reference model supports linear RoPE scaling only, found {scaling!r}")
        factor = number(Keys.Rope.SCALING_FACTOR, 0.0) if scaling == "linear" else 0.0
        n_embd, n_head = count(Keys.LLM.EMBEDDING_LENGTH), count(Keys.Attention.HEAD_COUNT)
        head_dim = count(Keys.Attention.KEY_LENGTH, max(1, n_embd // n_head))
        n_head_kv = meta.integers(Keys.Attention.HEAD_COUNT_KV.format(arch=arch), [n_head], low=1, high=n_head)
        if len(set(n_head_kv)) != 1:  # per-layer list in some files; the reference needs one value
            raise ModelFileError(f"per-layer KV head counts are not supported: {n_head_kv}")
        if n_head % n_head_kv[0]:
            raise meta.bad(Keys.Attention.HEAD_COUNT_KV.format(arch=arch), n_head_kv[0], f"a divisor of the {n_head} query heads")
        embd = tensors.get("token_embd.weight")
        if embd is None or len(embd.shape) != 2:
            raise ModelFileError(f"{header.path.name} has no two-dimensional token_embd.weight")
        return cls(
            arch=arch,
            n_vocab=int(embd.shape[1]),
            n_embd=n_embd,
            n_layer=meta.integer(Keys.LLM.BLOCK_COUNT.format(arch=arch), low=1, high=LLAMA_MAX_LAYERS),
            n_head=n_head,
            n_head_kv=n_head_kv[0],
            head_dim=head_dim,
            n_rot=count(Keys.Rope.DIMENSION_COUNT, head_dim),
            n_ff=count(Keys.LLM.FEED_FORWARD_LENGTH),
            norm_eps=number(Keys.Attention.LAYERNORM_RMS_EPS),
            rope_base=number(Keys.Rope.FREQ_BASE, 10000.0),
            rope_scale=1.0 / factor if factor else 1.0,
            rope_neox=ROPE_NEOX[arch],
            attn_scale=number(Keys.Attention.SCALE, 0.0) or 1.0 / float(np.sqrt(head_dim)),
            qk_norm="blk.0.attn_q_norm.weight" in tensors,
            qkv_bias="blk.0.attn_q.bias" in tensors,
            tied_output="output.weight" not in tensors,
            n_ctx_train=meta.integer(Keys.LLM.CONTEXT_LENGTH.format(arch=arch), 0),
        )


@dataclass
class Layer:
    """One block's weights as float32, matrices stored (in, out) so that `x @ w` applies them."""

    attn_norm: np.ndarray  # (n_embd,)
    wqkv: np.ndarray  # (n_embd, (n_head + 2 * n_head_kv) * head_dim): Q, K, V side by side, one GEMM
    bqkv: np.ndarray | None  # ((n_head + 2 * n_head_kv) * head_dim,) or None
    q_norm: np.ndarray | None  # (head_dim,) or None
    k_norm: np.ndarray | None  # (head_dim,) or None
    wo: np.ndarray  # (n_head * head_dim, n_embd)
    ffn_norm: np.ndarray  # (n_embd,)
    w_gate_up: np.ndarray  # (n_embd, 2 * n_ff): gate and up side by side
    w_down: np.ndarray  # (n_ff, n_embd)


@dataclass
class Weights:
    token_embd: np.ndarray  # (n_vocab, n_embd)
    output_norm: np.ndarray  # (n_embd,)
    output: np.ndarray  # (n_embd, n_vocab): a transposed view of token_embd when tied
    rope_freqs: np.ndarray | None  # (n_rot // 2,) Llama-3 frequency divisors, or None
    layers: list[Layer]


def per_file(kept: int) -> Callable[[Callable[[GGUFHeader], Loaded]], Callable[[str | Path | ModelInfo], Loaded]]:
    """A weights loader `load(header)` run once per file for the last `kept` files (dequantizing
    takes seconds), called with a model already opened (its header parsed) or a path."""
    def wrap(load: Callable[[GGUFHeader], Loaded]) -> Callable[[str | Path | ModelInfo], Loaded]:
        held: OrderedDict[str, Loaded] = OrderedDict()

        @functools.wraps(load)
        def cached(model: str | Path | ModelInfo) -> Loaded:
            key = str(Path(model.path if isinstance(model, ModelInfo) else model).resolve())
            if key not in held:
                held[key] = load(as_model_info(model).header)
                if len(held) > kept:
                    held.popitem(last=False)
            held.move_to_end(key)
            return held[key]

        return cached

    return wrap


@per_file(kept=2)
def load(header: GGUFHeader) -> tuple[Config, Weights]:
    """Read and dequantize a GGUF file's weights."""
    tensors = {t.name: t for t in header.tensors}
    config = Config.from_gguf(header, tensors)
    raw = np.memmap(header.path, dtype=np.uint8, mode="r")  # (file_size,)

    def get(name: str) -> np.ndarray:
        if name not in tensors:
            raise ModelFileError(f"{header.path.name} lacks tensor {name}, which a {config.arch} model has")
        return tensor_array(raw, tensors[name])  # numpy order: slowest first

    def opt(name: str) -> np.ndarray | None:
        return get(name) if name in tensors else None

    def linear(name: str) -> np.ndarray:
        return get(name).T  # GGUF (out, in) rows -> (in, out)

    layers = []
    for i in range(config.n_layer):
        p = f"blk.{i}."
        biases = [opt(p + f"attn_{x}.bias") for x in "qkv"]
        layers.append(
            Layer(
                attn_norm=get(p + "attn_norm.weight"),
                wqkv=np.ascontiguousarray(np.concatenate([linear(p + f"attn_{x}.weight") for x in "qkv"], axis=1)),
                bqkv=np.concatenate(biases) if config.qkv_bias else None,
                q_norm=opt(p + "attn_q_norm.weight"),
                k_norm=opt(p + "attn_k_norm.weight"),
                wo=np.ascontiguousarray(linear(p + "attn_output.weight")),
                ffn_norm=get(p + "ffn_norm.weight"),
                w_gate_up=np.ascontiguousarray(
                    np.concatenate([linear(p + "ffn_gate.weight"), linear(p + "ffn_up.weight")], axis=1)
                ),
                w_down=np.ascontiguousarray(linear(p + "ffn_down.weight")),
            )
        )
    token_embd = get("token_embd.weight")  # (n_vocab, n_embd)
    output = token_embd.T if config.tied_output else np.ascontiguousarray(linear("output.weight"))
    weights = Weights(token_embd, get("output_norm.weight"), output, opt("rope_freqs.weight"), layers)
    return config, weights


# ----------------------------------------------------------------------------- building blocks


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """RMSNorm over the last axis (llama.cpp ggml_rms_norm, then a multiply by the weight)."""
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., 1)
    return x * scale if weight is None else x * scale * weight  # (..., d)


def rope_angles(config: Config, positions: np.ndarray, freq_factors: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position * frequency, as ggml_rope_cache_init builds them without YaRN."""
    exponent = np.arange(0, config.n_rot, 2, dtype=np.float64) / config.n_rot  # (n_rot/2,)
    inv_freq = config.rope_scale * config.rope_base**-exponent  # (n_rot/2,)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors  # (n_rot/2,)
    theta = positions[:, None].astype(np.float64) * inv_freq[None, :]  # (n_tokens, n_rot/2)
    return np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """Rotate the first n_rot dimensions of every head; x is (n_tokens, n_heads, head_dim)."""
    n_rot = 2 * cos.shape[1]
    c, s = cos[:, None, :], sin[:, None, :]  # (n_tokens, 1, n_rot/2)
    rot = x[..., :n_rot]  # (n_tokens, n_heads, n_rot)
    if neox:  # pairs (i, i + n_rot/2)
        a, b = rot[..., : n_rot // 2], rot[..., n_rot // 2 :]  # (n_tokens, n_heads, n_rot/2) each
        rotated = np.concatenate([a * c - b * s, a * s + b * c], axis=-1)  # (n_tokens, n_heads, n_rot)
    else:  # adjacent pairs (2i, 2i+1)
        a, b = rot[..., 0::2], rot[..., 1::2]  # (n_tokens, n_heads, n_rot/2) each
        rotated = np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(rot.shape)  # (n_tokens, n_heads, n_rot)
    return np.concatenate([rotated, x[..., n_rot:]], axis=-1) if n_rot < x.shape[-1] else rotated


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


class AttentionPolicy(Protocol):
    """Who each query attends to. `kvphase.reference.policy` holds the compressed ones."""

    def attend(
        self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, scale: float
    ) -> np.ndarray:
        """q: (n_head_kv, n_group, n_q, head_dim); k, v: (n_head_kv, n_kv, head_dim) for the
        sequence positions 0..n_kv-1; q_pos: (n_q,) positions of the queries.
        Returns (n_head_kv, n_group, n_q, head_dim)."""
        ...


def dense_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, scale: float, f16_probs: bool = False
) -> np.ndarray:
    """Causal softmax attention over every cached token (what llama.cpp computes).

    `f16_probs` rounds the softmax weights to F16 before they meet V, as llama.cpp does
    with an F16 cache and no flash attention (scripts/reference_agreement.py)."""
    n_kv_head, n_group, n_q, head_dim = q.shape
    scores = q.reshape(n_kv_head, n_group * n_q, head_dim) @ k.transpose(0, 2, 1)  # (n_head_kv, n_group*n_q, n_kv)
    scores = scores.reshape(n_kv_head, n_group, n_q, -1) * scale  # (n_head_kv, n_group, n_q, n_kv)
    past = np.arange(k.shape[1])[None, :] <= q_pos[:, None]  # (n_q, n_kv)
    probs = masked_softmax(scores, past)  # (n_head_kv, n_group, n_q, n_kv)
    if f16_probs:
        probs = probs.astype(np.float16).astype(np.float32)  # (n_head_kv, n_group, n_q, n_kv)
    out = probs.reshape(n_kv_head, n_group * n_q, -1) @ v  # (n_head_kv, n_group*n_q, head_dim)
    return out.reshape(n_kv_head, n_group, n_q, head_dim)


class DenseAttention:
    """The default policy: every query sees every earlier token."""

    def attend(self, layer, q, k, v, q_pos, scale):
        return dense_attention(q, k, v, q_pos, scale)


class KVCache:
    """Post-RoPE keys and values per layer for one sequence starting at position 0.

    `truncate(n)` rolls the sequence back to its first n tokens, so a context can be
    evaluated once and each query run after it.
    """

    def __init__(self, config: Config, capacity: int = 1024):
        self.config, self.n = config, 0
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        c = self.config
        shape = (c.n_layer, c.n_head_kv, capacity, c.head_dim)
        k, v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)  # (n_layer, n_head_kv, capacity, head_dim)
        if self.n:
            k[:, :, : self.n], v[:, :, : self.n] = self.k[:, :, : self.n], self.v[:, :, : self.n]
        self.k, self.v = k, v

    def reserve(self, n_total: int) -> None:
        if n_total > self.k.shape[2]:
            self._alloc(max(n_total, 2 * self.k.shape[2]))

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.n:
            raise ValueError(f"cannot roll the cache back to {n} tokens, it holds {self.n}")
        self.n = n


# ----------------------------------------------------------------------------- the model


def hidden_rows(blocks, n_embd: int, tokens: Sequence[int], cache: KVCache, logits_for: Sequence[int] | None) -> np.ndarray:
    """Run `blocks(chunk, cache)` over `tokens` in chunks of N_BATCH, appending to the cache;
    return the final hidden states of the rows `logits_for` (all when None): (n_rows, n_embd)."""
    tokens = np.asarray(tokens, dtype=np.int64)  # (n_tokens,)
    rows = np.arange(len(tokens)) if logits_for is None else np.asarray(logits_for, dtype=np.int64)
    cache.reserve(cache.n + len(tokens))
    hidden = []
    for start in range(0, len(tokens), N_BATCH):
        chunk = tokens[start : start + N_BATCH]  # (n_chunk,)
        x = blocks(chunk, cache)  # (n_chunk, n_embd)
        hidden.append(x[rows[(rows >= start) & (rows < start + len(chunk))] - start])
    return np.concatenate(hidden) if hidden else np.zeros((0, n_embd), np.float32)  # (n_rows, n_embd)


class Transformer:
    """A decoder-only llama-family model over dequantized GGUF weights."""

    def __init__(self, config: Config, weights: Weights, policy: AttentionPolicy | None = None):
        self.config, self.w = config, weights
        self.policy = policy if policy is not None else DenseAttention()

    @classmethod
    def from_gguf(cls, model: str | Path | ModelInfo, policy: AttentionPolicy | None = None) -> Transformer:
        return cls(*load(model), policy=policy)

    def new_cache(self, capacity: int = 1024) -> KVCache:
        return KVCache(self.config, capacity)

    def forward(self, tokens: Sequence[int], cache: KVCache, logits_for: Sequence[int] | None = None) -> np.ndarray:
        """Append `tokens` to the cached sequence; return the logits of the rows
        `logits_for` (indices into `tokens`; all rows when None) as (n_rows, n_vocab)."""
        x = hidden_rows(self._blocks, self.config.n_embd, tokens, cache, logits_for)  # (n_rows, n_embd)
        x = rms_norm(x, self.w.output_norm, self.config.norm_eps)  # (n_rows, n_embd)
        return self.linear(x, self.w.output)  # (n_rows, n_vocab)

    def linear(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """Every weight matrix is applied here, so a subclass can change how (see
        scripts/reference_agreement.py, which imitates llama.cpp's 8-bit activations)."""
        return x @ weight  # (n_rows, n_out)

    def _blocks(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        """Run every block over one chunk, writing its keys and values into the cache."""
        c, w = self.config, self.w
        n, p0 = len(tokens), cache.n
        positions = np.arange(p0, p0 + n)  # (n_tokens,)
        cos, sin = rope_angles(c, positions, w.rope_freqs)  # (n_tokens, n_rot/2) each
        x = w.token_embd[tokens]  # (n_tokens, n_embd)
        n_q, n_kv = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        for il, layer in enumerate(w.layers):
            h = rms_norm(x, layer.attn_norm, c.norm_eps)  # (n_tokens, n_embd)
            qkv = self.linear(h, layer.wqkv)  # (n_tokens, (n_head + 2 * n_head_kv) * head_dim)
            if layer.bqkv is not None:
                qkv += layer.bqkv
            q = qkv[:, :n_q].reshape(n, c.n_head, c.head_dim)  # (n_tokens, n_head, head_dim)
            k = qkv[:, n_q : n_q + n_kv].reshape(n, c.n_head_kv, c.head_dim)  # (n_tokens, n_head_kv, head_dim)
            v = qkv[:, n_q + n_kv :].reshape(n, c.n_head_kv, c.head_dim)  # (n_tokens, n_head_kv, head_dim)
            if c.qk_norm:
                q = rms_norm(q, layer.q_norm, c.norm_eps)  # (n_tokens, n_head, head_dim)
                k = rms_norm(k, layer.k_norm, c.norm_eps)  # (n_tokens, n_head_kv, head_dim)
            q = apply_rope(q, cos, sin, c.rope_neox)  # (n_tokens, n_head, head_dim)
            k = apply_rope(k, cos, sin, c.rope_neox)  # (n_tokens, n_head_kv, head_dim)
            cache.k[il, :, p0 : p0 + n] = k.transpose(1, 0, 2)  # (n_head_kv, n_tokens, head_dim)
            cache.v[il, :, p0 : p0 + n] = v.transpose(1, 0, 2)  # (n_head_kv, n_tokens, head_dim)
            k_all = cache.k[il, :, : p0 + n]  # (n_head_kv, n_kv_tokens, head_dim)
            v_all = cache.v[il, :, : p0 + n]  # (n_head_kv, n_kv_tokens, head_dim)
            qg = q.reshape(n, c.n_head_kv, c.n_group, c.head_dim).transpose(1, 2, 0, 3)  # (n_head_kv, n_group, n_tokens, head_dim)
            att = self.policy.attend(il, qg, k_all, v_all, positions, c.attn_scale)  # (n_head_kv, n_group, n_tokens, head_dim)
            att = att.transpose(2, 0, 1, 3).reshape(n, n_q)  # (n_tokens, n_head * head_dim)
            x = x + self.linear(att, layer.wo)  # (n_tokens, n_embd)
            x = x + self.feed_forward(layer, x)  # (n_tokens, n_embd)
        cache.n = p0 + n
        return x

    def feed_forward(self, layer: Layer, x: np.ndarray) -> np.ndarray:
        """The block's SwiGLU feed-forward of the residual stream x: (n_tokens, n_embd)."""
        n_ff = self.config.n_ff
        h = rms_norm(x, layer.ffn_norm, self.config.norm_eps)  # (n_tokens, n_embd)
        gate_up = self.linear(h, layer.w_gate_up)  # (n_tokens, 2 * n_ff)
        h = silu(gate_up[:, :n_ff]) * gate_up[:, n_ff:]  # (n_tokens, n_ff)
        return self.linear(h, layer.w_down)  # (n_tokens, n_embd)
