"""Where generation starts: the answer-residue test's power, its printed detectable dip and its false
positives on the default design, by simulation (issue 70).

The default 1K plan (24 contexts of 32 targets at M = 8, `bench_density_statistics.placed`), each
target's answer at the residue the planner gives it (`positions.answer_residue`: balanced within every
context, crossed with the target's residue). Each simulated run draws a normal context effect of 1 logit
SD (as bench_power.py does) and, in the rows that say so, a depth trend (1 logit from the first lane
to the last, which the answer's residue must not pick up) at a base accuracy of 50% (and 10 and 90%),
then goes through what a report does (`analysis.summarize`'s tests on the answer axis):

- no fault: the share of runs whose answer-residue test, interaction test, and any of the three tests
  after Holm's adjustment (target, answer, interaction) reject at 5%: the false positive rates;
- a fault at one answer residue mod 4 (both residues 3 and 7 mod 8 lose the points, as the report
  defines a dip: the same share of every context's accuracy): the share of runs whose Holm-adjusted
  answer p is below 5% (found), and below 1e-6;
- the detectable dip the report prints for the answer axis (`what_the_run_can_see` on the answer's
  residues), planted at the answer residue it names as hardest in a fresh run: how often the answer
  test finds it (it should be 75-85%, as bench_power.py checks for the target's axis).

Run: `python bench/bench_answer_power.py [--runs 400]` (a few minutes on one core; `--quick`: 40 runs).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from bench_density_statistics import CONTEXT_SD, intercepts, placed

M, PER_CONTEXT, CONTEXTS = 8, 32, 24  # the default SmolLM2 plan
PERMUTATIONS = 500  # of the interaction test (the report's takes 2,000); at alpha = 0.05 they decide alike


def design() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each target's residue, answer residue, context and lane (order in its context), (N,) each."""
    from kvphase.sweep.positions import answer_residue

    residues, contexts = placed(M, PER_CONTEXT, CONTEXTS)
    lanes = np.concatenate([np.arange((contexts == c).sum()) for c in range(CONTEXTS)])
    answers = np.array([answer_residue(int(r), int(c), int(l), M) for r, c, l in zip(residues, contexts, lanes)])
    return residues, answers, contexts, lanes


def rates(base: float, contexts, lanes, rng, depth: float) -> np.ndarray:
    """Each target's chance (N,): a context effect of CONTEXT_SD logits and a linear depth trend of
    `depth` logits over the lanes, `base` on average."""
    from scipy import special

    effects = CONTEXT_SD * rng.standard_normal(contexts.max() + 1)  # (H,)
    trend = depth * (lanes / lanes.max() - 0.5)  # (N,)
    return special.expit(intercepts(np.array([base]))[0] + effects[contexts] + trend)


def p_values(correct, residues, answers, contexts, seed: int) -> tuple[float, float, float]:
    """The report's three accuracy tests: target residue, answer residue, their interaction."""
    from kvphase.statistics.stratified import Stratification, interaction_test, stratified_p_values

    out = []
    for groups in (residues, answers):
        p, _ = stratified_p_values(correct[None], Stratification.of(groups, contexts), binary=True, seed=seed,
                                   permutations=1000)
        out.append(float(p[0]))
    out.append(interaction_test(correct, residues, answers, contexts, seed, PERMUTATIONS).p_value)
    return tuple(out)


def one_row(base: float, fault: float, depth: float, runs: int, seed: int) -> dict:
    from kvphase.statistics.stratified import ALPHA, holm

    residues, answers, contexts, lanes = design()
    rng = np.random.default_rng(seed)
    faulty = answers % 4 == 3  # (N,) answers starting at residue 3 mod 4
    counts = {"answer": 0, "interaction": 0, "any": 0, "found": 0, "tiny": 0}
    for run in range(runs):
        chance = rates(base, contexts, lanes, rng, depth)
        chance = np.where(faulty, chance * max(1 - fault / base, 0.0), chance)
        correct = (rng.random(len(chance)) < chance).astype(float)
        p = p_values(correct, residues, answers, contexts, seed + run)
        adjusted = holm(list(p))
        counts["answer"] += p[1] < ALPHA
        counts["interaction"] += p[2] < ALPHA
        counts["any"] += min(adjusted) < ALPHA
        counts["found"] += adjusted[1] < ALPHA
        counts["tiny"] += p[1] < 1e-6
    return {k: v / runs for k, v in counts.items()}


