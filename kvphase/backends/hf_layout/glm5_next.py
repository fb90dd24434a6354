"""A glm5-next GGUF as the HF checkpoint transformers' `glm5_next` loads (`Glm5NextForConditionalGeneration`).

llama.cpp's converter read backwards (llama-cpp-python 0.3.36, `vendor/llama.cpp/`; the lines cited
are that tree's):
- `conversion/glm.py:455-516` (`Glm5NextModel.set_gguf_parameters`) for config.json: a KDA layer is
  the one whose `head_count_kv` is 0 (glm.py:458), the indexer keys are transformers' names
  (glm.py:487-494), mHC (glm.py:497-500), dense lead / experts (glm.py:503-510).
- `conversion/glm.py:518-572` (`modify_tensors`) for the weights, undone here: `kv_b_proj` was split
  per head into `k_b` (transposed) and `v_b` (glm.py:539-548); the KDA convolutions were reshaped
  to (1, d_inner, 1, d_conv) (glm.py:551-558); `A_log` became `-exp(A_log)` (glm.py:560-562);
  `dt_bias` was renamed `dt_proj.bias` (glm.py:564-565); the mHC and k-pool parameters got a
  `.weight` suffix (glm.py:567-569).
- `gguf-py/gguf/tensor_mapping.py` for the names (cited per tensor below).
The names are those transformers' `save_pretrained` writes for this class (its
`conversion_mapping.py` "glm5_next" entry renamed back: `hc_attn_fn`, `q_conv1d`, `f_a_proj`, ...),
under `model.language_model.`, which the converter strips (`conversion/base.py:596-597`).

What the GGUF cannot say and transformers needs is chosen so that the two compute the same
model, and stated: `swiglu_limit` (transformers always clamps; llama.cpp only with
`swiglu_clamp_exp`) is 1e30 where the file has no clamp; the vision tower, which a text prompt
never reaches, is the smallest transformers builds and has no weights in the folder (transformers
initialises it). The indexer key's LayerNorm epsilon is fixed at 1e-6 in transformers
(`Glm5NextTextIndexer.k_norm`), where llama.cpp reads `attention.layer_norm_epsilon`: a file that
declares another value is computed differently by the two (`EPSILON_NOTE`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvphase.backends.hf_layout.common import (ATTENTION_PROJECTIONS, BLOCK_NORMS, GGUFTensors,
                                               write_checkpoint_files)
from kvphase.errors import ModelFileError
from kvphase.gguf.keys import Keys
from kvphase.gguf.modelinfo import ModelInfo

PREFIX = "model.language_model."
NO_CLAMP = 1e30  # transformers' MLP clamps at swiglu_limit always; this one no activation reaches
TRANSFORMERS_INDEXER_LN_EPS = 1e-6  # modeling_glm5_next.py: `Glm5NextTextIndexer.k_norm = nn.LayerNorm(..., eps=1e-6)`
# the smallest vision tower Glm5NextForConditionalGeneration builds: unused by text, not in the folder
TINY_VISION = {"depth": 1, "hidden_size": 8, "num_heads": 1, "intermediate_size": 8, "projection_intermediate_size": 8,
               "patch_size": 2, "image_size": 4, "temporal_patch_size": 1, "spatial_merge_size": 1}

# GGUF name (per block) -> HF name under `model.language_model.layers.N.`; tensor_mapping.py lines
DENSE_BLOCK = {
    **BLOCK_NORMS,
    "ffn_gate.weight": "mlp.gate_proj.weight",  # tensor_mapping.py:573
    "ffn_up.weight": "mlp.up_proj.weight",  # tensor_mapping.py:502
    "ffn_down.weight": "mlp.down_proj.weight",  # tensor_mapping.py:637
    # mHC: converter appends ".weight" (glm.py:567-569); tensor_mapping.py:1342-1369
    "hc_attn_fn.weight": "hc_attn_fn", "hc_attn_base.weight": "hc_attn_base", "hc_attn_scale.weight": "hc_attn_scale",
    "hc_ffn_fn.weight": "hc_ffn_fn", "hc_ffn_base.weight": "hc_ffn_base", "hc_ffn_scale.weight": "hc_ffn_scale",
}
KDA_BLOCK = {
    **ATTENTION_PROJECTIONS,
    "ssm_f_a.weight": "self_attn.f_a_proj.weight",  # tensor_mapping.py:921
    "ssm_f_b.weight": "self_attn.f_b_proj.weight",  # tensor_mapping.py:924
    "ssm_beta.weight": "self_attn.b_proj.weight",  # tensor_mapping.py:928
    "ssm_g_a.weight": "self_attn.g_a_proj.weight",  # tensor_mapping.py:945
    "ssm_g_b.weight": "self_attn.g_b_proj.weight",  # tensor_mapping.py:948
    "ssm_norm.weight": "self_attn.o_norm.weight",  # tensor_mapping.py:887
    "ssm_dt.bias": "self_attn.dt_bias",  # dt_proj.bias (tensor_mapping.py:845) renamed at glm.py:564-565
}
MLA_BLOCK = {
    "attn_q_a.weight": "self_attn.q_a_proj.weight",  # tensor_mapping.py:1121
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",  # tensor_mapping.py:1156
    "attn_q_b.weight": "self_attn.q_b_proj.weight",  # tensor_mapping.py:1127
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",  # tensor_mapping.py:1133
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",  # tensor_mapping.py:1162
    "attn_output.weight": ATTENTION_PROJECTIONS["attn_output.weight"],
    "indexer.k_norm.weight": "self_attn.indexer.k_norm.weight",  # tensor_mapping.py:1306
    "indexer.k_norm.bias": "self_attn.indexer.k_norm.bias",  # tensor_mapping.py:1306
    "indexer.proj.weight": "self_attn.indexer.weights_proj.weight",  # tensor_mapping.py:1311
    "indexer.attn_k.weight": "self_attn.indexer.wk.weight",  # tensor_mapping.py:1315
    "indexer.attn_q_b.weight": "self_attn.indexer.wq_b.weight",  # tensor_mapping.py:1319
    # ".weight" appended by the converter (glm.py:567-569); tensor_mapping.py:1323, 1327
    "indexer_compressor_gate.weight": "self_attn.indexer.index_kpool_compress_gate",
    "indexer_compressor_ape.weight": "self_attn.indexer.index_kpool_compress_ape",
}


def write_glm5_next(info: ModelInfo, folder: Path) -> None:
    """config.json, model.safetensors (and tokenizer.json) of `info`'s glm5-next GGUF, in `folder`."""
    g = GGUFTensors(info)
    config = glm5_next_config(g)
    text = config["text_config"]
    tensors = {PREFIX + "embed_tokens.weight": g["token_embd.weight"],  # tensor_mapping.py:16
               PREFIX + "norm.weight": g["output_norm.weight"]}  # tensor_mapping.py:100
    if "output.weight" in g:
        tensors["lm_head.weight"] = g["output.weight"]  # tensor_mapping.py:79
    for i, kind in enumerate(text["layer_types"]):
        block = f"{PREFIX}layers.{i}."
        names = {**DENSE_BLOCK, **(KDA_BLOCK if kind == "linear_attention" else MLA_BLOCK)}
        for gguf_name, hf_name in names.items():
            tensors[block + hf_name] = g[f"blk.{i}.{gguf_name}"]
        if kind == "linear_attention":
            tensors.update(_kda_tensors(g, i, block))
        else:
            tensors[block + "self_attn.kv_b_proj.weight"] = _kv_b(g, i, text)
    write_checkpoint_files(folder, config, tensors, info)


