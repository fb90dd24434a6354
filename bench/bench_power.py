"""Is the detectable dip a report prints true, and do its intervals cover, at every accuracy?

On the planner's own designs (the 1K default: 24 contexts of 32 at M = 8; 8K: 8 contexts of 328;
16K: 8 of 504; a trained model's sweep: 1,024 contexts of one target at M = 4) and at base
accuracies 2, 10, 50, 90 and 98%, each simulated run (a normal context effect of 1 logit SD, as in
bench_density_statistics.py) goes through what a report does:

1. a run without a phase effect is summarized: the detectable dip the report would print
   (`analysis.what_the_run_can_see`, as `summarize` calls it, with chance 0: the simulated task's
   values are unbounded), or none (the run is *uninformative*: no dip that fits above chance, down
   to it from the lower end of the mean's interval, is found 80% of the time);
2. that dip is planted on the residue the report names as hardest, in a fresh run, and the
   report's accuracy test (`stratified_p_values`) is applied: the share that reject is the power
   the printed dip really has (it should be 75-85%). The dip is planted as the report defines it
   (the residue keeps the same share of every context's accuracy, its mean falling by the dip) and,
   in a column of its own, as a shift on the logit scale (which takes less from the contexts where
   the model does well, where the test sees most);
3. the gap's 95% interval (`analysis.context_intervals`, as computed, unclipped) is checked for
   the true gap, in the run without an effect (0) and in the run with the planted dip (the gap the
   planted model has on the run's contexts: the planted run is the same sweep scored again, so its
   contexts are the ones whose accuracy set the printed dip), and the mean's interval for the true
   mean; the last column counts the runs whose report says, in words, that the mean's interval held
   the mean less often than 93% in its own simulation (`intervals.mean_coverage`).

Run: `python bench/bench_power.py [--runs 200]` (about ten minutes on one core; `--quick`: 20 runs
and two accuracies, under a minute). The table is docs/statistics.md's.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from bench_density_statistics import CONTEXT_SD, intercepts, placed, simulate

PLAN_SHAPES = [("1K default", 8, 32, 24), ("8K", 8, 328, 8), ("16K", 8, 504, 8), ("trained, 1 per context", 4, 1, 1024)]
ACCURACIES = (0.02, 0.10, 0.50, 0.90, 0.98)
PERMUTATIONS = 1_000  # the report's test takes 4,000; at alpha = 0.05 a thousand decide the same


def one_cell(residues, contexts, modulus, base, runs, seed) -> dict:
    """Power of the printed dip (planted as the report defines it, and as a logit shift), the share
    of runs with none, and the intervals' coverage."""
    from kvphase.statistics.intervals import mean_coverage
    from kvphase.sweep.analysis import context_intervals, what_the_run_can_see
    from kvphase.sweep.report import SHORT_COVERAGE
    from kvphase.statistics.stratified import Stratification

    rng = np.random.default_rng(seed)
    stratification = Stratification.of(residues, contexts)
    found = {"share": 0, "logit": 0}
    printed = null_held = dipped_held = mean_held = said_short = 0
    dips = []
    for run in range(runs):
        rates = context_rates(contexts, base, rng)  # (N,) each target's chance, its context's effect in it
        correct = (rng.random(len(rates)) < rates).astype(float)  # (N,)
        mean_ci, gap_ci, seen = what_the_run_can_see(correct, residues, contexts, seed + run)
        null_held += gap_ci[0] <= 0 <= gap_ci[1]
        mean_held += mean_ci[0] <= 100 * base <= mean_ci[1]
        coverage = mean_coverage(correct, stratification, contexts, seed + run)
        said_short += coverage is not None and coverage < SHORT_COVERAGE
        if seen.dip is None:
            continue
        printed += 1
        dips.append(100 * seen.dip)
        dipped = residues == seen.residue  # (N,)
        # as the report defines the dip: the same share of every context's accuracy, so that the residue's
        # accuracy falls by the dip on average (to 0 when the printed dip exceeds the true accuracy)
        shared = np.where(dipped, rates * max(1 - seen.dip / base, 0.0), rates)  # (N,)
        outcome = (rng.random(len(rates)) < shared).astype(float)
        found["share"] += rejects(outcome, stratification, run)
        _, gap_ci = context_intervals(outcome, residues, contexts, seed + run)
        planted_gap = 100 * (rates[dipped].mean() - shared[dipped].mean())  # the dipped residue's expected loss here
        dipped_held += gap_ci[0] <= planted_gap <= gap_ci[1]
        accuracies = np.full(modulus, base)  # the same mean dip as a shift on the logit scale instead
        accuracies[list(stratification.labels).index(seen.residue)] = max(base - seen.dip, 1e-6)
        found["logit"] += rejects(simulate(residues, contexts, accuracies, 1, rng)[0], stratification, run)
    return {"printed": printed / runs, "power": found["share"] / printed if printed else math.nan,
            "logit": found["logit"] / printed if printed else math.nan,
            "dip": float(np.median(dips)) if dips else math.nan, "null_gap": null_held / runs,
            "dipped_gap": dipped_held / printed if printed else math.nan, "mean": mean_held / runs,
            "said_short": said_short / runs}


def context_rates(contexts: np.ndarray, base: float, rng: np.random.Generator) -> np.ndarray:
    """Each target's chance (N,) under a normal context effect of CONTEXT_SD logits, `base` on average."""
    from scipy import special

    effects = CONTEXT_SD * rng.standard_normal(contexts.max() + 1)  # (H,)
    return special.expit(intercepts(np.array([base]))[0] + effects[contexts])


def rejects(outcome: np.ndarray, stratification, seed: int) -> bool:
    """The report's accuracy test at ALPHA (chi-square law, or permutations where counts are small)."""
    from kvphase.statistics.stratified import ALPHA, stratified_p_values

    p, _ = stratified_p_values(outcome[None], stratification, binary=True, seed=seed, permutations=PERMUTATIONS)
    return bool(p[0] < ALPHA)


def percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="simulated runs per design and accuracy")
    parser.add_argument("--quick", action="store_true", help="20 runs at 10 and 50%% (CI: the bench still runs)")
    args = parser.parse_args()
    runs, accuracies = (20, (0.10, 0.50)) if args.quick else (args.runs, ACCURACIES)
    start = time.perf_counter()
    print(f"{runs} runs per row; context effect SD 1 logit; Monte Carlo SE of an 80% power "
          f"{100 * math.sqrt(0.16 / runs):.1f} points, of a 95% coverage {100 * math.sqrt(0.0475 / runs):.1f}")
    print("| design | targets | contexts | base accuracy % | runs printing a dip % | median printed dip (points) | "
          "power of the printed dip % | as a logit shift % | gap CI covers 0 (no effect) % | "
          "gap CI covers the planted dip % | mean CI covers % | reports saying the mean CI falls short % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, modulus, per_context, n_contexts in PLAN_SHAPES:
        residues, contexts = placed(modulus, per_context, n_contexts)
        for base in accuracies:
            cell = one_cell(residues, contexts, modulus, base, runs, seed=int(1000 * base) + n_contexts)
            dip = "-" if math.isnan(cell["dip"]) else f"{cell['dip']:.1f}"
            print(f"| {name} | {len(residues)} | {n_contexts} | {100 * base:.0f} | {percent(cell['printed'])} | {dip} | "
                  f"{percent(cell['power'])} | {percent(cell['logit'])} | {percent(cell['null_gap'])} | {percent(cell['dipped_gap'])} | "
                  f"{percent(cell['mean'])} | {percent(cell['said_short'])} |", flush=True)
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
