"""glm5-next in llama.cpp 0.3.36: one text's answer moves with where its prompt is split into a
context and a query on a copy of it, because the k-pool indexer's scores tie exactly and llama.cpp
breaks the tie by slot order (issue 62; docs/conform.md, "Indexer ties").

The conform reference tests/data/conform/glm5-next-random.gguf (random weights, k-pool 4, top-k 8
tokens with the tail), a 72-token text of random ids (seed 0): the last 4 tokens' log-probabilities
when the first `split` tokens are decoded into sequence 0 and the rest on a copy of it (as kvphase
scores a query), each minus the whole text decoded in one batch; and where the indexer's kept pools
first differ from one batch's (`kvphase.conform.ties.first_tie`). At position 64, layer 0's
scores tie at exactly 0 at the edge of the two pools kept; a query on a copy lays its pools out
after the context's, and libstdc++'s partial sort then keeps another of the tied pools, so every
split whose query holds position 64 moves and every other agrees.

`--identity-hc` runs a copy of the file whose hyper-connections are the identity (every hc fn
zero), which kvphase's numpy glm5-next reference runs, and prints its float64 answer beside.

    python scripts/glm5_split_repro.py [--seed 0] [--identity-hc] [--splits 8 16 32 56 60 63 64 65 66 67]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np

from kvphase.backends.base import Query, log_softmax_rows
from kvphase.backends.llamacpp import LlamaCppBackend
from kvphase.conform.ties import first_tie, recorded

MODEL = "tests/data/conform/glm5-next-random.gguf"


def identity_hc_copy(model: str, folder: Path) -> Path:
    """A copy of `model` with identity hyper-connections (`reference.deepseek4.identity_hc_base`)."""
    from kvphase.gguf.header import read_gguf_header
    from kvphase.reference.deepseek4 import identity_hc_base

    path = shutil.copy(model, folder / "glm5-next-random-identity-hc.gguf")
    raw = np.memmap(path, dtype=np.uint8, mode="r+")
    for t in read_gguf_header(path).tensors:
        if t.name.endswith(("_fn.weight", "_base.weight")):
            values = raw[t.data_offset:t.data_offset + t.n_bytes].view(np.float32)  # F32 in the tiny files
            values[:] = 0 if t.name.endswith("_fn.weight") else identity_hc_base(values.size)
    raw.flush()
    return Path(path)


def reference_answer(model: Path, tokens: list[int]) -> np.ndarray:
    """The numpy reference's log-probabilities of the last 4 tokens, weights in float64."""
    from kvphase.reference.deepseek4 import TokenCache
    from kvphase.reference.glm5 import Glm5Next

    loaded = Glm5Next.from_gguf(model)
    model64 = Glm5Next(loaded.config, {name: w.astype(np.float64) for name, w in loaded.w.items()})
    rows = log_softmax_rows(model64.forward(tokens[:-1], TokenCache(), logits_for=range(len(tokens) - 5, len(tokens) - 1)))
    return rows[np.arange(4), tokens[-4:]]  # (4,)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--identity-hc", action="store_true")
    parser.add_argument("--splits", type=int, nargs="+", default=[8, 16, 32, 56, 60, 63, 64, 65, 66, 67])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = identity_hc_copy(MODEL, Path(folder)) if args.identity_hc else Path(MODEL)
        backend = LlamaCppBackend(model, n_ctx=1024, n_threads=1, head_tap=True)
        tokens = np.random.default_rng(args.seed).integers(0, backend.n_vocab, 72).tolist()
        answer = tuple(tokens[68:])

        def answer_logprobs(split: int):
            rows = backend.answer_logprobs(tokens[:split], [Query(tuple(tokens[split:68]), answer)])[0]
            return rows[np.arange(len(answer)), list(answer)]  # (4,)

        one_batch, one = recorded(backend, lambda b: answer_logprobs(0))
        print(f"seed {args.seed}: the answer's log-probabilities in one batch ({', '.join(f'{v:.4f}' for v in one_batch)})")
        if args.identity_hc:
            print(f"  numpy reference (float64) minus one batch: "
                  f"{np.array2string(reference_answer(model, tokens) - one_batch, precision=4)}")
        for split in args.splits:
            moved, selections = recorded(backend, lambda b: answer_logprobs(split))
            tie = first_tie(one, selections)
            said = tie.phrase() if tie else "the indexer kept the same pools at every token as one batch"
            print(f"  split after {split:3d} tokens: {np.array2string(moved - one_batch, precision=4)}; {said}")
        backend.close()


if __name__ == "__main__":
    main()
