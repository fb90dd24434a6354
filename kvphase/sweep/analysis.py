"""Statistics over a run's results: per-residue accuracy with Wilson intervals, gap with a
bootstrap interval over contexts, periodicity, context-stratified tests of "the outcome
does not depend on the residue" on accuracy and on the answer log-probability, the
smallest dip the run could have detected, and how alike a context's targets were (their
intra-context correlation and design effect). Prints nothing."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from kvphase.sweep.stratified import (ALPHA, POWER, Design, StratifiedTest, basic_interval, bootstrap_gaps,
                                      bootstrap_residue_accuracy, design_effect, detectable_dip,
                                      intra_context_correlation, percentile_interval, stratified_test)

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(correct: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Two-sided Wilson score interval for a binomial proportion, as fractions."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def homogeneity_test(correct: np.ndarray, groups: np.ndarray, seed: int = 0) -> StratifiedTest:
    """The accuracy test for targets independent of one another (each its own context, as
    a trained model's held-out questions): one stratum, so (N - 1) / N x Pearson's chi-square."""
    correct = np.asarray(correct, dtype=float)  # (N,)
    return stratified_test(correct, Design.of(groups, np.arange(len(correct))), binary=True, seed=seed)


@dataclass(frozen=True)
class Summary:
    """What a report says, as numbers (accuracies in percent, two decimals)."""

    n_targets: int
    n_contexts: int
    balanced: bool  # every context holds the same number of targets of each residue it serves
    control: bool  # the model declares no compression: the stride is the user's
    mean_accuracy: float  # mean over residues
    mean_ci: tuple[float, float]  # 95% percentile bootstrap interval of the mean over contexts
    worst_accuracy: float
    worst_residue: int
    best_accuracy: float
    best_residue: int
    gap: float  # best - worst, points; biased upward at small n
    gap_ci: tuple[float, float]  # 95% basic bootstrap interval of the gap over contexts (bias taken out)
    periodicity: float | None  # mean over r < S of |A(r) - A(r + S)|, when M = 2S
    detectable_dip: float | None  # points: a one-residue dip the accuracy test finds with 80% power
    test: StratifiedTest  # accuracy
    logprob_test: StratifiedTest  # answer log-probability
    per_residue: list[dict]
    per_phase: list[dict]
    # the fields below have defaults because summary.json files written before them lack them
    targets_per_context: float | None = None  # mean over contexts; None only as a default, filled in below
    icc: float | None = None  # intra-context correlation of correctness; None when it cannot be measured
    design_effect: float | None = None  # 1 + (targets_per_context - 1) icc

    def __post_init__(self) -> None:
        if self.targets_per_context is None:  # a summary from before it was recorded: it follows from the counts
            object.__setattr__(self, "targets_per_context", round(self.n_targets / self.n_contexts, 2))

    @property
    def verdict(self) -> str:
        """The report's class: "effect" (the accuracy test rejects at alpha), "inconclusive" (it
        does not, but the gap's interval excludes 0 or the log-probability test rejects: the two
        disagree, and a larger sample would decide), or "no effect at this power" (nothing
        larger than the detectable dip; "no effect detectable" when accuracy never varies)."""
        if self.test.p_value < ALPHA:
            return "effect"
        if self._disagreements():
            return "inconclusive"
        return "no effect detectable" if self.detectable_dip is None else "no effect at this power"

    def _disagreements(self) -> list[str]:
        """What points to a phase effect the accuracy test did not reject."""
        said = []
        if self.gap_ci[0] > 0:
            said.append(f"the gap's 95% interval excludes 0 ({self.gap_ci[0]:.1f} to {self.gap_ci[1]:.1f})")
        if self.logprob_test.p_value < ALPHA:
            said.append(f"the answer's log-probability depends on the phase (p = {format_p(self.logprob_test.p_value)})")
        return said

    def headline(self) -> str:
        """One plain sentence on what the numbers say."""
        p = format_p(self.test.p_value)
        numbers = (f"gap {self.gap:.1f} points, 95% CI {self.gap_ci[0]:.1f} to {self.gap_ci[1]:.1f}; p = {p}, "
                   f"log-probability p = {format_p(self.logprob_test.p_value)}")
        claim = (f"residue {self.worst_residue} reaches {self.worst_accuracy:.1f}% against "
                 f"{self.best_accuracy:.1f}% at residue {self.best_residue} ({numbers})")
        if self.verdict == "inconclusive":
            decides = ("accuracy never varies within a context here: --calibrate finds a difficulty where it does"
                       if self.detectable_dip is None else
                       f"a larger sample decides (--per-residue auto --detect {max(self.gap, 1.0):.0f})")
            return (f"Inconclusive: the accuracy test finds no phase effect (p = {p}), but "
                    f"{' and '.join(self._disagreements())}; {claim}; {decides}.")
        if self.test.p_value < ALPHA:
            if self.control:
                return (f"Control run: the model declares no KV-cache compression, yet accuracy varies with the "
                        f"residue: {claim}. Chance alone gives a p this small in {100 * self.test.p_value:.1f}% "
                        f"of runs of a model without any phase effect, so one run is no evidence of one.")
            return f"Accuracy depends on the token phase: {claim}."
        if self.detectable_dip is None:
            return (f"No phase effect can be detected: accuracy is {self.mean_accuracy:.1f}% and never varies "
                    f"within a context ({numbers}).")
        return (f"No phase effect larger than {self.detectable_dip:.1f} points at this sample size (a one-residue "
                f"dip of that size would be detected {POWER:.0%} of the time; {numbers}).")

    def to_json(self) -> dict:
        out = asdict(self)
        out["verdict"], out["headline"] = self.verdict, self.headline()
        return out


def per_group(results: pd.DataFrame, column: str) -> pd.DataFrame:
    """n, correct, accuracy (%), Wilson 95% interval (%), mean logprob, target position moments."""
    rows = []
    for value, group in results.groupby(column, sort=True):
        n, hits = len(group), int(group["correct"].sum())
        low, high = wilson_interval(hits, n)
        rows.append({
            column: int(value),
            "n": n,
            "correct": hits,
            "accuracy": round(100 * hits / n, 2),
            "ci_low": round(100 * low, 2),
            "ci_high": round(100 * high, 2),
            "mean_logprob": round(float(group["logprob"].mean()), 4),
            "position_mean": round(float(group["target_pos"].mean()), 2),
            "position_sd": round(float(group["target_pos"].std(ddof=0)), 2),
        })
    return pd.DataFrame(rows)


def context_intervals(correct: np.ndarray, residues: np.ndarray, contexts: np.ndarray, gap: float,
                      seed: int = 0) -> tuple[tuple[float, float], tuple[float, float]]:
    """95% intervals of the mean accuracy over residues (percentile) and of the observed `gap`
    (points; basic, bounded below by 0), both from one bootstrap over whole contexts (%)."""
    resampled = bootstrap_residue_accuracy(correct, residues, contexts, seed)  # (n', G): bootstrap_gaps's resamples
    if not len(resampled):
        # no resample of contexts held every residue (one context per residue, as at M = 128 with 1 or 2
        # targets per residue): the intervals are unknown, so they are the whole range
        return (0.0, 100.0), (0.0, 100.0)
    means = resampled.mean(axis=1)  # (n',)
    gaps = resampled.max(axis=1) - resampled.min(axis=1)  # (n',)
    return (tuple(round(v, 2) for v in percentile_interval(means)),
            tuple(round(max(v, 0.0), 2) for v in basic_interval(gaps, gap)))


def summarize(results: pd.DataFrame, stride: int, modulus: int, seed: int = 0, control: bool = False) -> Summary:
    """The run's statistics from its results frame (one row per scored target)."""
    by_residue = per_group(results, "residue")
    by_phase = per_group(results, "phase")
    acc = by_residue.set_index("residue")["accuracy"]
    periodicity = None
    if modulus == 2 * stride and all(r in acc.index for r in range(modulus)):
        periodicity = round(float(np.mean([abs(acc[r] - acc[r + stride]) for r in range(stride)])), 2)
    correct = results["correct"].to_numpy(dtype=float)  # (N,)
    design = Design.of(results["residue"].to_numpy(), results["context"].to_numpy())
    dip = detectable_dip(correct, design)
    mean_ci, gap_ci = context_intervals(correct, results["residue"].to_numpy(), results["context"].to_numpy(),
                                        float(acc.max() - acc.min()), seed)
    per_context = len(results) / results["context"].nunique()
    icc = intra_context_correlation(correct, results["context"].to_numpy())
    return Summary(
        n_targets=len(results),
        n_contexts=int(results["context"].nunique()),
        balanced=design.balanced,
        control=control,
        mean_accuracy=round(float(acc.mean()), 2),
        mean_ci=mean_ci,
        worst_accuracy=float(acc.min()),
        worst_residue=int(acc.idxmin()),
        best_accuracy=float(acc.max()),
        best_residue=int(acc.idxmax()),
        gap=round(float(acc.max() - acc.min()), 2),
        gap_ci=gap_ci,
        periodicity=periodicity,
        detectable_dip=None if dip is None else round(100 * dip, 2),
        test=stratified_test(correct, design, binary=True, seed=seed),
        logprob_test=stratified_test(results["logprob"].to_numpy(dtype=float), design, binary=False, seed=seed),
        per_residue=by_residue.to_dict("records"),
        per_phase=by_phase.to_dict("records"),
        targets_per_context=round(per_context, 2),
        icc=None if icc is None else round(icc, 4),
        design_effect=None if icc is None else round(design_effect(icc, per_context), 3),
    )


