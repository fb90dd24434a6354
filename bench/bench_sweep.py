"""Speed of a sweep on the default model, as ratios measured in one run.

1. targets/s: kvphase (one context evaluation serves many teacher-forced queries: as many as
   the context holds, `--targets-per-context auto`) against a naive loop that evaluates one full
   prompt per target and generates the answer greedily (same targets, same model, same
   threads), at 1024 tokens (one round of contexts) and at 8128 (the first context only);
2. context tokens/s: kvphase's context decoding against llama.cpp's raw decode
   (llama-cpp-python's `Llama.eval`) of the same tokens;
3. targets/s through a local llama-server (`--backend server`) with 1, 2 and 4 slots
   against the naive loop on the same server (one full prompt per target).

Run: `make bench` (or `python bench/bench_sweep.py --context 1024 --per-residue 8`).
Queries are decoded one per llama_decode: batching several queries' sequences moved some
log-probabilities by up to 0.19 (kvphase/backends/llamacpp.py), beyond the scoring-equality
test's tolerance, so the queries' share is what `ceiling with free queries` shows.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=None, help="one length only (default: 1024, then 8128)")
    parser.add_argument("--per-residue", type=int, default=None, help="default: one round of M contexts")
    parser.add_argument("--targets-per-context", default="auto", help="auto (the sweep's default), N, or task")
    parser.add_argument("--naive-targets", type=int, default=6, help="targets timed in the naive loop")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--no-server", action="store_true", help="skip the llama-server rows")
    parser.add_argument("--contexts", type=int, default=None, help="time only the plan's first N contexts")
    parser.add_argument("--quick", action="store_true", help="the first 4 contexts of a 384-token plan, 2 naive targets (CI: the bench still runs)")
    args = parser.parse_args()
    if args.quick:
        args.context, args.per_residue, args.naive_targets, args.contexts = 384, 8, 2, 4
    if args.context:
        measure(args, args.context, args.contexts)
        return
    measure(args, 1024, args.contexts)
    # at 8128 tokens one context and two naive targets (each a whole 8K prompt), no server rows
    measure(argparse.Namespace(**{**vars(args), "naive_targets": 2, "no_server": True}), 8128, 1)


def measure(args, length: int, first) -> None:
    """Every row at one context length; `first`: time only the plan's first contexts."""
    import llama_cpp

    from kvphase.backends.llamacpp import LlamaCppBackend
    from kvphase.defaults import default_model_path
    from kvphase.engines.llamacpp import high_level_llama
    from kvphase.sweep.contexts import build_contexts
    from kvphase.sweep.layout import Layout
    from kvphase.sweep.context_settings import ContextSettings
    from kvphase.sweep.tasks import load_task

    args.context = length
    model = default_model_path()
    backend = LlamaCppBackend(model, n_ctx=args.context + 64, n_threads=args.threads)
    task, settings = load_task("records"), ContextSettings(args.context, 4, 8, 1, "prefix", 0, args.targets_per_context)
    lanes = Layout.of(task, backend, settings).lanes
    settings = ContextSettings(args.context, 4, 8, args.per_residue or lanes, "prefix", 0, args.targets_per_context)
    contexts = build_contexts(task, backend, settings)[:first]
    targets = [(c, t) for c in contexts for t in c.targets]
    backend.score(contexts[-1].tokens[:512], [])  # warm-up: page in the weights (not a context that is timed)

    start = time.perf_counter()
    context_seconds = 0.0
    for context in contexts:
        t0 = time.perf_counter()
        backend._load_context(context.tokens)
        context_seconds += time.perf_counter() - t0
        backend.score(context.tokens, [t.query for t in context.targets])
    kvphase_seconds = time.perf_counter() - start
    kvphase_rate = len(targets) / kvphase_seconds
    kvphase_tokens_rate = len(contexts) * args.context / context_seconds

    llm = high_level_llama(model, n_ctx=args.context + 64, n_threads=args.threads,
                          n_threads_batch=args.threads, n_batch=512, verbose=False)
    llm.eval(list(contexts[-1].tokens))  # warm-up
    picks = np.random.default_rng(0).choice(len(targets), size=min(args.naive_targets, len(targets)), replace=False)
    start = time.perf_counter()
    correct_naive = 0
    for i in picks:
        context, target = targets[int(i)]
        llm.reset()
        llm.eval(list(context.tokens) + list(target.query.prompt))
        generated = []
        for _ in target.query.answer:
            last = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)  # logits of the last decoded token
            token = int(np.argmax(np.ctypeslib.as_array(last, shape=(llm.n_vocab(),))))
            generated.append(token)
            llm.eval([token])
        correct_naive += tuple(generated) == target.query.answer
    naive_rate = len(picks) / (time.perf_counter() - start)

    raw_tokens = list(contexts[0].tokens)
    start = time.perf_counter()
    repeats = 3
    for _ in range(repeats):
        llm.reset()
        llm.eval(raw_tokens)
    raw_rate = repeats * len(raw_tokens) / (time.perf_counter() - start)

    print(f"default model, context {args.context} tokens, {len(targets)} targets in {len(contexts)} contexts, "
          f"{args.threads} threads")
    print(f"{'measure':<44}{'kvphase':>12}{'baseline':>12}{'ratio':>9}")
    print(f"{'targets/s (vs one prompt per target, greedy)':<44}{kvphase_rate:>12.2f}{naive_rate:>12.2f}"
          f"{kvphase_rate / naive_rate:>9.1f}")
    print(f"{'context tokens/s (vs llama.cpp raw decode)':<44}{kvphase_tokens_rate:>12.1f}{raw_rate:>12.1f}"
          f"{kvphase_tokens_rate / raw_rate:>9.2f}")
    query_seconds = kvphase_seconds - context_seconds
    print(f"where kvphase's time goes: contexts {context_seconds:.1f} s ({100 * context_seconds / kvphase_seconds:.0f}%), "
          f"queries {query_seconds:.1f} s ({1000 * query_seconds / len(targets):.0f} ms per target, one decode each); "
          f"{len(targets) / len(contexts):.0f} targets share each context evaluation")
    print(f"ceiling with free queries (contexts only): {len(targets) / context_seconds / naive_rate:.1f}x the naive loop; "
          f"with free contexts (queries only): {len(targets) / query_seconds / naive_rate:.1f}x")
    if not args.no_server:
        for label, rate, naive in server_rates(model, contexts, targets, picks, args):
            print(f"{label:<44}{rate:>12.2f}{naive:>12.2f}{rate / naive:>9.1f}")


