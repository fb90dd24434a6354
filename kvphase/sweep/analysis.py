"""Statistics over a run's results: per-residue accuracy with Wilson intervals, gap,
periodicity, and a test of "accuracy does not depend on the residue". Prints nothing."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

Z_95 = 1.959963984540054  # two-sided 95% normal quantile
PERMUTATIONS = 10_000
ALPHA = 0.05


def wilson_interval(correct: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Two-sided Wilson score interval for a binomial proportion, as fractions."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class HomogeneityTest:
    """Pearson's chi-square test that accuracy is the same in every residue group."""

    name: str
    statistic: float
    dof: int
    p_value: float
    cramers_v: float  # effect size, 0 (none) to 1
    note: str


def homogeneity_test(correct: np.ndarray, groups: np.ndarray, seed: int = 0) -> HomogeneityTest:
    """Chi-square on the groups x {correct, wrong} table; the p-value comes from label
    permutations when an expected count is below 5, where the chi-square law is poor."""
    labels, codes = np.unique(groups, return_inverse=True)
    correct = np.asarray(correct, dtype=bool)
    if correct.all() or not correct.any():
        return HomogeneityTest("Pearson chi-square test of homogeneity", 0.0, len(labels) - 1, 1.0, 0.0,
                               "every target has the same outcome, so accuracy cannot vary")
    statistic, expected_min = _chi_square(correct, codes, len(labels))
    dof = len(labels) - 1
    cramers_v = float(np.sqrt(statistic / len(correct)))  # one of the table's sides has 2 levels
    if expected_min >= 5:
        p = float(stats.chi2.sf(statistic, dof))
        return HomogeneityTest("Pearson chi-square test of homogeneity", statistic, dof, p, cramers_v,
                               f"chi-square law (df = {dof}); every expected count is at least 5")
    rng = np.random.default_rng(seed)
    exceed = sum(_chi_square(rng.permutation(correct), codes, len(labels))[0] >= statistic - 1e-12
                 for _ in range(PERMUTATIONS))
    p = (exceed + 1) / (PERMUTATIONS + 1)
    return HomogeneityTest("Pearson chi-square test of homogeneity (permutation p-value)", statistic, dof, p,
                           cramers_v, f"p from {PERMUTATIONS} label permutations: an expected count is below 5")


def _chi_square(correct: np.ndarray, codes: np.ndarray, n_groups: int) -> tuple[float, float]:
    n = np.bincount(codes, minlength=n_groups).astype(float)  # (n_groups,)
    hits = np.bincount(codes, weights=correct, minlength=n_groups)  # (n_groups,)
    observed = np.stack([hits, n - hits])  # (2, n_groups)
    expected = np.outer(observed.sum(axis=1), n) / n.sum()  # (2, n_groups)
    return float(((observed - expected) ** 2 / expected).sum()), float(expected.min())


@dataclass(frozen=True)
class Summary:
    """What a report says, as numbers (accuracies in percent, two decimals)."""

    n_targets: int
    mean_accuracy: float  # mean over residues
    worst_accuracy: float
    worst_residue: int
    best_accuracy: float
    best_residue: int
    gap: float  # best - worst, points
    periodicity: float | None  # mean over r < S of |A(r) - A(r + S)|, when M = 2S
    test: HomogeneityTest
    per_residue: list[dict]
    per_phase: list[dict]

    def headline(self) -> str:
        """One plain sentence on what the numbers say."""
        p = _format_p(self.test.p_value)
        if self.test.p_value < ALPHA:
            return (f"Accuracy depends on the token phase: residue {self.worst_residue} reaches "
                    f"{self.worst_accuracy:.1f}% against {self.best_accuracy:.1f}% at residue {self.best_residue} "
                    f"(gap {self.gap:.1f} points, p = {p}).")
        return f"No phase effect detected at this sample size (gap {self.gap:.1f} points, p = {p})."

    def to_json(self) -> dict:
        out = asdict(self)
        out["headline"] = self.headline()
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


def summarize(results: pd.DataFrame, stride: int, modulus: int, seed: int = 0) -> Summary:
    """The run's statistics from its results frame (one row per scored target)."""
    by_residue = per_group(results, "residue")
    by_phase = per_group(results, "phase")
    acc = by_residue.set_index("residue")["accuracy"]
    periodicity = None
    if modulus == 2 * stride and all(r in acc.index for r in range(modulus)):
        periodicity = round(float(np.mean([abs(acc[r] - acc[r + stride]) for r in range(stride)])), 2)
    test = homogeneity_test(results["correct"].to_numpy(), results["residue"].to_numpy(), seed)
    return Summary(
        n_targets=len(results),
        mean_accuracy=round(float(acc.mean()), 2),
        worst_accuracy=float(acc.min()),
        worst_residue=int(acc.idxmin()),
        best_accuracy=float(acc.max()),
        best_residue=int(acc.idxmax()),
        gap=round(float(acc.max() - acc.min()), 2),
        periodicity=periodicity,
        test=test,
        per_residue=by_residue.to_dict("records"),
        per_phase=by_phase.to_dict("records"),
    )


def _format_p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"
