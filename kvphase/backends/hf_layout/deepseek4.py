"""A deepseek4 GGUF as the DeepSeek-V4 checkpoint llama.cpp's converter reads: llama.cpp's converter read
backwards, in the layout transformers' `deepseek_v4` loads.

Sources (llama-cpp-python 0.3.36's vendored llama.cpp, `vendor/llama.cpp/`):
- tensor names: `conversion/deepseek.py:809-867` (`DeepseekV4Model._map_dsv4_tensor_name`: the checkpoint's
  name -> MODEL_TENSOR) with `gguf-py/gguf/constants.py:1428-1690` (MODEL_TENSOR -> the GGUF name). The
  converter passes every tensor's values through unchanged (`modify_tensors`, deepseek.py:880-893: no
  permutation, split or transpose); numpy's order of a GGUF tensor (ggml's ne reversed) is torch's.
- routed experts: the checkpoint holds one (out, in) matrix per expert, `layers.N.ffn.experts.E.w1/w2/w3`,
  which the converter stacks into `ffn_gate_exps` / `ffn_down_exps` / `ffn_up_exps` (deepseek.py:721-745,
  783-785); here they are unstacked. (The converter also repacks them to MXFP4 from FP8 with scales; this
  file's experts are float, so they are written float32 with no `.scale`.)
- config.json: `DeepseekV4Model.set_gguf_parameters` (deepseek.py:659-689) and `TextModel.set_gguf_parameters`
  (conversion/base.py:1434-1545) read backwards, GGUF key -> config key (`CONFIG_KEYS`).

transformers 5.25 loads those checkpoint names through its own renaming (`conversion_mapping.py:787-838`,
"deepseek_v4": `layers.N.attn.wq_a` -> `model.layers.N.self_attn.q_a_proj`, the experts merged into
`gate_up_proj` / `down_proj`), as it loads a released DeepSeek-V4 checkpoint.

Two keys mean something else in transformers, and are written as what llama.cpp computes:
- `swiglu_clamp_exp` 0 is "no clamp" in llama.cpp; transformers always clamps at `swiglu_limit`, so 0 is
  written as float32's largest value (no activation reaches it).
- llama.cpp's per-layer compress ratio (0, 4, or an HCA ratio) is transformers' `layer_types` plus
  `compress_rates`: 4 is "compressed_sparse_attention" (the overlapped compressor and the indexer: llama.cpp
  ties both to ratio 4), any other ratio above 1 "heavily_compressed_attention".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from kvphase.errors import ModelFileError, PlanError
from kvphase.gguf.keys import Keys
from kvphase.gguf.metadata import Metadata
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.gguf.tensors import tensor_array

ARCH = "deepseek4"
NO_CLAMP = float(np.finfo(np.float32).max)  # transformers' clamp limit that never clamps (llama.cpp's 0)
CSA = 4  # the only ratio llama.cpp builds the overlapped compressor and the indexer for

# GGUF name -> checkpoint name: constants.py:1428-1690 (GGUF names) against deepseek.py:810-817 (root)
ROOT_NAMES = {
    "token_embd.weight": "embed.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "head.weight",
    "output_hc_fn.weight": "hc_head_fn",
    "output_hc_base.weight": "hc_head_base",
    "output_hc_scale.weight": "hc_head_scale",
}
# blk.N.<GGUF> -> layers.N.<checkpoint>: deepseek.py:829-862
LAYER_NAMES = {
    "hc_attn_fn.weight": "hc_attn_fn", "hc_attn_base.weight": "hc_attn_base", "hc_attn_scale.weight": "hc_attn_scale",
    "hc_ffn_fn.weight": "hc_ffn_fn", "hc_ffn_base.weight": "hc_ffn_base", "hc_ffn_scale.weight": "hc_ffn_scale",
    "attn_sinks.weight": "attn.attn_sink",
    "attn_q_a.weight": "attn.wq_a.weight",
    "attn_q_b.weight": "attn.wq_b.weight",
    "attn_q_a_norm.weight": "attn.q_norm.weight",
    "attn_kv.weight": "attn.wkv.weight",
    "attn_kv_a_norm.weight": "attn.kv_norm.weight",  # ATTN_KV_NORM is spelled attn_kv_a_norm (constants.py:1581)
    "attn_output_a.weight": "attn.wo_a.weight",
    "attn_output_b.weight": "attn.wo_b.weight",
    "attn_compressor_ape.weight": "attn.compressor.ape",
    "attn_compressor_kv.weight": "attn.compressor.wkv.weight",
    "attn_compressor_gate.weight": "attn.compressor.wgate.weight",
    "attn_compressor_norm.weight": "attn.compressor.norm.weight",
    "indexer.attn_q_b.weight": "attn.indexer.wq_b.weight",
    "indexer.proj.weight": "attn.indexer.weights_proj.weight",
    "indexer_compressor_ape.weight": "attn.indexer.compressor.ape",
    "indexer_compressor_kv.weight": "attn.indexer.compressor.wkv.weight",
    "indexer_compressor_gate.weight": "attn.indexer.compressor.wgate.weight",
    "indexer_compressor_norm.weight": "attn.indexer.compressor.norm.weight",
    "attn_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate_inp.weight": "ffn.gate.weight",
    "exp_probs_b.bias": "ffn.gate.bias",
    "ffn_gate_shexp.weight": "ffn.shared_experts.w1.weight",
    "ffn_down_shexp.weight": "ffn.shared_experts.w2.weight",
    "ffn_up_shexp.weight": "ffn.shared_experts.w3.weight",
}
# the stacked routed experts -> each expert's matrix (deepseek.py:783-785: w1 gate, w2 down, w3 up)
EXPERT_NAMES = {"ffn_gate_exps.weight": "w1", "ffn_down_exps.weight": "w2", "ffn_up_exps.weight": "w3"}
GATING = {1: "softmax", 2: "sigmoid", 4: "sqrtsoftplus"}  # constants.py:5801-5804, base.py:1531-1536 backwards


def checkpoint_tensors(info: ModelInfo) -> dict[str, np.ndarray]:
    """Every tensor of the file under the name the converter reads it from, in torch's (out, in) order."""
    raw = np.memmap(info.path, dtype=np.uint8, mode="r")
    out: dict[str, np.ndarray] = {}
    for tensor in info.header.tensors:
        name = tensor.name
        array = tensor_array(raw, tensor)
        if name in ROOT_NAMES:
            out[ROOT_NAMES[name]] = array
            continue
        match = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
        suffix = match.group(2) if match else None
        if suffix in LAYER_NAMES:
            out[f"layers.{match.group(1)}.{LAYER_NAMES[suffix]}"] = array
        elif suffix in EXPERT_NAMES:
            for expert, matrix in enumerate(array):  # (n_expert, out, in)
                out[f"layers.{match.group(1)}.ffn.experts.{expert}.{EXPERT_NAMES[suffix]}.weight"] = matrix
        else:
            raise PlanError(f"{info.path.name}: tensor {name} has no DeepSeek-V4 checkpoint name "
                            "(llama.cpp's converter writes none such)")
    return {name: np.ascontiguousarray(array, dtype=np.float32) for name, array in out.items()}


