"""The cost of the llama.cpp head tap (`kvphase knockout` on models in llama.cpp).

The tap is an eval callback: llama.cpp asks Python about every graph node of every decode,
and the knocked-out layer's node is copied out and written back. Measured in one run on the
default model (SmolLM2-135M, 2 threads), the best of `--repeats` for each:

- a `--context`-token context decode (512) and 16 queries (6 prompt + 3 answer tokens) with no tap,
- the same with the tap installed but idle (a knockout's base sweep),
- the same with one head of one layer held at a mean (one knockout sweep),

as seconds and as ratios to the untapped backend.

Run: `python bench/bench_taps.py`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def timed(backend, context, queries, repeats: int) -> tuple[float, float]:
    """Best seconds over `repeats` for the context decode and for the queries after it."""
    best_context = best_queries = float("inf")
    for _ in range(repeats):
        backend._context = ()  # decode the context again
        started = time.perf_counter()
        backend.score(context, [])
        middle = time.perf_counter()
        backend.score(context, queries)
        best_context, best_queries = min(best_context, middle - started), min(best_queries, time.perf_counter() - middle)
    return best_context, best_queries


def main() -> None:
    from kvphase.backends.base import Query
    from kvphase.backends.llamacpp import LlamaCppBackend
    from kvphase.defaults import default_model_path
    from kvphase.probes.knockout_hooks import EngineHeads

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="a 128-token context, one repetition (CI: the bench still runs)")
    args = parser.parse_args()
    if args.quick:
        args.context, args.repeats = 128, 1
    rng = np.random.default_rng(0)
    context = rng.integers(100, 20000, args.context).tolist()
    queries = [Query(rng.integers(100, 20000, 6).tolist(), rng.integers(100, 20000, 3).tolist()) for _ in range(16)]
    rows = []
    for label, tapped, knock in (("no tap", False, False), ("tap installed, idle", True, False),
                                 ("tap holding L3H2 at a mean", True, True)):
        backend = LlamaCppBackend(default_model_path(), n_ctx=args.context + 512, n_threads=args.threads, head_tap=tapped)
        if knock:
            engine = EngineHeads(backend)
            engine.install(engine.knockout(3, 2, np.zeros(64, np.float32), args.context))  # SmolLM2: heads of 64
        rows.append((label, *timed(backend, context, queries, args.repeats)))
        backend.close()
    base_context, base_queries = rows[0][1], rows[0][2]
    print("| backend | context decode (s) | 16 queries (s) | context ratio | queries ratio |")
    print("|---|---|---|---|---|")
    for label, seconds_context, seconds_queries in rows:
        print(f"| {label} | {seconds_context:.3f} | {seconds_queries:.3f} | {seconds_context / base_context:.2f} | "
              f"{seconds_queries / base_queries:.2f} |")


if __name__ == "__main__":
    main()
