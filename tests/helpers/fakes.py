"""A backend with the llama.cpp backend's interface and no model, for fast unit tests
(in the spirit of simonw/llm's MockModel)."""

from __future__ import annotations

import re
from typing import Sequence

from kvphase.backends.base import Query, Score


class CharBackend:
    """One token per character, so segment tokenization always joins cleanly.

    A target is 'correct' when its first answer token is even: deterministic, and about
    half of the targets. `interrupt_after` raises KeyboardInterrupt on that score() call.
    """

    def __init__(self, prefix_ids: Sequence[int] = (), interrupt_after: int | None = None):
        self._prefix = list(prefix_ids)
        self.interrupt_after = interrupt_after
        self.calls = 0
        self.scored: list[Query] = []
        self.tokens_evaluated = 0
        self.n_threads = None
        self.closed = False

    @property
    def prefix_ids(self) -> list[int]:
        return self._prefix

    @property
    def n_ctx_train(self) -> int:
        return 1 << 16

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def detokenize(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)

    def score(self, context: Sequence[int], queries: Sequence[Query]) -> list[Score]:
        self.calls += 1
        if self.interrupt_after is not None and self.calls > self.interrupt_after:
            raise KeyboardInterrupt
        self.tokens_evaluated += len(context)
        self.scored += list(queries)
        return [Score(q.answer[0] % 2 == 0, -float(q.answer[0] % 7), tuple(q.answer)) for q in queries]

    def engine_info(self) -> dict:
        return {"engine": type(self).__name__}

    def close(self) -> None:
        self.closed = True


class WordBackend(CharBackend):
    """One token per word with the space before it, one per other character: records a few
    tokens long, as a real tokenizer makes them (CharBackend's are a few dozen)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ids: dict[str, int] = {}
        self._pieces: list[str] = []

    def tokenize(self, text: str) -> list[int]:
        return [self._id(piece) for piece in re.findall(r" ?\w+| ?[^\w ]| ", text)]

    def detokenize(self, ids: Sequence[int]) -> str:
        return "".join(self._pieces[i] for i in ids)

    def _id(self, piece: str) -> int:
        if piece not in self._ids:
            self._ids[piece] = len(self._pieces)
            self._pieces.append(piece)
        return self._ids[piece]


def validate_without_a_model_file(monkeypatch) -> None:
    """`kvphase validate` on a stand-in for a model file that is not there: the file is not opened
    and the check that it holds weights (validate refuses a header-only one first) is left out;
    tests/gguf/test_odd_inputs.py has that check."""
    from pathlib import Path
    from types import SimpleNamespace

    monkeypatch.setattr("kvphase.validate.run.read_model_info", lambda model: SimpleNamespace(header=None, path=Path(model)))
    monkeypatch.setattr("kvphase.gguf.header_only.require_weights", lambda model, command: None)
