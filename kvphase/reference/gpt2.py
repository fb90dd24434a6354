"""A readable numpy GPT-2: llama.cpp's `gpt2` architecture, and kvphase's trained models.

Follows src/models/gpt2.cpp (llama.cpp vendored in llama-cpp-python 0.3.36): token plus
learned absolute position embeddings, pre-LayerNorm blocks with biases, one fused QKV
projection (Q, K, V side by side, head h on channels h*head_dim..), attention scaled by
1/sqrt(head_dim), a tanh-GELU feed-forward, a final LayerNorm and the output matrix.

Attention goes through the same policies as the llama-family model (`model.py`): dense,
or, for a file `kvphase train` wrote with a compressor, `trained_policy(path)` built from
the per-layer gate tensors and offsets the file declares.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from kvphase.errors import ModelFileError
from kvphase.gguf.header import GGUFHeader
from kvphase.gguf.keys import Keys
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.gguf.tensors import tensor_array
from kvphase.reference.model import AttentionPolicy, DenseAttention, KVCache, hidden_rows, per_file


@dataclass(frozen=True)
class GPT2Config:
    arch: str  # "gpt2"
    n_vocab: int  # rows of token_embd
    n_embd: int  # width of the residual stream
    n_layer: int  # transformer blocks
    n_head: int  # attention heads (no GQA in gpt2)
    head_dim: int  # n_embd / n_head
    n_ff: int  # hidden width of the GELU feed-forward
    norm_eps: float  # LayerNorm epsilon (gpt2.attention.layer_norm_epsilon)
    n_ctx_train: int  # positions the model embeds (rows of position_embd)

    @property
    def n_head_kv(self) -> int:
        return self.n_head

    @property
    def n_group(self) -> int:
        return 1

    @property
    def attn_scale(self) -> float:
        return 1.0 / float(np.sqrt(self.head_dim))

    @classmethod
    def from_gguf(cls, fields: dict, tensors: dict) -> GPT2Config:
        def key(name: str):
            if name.format(arch='gpt2') not in fields:
                raise ModelFileError(f"GGUF metadata lacks {name.format(arch='gpt2')}")
            return fields[name.format(arch='gpt2')]

        n_embd, n_head = int(key(Keys.LLM.EMBEDDING_LENGTH)), int(key(Keys.Attention.HEAD_COUNT))
        if n_head < 1 or n_embd % n_head:
            raise ModelFileError(f"gpt2: embedding_length {n_embd} does not split into {n_head} heads")
        return cls(
            arch="gpt2",
            n_vocab=int(tensors["token_embd.weight"].shape[1]),
            n_embd=n_embd,
            n_layer=int(key(Keys.LLM.BLOCK_COUNT)),
            n_head=n_head,
            head_dim=n_embd // n_head,
            n_ff=int(key(Keys.LLM.FEED_FORWARD_LENGTH)),
            norm_eps=float(key(Keys.Attention.LAYERNORM_EPS)),
            n_ctx_train=int(tensors["position_embd.weight"].shape[1]),
        )


@dataclass
class GPT2Layer:
    """One block's weights, matrices stored (in, out) so that `x @ w` applies them."""

    attn_norm: np.ndarray  # (n_embd,)
    attn_norm_b: np.ndarray  # (n_embd,)
    wqkv: np.ndarray  # (n_embd, 3 * n_embd)
    bqkv: np.ndarray  # (3 * n_embd,)
    wo: np.ndarray  # (n_embd, n_embd)
    bo: np.ndarray  # (n_embd,)
    ffn_norm: np.ndarray  # (n_embd,)
    ffn_norm_b: np.ndarray  # (n_embd,)
    w_up: np.ndarray  # (n_embd, n_ff)
    b_up: np.ndarray  # (n_ff,)
    w_down: np.ndarray  # (n_ff, n_embd)
    b_down: np.ndarray  # (n_embd,)


@dataclass
class GPT2Weights:
    token_embd: np.ndarray  # (n_vocab, n_embd)
    position_embd: np.ndarray  # (n_ctx_train, n_embd)
    output_norm: np.ndarray  # (n_embd,)
    output_norm_b: np.ndarray  # (n_embd,)
    output: np.ndarray  # (n_embd, n_vocab)
    layers: list[GPT2Layer]


