"""A `glm-kpool` / `glm-dense` model (kvphase/train/glm5.py) as a `glm5-next` GGUF that llama.cpp runs.

The file is `gguf.tiny.glm5_next_spec` (the names and shapes llama.cpp's loader asks for)
at the trained sizes: the trained KDA layer first (`--kda trained`), then the trained NoPE
MLA layers with their k-pool indexers; with `--kda off` the KDA layer the architecture
requires comes last, made an exact identity, and the rest of the machinery is made exact
identities too (../shared/notes/llama-cpp-minimal-configs.md):

- the no-op KDA: small random weights (zero ones would L2-normalise zero vectors), a zero
  `attn_output` and a zero `ffn_down`, so the layer adds exactly nothing;
- hyper-connections: every `hc_*_fn` zero, so the four identical streams add back up to
  the residual (the same bias as the deepseek4 export); the output collapse is their mean;
- dense SwiGLU feed-forwards everywhere (`leading_dense_block_count` = block_count);
- the indexer's top-k is `top_k` pools of `stride` tokens for `glm-kpool`, and more pools
  than any context holds for the twin `glm-dense`, so every pool is read.
"""

from __future__ import annotations

import numpy as np

from kvphase.gguf.keys import Keys
from kvphase.gguf.trained import TRAINED_PREFIX
from kvphase.gguf.tiny import Glm5Layout, glm5_next_spec, init_tensor
from kvphase.reference.deepseek4 import identity_hc_base
from kvphase.train.config import TrainConfig
from kvphase.train.export_common import fill_spec, shared_metadata
from kvphase.train.csa import RMS_EPS  # the RMSNorm epsilon of both engine layouts' exports
from kvphase.train.glm5 import INDEXER_HEADS, KDA_CONV
from kvphase.train.model import LN_EPS  # the LayerNorm epsilon (glm5-next: the indexer key's)
from kvphase.train.vocab import WordVocab

KDA_HEAD_DIM = 8  # the no-op KDA layer's head width (--kda off): small, it computes nothing that counts
EVERY_POOL = 1 << 16  # pools the twin's top-k keeps: more than any context holds


def layout(config: TrainConfig) -> Glm5Layout:
    d, hd = config.d_model, config.head_dim
    pools = EVERY_POOL if config.design == "glm-dense" else config.top_k
    trained_kda = config.kda == "trained"
    return Glm5Layout(
        n_embd=d, n_head=config.heads, q_lora=d, kv_lora=d, k_mla=hd, v_mla=hd,
        kda_dim=hd if trained_kda else KDA_HEAD_DIM, d_conv=KDA_CONV, n_idx_head=INDEXER_HEADS, n_idx=hd,
        kpool=config.stride, top_k=pools * config.stride, n_ff=4 * d,
        kinds=(("kda",) + ("dsa",) * config.layers) if trained_kda else (("dsa",) * config.layers + ("kda",)),
    )


def kda_layer(config: TrainConfig) -> int:
    """The KDA layer's index: first when trained, last when it is the no-op."""
    return 0 if config.kda == "trained" else config.layers


def _kda_weights(block: dict) -> dict[str, np.ndarray]:
    """The trained KDA layer (layer 0) in numpy order."""
    b = {k: np.asarray(v, dtype=np.float32) for k, v in block.items()}
    out = {f"blk.0.ssm_conv1d_{x}.weight": b[f"conv_{x}"][:, None, :] for x in "qkv"}  # (inner, 1, taps)
    out.update({f"blk.0.attn_{x}.weight": b[x].T for x in "qkv"})
    out.update({
        "blk.0.attn_norm.weight": b["attn_norm"], "blk.0.ffn_norm.weight": b["ffn_norm"],
        "blk.0.ssm_f_a.weight": b["f_a"].T, "blk.0.ssm_f_b.weight": b["f_b"].T, "blk.0.ssm_dt.bias": b["dt_bias"],
        "blk.0.ssm_a": -np.exp(b["a_log"]), "blk.0.ssm_beta.weight": b["beta"].T,
        "blk.0.ssm_g_a.weight": b["g_a"].T, "blk.0.ssm_g_b.weight": b["g_b"].T, "blk.0.ssm_norm.weight": b["norm"],
        "blk.0.attn_output.weight": b["o"].T,
        "blk.0.ffn_gate.weight": b["w_gate"].T, "blk.0.ffn_up.weight": b["w_up"].T, "blk.0.ffn_down.weight": b["w_down"].T,
    })
    return out


