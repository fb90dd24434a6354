"""glm5-next in llama.cpp 0.3.36: a text's answer on sequence 1 while sequence 0 holds another text,
against the same text with sequence 0 empty (issue 62, the two-slots path; docs/conform.md).

llama.cpp lays a token's k-pool indexer row out sequence by sequence (`set_input_kpool`,
src/llama-memory-hybrid-idx.cpp), so what sequence 0 holds shifts where sequence 1's pools sit,
and its CPU top-k (a `std::partial_sort`) then keeps another of pools whose scores tie exactly.
llama-server's slots are sequences: this is the in-process form of its two-slots path, one
sequence decoded after the other (a graph tap reads positions, so the two are not batched
together here). For each random pair of texts it prints how far the answer moved and where the
indexer's kept pools first differ (`kvphase.conform.ties.first_tie`), then how many moved beyond
the paths' tolerance and how many of those an indexer tie explains.

    python scripts/glm5_two_sequences_repro.py [MODEL] [--texts 20] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np

from kvphase.backends.base import log_softmax_rows
from kvphase.backends.llamacpp import LlamaCppBackend
from kvphase.conform.paths import PATH_TOLERANCE
from kvphase.conform.ties import first_tie, recorded


def answer_beside(backend: LlamaCppBackend, text: list[int], other: list[int]) -> np.ndarray:
    """The last 4 tokens' log-probabilities, `text` decoded on sequence 1 after `other` on sequence 0."""
    backend._lc.llama_memory_clear(backend._memory, True)
    backend._context = None  # the backend's cached context is gone
    if other:
        backend._decode([(t, i, 0, False) for i, t in enumerate(other)], query=True)
    rows = [(t, i, 1, i >= len(text) - 5) for i, t in enumerate(text[:-1])]
    backend._decode(rows, query=True)
    return log_softmax_rows(backend._requested_logits(rows))[np.arange(4), text[-4:]]  # (4,)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="tests/data/conform/glm5-next-random.gguf")
    parser.add_argument("--texts", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    backend = LlamaCppBackend(args.model, n_ctx=1024, n_threads=1, head_tap=True)
    rng = np.random.default_rng(args.seed)
    moved = explained = 0
    for _ in range(args.texts):
        n, n_other = int(rng.integers(60, 140)), int(rng.integers(8, 140))
        text, other = rng.integers(0, backend.n_vocab, n).tolist(), rng.integers(0, backend.n_vocab, n_other).tolist()
        alone, one = recorded(backend, lambda b: answer_beside(b, text, []))
        beside, two = recorded(backend, lambda b: answer_beside(b, text, other))
        difference, tie = float(np.abs(beside - alone).max()), first_tie(one, two)
        if difference > PATH_TOLERANCE:
            moved, explained = moved + 1, explained + (tie is not None)
        print(f"{n} tokens beside {n_other}: moved {difference:.3g} nats; "
              f"{tie.phrase() if tie else 'the indexer kept the same pools at every token'}")
    print(f"{moved} of {args.texts} texts moved beyond {PATH_TOLERANCE} nats; an indexer tie explains {explained}")
    backend.close()


if __name__ == "__main__":
    main()