def with_shifts(results: pd.DataFrame, offsets: pd.DataFrame) -> pd.DataFrame:
    """One row per (target, shift) of offsets.csv, in results' shape: the target's residue, context and
    position, and its correct, logprob and predicted under that shift."""
    scored = offsets[["target_id", "shift", "correct", "logprob", "predicted"]]
    return results.drop(columns=["correct", "logprob", "predicted"]).merge(scored, on="target_id")


def summarize_shifts(results: pd.DataFrame, offsets: pd.DataFrame, stride: int, modulus: int,
                     seed: int = 0) -> dict[int, Summary]:
    """Each fixed shift's own summary (every target scored under it): what one shift alone gives."""
    shifted = with_shifts(results, offsets)
    return {int(d): summarize(frame.drop(columns="shift"), stride, modulus, seed)
            for d, frame in shifted.groupby("shift", sort=True)}


def format_p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


@dataclass(frozen=True)
class GapDifference:
    """One run's gap minus a baseline run's, with a 95% interval from bootstrapping each
    run's contexts independently."""

    difference: float  # points
    ci_low: float
    ci_high: float

    @property
    def differs(self) -> bool:
        """The interval excludes zero: the two gaps differ at the 5% level."""
        return self.ci_low > 0 or self.ci_high < 0


def gap_difference(baseline: pd.DataFrame, other: pd.DataFrame, seed: int = 0) -> GapDifference:
    """`other`'s gap minus `baseline`'s (e.g. a fix against the run it should improve)."""
    samples = [bootstrap_gaps(r["correct"].to_numpy(dtype=float), r["residue"].to_numpy(), r["context"].to_numpy(),
                              seed + i) for i, r in enumerate((baseline, other))]
    n = min(len(s) for s in samples)
    observed = [100 * np.ptp(r.groupby("residue")["correct"].mean().to_numpy()) for r in (baseline, other)]
    difference = float(observed[1] - observed[0])
    # a run none of whose resamples held every residue: the difference's interval is its whole range
    low, high = basic_interval(samples[1][:n] - samples[0][:n], difference) if n else (-100.0, 100.0)
    return GapDifference(round(difference, 2), round(low, 2), round(high, 2))
