"""How few contexts the report's intervals and test survive, at the planner's densities.

A design is a modulus M and a number of targets per context (32, 160 and 672: the auto
density at 1K, 4K and 16K tokens; 2: a trained model's contexts at M = 4), placed by
`plan_contexts` in 4, 8, 16 and 32 contexts (whole rounds of M contexts, or the first
contexts of one round). For each, `--runs` simulated runs with a normal context effect of
1 logit (SD) on the logit scale:

- coverage of the gap's 95% interval as the report makes it (`analysis.context_intervals`:
  simultaneous intervals of the residues' differences from the variance within contexts,
  `intervals.gap_interval`) of the gap the simulated model has on the run's own contexts (each
  residue's expected accuracy over its targets, given the contexts' effects: the interval is of
  the gap on the contexts the sweep scored, docs/statistics.md), the model's gap being 20 points:
  one residue at 45%, the others at 65%, accuracies over the context effects (Gauss-Hermite
  quadrature);
- coverage of the mean accuracy's 95% interval (Wilson's at the effective number of targets,
  whole contexts the sampled units: `intervals.mean_intervals`) of the model's mean over residues;
- the false positive rate of the report's accuracy test (`stratified_p_values`: the
  chi-square law, or permutations where an expected count is below 5) on null runs, every
  residue at 65%.

Coverage should be near 95% and the rate at most 5% (Monte Carlo SE printed). The table is
what the planner's minimum number of contexts is read from.

Run: `python bench/bench_density_statistics.py [--runs 500]` (about a minute on one core; `--quick`: 100 runs,
ten seconds).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

CONTEXT_SD = 1.0  # logits
ACCURACY, DIPPED_ACCURACY = 0.65, 0.45  # every residue, and residue 0 in the runs with a gap
CONTEXT_COUNTS = (4, 8, 16, 32)
PLAN_SHAPES = [(8, 32), (8, 160), (8, 672), (4, 2), (4, 32), (4, 160), (4, 672)]  # (M, targets per context)
LOWEST = 50  # first token a target may take


def placed(modulus: int, per_context: int, n_contexts: int) -> tuple[np.ndarray, np.ndarray]:
    """Each target's residue and context (N,), (N,): `plan_contexts` in a span wide enough for
    `per_context` targets (about 1K tokens per 32), cut to the first `n_contexts` contexts."""
    from kvphase.sweep.positions import plan_contexts

    highest = LOWEST + 8 * 99 * max(1, per_context // 32)
    rounds = math.ceil(n_contexts / modulus)
    contexts = plan_contexts(LOWEST, highest, modulus, rounds * per_context, per_context)[:n_contexts]
    positions = np.concatenate(contexts)  # (N,)
    return positions % modulus, np.repeat(np.arange(n_contexts), [len(c) for c in contexts])


def intercepts(accuracies: np.ndarray) -> np.ndarray:
    """The logit-scale intercept of each residue (G,) whose accuracy, averaged over context
    effects N(0, CONTEXT_SD^2), is `accuracies` (G,)."""
    from kvphase.statistics.intervals import logit_intercept

    return np.array([logit_intercept(p, CONTEXT_SD) for p in accuracies])


def chances(residues: np.ndarray, contexts: np.ndarray, accuracies: np.ndarray, runs: int,
            rng: np.random.Generator) -> np.ndarray:
    """Each target's chance of a right answer (runs, N): residues at the marginal `accuracies` (G,), each
    run's context effects shared by its contexts' targets."""
    from scipy import special

    effects = CONTEXT_SD * rng.standard_normal((runs, contexts.max() + 1))  # (runs, H)
    return special.expit(intercepts(accuracies)[residues] + effects[:, contexts])  # (runs, N)


def simulate(residues: np.ndarray, contexts: np.ndarray, accuracies: np.ndarray, runs: int,
             rng: np.random.Generator) -> np.ndarray:
    """0/1 outcomes (runs, N) of residues at the marginal `accuracies` (G,), context effects shared."""
    chance = chances(residues, contexts, accuracies, runs, rng)  # (runs, N)
    return (rng.random(chance.shape) < chance).astype(float)


def coverage(residues: np.ndarray, contexts: np.ndarray, modulus: int, runs: int, seed: int):
    """Shares of runs whose gap interval holds the gap on the run's contexts and whose mean interval holds
    the model's mean, and the gap intervals' median width."""
    from kvphase.sweep.analysis import context_intervals

    accuracies = np.full(modulus, ACCURACY)
    accuracies[0] = DIPPED_ACCURACY
    true_mean = 100 * accuracies.mean()
    rng = np.random.default_rng(seed)
    chance = chances(residues, contexts, accuracies, runs, rng)  # (runs, N)
    outcomes = (rng.random(chance.shape) < chance).astype(float)  # (runs, N)
    per_residue = np.bincount(residues)  # (G,)
    held_gap = held_mean = 0
    widths = []
    for run, correct in enumerate(outcomes):
        expected = np.bincount(residues, weights=chance[run]) / per_residue  # (G,) on this run's contexts
        mean_ci, gap_ci = context_intervals(correct, residues, contexts, seed + run)
        held_gap += gap_ci[0] <= 100 * np.ptp(expected) <= gap_ci[1]
        held_mean += mean_ci[0] <= true_mean <= mean_ci[1]
        widths.append(gap_ci[1] - gap_ci[0])
    return held_gap / runs, held_mean / runs, float(np.median(widths))


def false_positive_rate(residues: np.ndarray, contexts: np.ndarray, modulus: int, runs: int, seed: int,
                        permutations: int) -> tuple[float, float]:
    """Share of null runs the report's accuracy test rejects at ALPHA, and the share that took permutations."""
    from kvphase.statistics.stratified import ALPHA, Stratification, stratified_p_values

    outcomes = simulate(residues, contexts, np.full(modulus, ACCURACY), runs, np.random.default_rng(seed + 1))
    p, exact = stratified_p_values(outcomes, Stratification.of(residues, contexts), binary=True, seed=seed,
                                   permutations=permutations)
    return float((p < ALPHA).mean()), float(exact.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500, help="simulated runs per design and number of contexts")
    parser.add_argument("--permutations", type=int, default=2_000, help="for null runs that take permutation p-values")
    parser.add_argument("--quick", action="store_true", help="100 runs and 500 permutations (CI: the bench still runs)")
    args = parser.parse_args()
    runs, permutations = (100, 500) if args.quick else (args.runs, args.permutations)
    start = time.perf_counter()
    print(f"{runs} runs per row; context effect SD {CONTEXT_SD} logit; the model's gap {100 * (ACCURACY - DIPPED_ACCURACY):.0f} "
          f"points; Monte Carlo SE of a 95% coverage {100 * math.sqrt(0.05 * 0.95 / runs):.1f} points, of a 5% rate "
          f"{100 * math.sqrt(0.05 * 0.95 / runs):.1f} points")
    print("| design | contexts | targets | gap CI coverage of the gap on its contexts % | mean CI coverage % | CMH FPR % | "
          "null runs by permutation % | median gap CI width (points) |")
    print("|---|---|---|---|---|---|---|---|")
    for modulus, per_context in PLAN_SHAPES:
        for n_contexts in CONTEXT_COUNTS:
            residues, contexts = placed(modulus, per_context, n_contexts)
            seed = 1_000 * modulus + per_context + n_contexts
            gap_held, mean_held, width = coverage(residues, contexts, modulus, runs, seed)
            rate, permuted = false_positive_rate(residues, contexts, modulus, runs, seed, permutations)
            print(f"| M = {modulus}, {per_context} per context | {n_contexts} | {len(residues)} | {100 * gap_held:.1f} | "
                  f"{100 * mean_held:.1f} | {100 * rate:.1f} | {100 * permuted:.0f} | {width:.1f} |", flush=True)
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
