"""A trained model as a GGUF file the rest of kvphase uses like any model.

The blocks are llama.cpp's `gpt2` architecture (src/models/gpt2.cpp: tensor names and
shapes of `load_arch_tensors`), so the dense control runs in llama.cpp itself and every
file loads its vocabulary there. A compressed model adds, per layer, its gate
(`blk.N.attn_gate.weight`, per head (head_dim, head_dim)) and per-phase bias
(`blk.N.attn_gate_ape.weight`, per head (S, head_dim)), and declares the compressor under
`kvphase.trained.*`; llama.cpp cannot run it (extra tensors), the reference backend does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvphase.gguf.keys import Keys
from kvphase.gguf.writer import write_gguf
from kvphase.train.config import TrainConfig
from kvphase.train.export_common import shared_metadata
from kvphase.train.export_deepseek4 import deepseek4_file
from kvphase.train.export_glm5 import glm5_file
from kvphase.train.model import LN_EPS
from kvphase.train.vocab import WordVocab


def metadata(config: TrainConfig, vocab: WordVocab, step: int) -> dict:
    """Architecture, tokenizer and compressor keys of a trained gpt2 model."""
    return {
        Keys.LLM.CONTEXT_LENGTH.format(arch='gpt2'): config.n_positions,
        Keys.LLM.EMBEDDING_LENGTH.format(arch='gpt2'): config.d_model,
        Keys.LLM.FEED_FORWARD_LENGTH.format(arch='gpt2'): 4 * config.d_model,
        Keys.LLM.BLOCK_COUNT.format(arch='gpt2'): config.layers,
        Keys.Attention.HEAD_COUNT.format(arch='gpt2'): config.heads,
        Keys.Attention.HEAD_COUNT_KV.format(arch='gpt2'): config.heads,
        Keys.Attention.LAYERNORM_EPS.format(arch='gpt2'): LN_EPS,
        **shared_metadata(config, vocab, step),
    }


def tensors(params: dict, config: TrainConfig) -> list[tuple[str, np.ndarray]]:
    """Weights in numpy order (ggml's ne reversed): linear maps as (out, in)."""
    p = {k: np.asarray(v, dtype=np.float32) for k, v in params.items() if k != "blocks"}
    out = [
        ("token_embd.weight", p["wte"]),  # (n_vocab, d)
        ("position_embd.weight", p["wpe"]),  # (n_positions, d)
        ("output_norm.weight", p["lnf_g"]),
        ("output_norm.bias", p["lnf_b"]),
    ]
    for i, block in enumerate(params["blocks"]):
        b = {k: np.asarray(v, dtype=np.float32) for k, v in block.items()}
        out += [
            (f"blk.{i}.attn_norm.weight", b["ln1_g"]),
            (f"blk.{i}.attn_norm.bias", b["ln1_b"]),
            (f"blk.{i}.attn_qkv.weight", np.ascontiguousarray(b["w_qkv"].T)),  # (3d, d)
            (f"blk.{i}.attn_qkv.bias", b["b_qkv"]),
            (f"blk.{i}.attn_output.weight", np.ascontiguousarray(b["w_o"].T)),  # (d, d)
            (f"blk.{i}.attn_output.bias", b["b_o"]),
            (f"blk.{i}.ffn_norm.weight", b["ln2_g"]),
            (f"blk.{i}.ffn_norm.bias", b["ln2_b"]),
            (f"blk.{i}.ffn_up.weight", np.ascontiguousarray(b["w_up"].T)),  # (4d, d)
            (f"blk.{i}.ffn_up.bias", b["b_up"]),
            (f"blk.{i}.ffn_down.weight", np.ascontiguousarray(b["w_down"].T)),  # (d, 4d)
            (f"blk.{i}.ffn_down.bias", b["b_down"]),
        ]
        if "gate" in b and config.design != "meanpool":  # meanpool's gated start leaves a gate it no longer reads
            out += [
                (f"blk.{i}.attn_gate.weight", b["gate"]),  # (heads, head_dim in, head_dim out)
                (f"blk.{i}.attn_gate_ape.weight", b["ape"]),  # (heads, S, head_dim)
            ]
    return out


def export_gguf(path: str | Path, params: dict, config: TrainConfig, vocab: WordVocab, step: int) -> Path:
    """Write the model to `path` in its layout (atomically: a temporary file renamed into place)."""
    if config.layout == "deepseek4":
        arch, keys, weights = deepseek4_file(params, config, vocab, step)
    elif config.layout == "glm5-next":
        arch, keys, weights = glm5_file(params, config, vocab, step)
    else:
        arch, keys, weights = "gpt2", metadata(config, vocab, step), tensors(params, config)
    path = Path(path)
    write_gguf(path, arch, keys, weights)
    return path
