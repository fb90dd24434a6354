"""Context tokens/s of a long sweep context against llama.cpp's raw prompt processing, in one run.

On the default model (SmolLM2-135M, 8192-token training context) one real sweep context of
`--context` tokens (8128 = 8192 less the 64 kvphase keeps for the query, built by
`build_contexts` as `kvphase sweep` builds it) is timed, interleaved and best of `--repeats`:

- raw: llama.cpp's prompt processing of those tokens in a context of its own (the memory
  cleared before each pass), decoded in chunks of n_batch through `kvphase.engines.llamacpp`
  (`new_context` + `decode`; logits for the last token only, as llama.cpp's own prompt
  processing asks) once per `--batches` value: 512 is the backend's, 2048 is llama.cpp's
  default n_batch (here also the micro-batch); the faster is the baseline;
- sweep: what a sweep does per context, `LlamaCppBackend.score(context, queries)` with the
  context's 16 queries, counted as context tokens per second (the queries' time included).

The bench fails (exit 1) when sweep / raw is below `--min-ratio` (0.9, issue 21) unless
`--quick` (a 512-token context, one repetition: CI checks that the bench runs, not the figures).

Then what a CPU-minute buys at 1K, 4K, 8K and 16K tokens (`--lengths`; 16K is past SmolLM2's
trained context, which changes its answers, not its speed): one context of the sweep's plan is
timed with all its queries, at the task's 16 targets per context and at the default
`--targets-per-context auto`, and each density's targets per CPU-minute give the one-residue
dip a sweep of `--budget` CPU-minutes detects with 80% power at any accuracy (M = 8; the
worst-case variance, so a real run at another accuracy detects a smaller one).

Run: `make bench` (or `python bench/bench_long_context.py --threads 1`).
"""

from __future__ import annotations

import argparse
import sys
import time

BACKEND_BATCH = 512  # LlamaCppBackend's n_batch (= n_ubatch), what `kvphase sweep` decodes with
QUERY_ROOM = 64  # tokens kvphase keeps after the context (kvphase.sweep.plan.QUERY_ROOM)


class RawPrompt:
    """llama.cpp's prompt processing alone: a fresh context, the tokens decoded in n_batch chunks."""

    def __init__(self, model, n_ctx: int, n_batch: int, n_threads: int):
        import llama_cpp

        from kvphase.engines import llamacpp as engine

        self._lc, self._engine, self.n_batch = llama_cpp, engine, n_batch
        self._ctx = engine.new_context(model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)

    def run(self, tokens) -> float:
        """Seconds to decode `tokens` from position 0 into an empty memory."""
        self._lc.llama_memory_clear(self._memory, True)
        started = time.perf_counter()
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            last = start + len(chunk) == len(tokens)
            rows = [(t, start + i, 0, last and i == len(chunk) - 1) for i, t in enumerate(chunk)]
            if self._engine.decode(self._ctx, self._batch, rows) != 0:
                raise RuntimeError(f"llama_decode failed on the chunk at {start} (n_batch {self.n_batch})")
        return time.perf_counter() - started

    def close(self) -> None:
        self._lc.llama_batch_free(self._batch)
        self._lc.llama_free(self._ctx)


def sweep_context(backend, tokens, queries) -> tuple[float, float]:
    """Seconds for the context decode and for its queries, as one `score` call spends them."""
    backend._context = ()  # forget the cached context: decode it again
    started = time.perf_counter()
    backend.score(tokens, [])
    middle = time.perf_counter()
    backend.score(tokens, queries)  # the same context: only the queries are decoded
    return middle - started, time.perf_counter() - middle


def density_rows(lengths: list[int], threads: int, budget: float) -> None:
    """Per length: targets per CPU-minute and the dip `budget` CPU-minutes detect, at the task's
    16 targets per context against the default density, from one context timed with its queries."""
    from kvphase.backends.llamacpp import LlamaCppBackend
    from kvphase.defaults import default_model_path
    from kvphase.sweep.contexts import build_contexts
    from kvphase.sweep.layout import Layout
    from kvphase.sweep.context_settings import AUTO_DENSITY, TASK_DENSITY, ContextSettings
    from kvphase.sweep.strides import planned_dip
    from kvphase.sweep.tasks import load_task

    print(f"\nwhat {budget:g} CPU-minutes buy ({threads} thread{'s' * (threads > 1)}; one context timed with its queries)")
    print(f"{'context':>8}{'targets/context':>17}{'s/context':>11}{'targets/CPU-min':>17}{'dip, points':>13}"
          f"{'dip ratio':>11}{'RSS MiB, context / +queries':>29}")
    for length in lengths:
        backend = LlamaCppBackend(default_model_path(), n_ctx=length + QUERY_ROOM, n_threads=threads)
        task = load_task("records")
        lanes = Layout.of(task, backend, ContextSettings(length, 4, 8, 1, "prefix", 0, AUTO_DENSITY)).lanes
        context = build_contexts(task, backend, ContextSettings(length, 4, 8, lanes, "prefix", 0, AUTO_DENSITY))[0]
        task_lanes = len(build_contexts(task, backend, ContextSettings(length, 4, 8, 16, "prefix", 0, TASK_DENSITY))[0].targets)
        backend.score(list(context.tokens[:BACKEND_BATCH]), [])  # warm-up
        seconds_context, seconds_queries = sweep_context(backend, list(context.tokens),
                                                         [t.query for t in context.targets])
        rss_context, rss_queries = _resident_after(backend, list(context.tokens), [t.query for t in context.targets])
        backend.close()
        per_query = seconds_queries / len(context.targets)
        dips = []
        for label, per_context in ((TASK_DENSITY, task_lanes), (AUTO_DENSITY, len(context.targets))):
            seconds = seconds_context + per_context * per_query
            per_cpu_minute = per_context / (seconds * threads / 60)
            dips.append(planned_dip(max(1, int(budget * per_cpu_minute / 8)), 8))
            ratio = f"{dips[0] / dips[1]:.2f}x" if label == AUTO_DENSITY else ""
            memory = f"{rss_context:.0f} / {100 * (rss_queries / rss_context - 1):+.1f}%" if label == AUTO_DENSITY else ""
            print(f"{length:>8}{f'{per_context} ({label})':>17}{seconds:>11.1f}{per_cpu_minute:>17.1f}"
                  f"{dips[-1]:>13.1f}{ratio:>11}{memory:>29}")


