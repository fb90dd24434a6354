"""A numpy DeepSeek-V4 for the files `kvphase train csa` exports, independent of its JAX mirror.

It runs deepseek4 files in the minimal configuration (../shared/notes/llama-cpp-minimal-configs.md):
hyper-connections that are exact identities (every `hc_*_fn` zero), one routed expert beside
the shared one, layers at compress ratio 0, 4 (CSA, its lightning indexer selecting the top-k
entries as llama.cpp's partial sort does, ties included) or 128 (HCA), one output group, no
RoPE scaling. Anything else is refused, not approximated. The compressor and the window are
`kvphase.designs.DSV4` (the code `kvphase validate` proves equal to llama.cpp's); the rest
follows `build_attention_impl` in src/models/deepseek4.cpp.

Each call runs the whole sequence again (the cache is the token list): the models it is
for are a few hundred kilobytes and their contexts under a few hundred tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from kvphase.designs.dsv4 import CSA_RATIO, DSV4, HCA_RATIO, rms_norm, rope
from kvphase.designs.windows import softmax
from kvphase.errors import ModelFileError
from kvphase.gguf.header import GGUFHeader
from kvphase.gguf.keys import Keys
from kvphase.gguf.metadata import Metadata
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.gguf.tensors import tensor_array
from kvphase.reference.model import per_file, silu

ARCH = "deepseek4"


@dataclass(frozen=True)
class DSV4Config:
    n_layer: int
    n_head: int  # query heads; one K = V head of head_dim
    head_dim: int
    n_rot: int  # last channels of a head that RoPE turns (NORM mode)
    n_swa: int  # sliding window, the query included
    ratios: tuple[int, ...]  # per layer: 0 (window only), 4 (CSA) or 128 (HCA)
    rope_base: float  # rope.freq_base (ratio-0 layers)
    compress_rope_base: float  # compress_rope_freq_base (compressed layers, the indexer's queries)
    norm_eps: float
    n_ctx_train: int
    top_k: int  # attention.indexer.top_k: CSA entries each query reads
    n_idx_head: int  # attention.indexer.head_count

    @classmethod
    def from_meta(cls, meta: Metadata) -> DSV4Config:
        n_layer = meta.integer(Keys.LLM.BLOCK_COUNT.format(arch=ARCH), low=1)
        ratios = meta.integers(Keys.Attention.COMPRESS_RATIOS.format(arch=ARCH), [])
        ratios = ratios * n_layer if len(ratios) == 1 else ratios[:n_layer]
        if any(r not in (0, CSA_RATIO, HCA_RATIO) for r in ratios):
            raise ModelFileError(f"the reference runs deepseek4 layers at compress ratio 0, 4 or 128, found {ratios}")
        if meta.get(Keys.Rope.SCALING_TYPE.format(arch=ARCH), "none") not in ("none",):
            raise ModelFileError("the deepseek4 reference runs files without RoPE scaling")
        for key, want in ((Keys.LLM.EXPERT_COUNT, 1), (Keys.Attention.OUTPUT_GROUP_COUNT, 1), (Keys.Attention.HEAD_COUNT_KV, 1),
                          (Keys.LLM.EXPERT_WEIGHTS_SCALE, 1.0), (Keys.LLM.SWIGLU_CLAMP_EXP, 0.0), (Keys.HyperConnection.EPSILON, 0.0)):
            if meta.get(key.format(arch=ARCH)) != want:
                raise ModelFileError(f'the deepseek4 reference needs {key.format(arch=ARCH)} = {want} (the minimal configuration kvphase train exports), found {meta.get(key.format(arch=ARCH))}')
        return cls(
            n_layer=n_layer, n_head=meta.integer(Keys.Attention.HEAD_COUNT.format(arch=ARCH), low=1),
            head_dim=meta.integer(Keys.Attention.KEY_LENGTH.format(arch=ARCH), low=1),
            n_rot=meta.integer(Keys.Rope.DIMENSION_COUNT.format(arch=ARCH), 0),
            n_swa=meta.integer(Keys.Attention.SLIDING_WINDOW.format(arch=ARCH), low=1), ratios=tuple(ratios),
            rope_base=meta.number(Keys.Rope.FREQ_BASE.format(arch=ARCH), 10000.0),
            compress_rope_base=meta.number(Keys.Attention.COMPRESS_ROPE_FREQ_BASE.format(arch=ARCH)),
            norm_eps=meta.number(Keys.Attention.LAYERNORM_RMS_EPS.format(arch=ARCH)),
            n_ctx_train=meta.integer(Keys.LLM.CONTEXT_LENGTH.format(arch=ARCH), low=1),
            top_k=meta.integer(Keys.Attention.Indexer.TOP_K.format(arch=ARCH), low=1),
            n_idx_head=meta.integer(Keys.Attention.Indexer.HEAD_COUNT.format(arch=ARCH), low=1),
        )


class TokenCache:
    """The sequence so far; `truncate(n)` rolls it back to its first n tokens."""

    def __init__(self):
        self.tokens: list[int] = []

    @property
    def n(self) -> int:
        return len(self.tokens)

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.n:
            raise ValueError(f"cannot roll the cache back to {n} tokens, it holds {self.n}")
        del self.tokens[n:]


def hyper_connected_weights(header: GGUFHeader, arch: str, config_type):
    """(config, weights) of a file of `arch`, whose hyper-connections must be the identity (glm5-next
    shares deepseek4's); ModelFileError for a file of another architecture."""
    meta = Metadata(header)
    if meta.text(Keys.General.ARCHITECTURE) != arch:
        raise ModelFileError(f"{header.path} is not a {arch} file")
    config = config_type.from_meta(meta)  # a configuration the reference cannot run is refused before the weights
    raw = np.memmap(header.path, dtype=np.uint8, mode="r")
    weights = {t.name: tensor_array(raw, t) for t in header.tensors}
    check_identity_hyper_connections(weights, arch)
    return config, weights


@per_file(kept=4)
def _load(header: GGUFHeader) -> tuple[DSV4Config, dict[str, np.ndarray]]:
    return hyper_connected_weights(header, ARCH, DSV4Config)


def check_identity_hyper_connections(weights: dict[str, np.ndarray], arch: str) -> None:
    """Refuse a file whose hyper-connections are not the identity `identity_hc_base` makes."""
    if any(np.any(w) for n, w in weights.items() if n.endswith("_fn.weight")) or any(
            not np.allclose(w, identity_hc_base(len(w)), atol=1e-6) for n, w in weights.items() if n.endswith("_base.weight")):
        raise ModelFileError(f"the {arch} reference needs identity hyper-connections (every hc fn zero, each base "
                             "-ln 3 for the four streams' pre weights and 0 after)")


def last_channels_roped(x: np.ndarray, positions: np.ndarray, n_rot: int, base: float) -> np.ndarray:
    """RoPE (NORM mode) on the last n_rot channels of rows x (n, width) at positions (n,), as deepseek4's
    rope_ext with its nope offset; x itself when n_rot is 0. Negative positions rope back (rope_ext_back)."""
    return rope(x, positions, n_rot, base, offset=x.shape[-1] - n_rot) if n_rot else x


def swiglu(m: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """llama.cpp's build_ffn (LLM_FFN_SILU, LLM_FFN_PAR) on normed rows m (T, n_embd); weights (out, in)."""
    return (silu(m @ gate.T) * (m @ up.T)) @ down.T  # (T, n_embd)


def identity_hc_base(n: int, streams: int = 4) -> np.ndarray:
    """A hyper-connection bias under which (with its fn zero) the four identical streams add back up
    to the residual: pre = sigmoid(-ln 3) = 1/4 each, post = 2 sigmoid(0) = 1, comb = softmax(0)."""
    base = np.zeros(n, np.float32)
    base[:streams] = -np.log(3.0)
    return base


class WholeSequence:
    """A reference model for a file in an engine's own layout that runs the whole sequence again at
    every call; `forward(tokens, cache, logits_for)` as the other reference models have it.
    Subclasses name their `arch`, give `load(model) -> (config, weights)` and `hidden(tokens)`."""

    policy = None  # the file's own compressor; no post-hoc policy applies
    arch = ""
    # when a dict: each indexer layer's selection of the last forward, layer -> (T, k) pools or entries
    # by descending score, -1 padding (`sweep.selection` reads the query's row)
    selections: dict[int, np.ndarray] | None = None

    def __init__(self, config, weights: dict[str, np.ndarray]):
        self.config, self.w = config, weights

    @staticmethod
    def load(model: str | Path | ModelInfo) -> tuple:
        raise NotImplementedError

    @classmethod
    def from_gguf(cls, model: str | Path | ModelInfo, policy=None):
        if policy is not None:
            raise ModelFileError(f"a {cls.arch} file runs its own compressor; --design does not apply to it")
        return cls(*cls.load(model))

    def new_cache(self, capacity: int = 0) -> TokenCache:
        return TokenCache()

    def forward(self, tokens: Sequence[int], cache: TokenCache, logits_for: Sequence[int] | None = None) -> np.ndarray:
        """Append `tokens` to the sequence; the logits of rows `logits_for` of `tokens` (all when None)."""
        start = cache.n
        cache.tokens.extend(int(t) for t in tokens)
        if cache.n > self.config.n_ctx_train:
            raise ModelFileError(f"the model holds {self.config.n_ctx_train} positions; {cache.n} tokens do not fit")
        rows = np.arange(len(tokens)) if logits_for is None else np.asarray(logits_for, dtype=np.int64)
        if len(rows) == 0:
            return np.zeros((0, len(self.w["output.weight"])), np.float32)
        x = self.hidden(np.asarray(cache.tokens))[start + rows]  # (n_rows, n_embd)
        return rms_norm(x, self.w["output_norm.weight"], self.config.norm_eps) @ self.w["output.weight"].T  # (n_rows, n_vocab)

    def hidden(self, tokens: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class DeepSeek4(WholeSequence):
    """The deepseek4 files `kvphase train csa` exports."""

    arch = ARCH
    load = staticmethod(_load)

    def hidden(self, tokens: np.ndarray) -> np.ndarray:
        """The residual stream after the last layer at every position: (T, n_embd)."""
        w, c = self.w, self.config
        x = w["token_embd.weight"][tokens]  # (T, n_embd)
        for il in range(c.n_layer):
            p = f"blk.{il}."
            x = x + self.attention(il, rms_norm(x, w[p + "attn_norm.weight"], c.norm_eps))  # (T, n_embd)
            m = rms_norm(x, w[p + "ffn_norm.weight"], c.norm_eps)  # (T, n_embd)
            for expert in ("_exps", "_shexp"):  # the routed expert (weight exactly 1) and the shared one
                stored = (w[f"{p}ffn_{part}{expert}.weight"] for part in ("gate", "up", "down"))
                gate, up, down = (x.reshape(x.shape[-2:]) for x in stored)  # the routed one's expert axis dropped
                x = x + swiglu(m, gate, up, down)  # (T, n_embd)
        return x

    def attention(self, il: int, a: np.ndarray) -> np.ndarray:
        """One layer's attention output (T, n_embd) from its normed input a (T, n_embd)."""
        w, c, p = self.w, self.config, f"blk.{il}."
        t, hd = len(a), c.head_dim
        ratio = c.ratios[il]
        base = c.compress_rope_base if ratio else c.rope_base

        def turn(x, positions):  # RoPE on the last n_rot channels of (n, hd) rows
            return last_channels_roped(x, positions, c.n_rot, base)

        pos = np.arange(t)  # (T,)
        qr = rms_norm(a @ w[p + "attn_q_a.weight"].T, w[p + "attn_q_a_norm.weight"], c.norm_eps)  # (T, q_lora)
        q = (qr @ w[p + "attn_q_b.weight"].T).reshape(t, c.n_head, hd)  # (T, H, hd)
        q = rms_norm(q, np.float32(1.0), c.norm_eps)  # (T, H, hd): weightless per-head norm
        q = np.stack([turn(q[:, h], pos) for h in range(c.n_head)], axis=1)  # (T, H, hd)
        kv = turn(rms_norm(a @ w[p + "attn_kv.weight"].T, w[p + "attn_kv_a_norm.weight"], c.norm_eps), pos)  # (T, hd)
        design = DSV4(ratio=ratio or CSA_RATIO, n_swa=c.n_swa, top_k=c.top_k, cache_dtype="f32")
        keys, seen = kv, design.raw_window(pos, t)  # (T, hd), (T, T)
        if ratio:
            entries = design.finished(a @ w[p + "attn_compressor_kv.weight"].T, a @ w[p + "attn_compressor_gate.weight"].T,
                                      w[p + "attn_compressor_ape.weight"], w[p + "attn_compressor_norm.weight"], c.norm_eps,
                                      turn)  # (n_blocks, hd)
            index = self.indexer_scores(il, a, qr, design, pos) if design.is_csa else None  # (T, n_blocks)
            selection = design.select(pos, t, len(entries), index)
            if design.is_csa and self.selections is not None:
                self.selections[il] = selection.top_blocks  # (T, k)
            chosen = selection.block_visible  # (T, n_blocks)
            keys = np.concatenate([entries, kv])  # (n_blocks + T, hd)
            seen = np.concatenate([chosen, seen], axis=1)  # (T, n_blocks + T)
        scores = np.einsum("thd,kd->htk", q, keys) / np.sqrt(hd)  # (H, T, n_keys)
        sinks = np.broadcast_to(w[p + "attn_sinks.weight"][:, None, None], (c.n_head, t, 1))  # (H, T, 1)
        weights = softmax(np.concatenate([sinks, np.where(seen, scores, -np.inf)], axis=2), axis=2)[:, :, 1:]  # (H, T, n_keys)
        out = np.einsum("htk,kd->thd", weights, keys)  # (T, H, hd): V = K
        out = np.stack([turn(out[:, h], -pos) for h in range(c.n_head)], axis=1)  # (T, H, hd): roped back by the query's position
        return out.reshape(t, c.n_head * hd) @ w[p + "attn_output_a.weight"].T @ w[p + "attn_output_b.weight"].T  # (T, n_embd)

    def indexer_scores(self, il: int, a: np.ndarray, qr: np.ndarray, design: DSV4, pos: np.ndarray) -> np.ndarray:
        """`lid_score_masked` of a CSA layer (T, n_blocks): its queries from qr, weights from a, keys from
        its own overlapped compressor, roped as the attention's (the Hadamard rotations cancel in F32)."""
        w, c, p = self.w, self.config, f"blk.{il}."
        t, n_idx = len(a), w[p + "indexer_compressor_norm.weight"].shape[0]

        def turn(x, positions):  # RoPE on the last n_rot channels of (n, n_idx) rows
            return last_channels_roped(x, positions, c.n_rot, c.compress_rope_base)

        keys = design.finished(a @ w[p + "indexer_compressor_kv.weight"].T, a @ w[p + "indexer_compressor_gate.weight"].T,
                               w[p + "indexer_compressor_ape.weight"], w[p + "indexer_compressor_norm.weight"], c.norm_eps,
                               turn)  # (n_blocks, n_idx)
        q = (qr @ w[p + "indexer.attn_q_b.weight"].T).reshape(t, c.n_idx_head, n_idx)  # (T, Hi, n_idx)
        q = np.stack([turn(q[:, h], pos) for h in range(c.n_idx_head)], axis=1)  # (T, Hi, n_idx)
        weights = (a @ w[p + "indexer.proj.weight"].T) / np.float32(np.sqrt(n_idx * c.n_idx_head))  # (T, Hi)
        return design.indexer_scores(q, weights, keys, pos)  # (T, n_blocks)
