"""An HF checkpoint's tokenizer (its tokenizer.json) as a sweep uses a vocabulary: text <-> ids with
no special tokens parsed, and the ids the checkpoint's post-processor puts before every sequence.
It runs in the `tokenizers` library (Rust, no torch), so a plan over a checkpoint is laid out
without loading transformers' models (`backends.base.Tokenizer`)."""

from __future__ import annotations

from typing import Sequence

from kvphase.errors import ModelFileError
from kvphase.gguf.checkpoint import TOKENIZER
from kvphase.gguf.modelinfo import ModelInfo


class CheckpointVocab:
    def __init__(self, info: ModelInfo):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ModelFileError(f"{info.path} is an HF checkpoint: reading it needs the hf extra "
                                 "(pip install 'kvphase[hf]')") from None
        path = info.path / TOKENIZER
        if not path.is_file():
            raise ModelFileError(f"{info.path} holds no {TOKENIZER}, so no prompt can be built with its tokenizer")
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust library raises its own Exception subclass for any bad file
            raise ModelFileError(f"{path} is not a tokenizer the tokenizers library reads ({str(exc)[:80]})") from None
        self.n_vocab = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.n_ctx_train = info.context_length
        self.architecture = info.architecture

    @property
    def prefix_ids(self) -> list[int]:
        """What the post-processor adds before a text (BOS where the checkpoint adds one)."""
        bare = self._tokenizer.encode("a", add_special_tokens=False).ids
        full = self._tokenizer.encode("a", add_special_tokens=True).ids
        start = next((i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare), 0)
        return list(full[:start])

    def tokenize(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode([int(t) for t in ids], skip_special_tokens=False)

    def close(self) -> None:
        """Nothing to free (the Rust object goes with this one)."""