@per_file(kept=4)
def load_gpt2(header: GGUFHeader) -> tuple[GPT2Config, GPT2Weights]:
    """Read a gpt2 GGUF file's weights."""
    path = header.path
    tensors = {t.name: t for t in header.tensors}
    for name in ("token_embd.weight", "position_embd.weight"):
        if name not in tensors:
            raise ModelFileError(f"{path}: a gpt2 file needs the tensor {name}")
    config = GPT2Config.from_gguf(header.fields, tensors)
    raw = np.memmap(path, dtype=np.uint8, mode="r")  # (file_size,)

    def get(name: str) -> np.ndarray:
        if name not in tensors:
            raise ModelFileError(f"{path}: missing tensor {name}")
        return tensor_array(raw, tensors[name])

    def linear(name: str) -> np.ndarray:
        return np.ascontiguousarray(get(name).T)  # GGUF (out, in) rows -> (in, out)

    layers = [
        GPT2Layer(
            *(get(f"blk.{i}.attn_norm.{x}") for x in ("weight", "bias")),
            linear(f"blk.{i}.attn_qkv.weight"), get(f"blk.{i}.attn_qkv.bias"),
            linear(f"blk.{i}.attn_output.weight"), get(f"blk.{i}.attn_output.bias"),
            *(get(f"blk.{i}.ffn_norm.{x}") for x in ("weight", "bias")),
            linear(f"blk.{i}.ffn_up.weight"), get(f"blk.{i}.ffn_up.bias"),
            linear(f"blk.{i}.ffn_down.weight"), get(f"blk.{i}.ffn_down.bias"),
        )
        for i in range(config.n_layer)
    ]
    token_embd = get("token_embd.weight")  # (n_vocab, n_embd)
    output = linear("output.weight") if "output.weight" in tensors else token_embd.T
    return config, GPT2Weights(
        token_embd, get("position_embd.weight"), get("output_norm.weight"), get("output_norm.bias"), output, layers
    )


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis (ggml_norm, then weight and bias)."""
    centered = x - x.mean(axis=-1, keepdims=True)  # (..., d)
    variance = np.mean(centered * centered, axis=-1, keepdims=True)  # (..., 1)
    return centered / np.sqrt(variance + eps) * weight + bias  # (..., d)


def gelu(x: np.ndarray) -> np.ndarray:
    """tanh-approximated GELU (ggml_gelu)."""
    return 0.5 * x * (1.0 + np.tanh(np.float32(np.sqrt(2.0 / np.pi)) * (x + np.float32(0.044715) * x**3)))


class GPT2:
    """A GPT-2 over GGUF weights, with the same `forward(tokens, cache, logits_for)` as `Transformer`."""

    def __init__(self, config: GPT2Config, weights: GPT2Weights, policy: AttentionPolicy | None = None):
        self.config, self.w = config, weights
        self.policy = policy if policy is not None else DenseAttention()

    @classmethod
    def from_gguf(cls, model: str | Path | ModelInfo, policy: AttentionPolicy | None = None) -> GPT2:
        return cls(*load_gpt2(model), policy=policy)

    def new_cache(self, capacity: int = 1024) -> KVCache:
        return KVCache(self.config, capacity)

    def forward(self, tokens: Sequence[int], cache: KVCache, logits_for: Sequence[int] | None = None) -> np.ndarray:
        """Append `tokens` to the cached sequence; return the logits of rows `logits_for` (all when None)."""
        if cache.n + len(tokens) > self.config.n_ctx_train:
            raise ModelFileError(
                f"gpt2 embeds {self.config.n_ctx_train} positions; {cache.n + len(tokens)} tokens do not fit"
            )
        x = hidden_rows(self._blocks, self.config.n_embd, tokens, cache, logits_for)  # (n_rows, n_embd)
        x = layer_norm(x, self.w.output_norm, self.w.output_norm_b, self.config.norm_eps)  # (n_rows, n_embd)
        return x @ self.w.output  # (n_rows, n_vocab)

    def _blocks(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        c, w = self.config, self.w
        n, p0 = len(tokens), cache.n
        positions = np.arange(p0, p0 + n)  # (n_tokens,)
        x = w.token_embd[tokens] + w.position_embd[positions]  # (n_tokens, n_embd)
        for il, layer in enumerate(w.layers):
            h = layer_norm(x, layer.attn_norm, layer.attn_norm_b, c.norm_eps)  # (n_tokens, n_embd)
            qkv = h @ layer.wqkv + layer.bqkv  # (n_tokens, 3 * n_embd)
            q, k, v = (qkv[:, i * c.n_embd : (i + 1) * c.n_embd].reshape(n, c.n_head, c.head_dim) for i in range(3))  # (n_tokens, n_head, head_dim)
            cache.k[il, :, p0 : p0 + n] = k.transpose(1, 0, 2)  # (n_head, n_tokens, head_dim)
            cache.v[il, :, p0 : p0 + n] = v.transpose(1, 0, 2)  # (n_head, n_tokens, head_dim)
            qg = q.transpose(1, 0, 2)[:, None]  # (n_head, 1, n_tokens, head_dim)
            att = self.policy.attend(il, qg, cache.k[il, :, : p0 + n], cache.v[il, :, : p0 + n], positions, c.attn_scale)
            att = att[:, 0].transpose(1, 0, 2).reshape(n, c.n_embd)  # (n_tokens, n_embd)
            x = x + att @ layer.wo + layer.bo  # (n_tokens, n_embd)
            h = layer_norm(x, layer.ffn_norm, layer.ffn_norm_b, c.norm_eps)  # (n_tokens, n_embd)
            x = x + gelu(h @ layer.w_up + layer.b_up) @ layer.w_down + layer.b_down  # (n_tokens, n_embd)
        cache.n = p0 + n
        return x
