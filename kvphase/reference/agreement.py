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
from kvphase.engines.llamacpp import GGML_TYPE_F32, high_level_llama, silence_llama_logs

__all__ = ["CLEAR_LEAD", "GGML_TYPE_F32", "Agreement", "agreement", "lead", "llamacpp_logits", "natural_text"]

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


def llamacpp_logits(path: str | Path, tokens: Sequence[int], **params) -> np.ndarray:
    """Every row's logits from llama.cpp (one prompt from position 0): (n_tokens, n_vocab).

    `params` go to `llama_cpp.Llama` (through `high_level_llama`, which keeps weight repacking
    off where it crashes), e.g. `flash_attn=True` or `type_k=0, type_v=0` for an F32 KV cache."""
    silence_llama_logs()
    settings = {"n_ctx": max(2048, len(tokens)), "n_threads": default_threads(), **params}
    llm = high_level_llama(path, logits_all=True, verbose=False, **settings)
    try:
        llm.eval(list(tokens))
        return np.array(llm.scores[: len(tokens)], dtype=np.float32)  # (n_tokens, n_vocab)
    finally:
        llm.close()
