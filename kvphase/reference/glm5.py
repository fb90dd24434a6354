"""A numpy GLM-5.3 (glm5-next) for the files `kvphase train glm-kpool` exports, independent of its JAX mirror.

It runs glm5-next files in the minimal configuration (../shared/notes/llama-cpp-minimal-configs.md):
hyper-connections that are exact identities (every `hc_*_fn` zero) and dense SwiGLU
feed-forwards; anything else is refused, not approximated. The selection is
`kvphase.designs.KPool` (the code `kvphase validate` proves equal to llama.cpp's) with an F32
indexer cache, or for `glm-msa` files (`kvphase.trained.design`) `kvphase.designs.MSA` over the
first indexer head's queries and the indexer keys, the query's own block kept and `top_k /
kpool` other blocks (llama.cpp does not run those files); the attention follows `build_dsa_layer` in src/models/glm5-next.cpp: NoPE MLA
over one RMS-normed latent. KDA layers follow `build_kda_layer`, whose CPU op is a per-token
gated delta rule from a zero state (no gate lower bound).

Each call runs the whole sequence again (the cache is the token list), as the deepseek4
reference does: the models it is for are small and their contexts short.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from kvphase.designs.dsv4 import rms_norm
from kvphase.designs.kpool import KPool
from kvphase.designs.msa import MSA
from kvphase.gguf.keys import Keys
from kvphase.gguf.trained import GLM5_REFERENCE_DESIGNS, TRAINED_PREFIX
from kvphase.designs.windows import causal_mask, softmax
from kvphase.errors import ModelFileError
from kvphase.gguf.header import GGUFHeader
from kvphase.gguf.metadata import Metadata
from kvphase.reference.deepseek4 import WholeSequence, hyper_connected_weights, swiglu
from kvphase.reference.model import per_file, silu

ARCH = "glm5-next"


@dataclass(frozen=True)
class Glm5Config:
    n_layer: int
    mla_layers: tuple[bool, ...]  # per layer: NoPE MLA with the indexer (True) or KDA (False)
    n_head: int
    k_mla: int  # per-head key width (the scale 1/sqrt(k_mla))
    kda_dim: int  # KDA head width
    kpool: int
    top_k: int  # tokens: top_k // kpool pools
    n_idx_head: int
    norm_eps: float  # RMSNorm
    ln_eps: float  # the indexer key's LayerNorm
    n_ctx_train: int
    msa: bool = False  # a glm-msa file: MSA's block selection instead of k-pool's

    @classmethod
    def from_meta(cls, meta: Metadata) -> Glm5Config:
        n_layer = meta.integer(Keys.LLM.BLOCK_COUNT.format(arch=ARCH), low=1)
        kv_heads = meta.integers(Keys.Attention.HEAD_COUNT_KV.format(arch=ARCH))
        if len(kv_heads) != n_layer or meta.integer(Keys.LLM.LEADING_DENSE_BLOCK_COUNT.format(arch=ARCH), 0) < n_layer:
            raise ModelFileError(f"the glm5-next reference runs dense feed-forwards on every layer and needs a head_count_kv "
                                 f"per layer (the minimal configuration kvphase train exports)")
        if Keys.KDA.GATE_LOWER_BOUND.format(arch=ARCH) in meta.fields:
            raise ModelFileError("the glm5-next reference runs KDA without a gate lower bound")
        if not meta.get(Keys.Attention.Indexer.KPOOL_SELECT_TAIL.format(arch=ARCH), False):
            raise ModelFileError("the glm5-next reference reads each query's pool tail: kpool_select_tail must be true")
        return cls(
            n_layer=n_layer, mla_layers=tuple(h > 0 for h in kv_heads),
            n_head=meta.integer(Keys.Attention.HEAD_COUNT.format(arch=ARCH), low=1),
            k_mla=meta.integer(Keys.Attention.KEY_LENGTH_MLA.format(arch=ARCH), low=1),
            kda_dim=meta.integer(Keys.KDA.HEAD_DIM.format(arch=ARCH), low=1),
            kpool=meta.integer(Keys.Attention.Indexer.KPOOL.format(arch=ARCH), low=2),
            top_k=meta.integer(Keys.Attention.Indexer.TOP_K.format(arch=ARCH), low=1),
            n_idx_head=meta.integer(Keys.Attention.Indexer.HEAD_COUNT.format(arch=ARCH), low=1),
            norm_eps=meta.number(Keys.Attention.LAYERNORM_RMS_EPS.format(arch=ARCH)),
            ln_eps=meta.number(Keys.Attention.LAYERNORM_EPS.format(arch=ARCH)),
            n_ctx_train=meta.integer(Keys.LLM.CONTEXT_LENGTH.format(arch=ARCH), low=1),
            msa=meta.get(TRAINED_PREFIX + "design", "") in GLM5_REFERENCE_DESIGNS,
        )


@per_file(kept=4)
def _load(header: GGUFHeader) -> tuple[Glm5Config, dict[str, np.ndarray]]:
    return hyper_connected_weights(header, ARCH, Glm5Config)


class Glm5Next(WholeSequence):
    """The glm5-next files `kvphase train glm-kpool` exports."""

    arch = ARCH
    load = staticmethod(_load)

    def hidden(self, tokens: np.ndarray) -> np.ndarray:
        """The residual stream after the last layer at every position: (T, n_embd)."""
        w, c = self.w, self.config
        x = w["token_embd.weight"][tokens]  # (T, n_embd)
        for il, mla in enumerate(c.mla_layers):
            p = f"blk.{il}."
            mixer = self.attention if mla else self.kda
            x = x + mixer(il, rms_norm(x, w[p + "attn_norm.weight"], c.norm_eps))  # (T, n_embd)
            m = rms_norm(x, w[p + "ffn_norm.weight"], c.norm_eps)  # (T, n_embd)
            x = x + swiglu(m, *(w[f"{p}ffn_{part}.weight"] for part in ("gate", "up", "down")))  # (T, n_embd)
        return x

    def visible(self, il: int, a: np.ndarray, qr: np.ndarray) -> np.ndarray:
        """Which tokens each query reads (T, T): its top pools and its pool's tail, causally."""
        w, c, p = self.w, self.config, f"blk.{il}."
        t = len(a)
        design = KPool(kpool=c.kpool, top_k=c.top_k, cache_dtype="f32")
        keys = design.key_norm(a @ w[p + "indexer.attn_k.weight"].T, w[p + "indexer.k_norm.weight"],
                               w[p + "indexer.k_norm.bias"], c.ln_eps)  # (T, d_idx)
        queries = (qr @ w[p + "indexer.attn_q_b.weight"].T).reshape(t, c.n_idx_head, -1)  # (T, H_idx, d_idx)
        if c.msa:
            blocks = MSA(block_size=c.kpool, top_k=c.top_k // c.kpool + 1, local_blocks=1, cache_dtype="f32")
            return blocks.forward(queries[:, :1], keys, np.arange(t)).visible[:, 0] & causal_mask(np.arange(t), t)
        weights = design.scale_weights(a @ w[p + "indexer.proj.weight"].T, queries.shape[-1])  # (T, H_idx)
        selection = design.forward(queries, weights, keys, a @ w[p + "indexer_compressor_gate.weight"].T,
                                   w[p + "indexer_compressor_ape.weight"], np.arange(t))
        if self.selections is not None:
            self.selections[il] = selection.top_pools  # (T, n_top)
        return selection.visible & causal_mask(np.arange(t), t)  # (T, T)

    def attention(self, il: int, a: np.ndarray) -> np.ndarray:
        """One MLA layer's output (T, n_embd) from its normed input a (T, n_embd)."""
        w, c, p = self.w, self.config, f"blk.{il}."
        t = len(a)
        qr = rms_norm(a @ w[p + "attn_q_a.weight"].T, w[p + "attn_q_a_norm.weight"], c.norm_eps)  # (T, q_lora)
        q = (qr @ w[p + "attn_q_b.weight"].T).reshape(t, c.n_head, c.k_mla)  # (T, H, k_mla)
        q_absorbed = np.einsum("thd,hld->thl", q, w[p + "attn_k_b.weight"])  # (T, H, L)
        latent = rms_norm(a @ w[p + "attn_kv_a_mqa.weight"].T, w[p + "attn_kv_a_norm.weight"], c.norm_eps)  # (T, L)
        scores = np.einsum("thl,ul->htu", q_absorbed, latent) / np.sqrt(c.k_mla)  # (H, T, T)
        weights = softmax(np.where(self.visible(il, a, qr)[None], scores, -np.inf), axis=2)  # (H, T, T)
        read = np.einsum("htu,ul->thl", weights, latent)  # (T, H, L)
        out = np.einsum("thl,hvl->thv", read, w[p + "attn_v_b.weight"])  # (T, H, v_mla)
        return out.reshape(t, -1) @ w[p + "attn_output.weight"].T  # (T, n_embd)

    def kda(self, il: int, a: np.ndarray) -> np.ndarray:
        """One KDA layer's output (T, n_embd) from its normed input a (T, n_embd)."""
        w, c, p = self.w, self.config, f"blk.{il}."
        t, dk = len(a), c.kda_dim

        def conv(x, taps):  # ggml_ssm_conv then silu: tap K-1 is the current token, zeros before the sequence
            taps = taps.reshape(taps.shape[0], -1)  # (C, K)
            padded = np.concatenate([np.zeros((taps.shape[1] - 1, x.shape[1]), np.float32), x])  # (T + K - 1, C)
            y = sum(padded[i : i + t] * taps[:, i] for i in range(taps.shape[1]))  # (T, C)
            return silu(y).reshape(t, -1, dk)  # (T, H, dk)

        def l2(x):  # ggml_l2_norm, eps 1e-6
            return x / np.sqrt(np.sum(x.astype(np.float64) ** 2, -1, keepdims=True) + 1e-6).astype(np.float32)

        q, k, v = (conv(a @ w[f"{p}attn_{x}.weight"].T, w[f"{p}ssm_conv1d_{x}.weight"]) for x in "qkv")  # (T, H, dk)
        q, k = l2(q), l2(k)
        f = a @ w[p + "ssm_f_a.weight"].T @ w[p + "ssm_f_b.weight"].T + w[p + "ssm_dt.bias"]  # (T, H dk)
        decay = np.exp(np.logaddexp(0, f).reshape(t, -1, dk) * w[p + "ssm_a"][None, :, None])  # (T, H, dk)
        beta = 1 / (1 + np.exp(-(a @ w[p + "ssm_beta.weight"].T)))  # (T, H)
        state = np.zeros((q.shape[1], dk, dk), np.float32)  # (H, dk, dv)
        out = np.zeros_like(q)  # (T, H, dv)
        for i in range(t):
            state = decay[i][:, :, None] * state
            u = (v[i] - np.einsum("hk,hkv->hv", k[i], state)) * beta[i][:, None]  # (H, dv)
            state = state + k[i][:, :, None] * u[:, None, :]
            out[i] = np.einsum("hk,hkv->hv", q[i], state) / np.sqrt(dk)
        gate = 1 / (1 + np.exp(-(a @ w[p + "ssm_g_a.weight"].T @ w[p + "ssm_g_b.weight"].T).reshape(t, -1, dk)))
        normed = rms_norm(out, w[p + "ssm_norm.weight"], c.norm_eps) * gate  # (T, H, dv)
        return normed.reshape(t, -1) @ w[p + "attn_output.weight"].T  # (T, n_embd)