def checkpoint_config(info: ModelInfo) -> dict:
    """config.json for transformers' DeepseekV4Config; a GGUF key transformers cannot express is refused by name."""
    meta = Metadata(info.header)
    key = lambda name: name.format(arch=ARCH)  # noqa: E731
    n_layer = meta.integer(key(Keys.LLM.BLOCK_COUNT), low=1)
    head_dim = meta.integer(key(Keys.Attention.KEY_LENGTH), low=1)
    if meta.integer(key(Keys.Attention.VALUE_LENGTH), head_dim) != head_dim:
        raise meta.bad(key(Keys.Attention.VALUE_LENGTH), meta.get(key(Keys.Attention.VALUE_LENGTH)),
                       f"{head_dim}, the key length (DeepSeek-V4 reads one K = V head)")
    if meta.integer(key(Keys.Attention.HEAD_COUNT_KV), 1) != 1:
        raise meta.bad(key(Keys.Attention.HEAD_COUNT_KV), meta.get(key(Keys.Attention.HEAD_COUNT_KV)), "1 (one K = V head)")
    if meta.get(key(Keys.Rope.SCALING_TYPE), "none") != "none":
        raise PlanError(f"{info.path.name}: {key(Keys.Rope.SCALING_TYPE)} is {meta.get(key(Keys.Rope.SCALING_TYPE))!r}; "
                        "export-hf writes deepseek4 files without RoPE scaling")
    layer_types, rates = _layer_types(meta, n_layer)
    gating = meta.integer(key(Keys.LLM.EXPERT_GATING_FUNC), 4)
    if gating not in GATING:
        raise meta.bad(key(Keys.LLM.EXPERT_GATING_FUNC), gating, f"one of {GATING} (llama.cpp's gating functions)")
    n_rot = meta.integer(key(Keys.Rope.DIMENSION_COUNT), low=0, high=head_dim)
    bos = meta.integer(Keys.Tokenizer.BOS_ID, 0)
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": int(info.vocab_size or meta.integer(key(Keys.LLM.VOCAB_SIZE), low=1)),
        "hidden_size": meta.integer(key(Keys.LLM.EMBEDDING_LENGTH), low=1),
        "num_hidden_layers": n_layer,
        "num_attention_heads": meta.integer(key(Keys.Attention.HEAD_COUNT), low=1),
        "num_key_value_heads": 1,
        "head_dim": head_dim,
        "partial_rotary_factor": n_rot / head_dim,
        "q_lora_rank": meta.integer(key(Keys.Attention.Q_LORA_RANK), low=1),
        "max_position_embeddings": meta.integer(key(Keys.LLM.CONTEXT_LENGTH), low=1),
        "rms_norm_eps": meta.number(key(Keys.Attention.LAYERNORM_RMS_EPS)),
        "rope_theta": meta.number(key(Keys.Rope.FREQ_BASE), 10000.0),
        "compress_rope_theta": meta.number(key(Keys.Attention.COMPRESS_ROPE_FREQ_BASE)),
        "layer_types": layer_types,
        "compress_rates": rates,
        "sliding_window": meta.integer(key(Keys.Attention.SLIDING_WINDOW), low=1),
        "index_n_heads": meta.integer(key(Keys.Attention.Indexer.HEAD_COUNT), low=1),
        "index_head_dim": meta.integer(key(Keys.Attention.Indexer.KEY_LENGTH), low=1),
        "index_topk": meta.integer(key(Keys.Attention.Indexer.TOP_K), low=1),
        "o_groups": meta.integer(key(Keys.Attention.OUTPUT_GROUP_COUNT), low=1),
        "o_lora_rank": meta.integer(key(Keys.Attention.OUTPUT_LORA_RANK), low=1),
        "n_routed_experts": meta.integer(key(Keys.LLM.EXPERT_COUNT), low=1),
        "num_experts_per_tok": meta.integer(key(Keys.LLM.EXPERT_USED_COUNT), low=1),
        "moe_intermediate_size": meta.integer(key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH), low=1),
        "n_shared_experts": _one_shared_expert(meta),
        "scoring_func": GATING[gating],
        "norm_topk_prob": bool(meta.get(key(Keys.LLM.EXPERT_WEIGHTS_NORM), True)),
        "routed_scaling_factor": meta.number(key(Keys.LLM.EXPERT_WEIGHTS_SCALE), 1.0),
        "swiglu_limit": _swiglu_limit(meta, n_layer),
        "hc_mult": meta.integer(key(Keys.HyperConnection.COUNT), low=1),
        "hc_sinkhorn_iters": meta.integer(key(Keys.HyperConnection.SINKHORN_ITERATIONS), low=1),
        "hc_eps": meta.number(key(Keys.HyperConnection.EPSILON)),
        "mlp_layer_types": _mlp_layer_types(meta, n_layer),
        "num_nextn_predict_layers": 0,
        "tie_word_embeddings": False,
        "bos_token_id": bos,
        "eos_token_id": meta.integer(Keys.Tokenizer.EOS_ID, bos),
        "torch_dtype": "float32",
        **trained_keys(info),
    }


