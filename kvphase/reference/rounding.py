"""The reference model rounding where llama.cpp's CPU backend rounds (ggml-cpu, x86).

ggml-cpu multiplies quantized weights with activations quantized to 8-bit blocks
(`quantize_row_q8_0` / `quantize_row_q8_1`), and with an F16 KV cache and no flash attention
it multiplies F16 queries, keys, values and softmax weights. `LlamaCppRounding` is the
reference transformer with those roundings, used by scripts/reference_agreement.py to
measure how much of the reference's distance to llama.cpp they explain.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Quant

from kvphase.designs.windows import round_to_cache
from kvphase.errors import PlanError
from kvphase.gguf.modelinfo import ModelInfo, as_model_info
from kvphase.reference.model import Transformer, dense_attention, load

Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of 4-bit quants per 32 weights


def round_f16(a: np.ndarray) -> np.ndarray:
    return round_to_cache(a, "f16")


def quantize_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml-cpu's x86 quantize_row_q8_0/q8_1: blocks of 32, scale amax/127 stored as fp16.

    Returns the dequantized activations (n, K) and, for Q8_1, the error of its fp16 block
    sums s = fp16(d * sum(q)) against fp16(d) * sum(q): (n, K/32)."""
    n, width = x.shape
    blocks = x.reshape(n, width // 32, 32)  # (n, n_blocks, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)  # (n, n_blocks, 1)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax != 0, np.float32(127) / amax, np.float32(0))  # (n, n_blocks, 1)
    q = np.rint(blocks * inverse)  # (n, n_blocks, 32), round half to even like _MM_ROUND_NEAREST
    d = amax[..., 0] / np.float32(127)  # (n, n_blocks)
    sums = q.sum(axis=-1)  # (n, n_blocks)
    dequantized = (q * round_f16(d)[..., None]).reshape(n, width)  # (n, K)
    return dequantized, round_f16(d * sums) - round_f16(d) * sums


class F16Attention:
    """Dense attention over F16 queries, keys and values with F16 softmax weights, as
    llama.cpp's non-flash path multiplies them with an F16 cache."""

    def attend(self, layer, q, k, v, q_pos, scale):
        return dense_attention(round_f16(q), round_f16(k), round_f16(v), q_pos, scale, f16_probs=True)


class LlamaCppRounding(Transformer):
    """The reference rounding where ggml-cpu rounds: each matmul input to 8-bit blocks
    (Q8_0 for Q8_0 weights; Q8_1 for Q4_1 weights, whose dot product adds the weights'
    block minimums times the activations' fp16 block sums), attention in F16."""

    def __init__(self, model: Path | ModelInfo):
        info = as_model_info(model)
        config, weights = load(info)
        super().__init__(config, weights, policy=F16Attention())
        tensors = {t.name: t for t in info.header.tensors}
        raw = np.memmap(info.path, dtype=np.uint8, mode="r")  # (file_size,)

        def scheme(names: list[str]) -> tuple[int, np.ndarray | None]:
            kinds = {tensors[name].type_id for name in names}
            if len(kinds) != 1 or not kinds <= {Quant.F32, Quant.Q4_1, Quant.Q8_0}:
                raise PlanError(f"LlamaCppRounding imitates F32, Q4_1 and Q8_0 weights only; {names} are types {kinds}")
            kind = kinds.pop()
            if kind != Quant.Q4_1:
                return kind, None
            mins = []
            for name in names:
                t = tensors[name]
                blocks = raw[t.data_offset : t.data_offset + t.n_bytes].reshape(-1, Q4_1_BLOCK_BYTES)  # (n_blocks_total, 20)
                m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)  # (n_blocks_total, 1)
                mins.append(m.reshape(t.shape[1], t.shape[0] // 32))  # (n_out, n_blocks)
            return kind, np.concatenate(mins).T  # (n_blocks, n_out)

        self.schemes = {}
        for i, layer in enumerate(weights.layers):
            p = f"blk.{i}."
            self.schemes[id(layer.wqkv)] = scheme([p + f"attn_{x}.weight" for x in "qkv"])
            self.schemes[id(layer.wo)] = scheme([p + "attn_output.weight"])
            self.schemes[id(layer.w_gate_up)] = scheme([p + "ffn_gate.weight", p + "ffn_up.weight"])
            self.schemes[id(layer.w_down)] = scheme([p + "ffn_down.weight"])
        self.schemes[id(weights.output)] = scheme(["token_embd.weight" if config.tied_output else "output.weight"])

    def linear(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        kind, mins = self.schemes[id(weight)]
        if kind == Quant.F32:
            return x @ weight  # (n, n_out)
        activations, sum_error = quantize_q8(x)  # (n, K), (n, K/32)
        out = activations @ weight  # (n, n_out)
        return out if mins is None else out + sum_error @ mins  # (n, n_out)