def printed_dip_power(base: float, runs: int, seed: int) -> tuple[float, float, float]:
    """The median detectable dip the report prints for the answer axis, the share of runs printing one,
    and how often that dip, planted at the hardest answer residue in a fresh run, is found."""
    from kvphase.statistics.stratified import ALPHA, Stratification, stratified_p_values
    from kvphase.sweep.analysis import what_the_run_can_see

    residues, answers, contexts, lanes = design()
    stratification = Stratification.of(answers, contexts)
    rng = np.random.default_rng(seed)
    dips, found = [], 0
    for run in range(runs):
        chance = rates(base, contexts, lanes, rng, 0.0)
        correct = (rng.random(len(chance)) < chance).astype(float)
        _, _, seen = what_the_run_can_see(correct, answers, contexts, seed + run)
        if seen.dip is None:
            continue
        dips.append(100 * seen.dip)
        dipped = np.where(answers == seen.residue, chance * max(1 - seen.dip / base, 0.0), chance)
        outcome = (rng.random(len(chance)) < dipped).astype(float)
        p, _ = stratified_p_values(outcome[None], stratification, binary=True, seed=run, permutations=1000)
        found += p[0] < ALPHA
    return (float(np.median(dips)) if dips else math.nan, len(dips) / runs, found / len(dips) if dips else math.nan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400, help="simulated runs per row")
    parser.add_argument("--quick", action="store_true", help="40 runs, base 50%% only (CI: the bench still runs)")
    args = parser.parse_args()
    runs = 40 if args.quick else args.runs
    bases = (0.5,) if args.quick else (0.1, 0.5, 0.9)
    start = time.perf_counter()
    print(f"Default design: {CONTEXTS} contexts of {PER_CONTEXT} targets, M = {M}; context effect SD 1 logit; "
          f"{runs} runs per row (Monte Carlo SE of a 5% rate {100 * math.sqrt(0.0475 / runs):.1f} points, of an 80% "
          f"power {100 * math.sqrt(0.16 / runs):.1f})")
    print("| base accuracy % | fault at answers 3 mod 4 (points) | depth trend (logits) | answer test rejects % | "
          "interaction rejects % | any of 3 after Holm % | answer found after Holm % | answer p < 1e-6 % |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [(b, 0.0, 0.0) for b in bases] + [(0.5, 0.0, 1.0), (0.5, 0.2, 0.0), (0.5, 0.6, 0.0)]
    if not args.quick:
        rows += [(0.9, 0.2, 0.0), (0.65, 0.6, 0.0)]
    for base, fault, depth in rows:
        row = one_row(base, fault, depth, runs, seed=int(1000 * base) + int(100 * fault) + int(10 * depth))
        print(f"| {100 * base:.0f} | {100 * fault:.0f} | {depth:g} | {100 * row['answer']:.1f} | "
              f"{100 * row['interaction']:.1f} | {100 * row['any']:.1f} | {100 * row['found']:.1f} | "
              f"{100 * row['tiny']:.1f} |", flush=True)
    print("| base accuracy % | median printed answer dip (points) | runs printing one % | power of the printed dip % |")
    print("|---|---|---|---|")
    for base in bases:
        dip, printed, power = printed_dip_power(base, max(20, runs // 2), seed=7 + int(100 * base))
        print(f"| {100 * base:.0f} | {dip:.1f} | {100 * printed:.0f} | {100 * power:.0f} |", flush=True)
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
