"""A minimax-m3 GGUF as the HF checkpoint transformers' `minimax_m3_vl` text model loads
(`MiniMaxM3VLForCausalLM`, model_type `minimax_m3_vl_text`).

llama.cpp's converter read backwards (llama-cpp-python 0.3.36, `vendor/llama.cpp/`):
- `conversion/minimax.py:172-196` (`MiniMaxM3Model.set_gguf_parameters`) for config.json: the indexer
  keys come from `sparse_attention_config` (minimax.py:183-188), which transformers' config reads
  under its flat names (`index_block_size`, `index_topk_blocks`, ...;
  configuration_minimax_m3_vl.py `__post_init__`); the dense lead from `moe_layer_freq`
  (minimax.py:190-196); `rotary_dim` from minimax.py:131.
- `conversion/minimax.py:198-203`: every `*norm.weight` had 1 added (Gemma-style `(1 + w)` RMSNorm
  baked for llama.cpp's plain RMSNorm); undone here by subtracting 1.
- `conversion/minimax.py:133-160`: the experts' `w1`/`w2`/`w3` were stacked per layer
  (ffn_gate_exps / ffn_down_exps / ffn_up_exps: tensor_mapping.py:597, 674, 543).
- `gguf-py/gguf/tensor_mapping.py` for the names (cited per tensor below).
The names are those `MiniMaxM3VLForCausalLM.save_pretrained` writes: the experts fused as
transformers holds them (`gate_up_proj` = [w1; w3], conversion_mapping.py "minimax_m3_vl": the
experts `MergeModulelist(dim=0), Concatenate(dim=1)`, the dense and shared MLPs `Concatenate(dim=0)`
of gate_proj and up_proj), the indexer under `self_attn.indexer.` (its renames of `index_q_proj`, ...).

llama.cpp's swigluoai constants (alpha 1.702, limit 7.0, `src/llama-graph.cpp:1910-1911, 2292-2293`)
are transformers' defaults, written out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvphase.backends.hf_layout.common import (ATTENTION_PROJECTIONS, BLOCK_NORMS, GGUFTensors,
                                               write_checkpoint_files)
from kvphase.errors import ModelFileError
from kvphase.gguf.keys import Keys
from kvphase.gguf.modelinfo import ModelInfo

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # llama-graph.cpp:1910-1911 (LLM_FFN_SWIGLU_OAI_MOE)
SIGMOID_GATING = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID: transformers' MiniMaxM3VLTopKRouter is sigmoid only

# GGUF name (per block) -> HF name under `model.layers.N.`; the norms (1 + w) are shifted back by 1
BLOCK = {
    **BLOCK_NORMS,
    **ATTENTION_PROJECTIONS,
    "attn_q_norm.weight": "self_attn.q_norm.weight",  # tensor_mapping.py:703
    "attn_k_norm.weight": "self_attn.k_norm.weight",  # tensor_mapping.py:720
}
INDEXER = {
    "indexer.q_proj.weight": "self_attn.indexer.q_proj.weight",  # index_q_proj, tensor_mapping.py:1331
    "indexer.k_proj.weight": "self_attn.indexer.k_proj.weight",  # index_k_proj, tensor_mapping.py:1335
    "indexer.q_norm.weight": "self_attn.indexer.q_norm.weight",  # index_q_norm, tensor_mapping.py:1339
    "indexer.k_norm.weight": "self_attn.indexer.k_norm.weight",  # index_k_norm, tensor_mapping.py:1307
}
MOE = {
    "ffn_gate_inp.weight": "mlp.gate.weight",  # block_sparse_moe.gate, tensor_mapping.py:458
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",  # tensor_mapping.py:487 (minimax-m2)
}


def write_minimax_m3(info: ModelInfo, folder: Path) -> None:
    """config.json, model.safetensors (and tokenizer.json) of `info`'s minimax-m3 GGUF, in `folder`."""
    g = GGUFTensors(info)
    config = minimax_m3_config(g)
    tensors = {"model.embed_tokens.weight": g["token_embd.weight"],  # tensor_mapping.py:16
               "model.norm.weight": g["output_norm.weight"] - 1.0,  # tensor_mapping.py:100; minimax.py:201
               "lm_head.weight": g["output.weight"]}  # tensor_mapping.py:79
    for i in range(config["num_hidden_layers"]):
        block = f"model.layers.{i}."
        names = {**BLOCK, **(INDEXER if config["layer_types"][i] == "minimax_m3_sparse" else {}),
                 **(MOE if config["mlp_layer_types"][i] == "sparse" else {})}
        for gguf_name, hf_name in names.items():
            weight = g[f"blk.{i}.{gguf_name}"]
            tensors[block + hf_name] = weight - 1.0 if gguf_name.endswith("norm.weight") else weight
        if config["mlp_layer_types"][i] == "dense":
            tensors[block + "mlp.gate_up_proj.weight"] = _gate_up(g, i, "")
            tensors[block + "mlp.down_proj.weight"] = g[f"blk.{i}.ffn_down.weight"]  # tensor_mapping.py:637
        else:
            # routed experts (E, 2 * I, H): [w1; w3] per expert, concatenated on the intermediate axis
            tensors[block + "mlp.experts.gate_up_proj"] = np.concatenate(
                [g[f"blk.{i}.ffn_gate_exps.weight"], g[f"blk.{i}.ffn_up_exps.weight"]], axis=1)
            tensors[block + "mlp.experts.down_proj"] = g[f"blk.{i}.ffn_down_exps.weight"]  # (E, H, I)
            tensors[block + "mlp.shared_experts.gate_up_proj.weight"] = _gate_up(g, i, "_shexp")
            tensors[block + "mlp.shared_experts.down_proj.weight"] = g[f"blk.{i}.ffn_down_shexp.weight"]
    write_checkpoint_files(folder, config, tensors, info)


