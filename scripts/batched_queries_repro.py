"""Several queries' sequences in one llama_decode against each query alone (issue 62, item 4).

A context is decoded into sequence 0 and copied to sequences 1..K; the same query is then scored
on each copy in one batch of K sequences, and once alone; printed: each copy's largest difference
in the answer's log-probabilities (nats), per setting (flash attention off/on, a unified cache or
one stream per sequence), and the decode time of K queries one per decode against all in one.
On SmolLM2-135M-Instruct Q4_1 under llama.cpp 0.3.36 (the default model): with flash attention
off and a unified cache, the first sequence of the batch equals its score alone and later ones do
not; with flash attention on, or one stream per sequence, every copy equals it.

    python scripts/batched_queries_repro.py [MODEL.gguf] [--queries 4] [--context 64 65 66 67]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kvphase.backends.base import log_softmax_rows
from kvphase.defaults import default_model_path
from kvphase.engines import llamacpp as engine

QUERY_TOKENS, ANSWER_TOKENS = 4, 4


def compare(model, n_vocab: int, lengths: list[int], k: int, flash_attn: bool, unified: bool) -> tuple[list, float, float]:
    """Each copy's largest difference from the query alone (per context), and the seconds the K
    queries took one per decode and all in one."""
    import llama_cpp

    ctx = engine.new_context(model, n_ctx=2048, n_batch=512, n_threads=1, n_seq_max=k + 1, kv_unified=unified,
                             flash_attn=flash_attn)
    memory, batch = llama_cpp.llama_get_memory(ctx), llama_cpp.llama_batch_init(512, 0, 1)
    rng = np.random.default_rng(0)
    differences, alone_s, together_s = [], 0.0, 0.0

    def answer(rows, query, first):
        logprobs = log_softmax_rows(engine.logits(ctx, rows, n_vocab))[first:first + ANSWER_TOKENS]  # (4, n_vocab)
        return logprobs[np.arange(ANSWER_TOKENS), query[QUERY_TOKENS:]]

    try:
        for length in lengths:
            context = rng.integers(0, min(n_vocab, 32000), length).tolist()
            query = rng.integers(0, min(n_vocab, 32000), QUERY_TOKENS + ANSWER_TOKENS).tolist()
            llama_cpp.llama_memory_clear(memory, True)
            assert engine.decode(ctx, batch, [(t, i, 0, False) for i, t in enumerate(context)]) == 0

            def rows_of(seq):
                return [(t, length + i, seq, i >= QUERY_TOKENS - 1) for i, t in enumerate(query[:-1])]

            started = time.perf_counter()
            for seq in range(1, k + 1):
                llama_cpp.llama_memory_seq_cp(memory, 0, seq, -1, -1)
                assert engine.decode(ctx, batch, rows_of(seq)) == 0
                alone = answer(rows_of(seq), query, 0)
                llama_cpp.llama_memory_seq_rm(memory, seq, -1, -1)
            alone_s += time.perf_counter() - started
            started = time.perf_counter()
            rows = []
            for seq in range(1, k + 1):
                llama_cpp.llama_memory_seq_cp(memory, 0, seq, -1, -1)
                rows += rows_of(seq)
            assert engine.decode(ctx, batch, rows) == 0
            together = [answer(rows, query, ANSWER_TOKENS * copy) for copy in range(k)]
            for seq in range(1, k + 1):
                llama_cpp.llama_memory_seq_rm(memory, seq, -1, -1)
            together_s += time.perf_counter() - started
            differences.append([float(np.abs(t - alone).max()) for t in together])
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    return differences, alone_s, together_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--queries", type=int, default=4)
    parser.add_argument("--context", type=int, nargs="+", default=[64, 65, 66, 67])
    args = parser.parse_args()
    import llama_cpp

    path = args.model or default_model_path()
    model = engine.load_model(path)
    n_vocab = engine.Vocab(model).n_vocab
    print(f"{path}: {args.queries} copies of one query in one batch, against it alone (nats)")
    try:
        for flash_attn in (False, True):
            for unified in (True, False):
                differences, alone_s, together_s = compare(model, n_vocab, args.context, args.queries, flash_attn,
                                                           unified)
                print(f"  fa {'on ' if flash_attn else 'off'} {'unified' if unified else 'streams'}: "
                      + "; ".join(" ".join(f"{d:.3g}" for d in per) for per in differences)
                      + f"  (alone {alone_s:.3f} s, in one batch {together_s:.3f} s)")
    finally:
        llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