def server_rates(model, contexts, targets, picks, args):
    """targets/s of `--backend server` on one local llama-server with 4 slots, using 1, 2
    and 4 of them, against the naive loop on the same server: one request per target with
    the whole prompt evaluated (`cache_prompt: false`) and the answer generated greedily."""
    from kvphase.backends.fleet import open_server_backend
    from kvphase.backends.transport import Http, Retry
    from kvphase.engines.llama_server import llama_server

    jobs = [(c.tokens, [t.query for t in c.targets]) for c in contexts]
    rows = []
    with llama_server(model, slots=4, n_ctx_per_slot=args.context + 64, threads=args.threads) as server:
        http = Http(server.url, Retry())
        start = time.perf_counter()
        for i in picks:
            context, target = targets[int(i)]
            http.post("/completion", {"prompt": list(context.tokens) + list(target.query.prompt), "temperature": 0.0,
                                      "n_predict": len(target.query.answer), "cache_prompt": False})
        naive = len(picks) / (time.perf_counter() - start)
        for slots in (1, 2, 4):
            backend = open_server_backend(model, n_ctx=args.context + 64, urls=[server.url], slots=slots)
            start = time.perf_counter()
            for _ in backend.score_many(jobs):
                pass
            rows.append((f"server targets/s, {slots} slot{'s' * (slots > 1)} (vs naive on it)",
                         len(targets) / (time.perf_counter() - start), naive))
    return rows


if __name__ == "__main__":
    main()