def trained_keys(info: ModelInfo) -> dict:
    """A `kvphase train` file's kvphase.trained.* keys, copied into config.json (`checkpoint.TRAINED_KEYS`):
    its plan (the context its questions sit at, the default stride and modulus) depends on them."""
    from kvphase.gguf.checkpoint import TRAINED_KEYS
    from kvphase.gguf.trained import TRAINED_PREFIX

    keys = {name: value for name, value in info.header.fields.items() if name.startswith(TRAINED_PREFIX)}
    return {TRAINED_KEYS: keys} if keys else {}


def _layer_types(meta: Metadata, n_layer: int) -> tuple[list[str], dict[str, int]]:
    """llama.cpp's per-layer compress ratios as transformers' layer types and their rates."""
    name = Keys.Attention.COMPRESS_RATIOS.format(arch=ARCH)
    ratios = meta.integers(name, low=0)
    ratios = ratios * n_layer if len(ratios) == 1 else ratios
    if len(ratios) != n_layer:
        raise meta.bad(name, ratios, f"{n_layer} per-layer ratios (block_count)")
    hca = sorted({r for r in ratios if r not in (0, CSA)})
    if 1 in hca or len(hca) > 1:
        raise meta.bad(name, ratios, "ratios 0, 4 and at most one other ratio above 1 (transformers has one "
                                     "heavily_compressed_attention rate)")
    kinds = {0: "sliding_attention", CSA: "compressed_sparse_attention"}
    rates = {"compressed_sparse_attention": CSA, "heavily_compressed_attention": hca[0] if hca else 128}
    return [kinds.get(r, "heavily_compressed_attention") for r in ratios], rates