def _kda_tensors(g: GGUFTensors, i: int, block: str) -> dict[str, np.ndarray]:
    out = {}
    for qkv in "qkv":  # (d_inner, 1, d_conv) as nn.Conv1d holds a depthwise kernel; glm.py:551-558 made it 4-D
        conv = g[f"blk.{i}.ssm_conv1d_{qkv}.weight"]  # ggml (d_conv, 1, d_inner) -> numpy (d_inner, 1, d_conv)
        out[block + f"self_attn.{qkv}_conv1d.weight"] = conv.reshape(conv.shape[-3], 1, conv.shape[-1])
    a = g[f"blk.{i}.ssm_a"]  # -exp(A_log) (glm.py:560-562)
    if not np.all(a < 0):
        raise ModelFileError(f"{g.info.path.name}: blk.{i}.ssm_a holds a value >= 0, which no A_log gives (-exp(A_log))")
    out[block + "self_attn.A_log"] = np.log(-a)  # tensor_mapping.py:860
    return out


def _kv_b(g: GGUFTensors, i: int, text: dict) -> np.ndarray:
    """kv_b_proj (n_head * (nope + v), kv_lora) back from llama.cpp's absorbed halves (glm.py:539-548):
    k_b = kv_b[:, :nope].transpose(1, 2) per head, v_b = kv_b[:, nope:]."""
    k_b = g[f"blk.{i}.attn_k_b.weight"]  # (n_head, kv_lora, nope)  tensor_mapping.py:1144
    v_b = g[f"blk.{i}.attn_v_b.weight"]  # (n_head, v, kv_lora)     tensor_mapping.py:1150
    n_head = text["num_attention_heads"]
    kv_b = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)  # (n_head, nope + v, kv_lora)
    return kv_b.reshape(n_head * kv_b.shape[1], kv_b.shape[2])


