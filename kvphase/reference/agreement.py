"""How closely the reference transformer reproduces llama.cpp's next-token logits.

Both see the same tokens of a natural English text (`prompts/natural-text.txt`, no BOS)
and every row's logits are compared: top-1 agreement, max and mean absolute difference.
`export_f32` writes a model's weights again as F32, dequantized by `gguf` exactly as the
reference reads them, so llama.cpp can run the very numbers the reference runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from kvphase.capture import GGML_TYPE_F32
from kvphase.tasks import PROMPTS_DIR

__all__ = ["CLEAR_LEAD", "GGML_TYPE_F32", "Agreement", "agreement", "export_f32", "lead", "llamacpp_logits", "natural_text"]

NATURAL_TEXT = PROMPTS_DIR / "natural-text.txt"
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

    `params` go to `llama_cpp.Llama`, e.g. `flash_attn=True` or `type_k=0, type_v=0` for
    an F32 KV cache."""
    import llama_cpp

    from kvphase.backends.llamacpp import silence_llama_logs

    silence_llama_logs()
    settings = {"n_ctx": max(2048, len(tokens)), "n_threads": 2, **params}
    llm = llama_cpp.Llama(str(path), logits_all=True, verbose=False, **settings)
    try:
        llm.eval(list(tokens))
        return np.array(llm.scores[: len(tokens)], dtype=np.float32)  # (n_tokens, n_vocab)
    finally:
        llm.close()


def export_f32(src: str | Path, dst: str | Path) -> None:
    """Write `src` again with every tensor dequantized to F32 by gguf (what the reference reads)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
    from gguf.quants import dequantize

    reader = GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if field.name == "general.file_type":
            writer.add_file_type(LlamaFileType.ALL_F32)
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, values.reshape([int(d) for d in tensor.shape[::-1]]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
