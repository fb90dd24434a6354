"""Targets/s of `--backend transformers` against llama.cpp on the same plan, in one run.

One plan (the default model's at --context, a round of contexts), its contexts laid out once with
the GGUF's vocabulary; llama.cpp in process and transformers (on an HF checkpoint folder given with
--checkpoint, else on the GGUF dequantized by transformers) score the same contexts one after the
other, context by context alternating, so the machine's load moves both alike; the ratio is the
number. Usage:

    python bench/bench_transformers.py [MODEL.gguf] [--checkpoint DIR] [--context 1024] [--contexts 4]

It needs the hf extra (pip install -e '.[hf]'). --quick: 256 tokens, 2 contexts (CI: the bench still runs).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvphase.defaults import default_model_path, default_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--checkpoint", type=Path, default=None, help="an HF copy of MODEL (kvphase export-hf)")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--contexts", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.context, args.contexts = 256, 2

    from kvphase.backends import BACKENDS
    from kvphase.backends.base import score_contexts
    from kvphase.engines.llamacpp import Vocab
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.sweep.contexts import build_contexts
    from kvphase.sweep.options import SweepOptions
    from kvphase.sweep.planning import plan_sweep_runs
    from kvphase.sweep.tasks import load_task

    model = Path(args.model or default_model_path())
    info = read_model_info(model)
    plan = plan_sweep_runs(model, SweepOptions(context=args.context, out=Path("/tmp/bench-transformers"))).runs[0][0]
    contexts = build_contexts(load_task(plan.task), Vocab.load(info), plan.context_settings)[: args.contexts]
    jobs = [(c.tokens, [t.query for t in c.targets]) for c in contexts]
    threads = args.threads or default_threads()
    room = args.context + 256
    backends = {"llama.cpp": BACKENDS["llama.cpp"](info, n_ctx=room, n_threads=threads),
                "transformers": BACKENDS["transformers"](read_model_info(args.checkpoint) if args.checkpoint else info,
                                                         n_ctx=room, n_threads=threads)}
    seconds = dict.fromkeys(backends, 0.0)
    flags = {name: [] for name in backends}
    for job in jobs:  # alternating, context by context
        for name, backend in backends.items():
            start = time.perf_counter()
            for _, scores in score_contexts(backend, [job]):
                flags[name] += [s.correct for s in scores]
            seconds[name] += time.perf_counter() - start
    targets = sum(len(queries) for _, queries in jobs)
    rate = {name: targets / seconds[name] for name in backends}
    agree = sum(a == b for a, b in zip(flags["llama.cpp"], flags["transformers"]))
    print(f"plan: {len(jobs)} contexts of {args.context} tokens, {targets} targets, {threads} threads; "
          f"transformers on {'the HF checkpoint' if args.checkpoint else 'the GGUF dequantized'} "
          f"({backends['transformers'].engine_info()['device']})")
    for name in backends:
        print(f"{name:>12}: {rate[name]:8.2f} targets/s ({seconds[name]:.1f} s)")
    print(f"llama.cpp / transformers: {rate['llama.cpp'] / rate['transformers']:.2f}x; "
          f"flags agree on {agree} of {targets} targets")
    for backend in backends.values():
        backend.close()


if __name__ == "__main__":
    main()