def glm5_next_config(g: GGUFTensors) -> dict:
    """config.json from the GGUF's keys, each the inverse of glm.py's `set_gguf_parameters` line for it."""
    n_layer = g.integer(Keys.LLM.BLOCK_COUNT)
    kv_heads = g.key(Keys.Attention.HEAD_COUNT_KV)
    kv_heads = kv_heads if isinstance(kv_heads, list) else [kv_heads] * n_layer
    layer_types = ["linear_attention" if n == 0 else "indexed_attention" for n in kv_heads]  # glm.py:458
    n_dense = g.integer(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0)
    if n_dense < n_layer:  # no reference has one: refused rather than written untried
        raise ModelFileError(f'{g.info.path.name}: layers {n_dense}..{n_layer - 1} are MoE ({Keys.LLM.LEADING_DENSE_BLOCK_COUNT.format(arch=g.arch)} {n_dense}); export-hf writes dense glm5-next files')
    if g.integer(Keys.Rope.DIMENSION_COUNT, 0) != 0:
        raise ModelFileError(f"{g.info.path.name}: {Keys.Rope.DIMENSION_COUNT.format(arch=g.arch)} is not 0; transformers' glm5_next is NoPE-only MLA")  # configuration_glm5_next.py validate_architecture
    n_head = g.integer(Keys.Attention.HEAD_COUNT)
    clamp = g.key(Keys.LLM.SWIGLU_CLAMP_EXP, [])
    clamps = set(clamp if isinstance(clamp, list) else [clamp])
    if len(clamps) > 1:
        raise ModelFileError(f"{g.info.path.name}: {Keys.LLM.SWIGLU_CLAMP_EXP.format(arch=g.arch)} differs between layers; transformers' swiglu_limit is one number")
    select_tail = g.key(Keys.Attention.Indexer.KPOOL_SELECT_TAIL, True)
    indexer_types = g.optional(Keys.Attention.Indexer.TYPES)  # glm.py:494-495
    text = {
        "model_type": "glm5_next_text",
        "vocab_size": g.integer(Keys.LLM.VOCAB_SIZE),
        "hidden_size": g.integer(Keys.LLM.EMBEDDING_LENGTH),
        "intermediate_size": g.integer(Keys.LLM.FEED_FORWARD_LENGTH),
        "moe_intermediate_size": g.integer(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, 1),
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head,  # MLA: transformers requires them equal (validate_architecture)
        "n_shared_experts": g.integer(Keys.LLM.EXPERT_SHARED_COUNT, 1),
        "n_routed_experts": g.integer(Keys.LLM.EXPERT_COUNT, 1),
        "num_experts_per_tok": g.integer(Keys.LLM.EXPERT_USED_COUNT, 1),
        "routed_scaling_factor": g.number(Keys.LLM.EXPERT_WEIGHTS_SCALE, 1.0),
        "norm_topk_prob": bool(g.key(Keys.LLM.EXPERT_WEIGHTS_NORM, True)),
        "kv_lora_rank": g.integer(Keys.Attention.KV_LORA_RANK),  # glm.py:476
        "q_lora_rank": g.integer(Keys.Attention.Q_LORA_RANK),  # glm.py:475
        "qk_rope_head_dim": 0,
        "qk_nope_head_dim": g.integer(Keys.Attention.KEY_LENGTH_MLA),  # glm.py:480
        "v_head_dim": g.integer(Keys.Attention.VALUE_LENGTH_MLA),  # glm.py:481
        "index_n_heads": g.integer(Keys.Attention.Indexer.HEAD_COUNT),  # glm.py:484
        "index_head_dim": g.integer(Keys.Attention.Indexer.KEY_LENGTH),  # glm.py:485
        "index_topk": g.integer(Keys.Attention.Indexer.TOP_K),  # glm.py:486
        "index_kpool": g.integer(Keys.Attention.Indexer.KPOOL),  # glm.py:487
        "index_kpool_always_select_tail": bool(select_tail),  # glm.py:488
        "indexer_types": (["full" if full else "shared" for full in indexer_types] if indexer_types is not None
                          else ["full"] * n_layer),  # llama.cpp: every layer full when the key is absent
        "layer_types": layer_types,
        "mlp_layer_types": ["dense"] * n_layer,
        "linear_head_dim": g.integer(Keys.KDA.HEAD_DIM),  # glm.py:469
        "linear_num_heads": n_head,  # glm.py:467 asserts the KDA heads are the attention heads
        "linear_conv_kernel_dim": g.integer(Keys.SSM.CONV_KERNEL),  # glm.py:468
        "linear_lower_bound": (g.number(Keys.KDA.GATE_LOWER_BOUND) if g.optional(Keys.KDA.GATE_LOWER_BOUND) is not None
                               else None),  # glm.py:470-471: absent means the softplus decay
        "hc_mult": g.integer(Keys.HyperConnection.COUNT),  # glm.py:498
        "hc_sinkhorn_iters": g.integer(Keys.HyperConnection.SINKHORN_ITERATIONS),  # glm.py:499
        "hc_eps": g.number(Keys.HyperConnection.EPSILON),  # glm.py:500
        "rms_norm_eps": g.number(Keys.Attention.LAYERNORM_RMS_EPS),
        "swiglu_limit": float(clamps.pop()) if clamps else NO_CLAMP,  # glm.py:511-513
        "max_position_embeddings": g.integer(Keys.LLM.CONTEXT_LENGTH),
        "tie_word_embeddings": "output.weight" not in g,
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
    }
    return {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
            "text_config": text, "vision_config": {"model_type": "glm5_next_vision", **TINY_VISION,
                                                   "out_hidden_size": text["hidden_size"]},
            "tie_word_embeddings": text["tie_word_embeddings"]}


def indexer_epsilon_note(info: ModelInfo) -> str | None:
    """The finding when the file's indexer LayerNorm epsilon is not the one transformers fixes."""
    eps = info.header.fields.get(Keys.Attention.LAYERNORM_EPS.format(arch=info.architecture))
    if eps is None or abs(float(eps) - TRANSFORMERS_INDEXER_LN_EPS) <= 1e-12:
        return None
    return (f"{info.path.name} declares attention.layer_norm_epsilon {float(eps):.3g} (llama.cpp's indexer key "
            f"LayerNorm); transformers' glm5_next fixes it at {TRANSFORMERS_INDEXER_LN_EPS:g}")
