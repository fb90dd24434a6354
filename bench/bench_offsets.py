"""Cost of the fixes at inference time (`kvphase sweep --offsets K`, `--random-offset`), as ratios
against the plain sweep measured in one run: the same contexts and targets scored plainly and under
each fix, through one backend, the rounds interleaved (plain, fix, plain, fix, ...) so that load
from other work on the machine falls on both; each ratio is of the best round of each.

    .venv/bin/python bench/bench_offsets.py [--per-residue 64] [--rounds 3] [--quick] [MODEL ...]

Default models: tests/data/trained/csa-disjoint.gguf (llama.cpp, prefix shifts) and
tests/data/trained/gated.gguf (the numpy reference, window shifts).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = [REPO / "tests/data/trained/csa-disjoint.gguf", REPO / "tests/data/trained/gated.gguf"]
FIXES = {"offsets 2 (mean)": dict(offsets=2), "offsets 4 (mean)": dict(offsets=4),
         "offsets 4 (max)": dict(offsets=4, combine="max"), "random offset": dict(random_offset=True)}


def main() -> None:
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.sweep.backend_setup import open_backend
    from kvphase.sweep.contexts import build_contexts
    from kvphase.sweep.offsets import ShiftedScorer, offset_plan_from_options
    from kvphase.sweep.plan import SweepDefaults, SweepPlan
    from kvphase.sweep.tasks import load_task

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-residue", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("models", nargs="*", type=Path, default=MODELS)
    parser.add_argument("--quick", action="store_true", help="2 contexts, one round (CI: the bench still runs)")
    args = parser.parse_args()
    if args.quick:
        args.per_residue, args.rounds = 64, 1
    print("| model | fix | tokens x plain | wall time x plain |\n|---|---|---|---|")
    for model in args.models:
        info = read_model_info(model)
        defaults = SweepDefaults.for_model(info)
        design = {"design": defaults.design} if defaults.backend == "reference" else {}
        plan = SweepPlan(model=str(model), task=defaults.task, stride=info.compression.stride or 4,
                         modulus=info.compression.stride or 4, context=defaults.context, per_residue=args.per_residue,
                         padding=defaults.padding, seed=0, control=False, backend=defaults.backend,
                         backend_options=design)
        shift_by = "window" if plan.backend == "reference" else "prefix"
        with open_backend(plan, info, threads=1) as backend:
            task = load_task(plan.task)
            contexts = build_contexts(task, backend, plan.context_settings)[:2 if args.quick else None]
            filler = backend.tokenize(task.filler_text)

            def plain() -> None:
                for c in contexts:
                    backend.score(c.tokens, [t.query for t in c.targets])

            def fixed(options: dict):
                scorer = ShiftedScorer(backend, offset_plan_from_options(options.get("offsets"), options.get("combine"),
                                                                         None, options.get("random_offset", False),
                                                                         plan.stride, shift_by),
                                       filler, plan.seed, plan.stride)
                return lambda: [scorer.score(c.index, c.tokens, [t.query for t in c.targets]) for c in contexts]

            for name, options in FIXES.items():
                best = {"plain": (float("inf"), 0), name: (float("inf"), 0)}
                for _ in range(args.rounds):
                    for label, run in (("plain", plain), (name, fixed(options))):
                        tokens, started = backend.tokens_evaluated, time.perf_counter()
                        run()
                        seconds = time.perf_counter() - started
                        best[label] = (min(best[label][0], seconds), backend.tokens_evaluated - tokens)
                (plain_s, plain_tokens), (fix_s, fix_tokens) = best["plain"], best[name]
                print(f"| {model.name} | {name} | {fix_tokens / plain_tokens:.2f} | {fix_s / plain_s:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
