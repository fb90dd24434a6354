"""How closely can a numpy model reproduce llama.cpp on a quantized file? Writes
reports/reference-agreement.md.

    .venv/bin/python reports/reference-agreement.py [MODEL.gguf]

Every row compares next-token logits over the first 1024 tokens of
prompts/natural-text.txt with those of llama.cpp's default run on the file (F16 KV
cache, no flash attention), except the first, which runs llama.cpp on an F32 export of
the weights the reference dequantizes. Rows:

- the reference (float32 throughout), against the F32 export and against the file;
- the reference imitating llama.cpp's CPU roundings (`LlamaCppRounding` below);
- llama.cpp itself under other settings that are just as correct: flash attention, an
  F32 KV cache, and smaller ubatches and one thread (which should change nothing);
- the same comparisons on the tokens that are no near-tie for llama.cpp, and how close
  the tokens the reference gets "wrong" are to a tie;
- one stage alone: each layer's feed-forward run on llama.cpp's captured input.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Quant

from kvphase.defaults import default_model_path
from kvphase.designs.windows import round_to_cache
from kvphase.gguf_header import read_gguf_header
from kvphase.reference.agreement import CLEAR_LEAD, GGML_TYPE_F32, agreement, export_f32, lead, llamacpp_logits, natural_text
from kvphase.reference.model import Transformer, dense_attention, load

N_TOKENS = 1024
N_STAGE_TOKENS = 256
OUT = Path(__file__).resolve().parent / "reference-agreement.md"
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

    def __init__(self, path: Path):
        config, weights = load(str(path))
        super().__init__(config, weights, policy=F16Attention())
        header = read_gguf_header(path)
        tensors = {t.name: t for t in header.tensors}
        raw = np.memmap(path, dtype=np.uint8, mode="r")  # (file_size,)

        def scheme(names: list[str]) -> tuple[int, np.ndarray | None]:
            kinds = {tensors[name].type_id for name in names}
            if len(kinds) != 1 or not kinds <= {Quant.F32, Quant.Q4_1, Quant.Q8_0}:
                sys.exit(f"LlamaCppRounding imitates F32, Q4_1 and Q8_0 weights only; {names} are types {kinds}")
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


def feed_forward_error(reference: Transformer, model: Path, tokens: list[int]) -> str:
    """Run each layer's feed-forward on llama.cpp's captured input and compare the outputs:
    the error of one stage, without the drift of the stages before it."""
    from kvphase.capture import EngineSettings, by_name, run_and_capture

    n = len(tokens)
    settings = EngineSettings(n_ctx=max(512, n), flash_attn=False, kv_f32=False)
    run = run_and_capture(model, tokens, [n], by_name(["ffn_inp", "ffn_out"]), settings)
    diffs = []
    for il, layer in enumerate(reference.w.layers[:-1]):  # the last layer keeps only the rows with logits
        given = run.all("ffn_inp", il, 0)[-1].array.reshape(n, -1)  # (n_tokens, n_embd)
        expected = run.all("ffn_out", il, 0)[-1].array.reshape(n, -1)  # (n_tokens, n_embd)
        diffs.append(np.abs(reference.feed_forward(layer, given) - expected))  # (n_tokens, n_embd)
    diff = np.stack(diffs)  # (n_layer, n_tokens, n_embd)
    return f"max abs diff {diff.max():.3g}, mean {diff.mean():.3g}"


def main() -> None:
    import llama_cpp

    model = Path(sys.argv[1]) if len(sys.argv) > 1 else default_model_path()
    vocab = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    tokens = vocab.tokenize(natural_text().encode(), add_bos=False)[:N_TOKENS]
    vocab.close()
    rows: list[tuple[str, str]] = []

    def row(label: str, logits: np.ndarray, against: np.ndarray) -> None:
        rows.append((label, str(agreement(logits, against))))
        print(f"{label}: {rows[-1][1]}", flush=True)

    default = llamacpp_logits(model, tokens)  # (n_tokens, n_vocab)
    reference = Transformer.from_gguf(model)
    exact = reference.forward(tokens, reference.new_cache())  # (n_tokens, n_vocab)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "f32.gguf"
        export_f32(model, f32)
        row("reference vs llama.cpp on the F32 export (F32 KV cache)",
            exact, llamacpp_logits(f32, tokens, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32))
    row("reference vs llama.cpp", exact, default)
    imitation = LlamaCppRounding(model)
    row("reference imitating llama.cpp's roundings vs llama.cpp",
        imitation.forward(tokens, imitation.new_cache()), default)
    variants = {
        "flash attention": {"flash_attn": True},
        "F32 KV cache": {"type_k": GGML_TYPE_F32, "type_v": GGML_TYPE_F32},
        "ubatch 128": {"n_batch": 128, "n_ubatch": 128},
        "one thread": {"n_threads": 1},
    }
    flash = None
    for name, params in variants.items():
        logits = llamacpp_logits(model, tokens, **params)  # (n_tokens, n_vocab)
        flash = logits if name == "flash attention" else flash
        row(f"llama.cpp with {name} vs llama.cpp", logits, default)
    clear = lead(default) > CLEAR_LEAD  # (n_tokens,) tokens that are no near-tie for llama.cpp
    where = f"on the {clear.mean():.0%} of tokens where llama.cpp's best token leads by more than {CLEAR_LEAD} logits"
    row(f"reference vs llama.cpp {where}", exact[clear], default[clear])
    row(f"llama.cpp with flash attention vs llama.cpp {where}", flash[clear], default[clear])
    missed = exact.argmax(1) != default.argmax(1)  # (n_tokens,)
    rows.append(("llama.cpp's lead at the tokens where the reference picks another",
                 f"max {lead(default)[missed].max():.3g}, median {np.median(lead(default)[missed]):.3g} logits"))
    print(f"{rows[-1][0]}: {rows[-1][1]}", flush=True)
    for label, model_ in (("reference", reference), ("imitation", imitation)):
        rows.append((f"{label}'s feed-forward of every layer from llama.cpp's own input, {N_STAGE_TOKENS} tokens",
                     feed_forward_error(model_, model, tokens[:N_STAGE_TOKENS])))
        print(f"{rows[-1][0]}: {rows[-1][1]}", flush=True)
    table = "\n".join(f"| {label} | {result} |" for label, result in rows)
    OUT.write_text(
        f"# The reference model against llama.cpp on {model.name}\n\n"
        f"Written by `reports/reference-agreement.py`; next-token logits over the first {len(tokens)} tokens of "
        "`prompts/natural-text.txt`, compared with llama.cpp's default run on the file (F16 KV cache, "
        "no flash attention) unless the row says otherwise.\n\n"
        f"| comparison | result |\n|---|---|\n{table}\n",
        encoding="utf-8",
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
