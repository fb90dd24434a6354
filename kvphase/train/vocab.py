"""The word-level vocabulary of kvphase's trained models, written as a GPT-2 BPE tokenizer.

Every word of the training task (keys, values, filler) is one token, so a sweep's probes
are token for token what the model was trained on. The vocabulary is stored the way
llama.cpp reads a GPT-2 byte-level BPE (`tokenizer.ggml.model = "gpt2"`): 256 byte
symbols, then for every word " w1w2...wn" the merges "Ġ w1", "Ġw1 w2", ... that build
it from the left. Merges only ever extend a prefix that starts with "Ġ", so llama.cpp's
BPE (lowest merge rank first) always assembles the whole word and nothing else; a test
checks llama.cpp's tokenizer against `encode`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from kvphase.errors import PlanError

BOS = "<|endoftext|>"


@functools.lru_cache(maxsize=1)
def byte_symbols() -> tuple[str, ...]:
    """GPT-2's printable stand-in for each byte (openai/gpt-2 encoder.py `bytes_to_unicode`)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


def symbol_text(text: str) -> str:
    """Text as GPT-2 byte symbols (" cat" -> "Ġcat")."""
    symbols = byte_symbols()
    return "".join(symbols[b] for b in text.encode("utf-8"))


@dataclass(frozen=True)
class WordVocab:
    """Token strings (GPT-2 byte symbols) and merges; id 0 is BOS, ids 1..256 the bytes."""

    tokens: tuple[str, ...]
    merges: tuple[str, ...]

    @classmethod
    def of_words(cls, words) -> WordVocab:
        """A vocabulary in which " word" is one token for every word (alphabetic ASCII only)."""
        tokens = [BOS, *byte_symbols()]
        known, merges = set(tokens), []
        for word in dict.fromkeys(words):
            if not word.isascii() or not word.isalpha():
                raise PlanError(f"trained vocabularies hold alphabetic ASCII words, got {word!r}")
            text = symbol_text(" " + word)
            for end in range(2, len(text) + 1):
                piece = text[:end]
                if piece not in known:
                    merges.append(f"{text[: end - 1]} {text[end - 1]}")
                    tokens.append(piece)
                    known.add(piece)
        return cls(tuple(tokens), tuple(merges))

    @property
    def bos_id(self) -> int:
        return 0

    @functools.cached_property
    def _ids(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}

    def word_id(self, word: str) -> int:
        """The id of " word"."""
        try:
            return self._ids[symbol_text(" " + word)]
        except KeyError:
            raise PlanError(f"{word!r} is not a word of this vocabulary") from None

    def encode(self, text: str) -> list[int]:
        """Ids of space-separated words (" a b" -> [id(" a"), id(" b")])."""
        return [self.word_id(w) for w in text.split()]

    def __len__(self) -> int:
        return len(self.tokens)
