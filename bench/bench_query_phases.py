"""What query phases (issue 61, item 3) cost: the tests' false positive rates on the new design, and
the wall time of a query-phase plan against the fixed-phase plan, in one run.

1. Simulation: runs of a query-phase plan's design (context c of a round holds residue (l + c) mod M
   in lane l; `positions.query_phase` gives its query residue), a normal context effect of 1 logit
   SD, accuracy falling by 1.5 logits from the first lane to the last, and no residue effect. Each
   row is the share of runs whose test rejects at 5%: the report's stratified test of the target
   residue (`stratified_p_values`) with a 1-logit query-phase dip present (it must stay at or below
   5%), the query-phase test without that dip, and the interaction test with the dip and the depth
   trend (neither an interaction).
2. Wall time: the first `--contexts` contexts of a plan scored through llama.cpp with and without
   query phases, alternating context by context, on a tiny deepseek4 file with SmolLM2's vocabulary
   (`gguf.tiny.write_tiny_model`), or with `--model default` on SmolLM2 itself (its default plan is a
   control run and leaves query phases off; this is what `--query-phases` costs it): the ratio of
   their wall times. A `kvphase train` deepseek4 cannot take query phases (its questions sit at the
   one position it learned), so the tiny file stands in for it.

Run: `python bench/bench_query_phases.py [--runs 200] [--context 1024] [--contexts 8] [--repeats 3] [--model default]`
(`--runs 0`: the wall time only; `--skip-time`: the simulation only; `--quick`: small sizes, for CI).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kvphase.sweep.contexts import build_contexts
from kvphase.sweep.positions import query_phase
from kvphase.sweep.context_settings import ContextSettings
from kvphase.statistics.context_units import ContextUnits, interaction_test, query_phase_test
from kvphase.statistics.stratified import Stratification, stratified_p_values
from kvphase.sweep.query_phases import with_query_residue

M = 8
PLAN_SHAPES = {"1K default: 3 rounds of 8 contexts x 32": (3, 32), "8K default: 1 round of 8 contexts x 256": (1, 256),
           "4 rounds of 8 contexts x 64": (4, 64)}


def simulated(rounds: int, lanes: int, rng: np.random.Generator, query_dip: float) -> pd.DataFrame:
    rows = []
    for index in range(rounds * M):
        q, difficulty = query_phase(index, M), rng.normal()
        lane = np.arange(lanes)  # (lanes,)
        logit = 0.5 + difficulty - 1.5 * lane / lanes - query_dip * (q == 5)  # (lanes,)
        rows.append(pd.DataFrame({"context": index, "residue": (lane + index) % M, "query_pos": 1024 + q,
                                  "correct": rng.random(lanes) < 1 / (1 + np.exp(-logit))}))
    return pd.concat(rows, ignore_index=True)


def false_positive_rates(runs: int) -> pd.DataFrame:
    out = []
    for name, (rounds, lanes) in PLAN_SHAPES.items():
        rng = np.random.default_rng(61)
        residue, query, interaction = [], [], []
        for seed in range(runs):
            dipped = with_query_residue(simulated(rounds, lanes, rng, query_dip=1.0), M)
            stratification = Stratification.of(dipped["residue"].to_numpy(), dipped["context"].to_numpy())
            p, _ = stratified_p_values(dipped["correct"].to_numpy(dtype=float)[None, :], stratification, binary=True,
                                       seed=seed, permutations=500)
            residue.append(p[0] < 0.05)
            interaction.append(interaction_test(ContextUnits.of(dipped, M), seed).p_value)
            plain = with_query_residue(simulated(rounds, lanes, rng, query_dip=0.0), M)
            query.append(query_phase_test(ContextUnits.of(plain, M), seed).p_value)
        out.append({"design": name, "runs": runs, "target residue test": f"{np.mean(residue):.1%}",
                    "query phase test": rejected(query), "interaction test": rejected(interaction)})
    return pd.DataFrame(out)


def rejected(p_values: list) -> str:
    """The share of runs rejecting at 5%, among the runs where the test gave a p (None: not computed)."""
    given = [p for p in p_values if p is not None]
    return f"{np.mean([p < 0.05 for p in given]):.1%}" if given else "not computed"


def forget_context(backend, context) -> None:
    """Make the backend decode `context` again on its next call, as a sweep does once per context: answer
    phases keep the context's tokens, so without this the plan timed second would reuse the first one's
    cached context and be charged none of it (a one-token context replaces it, untimed)."""
    target = context.targets[0].query
    backend.score(context.tokens[:1], [target._replace(prompt=target.prompt[-1:], pad=0)])


def wall_time_ratio(context: int, n_contexts: int, repeats: int, model: str = "tiny-deepseek4",
                    varied_field: str = "query_phases") -> tuple[float, float, float]:
    """The wall time of the first `n_contexts` contexts of a plan with `varied_field` (query_phases,
    or answer_phases: bench_answer_phases.py) over the same plan without it, alternating context by
    context; the plain plan's seconds; and the same ratio in this process's CPU time (which other
    processes on a loaded machine move less)."""
    from kvphase.backends.llamacpp import LlamaCppBackend
    from kvphase.defaults import default_model_path, default_threads
    from kvphase.gguf.tiny import write_tiny_model
    from kvphase.sweep.tasks import load_task

    with tempfile.TemporaryDirectory() as folder:
        path = default_model_path() if model == "default" else write_tiny_model(
            "deepseek4", Path(folder) / "tiny-ds4.gguf", tokenizer_from=default_model_path())
        backend = LlamaCppBackend(path, n_ctx=context + 2 * M + 64, n_threads=default_threads())
        plans = {}
        for varied in (False, True):
            settings = replace(ContextSettings(context, 4, M, 32, "prefix", 0, "auto"), **{varied_field: varied})
            lanes = len(build_contexts(load_task("records"), backend, settings)[0].targets)
            settings = replace(settings, per_residue=lanes)
            plans[varied] = build_contexts(load_task("records"), backend, settings)[:n_contexts]
        backend.score(plans[False][0].tokens, [t.query for t in plans[False][0].targets])  # warm-up, not timed
        spent, cpu = {False: 0.0, True: 0.0}, {False: 0.0, True: 0.0}
        for repeat in range(repeats):  # context by context, the two plans alternating, so load drifts hit both
            for i in range(n_contexts):
                for varied in ((False, True) if (repeat + i) % 2 == 0 else (True, False)):
                    context = plans[varied][i]
                    forget_context(backend, context)
                    started, cpu_started = time.perf_counter(), time.process_time()
                    backend.score(context.tokens, [t.query for t in context.targets])
                    spent[varied] += time.perf_counter() - started
                    cpu[varied] += time.process_time() - cpu_started
        backend.close()
    return spent[True] / spent[False], spent[False], cpu[True] / cpu[False]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--contexts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-time", action="store_true")
    parser.add_argument("--model", choices=("tiny-deepseek4", "default"), default="tiny-deepseek4",
                        help="the file timed: a tiny deepseek4, or the bundled default model (SmolLM2)")
    parser.add_argument("--quick", action="store_true", help="20 simulated runs, 8 contexts of 512 tokens once (CI)")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.context, args.contexts, args.repeats = 20, 512, 8, 1
    if args.runs:
        print(false_positive_rates(args.runs).to_string(index=False))
    if not args.skip_time:
        ratio, fixed, _ = wall_time_ratio(args.context, args.contexts, args.repeats, args.model)
        print(f"\nwall time on {args.model}, query phases / fixed phase: {ratio:.3f} ({args.contexts} contexts of "
              f"{args.context} tokens x {args.repeats}, fixed phase {fixed:.1f} s in all)")


if __name__ == "__main__":
    main()