def _swiglu_limit(meta: Metadata, n_layer: int) -> float:
    name = Keys.LLM.SWIGLU_CLAMP_EXP.format(arch=ARCH)
    value = meta.get(name, [0.0])
    values = value if isinstance(value, list) else [value]
    if len(set(float(v) for v in values)) != 1:
        raise meta.bad(name, value, "one clamp for every layer (transformers has one swiglu_limit)")
    limit = float(values[0])
    return NO_CLAMP if limit <= 0 else limit


def _one_shared_expert(meta: Metadata) -> int:
    name = Keys.LLM.EXPERT_SHARED_COUNT.format(arch=ARCH)
    if meta.integer(name, 1) != 1:
        raise meta.bad(name, meta.get(name), "1 (transformers builds one shared expert)")
    return 1


def _mlp_layer_types(meta: Metadata, n_layer: int) -> list[str]:
    name = Keys.LLM.HASH_LAYER_COUNT.format(arch=ARCH)
    n_hash = meta.integer(name, 0, high=n_layer)
    if n_hash:
        raise meta.bad(name, n_hash, "0: hash-routed layers need the checkpoint's tid2eid table, which the "
                                     "converter leaves out of the GGUF")
    return ["moe"] * n_layer


def write_deepseek4(info: ModelInfo, folder: Path) -> int:
    """Write config.json, model.safetensors and the tokenizer of a deepseek4 GGUF into `folder`;
    the number of parameters written."""
    from safetensors.numpy import save_file

    from kvphase.backends.hf_layout.tokenizer import write_gguf_tokenizer

    if info.architecture != ARCH:
        raise ModelFileError(f"{info.path.name} is {info.architecture}, not {ARCH}")
    config = checkpoint_config(info)
    tensors = checkpoint_tensors(info)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_gguf_tokenizer(info, folder)
    return sum(int(a.size) for a in tensors.values())
