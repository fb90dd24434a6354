"""How closely can a numpy model reproduce llama.cpp on a quantized file? Writes
reports/reference-agreement.md.

    .venv/bin/python scripts/reference_agreement.py [MODEL.gguf]

Every row compares next-token logits over the first 1024 tokens of
prompts/natural-text.txt with those of llama.cpp's default run on the file (F16 KV
cache, no flash attention), except the first, which runs llama.cpp on an F32 export of
the weights the reference dequantizes. Rows:

- the reference (float32 throughout), against the F32 export and against the file;
- the reference imitating llama.cpp's CPU roundings (`kvphase.reference.rounding.LlamaCppRounding`);
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

from kvphase.defaults import default_model_path
from kvphase.reference.agreement import CLEAR_LEAD, GGML_TYPE_F32, agreement, lead, llamacpp_logits, natural_text
from kvphase.gguf.writer import export_f32
from kvphase.reference.model import Transformer
from kvphase.reference.rounding import LlamaCppRounding

N_TOKENS = 1024
N_STAGE_TOKENS = 256
OUT = Path(__file__).resolve().parent.parent / "reports" / "reference-agreement.md"


def feed_forward_error(reference: Transformer, model: Path, tokens: list[int]) -> str:
    """Run each layer's feed-forward on llama.cpp's captured input and compare the outputs:
    the error of one stage, without the drift of the stages before it."""
    from kvphase.engines.capture import EngineSettings, by_name, run_and_capture

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
        f"Written by `scripts/reference_agreement.py`; next-token logits over the first {len(tokens)} tokens of "
        "`prompts/natural-text.txt`, compared with llama.cpp's default run on the file (F16 KV cache, "
        "no flash attention) unless the row says otherwise.\n\n"
        f"| comparison | result |\n|---|---|\n{table}\n",
        encoding="utf-8",
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
