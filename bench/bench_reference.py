"""Prompt processing speed of the numpy reference vs llama.cpp on one 1K-token context.

Both run in this process, one after the other, on the same tokens; the ratio is what
matters (the machine's load moves both). Usage:

    python bench/bench_reference.py [MODEL.gguf] [--tokens 1024] [--repeats 2] [--threads N]

numpy's BLAS threads follow OPENBLAS_NUM_THREADS; on a machine shared with other jobs,
OPENBLAS_NUM_THREADS=1 is often faster than spinning threads.
"""

from __future__ import annotations

import argparse
import os
import time

from kvphase.defaults import default_model_path

SENTENCE = (
    "The old harbor town kept its ropeworks running long after the herring had gone, "
    "and every evening the painters walked down to the quay to watch the light change. "
)


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    parser.add_argument("--quick", action="store_true", help="128 tokens, one repetition (CI: the bench still runs)")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.repeats = 128, 1
    path = str(args.model or default_model_path())

    from kvphase.engines.llamacpp import high_level_llama
    from kvphase.reference.model import Transformer

    threads = args.threads or os.cpu_count() or 1
    llm = high_level_llama(path, n_ctx=args.tokens + 16, n_batch=512, n_threads=threads, verbose=False)
    tokens = llm.tokenize((SENTENCE * (args.tokens // 20 + 1)).encode(), add_bos=False)[: args.tokens]

    def run_llamacpp():
        llm.reset()
        llm.eval(tokens)  # logits of the last token only (logits_all is off)

    load_start = time.perf_counter()
    model = Transformer.from_gguf(path)
    load_s = time.perf_counter() - load_start

    def run_reference():
        model.forward(tokens, model.new_cache(len(tokens)), logits_for=[len(tokens) - 1])

    run_llamacpp()  # warm up both
    lc = best_time(run_llamacpp, args.repeats)
    ref = best_time(run_reference, args.repeats)
    llm.close()

    rows = [
        ("llama.cpp", lc, len(tokens) / lc),
        ("numpy reference", ref, len(tokens) / ref),
    ]
    print(f"model {os.path.basename(path)}, {len(tokens)} tokens, {threads} threads, best of {args.repeats}")
    print(f"{'engine':<16} {'seconds':>8} {'tokens/s':>9}")
    for name, seconds, rate in rows:
        print(f"{name:<16} {seconds:>8.2f} {rate:>9.1f}")
    print(f"speed ratio reference / llama.cpp: {lc / ref:.3f}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f} on {threads} cores (a busy machine slows both, unevenly)")
    print(f"reference load + dequantize (first time in this process): {load_s:.1f} s")


if __name__ == "__main__":
    main()
