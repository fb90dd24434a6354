"""Intervals that respect the contexts, and how clustered a run was.

- Gap intervals: simultaneous intervals on the residues' differences within contexts, and a
  bootstrap over whole contexts (basic intervals, which undo the upward bias of a best - worst
  difference).
- The mean accuracy's interval: Wilson's score interval at the effective number of targets,
  whole contexts the sampled units, and its coverage in runs simulated like this one.
- How clustered the run was: the intra-context correlation of the outcome (one-way ANOVA
  estimator) and the design effect it implies for anything that pools contexts, such as the
  mean accuracy.
"""

from __future__ import annotations

import math

import numpy as np

from kvphase.statistics.stratified import Stratification

BOOTSTRAPS = 2_000
Z_95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(correct: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Two-sided Wilson score interval for a binomial proportion, as fractions."""
    if np.ndim(n) == 0 and n == 0:
        return (0.0, 1.0)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (np.maximum(0.0, centre - half), np.minimum(1.0, centre + half))  # each a float, or an array of them


def intra_context_correlation(outcome: np.ndarray, contexts: np.ndarray) -> float | None:
    """How alike targets of one context are: the intra-class correlation of the outcome with
    contexts as classes, by the one-way ANOVA estimator for classes of unequal sizes (Donner,
    International Statistical Review 54, 1986; the estimator Fleiss uses for a 0/1 outcome):

        (MSB - MSW) / (MSB + (n0 - 1) MSW),  n0 = (N - sum n_c^2 / N) / (K - 1)

    MSB and MSW are the mean squares between and within the K contexts, n_c their sizes.
    Clipped at 0 from below: a negative estimate (contexts less alike than chance makes
    them) is read as no clustering, not as contexts that add information. None when it
    cannot be measured: fewer than two contexts, no context of two targets, or an outcome
    that never varies.
    """
    y = np.asarray(outcome, dtype=float)  # (N,)
    _, codes, sizes = np.unique(np.asarray(contexts), return_inverse=True, return_counts=True)  # (N,), (K,)
    n, k = len(y), len(sizes)
    if k < 2 or n == k or y.min() == y.max():
        return None
    means = np.bincount(codes, weights=y) / sizes  # (K,)
    between = sizes @ (means - y.mean()) ** 2 / (k - 1)
    within = ((y - means[codes]) ** 2).sum() / (n - k)
    n0 = (n - (sizes**2).sum() / n) / (k - 1)  # the adjusted mean context size
    return max(0.0, float((between - within) / (between + (n0 - 1) * within)))


def design_effect(icc: float, targets_per_context: float) -> float:
    """1 + (m - 1) ICC: how many times the variance of a mean over the run exceeds what as many
    independent targets would give (Kish, Survey Sampling, 1965), m targets per context; N
    targets carry the information of N / design effect independent ones."""
    return 1 + (targets_per_context - 1) * icc


def bootstrap_gaps(correct: np.ndarray, residues: np.ndarray, contexts: np.ndarray, seed: int = 0,
                   n: int = BOOTSTRAPS) -> np.ndarray:
    """Best - worst residue accuracy (points) in `n` resamples of whole contexts (n,).

    Contexts are drawn with replacement, so targets that share a context stay together.
    A resample in which some residue has no target is dropped.
    """
    accuracy = bootstrap_residue_accuracy(correct, residues, contexts, seed, n)  # (n', G)
    return accuracy.max(axis=1) - accuracy.min(axis=1)


def bootstrap_residue_accuracy(correct: np.ndarray, residues: np.ndarray, contexts: np.ndarray, seed: int = 0,
                               n: int = BOOTSTRAPS) -> np.ndarray:
    """Each residue's accuracy (%) in `n` resamples of whole contexts, (n', G): `bootstrap_gaps`'s
    resamples (the same for the same seed), of which the gap and the mean over residues are read."""
    _, context_codes = np.unique(np.asarray(contexts), return_inverse=True)
    _, groups = np.unique(np.asarray(residues), return_inverse=True)
    shape = (context_codes.max() + 1, groups.max() + 1)
    hits, totals = np.zeros(shape), np.zeros(shape)  # (H, G)
    np.add.at(hits, (context_codes, groups), np.asarray(correct, dtype=float))
    np.add.at(totals, (context_codes, groups), 1)
    draws = np.random.default_rng(seed).multinomial(shape[0], np.full(shape[0], 1 / shape[0]), size=n)  # (n, H)
    counted = draws @ totals  # (n, G)
    complete = (counted > 0).all(axis=1)  # (n,)
    return 100 * (draws @ hits)[complete] / counted[complete]  # (n', G)


def percentile_interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central `level` interval of bootstrap samples."""
    low, high = np.percentile(samples, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def small_sample_widening(n_contexts: int, level: float = 0.95) -> float:
    """How much wider than the bootstrap's own spread an interval over `n_contexts` contexts is drawn:
    Student's t with n - 1 degrees of freedom against the normal, times sqrt(n / (n - 1)) (the
    bootstrap's spread is the plug-in one). Resampling 8 contexts underestimates the spread (the
    intervals covered 80-89% in simulation, bench/bench_power.py); 1 at many contexts."""
    from scipy import stats

    if n_contexts < 2:
        return math.inf
    return float(stats.t.isf((1 - level) / 2, n_contexts - 1) / stats.norm.isf((1 - level) / 2)
                 * math.sqrt(n_contexts / (n_contexts - 1)))


GAP_DRAWS = 20_000  # normal draws for the simultaneous intervals' critical value (fixed seed; its SE about 0.03)


def gap_interval(outcome: np.ndarray, stratification: Stratification, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """The gap's interval (points) from simultaneous intervals on every pairwise difference between
    residue accuracies: with every difference d_rs inside d_rs +- c se_rs at once (c: the `level`
    quantile of the largest |Z_r - Z_s| / se_rs over pairs, Z the residue means' normal law), the gap,
    max |d_rs|, lies in [max (|d_rs| - c se_rs), max (|d_rs| + c se_rs)]. The lower end can be 0 or
    less (the data allow no gap at all); it is reported as computed.

    The standard errors come from the variance within each context (a stratum of `stratification`), as the
    test's do: a context's effect moves all of its residues alike and leaves their differences. A
    bootstrap of the best - worst difference over whole contexts (the interval kvphase printed before)
    does not cover near 0, and resampling 8 contexts misjudges the spread: its interval held a true gap
    of 0 in 70-82% of simulated runs without an effect (bench/bench_power.py)."""
    y = np.asarray(outcome, dtype=float)  # (N,)
    table = stratification.counts  # (H, G)
    size = table.sum(axis=1)  # (H,)
    sums = np.bincount(stratification.strata, weights=y, minlength=len(table))  # (H,)
    squares = np.bincount(stratification.strata, weights=y * y, minlength=len(table))  # (H,)
    spread = np.where(size > 1, np.clip(squares - sums**2 / size, 0, None) / np.maximum(size - 1, 1), 0.0)  # (H,)
    # a stratum all right or all wrong shows no spread, which would claim a gap known exactly: its variance
    # is taken no lower than that of its rate with half a target added each way (as Agresti-Coull do)
    settled = (sums + 0.5) / (size + 1)  # (H,)
    spread = np.maximum(spread, settled * (1 - settled))  # (H,)
    per_group = table.sum(axis=0)  # (G,)
    accuracy = 100 * np.bincount(stratification.groups, weights=y, minlength=stratification.n_groups) / per_group  # (G,)
    variance = 100**2 * (spread @ table) / per_group**2  # (G,) of each residue's accuracy
    first, second = np.triu_indices(stratification.n_groups, k=1)  # (P,), (P,) each pair once
    shown = np.abs(accuracy[first] - accuracy[second])  # (P,)
    error = np.sqrt(variance[first] + variance[second])  # (P,)
    varies = error > 0
    z = np.random.default_rng(seed).standard_normal((GAP_DRAWS, stratification.n_groups)) * np.sqrt(variance)  # (D, G)
    largest = np.zeros(GAP_DRAWS)  # (D,) the largest studentized difference in each draw
    for start in range(0, len(first), 512):  # pairs in chunks: M = 128 has 8,128
        pair = slice(start, start + 512)
        keep = varies[pair]
        moved = np.abs(z[:, first[pair]] - z[:, second[pair]])[:, keep] / error[pair][keep]  # (D, p)
        largest = np.maximum(largest, moved.max(axis=1, initial=0.0))
    critical = float(np.quantile(largest, level))
    # a gap lies within 0-100 points: the upper end is capped there, the lower end (-100 at least) kept as computed
    return max(float(np.max(shown - critical * error)), -100.0), min(float(np.max(shown + critical * error)), 100.0)


def basic_interval(samples: np.ndarray, observed: float, level: float = 0.95) -> tuple[float, float]:
    """The basic (reverse percentile) bootstrap interval, 2 x observed - the samples' upper and
    lower quantiles: a gap is biased upward (noise alone makes some residue best and another
    worst), resamples are biased once more, and this interval takes that bias back out."""
    low, high = percentile_interval(samples, level)
    return 2 * observed - high, 2 * observed - low


def mean_over_residues(values: np.ndarray, stratification: Stratification,
                       contexts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean over residues of each of R rows of per-target `values` (R, N), and its variance with whole
    contexts as the sampled units (each context's share of every residue's deviation, squared and summed:
    what a bootstrap over contexts estimates), widened for few contexts: ((R,), (R,))."""
    from scipy import sparse

    values = np.atleast_2d(np.asarray(values, dtype=float))  # (R, N)
    _, context_codes = np.unique(np.asarray(contexts), return_inverse=True)
    n_contexts, n_targets = context_codes.max() + 1, values.shape[1]
    cells = context_codes.ravel() * stratification.n_groups + stratification.groups  # (N,)
    member = sparse.csr_matrix((np.ones(n_targets), (np.arange(n_targets), cells)),
                               shape=(n_targets, n_contexts * stratification.n_groups))  # (N, H*G)
    hits = np.asarray((member.T @ values.T).T).reshape(len(values), n_contexts, stratification.n_groups)  # (R, H, G)
    sizes = np.asarray(member.sum(axis=0)).reshape(n_contexts, stratification.n_groups)  # (H, G)
    per_group = sizes.sum(axis=0)  # (G,)
    mean = hits.sum(axis=1) / per_group  # (R, G)
    share = ((hits - sizes * mean[:, None, :]) / per_group).mean(axis=2)  # (R, H) each context's part of the mean
    return mean.mean(axis=1), (share**2).sum(axis=1) * small_sample_widening(n_contexts) ** 2


def paired_difference(correct: np.ndarray, baseline: np.ndarray, residues: np.ndarray,
                      contexts: np.ndarray) -> tuple[float, float, float]:
    """(difference, low, high) in points: the mean accuracy over residues of `correct` minus `baseline`'s,
    the same targets scored twice (N,), with a 95% normal interval of the paired mean whose variance has
    whole contexts as the sampled units (`mean_over_residues`), widened for few contexts."""
    difference = np.asarray(correct, dtype=float) - np.asarray(baseline, dtype=float)  # (N,) -1, 0 or 1
    mean, variance = mean_over_residues(difference, Stratification.of(residues, contexts), contexts)
    half = Z_95 * math.sqrt(float(variance[0]))
    return 100 * float(mean[0]), 100 * (float(mean[0]) - half), 100 * (float(mean[0]) + half)


def mean_intervals(correct: np.ndarray, stratification: Stratification, contexts: np.ndarray) -> np.ndarray:
    """The mean accuracy's 95% interval (%) of each of R runs on one design, (R, 2) from `correct` (R, N):
    Wilson's score interval at the effective number of targets (n p (1 - p) / variance, at most n), the
    variance that of the mean over residues with whole contexts as the sampled units (each context's
    share of every residue's deviation, squared and summed: what a bootstrap over contexts estimates),
    widened for few contexts. It stays within 0-100 and, unlike a symmetric interval, covers near them."""
    correct = np.atleast_2d(np.asarray(correct, dtype=float))  # (R, N)
    n_targets = correct.shape[1]
    if len(np.unique(np.asarray(contexts))) < 2:
        return np.tile([0.0, 100.0], (len(correct), 1))  # one context: the mean's interval is unknown
    p, variance = mean_over_residues(correct, stratification, contexts)
    settled = (variance == 0) | (p <= 0) | (p >= 1)
    effective = np.where(settled, n_targets, np.minimum(n_targets, p * (1 - p) / np.where(settled, 1, variance)))
    low, high = wilson_interval(p * effective, effective)
    return 100 * np.stack([low, high], axis=1)


COVERAGE_RUNS = 400  # runs simulated for a mean interval's coverage (its Monte Carlo SE about 1.1 points at 95%)
SIMULATED_CELLS = 1_000_000  # targets simulated at once (runs x targets): some 8 MB per array


def mean_coverage(correct: np.ndarray, stratification: Stratification, contexts: np.ndarray, seed: int = 0,
                  runs: int = COVERAGE_RUNS) -> float | None:
    """How often the mean's interval holds the true mean in `runs` runs simulated like this one: its
    design, its mean accuracy, and contexts as varied as its own (a normal context effect on the logit
    scale whose SD matches the spread of the contexts' accuracies beyond what chance gives). None when
    the run is all right or all wrong (nothing to simulate from) or holds one context."""
    from scipy import special

    correct = np.asarray(correct, dtype=float)  # (N,)
    _, context_codes = np.unique(np.asarray(contexts), return_inverse=True)
    p = correct.mean()
    if not 0 < p < 1 or context_codes.max() < 1:
        return None
    size = np.bincount(context_codes)  # (H,)
    rate = np.bincount(context_codes, weights=correct) / size  # (H,)
    beyond_chance = max(float(np.average((rate - p) ** 2, weights=size) - np.mean(p * (1 - p) / size)), 0.0)
    spread = min(np.sqrt(beyond_chance) / (p * (1 - p)), 3.0)  # logits (delta method), capped at a wide 3
    intercept = logit_intercept(p, spread)
    rng = np.random.default_rng(seed)
    held = 0
    batch = max(1, SIMULATED_CELLS // len(correct))  # runs at a time: a large run's simulation stays small
    for start in range(0, runs, batch):
        effects = spread * rng.standard_normal((min(batch, runs - start), len(size)))  # (R', H)
        chance = special.expit(intercept + effects[:, context_codes])  # (R', N)
        simulated = (rng.random(chance.shape) < chance).astype(float)  # (R', N)
        bounds = mean_intervals(simulated, stratification, contexts)  # (R', 2)
        held += int(np.sum((bounds[:, 0] <= 100 * p) & (100 * p <= bounds[:, 1])))
    return held / runs


def logit_intercept(mean: float, spread: float) -> float:
    """The intercept a whose accuracy averaged over context effects N(0, spread^2) on the logit scale is `mean`."""
    from scipy import optimize, special

    nodes, weights = np.polynomial.hermite_e.hermegauss(60)  # E f(Z) = sum w f(x) / sqrt(2 pi)
    weights = weights / weights.sum()
    return float(optimize.brentq(lambda a: weights @ special.expit(a + spread * nodes) - mean, -30, 30))