def _resident_after(backend, tokens, queries) -> tuple[float, float]:
    """This process's resident memory (MiB) with the context decoded, then after its queries: what
    many targets a context add to one context's KV cache and the weights."""
    def resident() -> float:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024

    backend._context = ()
    backend.score(tokens, [])
    with_context = resident()
    backend.score(tokens, queries)
    return with_context, resident()


def main() -> int:
    from kvphase.backends.llamacpp import LlamaCppBackend
    from kvphase.defaults import default_model_path, default_threads
    from kvphase.sweep.contexts import build_contexts
    from kvphase.sweep.context_settings import ContextSettings
    from kvphase.sweep.tasks import load_task

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=8192 - QUERY_ROOM, help="context tokens (default 8128)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repetitions; the best of each is kept")
    parser.add_argument("--batches", default="512,2048", help="n_batch values of the raw baseline, comma-separated")
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--min-ratio", type=float, default=0.9, help="fail below this sweep / raw ratio")
    parser.add_argument("--lengths", default="1024,4096,8128,16384", help="context lengths of the density rows")
    parser.add_argument("--budget", type=float, default=10.0, help="CPU-minutes a sweep spends, for the dip column")
    parser.add_argument("--quick", action="store_true", help="a 512-token context, one repetition, n_batch 512 only, "
                        "density rows at 512 and 1024 tokens, nothing judged (CI: the bench still runs)")
    args = parser.parse_args()
    if args.quick:
        args.context, args.repeats, args.batches, args.lengths = 512, 1, str(BACKEND_BATCH), "512,1024"
    batches = [int(b) for b in args.batches.split(",")]

    model_path = default_model_path()
    n_ctx = args.context + QUERY_ROOM
    backend = LlamaCppBackend(model_path, n_ctx=n_ctx, n_threads=args.threads)  # as `kvphase sweep` opens it
    context = build_contexts(load_task("records"), backend, ContextSettings(args.context, 4, 8, 32, "prefix", seed=0))[0]
    tokens, queries = list(context.tokens), [t.query for t in context.targets]
    raws = {b: RawPrompt(backend._model, n_ctx, b, args.threads) for b in batches}

    warm = tokens[:BACKEND_BATCH]  # page the weights in and let each context allocate its buffers
    backend.score(warm, [])
    for raw in raws.values():
        raw.run(warm)

    best_raw = {b: float("inf") for b in batches}
    best_context = best_queries = best_sweep = float("inf")
    for _ in range(args.repeats):  # interleaved: the machine's load moves every row alike
        for b, raw in raws.items():
            best_raw[b] = min(best_raw[b], raw.run(tokens))
        seconds_context, seconds_queries = sweep_context(backend, tokens, queries)
        best_context, best_queries = min(best_context, seconds_context), min(best_queries, seconds_queries)
        best_sweep = min(best_sweep, seconds_context + seconds_queries)
    for raw in raws.values():
        raw.close()
    backend.close()

    baseline = min(batches, key=lambda b: best_raw[b])
    raw_rate = len(tokens) / best_raw[baseline]
    print(f"default model, one {len(tokens)}-token sweep context with {len(queries)} queries, {args.threads} "
          f"thread{'s' * (args.threads > 1)}, best of {args.repeats} (interleaved)")
    print(f"{'measure':<52}{'seconds':>9}{'tokens/s':>10}{'vs raw':>8}")
    for b in batches:
        mark = "  <- baseline" if b == baseline else ""
        print(f"{f'raw prompt processing, n_batch {b}':<52}{best_raw[b]:>9.2f}{len(tokens) / best_raw[b]:>10.1f}"
              f"{len(tokens) / best_raw[b] / raw_rate:>8.2f}{mark}")
    print(f"{'sweep: context decode alone':<52}{best_context:>9.2f}{len(tokens) / best_context:>10.1f}"
          f"{len(tokens) / best_context / raw_rate:>8.2f}")
    print(f"{f'sweep: score(context, {len(queries)} queries)':<52}{best_sweep:>9.2f}{len(tokens) / best_sweep:>10.1f}"
          f"{len(tokens) / best_sweep / raw_rate:>8.2f}")
    ratio = len(tokens) / best_sweep / raw_rate
    print(f"queries: {best_queries:.2f} s for {len(queries)} ({1000 * best_queries / len(queries):.0f} ms each); "
          f"ratio sweep / raw = {ratio:.3f}")
    density_rows([int(n) for n in args.lengths.split(",")], args.threads, args.budget)
    if args.quick:
        return 0
    if ratio < args.min_ratio:
        print(f"FAIL: context tokens/s is {ratio:.3f} of llama.cpp's raw prompt processing, below {args.min_ratio}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