def _block_weights(i: int, block: dict) -> dict[str, np.ndarray]:
    """The trained tensors of MLA layer i in numpy order (linear maps as (out, in))."""
    b = {k: np.asarray(v, dtype=np.float32) for k, v in block.items()}
    p = f"blk.{i}."
    return {
        p + "attn_norm.weight": b["attn_norm"], p + "ffn_norm.weight": b["ffn_norm"],
        p + "attn_q_a.weight": b["q_a"].T, p + "attn_q_a_norm.weight": b["q_a_norm"], p + "attn_q_b.weight": b["q_b"].T,
        p + "attn_kv_a_mqa.weight": b["kv_a"].T, p + "attn_kv_a_norm.weight": b["kv_norm"],
        p + "attn_k_b.weight": b["k_b"], p + "attn_v_b.weight": b["v_b"], p + "attn_output.weight": b["o"].T,
        p + "indexer.attn_q_b.weight": b["idx_q"].T, p + "indexer.attn_k.weight": b["idx_k"].T,
        p + "indexer.k_norm.weight": b["idx_k_norm"], p + "indexer.k_norm.bias": b["idx_k_bias"],
        p + "indexer.proj.weight": b["idx_proj"].T, p + "indexer_compressor_gate.weight": b["idx_gate"].T,
        p + "indexer_compressor_ape.weight": b["idx_ape"],
        p + "ffn_gate.weight": b["w_gate"].T, p + "ffn_up.weight": b["w_up"].T, p + "ffn_down.weight": b["w_down"].T,
    }


def _untrained_weight(name: str, ne: tuple[int, ...], kind: str, kda_layer: int, rng: np.random.Generator) -> np.ndarray:
    """A tensor training does not produce: an identity hyper-connection, or the neutralised KDA layer's."""
    shape = tuple(reversed(ne))
    if name.endswith("_fn.weight"):
        return np.zeros(shape, np.float32)
    if name.endswith("_base.weight"):
        return identity_hc_base(shape[0])
    if name in (f"blk.{kda_layer}.attn_output.weight", f"blk.{kda_layer}.ffn_down.weight"):
        return np.zeros(shape, np.float32)
    return init_tensor(rng, ne, kind)


def glm5_file(params: dict, config: TrainConfig, vocab: WordVocab, step: int):
    """(architecture, keys, tensors) of the trained model as a glm5-next GGUF."""
    spec = glm5_next_spec(layout(config))
    trained = {"token_embd.weight": np.asarray(params["wte"], np.float32),
               "output.weight": np.asarray(params["wte"], np.float32),  # tied in training, untied in the file
               "output_norm.weight": np.asarray(params["out_norm"], np.float32)}
    first_mla = int(kda_layer(config) == 0)
    for i, block in enumerate(params["blocks"]):
        trained.update(_block_weights(first_mla + i, block))
    if "kda" in params:
        trained.update(_kda_weights(params["kda"]))
    keys = {**spec.keys, **shared_metadata(config, vocab, step)}
    keys[Keys.LLM.VOCAB_SIZE.format(arch='glm5-next')] = len(vocab)
    keys[Keys.LLM.CONTEXT_LENGTH.format(arch='glm5-next')] = config.n_positions
    keys[Keys.Attention.LAYERNORM_RMS_EPS.format(arch='glm5-next')] = RMS_EPS
    keys[Keys.Attention.LAYERNORM_EPS.format(arch='glm5-next')] = LN_EPS
    keys[TRAINED_PREFIX + "starts"] = [0] * (len(spec.keys[Keys.Attention.HEAD_COUNT_KV.format(arch='glm5-next')]) * config.heads)  # the KDA
    # layer's too: every pool of every layer starts at the sequence's first position
    rng = np.random.default_rng([config.seed, 5])
    tensors = fill_spec(spec, trained, lambda name, ne, kind: _untrained_weight(name, ne, kind, kda_layer(config), rng),
                        len(vocab))
    return "glm5-next", keys, tensors
