"""glm5-next in llama.cpp 0.3.36: one text's answer moves with where its prompt is split into
decodes (issue 62). The conform reference tests/data/conform/glm5-next-random.gguf (random
weights, k-pool 4, top-k 8 tokens with the tail), a 72-token text of random ids (seed 0): the
last 4 tokens' log-probabilities when the first `split` tokens are decoded first and the rest in
a second decode, each minus the whole text decoded in one batch. `kvphase conform` found it: the
three engine paths after this text's 64-token context FAIL together (kvphase.conform.paths).

    python scripts/glm5_split_repro.py [--seed 0] [--splits 8 16 32 56 60 63 64 65 66 67]
"""

from __future__ import annotations

import argparse

import numpy as np

from kvphase.backends.base import Query
from kvphase.backends.llamacpp import LlamaCppBackend

MODEL = "tests/data/conform/glm5-next-random.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--splits", type=int, nargs="+", default=[8, 16, 32, 56, 60, 63, 64, 65, 66, 67])
    args = parser.parse_args()
    backend = LlamaCppBackend(MODEL, n_ctx=1024, n_threads=1)
    tokens = np.random.default_rng(args.seed).integers(0, backend.n_vocab, 72).tolist()
    answer = tuple(tokens[68:])

    def answer_logprobs(split: int) -> np.ndarray:
        rows = backend.answer_logprobs(tokens[:split], [Query(tuple(tokens[split:68]), answer)])[0]
        return rows[np.arange(len(answer)), list(answer)]  # (4,)

    one_batch = answer_logprobs(0)
    print(f"seed {args.seed}: the answer's log-probabilities minus the whole text's in one batch "
          f"({', '.join(f'{v:.4f}' for v in one_batch)})")
    for split in args.splits:
        print(f"  split after {split:3d} tokens: {np.array2string(answer_logprobs(split) - one_batch, precision=4)}")


if __name__ == "__main__":
    main()
