"""A `csa` model (kvphase/train/csa.py) as a `deepseek4` GGUF that llama.cpp itself runs.

The file is `gguf.tiny.deepseek4_spec` (the tensor names and shapes llama.cpp's loader
asks for) at the trained sizes, with the machinery the model does not use made exact
identities (../shared/notes/llama-cpp-minimal-configs.md):

- hyper-connections: every `hc_*_fn` zero, so each mix is its bias: pre = sigmoid(-ln 3) =
  1/4 for each of the four identical streams (they sum back to the residual), post =
  2 sigmoid(0) = 1, comb = softmax(0) = 1/4 (doubly stochastic already); epsilon 0;
- one routed expert (its weight p / max(p, 6e-5) is exactly 1) plus the shared expert: the
  trained SwiGLU's hidden units split in two; no SwiGLU clamp, no hash routing;
- the lightning indexer as trained (`--top-k`: its top-k, heads and weights), or, without one,
  its weights zero and its top-k above any block count, so every visible block is read;
- one output group, so the output projection is o_b o_a;
- each layer's compress ratio (`--ratios`), HCA's compressor one block wide;
- `csa-disjoint`: the previous block's gate rows at -1e30 (weight exactly 0) in its CSA layers;
- `csa-dense`: a window over every position and compressed entries exactly zero (the
  compressor's weights and its norm weight zero); llama.cpp dies on a file with no ratio-4
  layer, so the twin keeps the layers at ratio 4 (kvphase/train/csa.py).
"""

from __future__ import annotations

import numpy as np

from kvphase.gguf.keys import Keys
from kvphase.gguf.tiny import DSV4Layout, deepseek4_spec
from kvphase.reference.deepseek4 import identity_hc_base
from kvphase.train.config import TrainConfig
from kvphase.train.csa import INDEXER_HEADS, MASKED, RATIO, RMS_EPS, ROPE_BASE, indexer_key_length, rope_dims, window
from kvphase.train.export_common import fill_spec, shared_metadata
from kvphase.train.vocab import WordVocab

EVERY_BLOCK = 1 << 20  # an indexer top-k above any block count a context can hold: every block is read


def layout(config: TrainConfig) -> DSV4Layout:
    hd, d = config.head_dim, config.d_model
    return DSV4Layout(
        n_embd=d, n_head=config.heads, head_dim=hd, n_rot=rope_dims(config), q_lora=d, o_groups=1, o_lora=d,
        n_idx_head=INDEXER_HEADS if config.indexer_top_k else 1, n_idx=indexer_key_length(hd),
        idx_top_k=config.indexer_top_k or EVERY_BLOCK, n_expert=1, n_used=1, n_ff_exp=2 * d,
        ratios=config.layer_ratios, sliding_window=window(config),
        rope_base=ROPE_BASE, compress_rope_base=ROPE_BASE, expert_weights_scale=1.0, swiglu_clamp=0.0,
        hc_iterations=1, hc_eps=0.0,
    )


def _block_weights(i: int, block: dict, config: TrainConfig) -> dict[str, np.ndarray]:
    """The trained tensors of layer i in numpy order (linear maps as (out, in))."""
    b = {k: np.asarray(v, dtype=np.float32) for k, v in block.items()}
    f, hd = 2 * config.d_model, config.head_dim
    p = f"blk.{i}."
    out = {
        p + "attn_norm.weight": b["attn_norm"], p + "ffn_norm.weight": b["ffn_norm"],
        p + "attn_sinks.weight": b["sinks"],
        p + "attn_q_a.weight": b["q_a"].T, p + "attn_q_a_norm.weight": b["q_a_norm"], p + "attn_q_b.weight": b["q_b"].T,
        p + "attn_kv.weight": b["kv"].T, p + "attn_kv_a_norm.weight": b["kv_norm"],
        p + "attn_output_a.weight": b["o_a"].T, p + "attn_output_b.weight": b["o_b"].T,
        p + "ffn_gate_exps.weight": b["w_gate"][:, :f].T[None], p + "ffn_up_exps.weight": b["w_up"][:, :f].T[None],
        p + "ffn_down_exps.weight": b["w_down"][:f].T[None],
        p + "ffn_gate_shexp.weight": b["w_gate"][:, f:].T, p + "ffn_up_shexp.weight": b["w_up"][:, f:].T,
        p + "ffn_down_shexp.weight": b["w_down"][f:].T,
    }
    if "comp_kv" in b:
        kv, gate, ape = b["comp_kv"].T.copy(), b["comp_gate"].T.copy(), b["comp_ape"].copy()  # (halves hd, d) x2, (ratio, halves hd)
        if config.design == "csa-disjoint" and len(ape) == RATIO:
            kv[:hd], gate[:hd], ape[:, :hd] = 0.0, 0.0, MASKED
        out.update({p + "attn_compressor_kv.weight": kv, p + "attn_compressor_gate.weight": gate,
                    p + "attn_compressor_ape.weight": ape, p + "attn_compressor_norm.weight": b["comp_norm"]})
    if "idx_q" in b:
        out.update({p + "indexer.proj.weight": b["idx_proj"].T, p + "indexer.attn_q_b.weight": b["idx_q"].T,
                    p + "indexer_compressor_kv.weight": b["idx_kv"].T, p + "indexer_compressor_gate.weight": b["idx_gate"].T,
                    p + "indexer_compressor_ape.weight": b["idx_ape"], p + "indexer_compressor_norm.weight": b["idx_norm"]})
    return out


def _identity_weight(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """An unused tensor's value that makes its machinery an identity (see the module docstring)."""
    if name.endswith("_base.weight"):
        return identity_hc_base(shape[0])
    if name.endswith(("_scale.weight", "indexer_compressor_norm.weight")):
        return np.ones(shape, np.float32)
    return np.zeros(shape, np.float32)


def deepseek4_file(params: dict, config: TrainConfig, vocab: WordVocab, step: int):
    """(architecture, keys, tensors) of the trained model as a deepseek4 GGUF."""
    spec = deepseek4_spec(layout(config))
    trained = {"token_embd.weight": np.asarray(params["wte"], np.float32),
               "output.weight": np.asarray(params["wte"], np.float32),  # tied in training, untied in the file
               "output_norm.weight": np.asarray(params["out_norm"], np.float32)}
    for i, block in enumerate(params["blocks"]):
        trained.update(_block_weights(i, block, config))
    keys = {**spec.keys, **shared_metadata(config, vocab, step)}
    keys[Keys.LLM.VOCAB_SIZE.format(arch='deepseek4')] = len(vocab)
    keys[Keys.LLM.CONTEXT_LENGTH.format(arch='deepseek4')] = config.n_positions
    keys[Keys.Attention.LAYERNORM_RMS_EPS.format(arch='deepseek4')] = RMS_EPS
    tensors = fill_spec(spec, trained, lambda name, ne, kind: _identity_weight(name, tuple(reversed(ne))), len(vocab))
    return "deepseek4", keys, tensors
