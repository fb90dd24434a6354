"""How closely the reference transformer reproduces llama.cpp's next-token logits.

Both see the same tokens of a natural English text (`prompts/natural-text.txt`, no BOS)
and every row's logits are compared: top-1 agreement, max and mean absolute difference.
`kvphase.gguf.writer.export_f32` writes a model's weights again as F32, dequantized by
`gguf` exactly as the reference reads them, so llama.cpp can run the very numbers the
reference runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from kvphase.defaults import default_threads, prompts_dir
from kvphase.errors import BackendError

__all__ = ["CLEAR_LEAD", "Agreement", "agreement", "lead", "llamacpp_logits", "natural_text"]

NATURAL_TEXT = prompts_dir() / "natural-text.txt"
# a token is no near-tie when its best logit leads the second by more than this; on the
# quantized file the reference's logits differ from llama.cpp's by ~0.15 on average
CLEAR_LEAD = 0.5


class Agreement(NamedTuple):
    top1: float  # share of rows whose argmax is the same
    max_diff: float  # largest absolute logit difference
    mean_diff: float  # mean absolute logit difference

    def __str__(self) -> str:
        return f"top-1 agreement {self.top1:.2%}, max abs diff {self.max_diff:.3g}, mean {self.mean_diff:.3g}"


def agreement(a: np.ndarray, b: np.ndarray) -> Agreement:
    """Compare two (n_tokens, n_vocab) logit arrays row by row."""
    diff = np.abs(a - b)  # (n_tokens, n_vocab)
    return Agreement(float(np.mean(a.argmax(1) == b.argmax(1))), float(diff.max()), float(diff.mean()))


def lead(logits: np.ndarray) -> np.ndarray:
    """How far each row's best token is ahead of the second best: (n_tokens,)."""
    top2 = np.partition(logits, -2, axis=1)[:, -2:]  # (n_tokens, 2)
    return top2[:, 1] - top2[:, 0]


def natural_text() -> str:
    return NATURAL_TEXT.read_text(encoding="utf-8")


def llamacpp_logits(path: str | Path, tokens: Sequence[int], *, kv_f32: bool = False, flash_attn: bool = False,
                    n_batch: int = 512, n_threads: int | None = None) -> np.ndarray:
    """Every row's logits from llama.cpp (one prompt from position 0, decoded n_batch tokens at
    a time): (n_tokens, n_vocab). The cache is F16, or F32 with `kv_f32`."""
    import llama_cpp

    from kvphase.engines import llamacpp as engine

    model = engine.load_model(path)
    if not model:
        raise BackendError(f"llama.cpp could not load {path}")
    ctx = batch = None
    try:
        ctx = engine.new_context(model, n_ctx=max(2048, len(tokens)), n_batch=n_batch, n_threads=n_threads or default_threads(),
                                 flash_attn=flash_attn, kv_f32=kv_f32, label=str(path))
        batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        out = []
        for lo in range(0, len(tokens), n_batch):
            rows = [(token, lo + i, 0, True) for i, token in enumerate(tokens[lo : lo + n_batch])]
            if engine.decode(ctx, batch, rows) != 0:
                raise BackendError(f"llama.cpp could not decode tokens {lo}-{lo + len(rows) - 1} of {path}")
            out.append(engine.logits(ctx, rows, n_vocab))  # (rows, n_vocab)
        return np.concatenate(out)  # (n_tokens, n_vocab)
    finally:
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
        if ctx:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