def _gate_up(g: GGUFTensors, i: int, suffix: str) -> np.ndarray:
    """(2 * I, H): gate_proj over up_proj, as transformers' MLP chunks `gate_up_proj`'s output (gate first)."""
    return np.concatenate([g[f"blk.{i}.ffn_gate{suffix}.weight"], g[f"blk.{i}.ffn_up{suffix}.weight"]], axis=0)


def minimax_m3_config(g: GGUFTensors) -> dict:
    """config.json from the GGUF's keys, each the inverse of minimax.py's `set_gguf_parameters` line for it."""
    n_layer = g.integer(Keys.LLM.BLOCK_COUNT)
    n_dense = g.integer(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0)
    if g.integer(Keys.LLM.EXPERT_GATING_FUNC) != SIGMOID_GATING:
        raise ModelFileError(f"{g.info.path.name}: {Keys.LLM.EXPERT_GATING_FUNC.format(arch=g.arch)} is not sigmoid (2), the only routing transformers' minimax_m3_vl has")
    if not g.key(Keys.LLM.EXPERT_WEIGHTS_NORM, False):
        raise ModelFileError(f"{g.info.path.name}: {Keys.LLM.EXPERT_WEIGHTS_NORM.format(arch=g.arch)} is false; transformers' minimax_m3_vl always normalises the routing weights (minimax.py:179 writes true)")
    n_ff_exp = g.integer(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)
    n_kv = g.integer(Keys.Attention.HEAD_COUNT_KV)
    if g.integer(Keys.Attention.Indexer.HEAD_COUNT) != n_kv:
        raise ModelFileError(f'{g.info.path.name}: {Keys.Attention.Indexer.HEAD_COUNT.format(arch=g.arch)} differs from head_count_kv; MSA keeps one indexer head per KV head')
    head_dim, n_rot = g.integer(Keys.Attention.KEY_LENGTH), g.integer(Keys.Rope.DIMENSION_COUNT)
    return {
        "architectures": ["MiniMaxM3VLForCausalLM"],
        "model_type": "minimax_m3_vl_text",
        "vocab_size": g.integer(Keys.LLM.VOCAB_SIZE),
        "hidden_size": g.integer(Keys.LLM.EMBEDDING_LENGTH),
        "intermediate_size": n_ff_exp,  # minimax.py:130 (expert width)
        "dense_intermediate_size": g.integer(Keys.LLM.FEED_FORWARD_LENGTH),
        "shared_intermediate_size": n_ff_exp * g.integer(Keys.LLM.EXPERT_SHARED_COUNT),  # minimax.py:177
        "num_hidden_layers": n_layer,
        "num_attention_heads": g.integer(Keys.Attention.HEAD_COUNT),
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "rotary_dim": n_rot,  # minimax.py:131
        # transformers' rotary embedding reads partial_rotary_factor, not rotary_dim (which alone rotates the
        # whole head: MiniMaxM3VLRotaryEmbedding.compute_default_rope_parameters)
        "rope_parameters": {"rope_type": "default", "rope_theta": g.number(Keys.Rope.FREQ_BASE),
                            "partial_rotary_factor": n_rot / head_dim},
        "num_local_experts": g.integer(Keys.LLM.EXPERT_COUNT),
        "num_experts_per_tok": g.integer(Keys.LLM.EXPERT_USED_COUNT),
        "routed_scaling_factor": g.number(Keys.LLM.EXPERT_WEIGHTS_SCALE, 1.0),  # minimax.py:178
        "mlp_layer_types": ["dense" if i < n_dense else "sparse" for i in range(n_layer)],  # minimax.py:190-196
        # llama.cpp's MSA runs on the layers that hold an indexer (minimax-m3.cpp load_arch_tensors: the MoE ones)
        "layer_types": ["minimax_m3_sparse" if f"blk.{i}.indexer.q_proj.weight" in g else "full_attention"
                        for i in range(n_layer)],
        "index_n_heads": n_kv,  # minimax.py:183
        "index_head_dim": g.integer(Keys.Attention.Indexer.KEY_LENGTH),  # minimax.py:184
        "index_topk_blocks": g.integer(Keys.Attention.Indexer.TOP_K),  # minimax.py:185
        "index_block_size": g.integer(Keys.Attention.Indexer.BLOCK_SIZE),  # minimax.py:186
        "index_local_blocks": g.integer(Keys.Attention.Indexer.LOCAL_BLOCKS),  # minimax.py:187
        "rms_norm_eps": g.number(Keys.Attention.LAYERNORM_RMS_EPS),
        "swiglu_alpha": SWIGLU_ALPHA, "swiglu_limit": SWIGLU_LIMIT,
        "max_position_embeddings": g.integer(Keys.LLM.CONTEXT_LENGTH),
        "tie_word_embeddings": False,
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
    }
