"""Tests, power and intervals that respect a clustered design.

Targets that share a context are not independent: a context that confuses the model
pulls all of its targets down together (docs/protocol.md, "Statistics that respect the
design"). Everything here therefore compares residues *within* contexts, or resamples
whole contexts:

- The test is the generalized Cochran-Mantel-Haenszel statistic stratified by context
  (Agresti, Categorical Data Analysis, 3rd ed., section 8.4): within each context, each
  residue's outcome sum is compared with what the context's own mean predicts, and the
  differences are weighed by their variance under residue labels permuted within the
  context. For a 0/1 outcome it is CMH's general-association statistic for residue x
  correct; for a continuous outcome (the answer log-probability) its mean-score form. A
  context effect moves every residue of that context alike, so it cancels.
- The p-value comes from the chi-square law where counts are large, and otherwise from
  the permutations themselves (residue labels shuffled within each context, fixed seed).
- Power: the smallest one-residue dip the test detects with 80% power, from the
  non-central chi-square law with the test's own variance (so the run's design and the
  context effects it saw are in it).
- Gap intervals come from a bootstrap over contexts (basic intervals, which undo the
  upward bias of a best - worst difference).
- How clustered the run was: the intra-context correlation of the outcome (one-way ANOVA
  estimator) and the design effect it implies for anything that pools contexts, such as the
  mean accuracy.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np

from kvphase.defaults import default_threads

ALPHA = 0.05
POWER = 0.80
PERMUTATIONS = 4_000
BOOTSTRAPS = 2_000
MIN_EXPECTED = 5  # the chi-square law is used when every expected count reaches this
WHOLE_ROUNDS_BELOW = 32  # moduli whose auto sample sizes are rounded to a multiple of M (per_residue_for_dip)
_CHUNK_VALUES = 1 << 22  # shuffled outcomes held at once (permutations x targets), to bound memory
# eigenvalues of the CMH covariance below this share of the largest are rounding, not a direction the
# outcome varies in: the pseudo-inverse drops them and the degrees of freedom do not count them
RCOND = 1e-10


@dataclass(frozen=True)
class Design:
    """Which residue group and which stratum each scored target belongs to.

    A stratum is a context; contexts holding a single target carry no within-context
    comparison, and being independent of one another they share one stratum.
    """

    groups: np.ndarray  # (N,) residue codes 0..G-1
    strata: np.ndarray  # (N,) stratum codes 0..H-1
    labels: np.ndarray  # (G,) the residue each code stands for

    def __post_init__(self) -> None:
        if self.groups.shape != self.strata.shape or self.groups.ndim != 1:
            raise ValueError(f"expected one group and one stratum per target, got shapes "
                             f"{self.groups.shape} and {self.strata.shape}")

    @classmethod
    def of(cls, residues, contexts, blocks=None) -> "Design":
        """With `blocks` (one code per target), strata never mix blocks: a stratum is one context's
        targets within one block, and the singletons of a block share a stratum of their own."""
        labels, groups = np.unique(np.asarray(residues), return_inverse=True)
        _, context_codes = np.unique(np.asarray(contexts), return_inverse=True)
        block = np.zeros_like(groups) if blocks is None else np.unique(np.asarray(blocks), return_inverse=True)[1]
        cells = np.stack([block.ravel(), context_codes.ravel()])  # (2, N) block, context
        _, cell_codes, sizes = np.unique(cells, axis=1, return_inverse=True, return_counts=True)
        pooled = np.where(sizes[cell_codes.ravel()] == 1, -1, cells[1])  # (N,) a block's singletons share -1
        _, strata = np.unique(np.stack([cells[0], pooled]), axis=1, return_inverse=True)
        return cls(groups.ravel(), strata.ravel(), labels)

    @property
    def n_groups(self) -> int:
        return len(self.labels)

    @cached_property
    def counts(self) -> np.ndarray:
        """Targets per stratum and group (computed once: the power rule reads it many times)."""
        table = np.zeros((self.strata.max() + 1, self.n_groups))  # (H, G)
        np.add.at(table, (self.strata, self.groups), 1)
        return table

    @property
    def balanced(self) -> bool:
        """True when every stratum holds the same number of targets of each group it holds."""
        table = self.counts  # (H, G)
        return bool(all(len(set(row[row > 0])) == 1 for row in table))


@dataclass(frozen=True)
class StratifiedTest:
    """A test that the outcome does not depend on the residue, stratified by context."""

    name: str
    statistic: float
    dof: int
    p_value: float
    note: str
    permutations: int = 0  # how many the p came from (0: the chi-square law); summaries from before lack it


def one_hot(codes: np.ndarray, n: int):
    """Sparse (N, n) membership matrix of `codes`: a run's contexts are thousands of strata, and
    a dense one would be N x H numbers."""
    from scipy import sparse

    return sparse.csr_array((np.ones(len(codes)), (np.arange(len(codes)), codes)), shape=(len(codes), n))


def cmh_parts(outcomes: np.ndarray, design: Design) -> tuple[np.ndarray, np.ndarray]:
    """Per batch row: each group's outcome sum minus its expectation within strata, and
    the covariance of those differences under within-stratum permutation."""
    y = np.atleast_2d(np.asarray(outcomes, dtype=float))  # (B, N)
    in_stratum = one_hot(design.strata, design.strata.max() + 1)  # (N, H) sparse
    in_group = one_hot(design.groups, design.n_groups)  # (N, G) sparse
    table = design.counts  # (H, G)
    size = table.sum(axis=1)  # (H,)
    sums = (in_stratum.T @ y.T).T  # (B, H)
    means = sums / size  # (B, H)
    excess = (in_group.T @ y.T).T - means @ table  # (B, G)
    squares = np.clip((in_stratum.T @ (y * y).T).T - sums * means, 0, None)  # (B, H) sum of squared deviations
    spread = np.where(size > 1, squares / np.maximum(size - 1, 1), 0.0)  # (B, H) within-stratum variance
    shape = np.einsum("hg,gk->hgk", table, np.eye(design.n_groups)) - (
        table[:, :, None] * table[:, None, :] / size[:, None, None])  # (H, G, G)
    covariance = np.einsum("bh,hgk->bgk", spread, shape)  # (B, G, G)
    return excess, covariance


def pseudo_inverse(covariance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pseudo-inverse of each symmetric matrix in `covariance` (..., G, G) and its rank (...,),
    both from one eigendecomposition with one tolerance (RCOND).

    The CMH covariance always has the null direction "every group alike" (the differences sum
    to zero), so its rank is at most G - 1. Summed over hundreds of strata, that direction's
    eigenvalue comes out of rounding at about 1e-15 of the largest, which numpy's default rank
    tolerance (G x machine epsilon, 9e-16 at G = 4) counted while the pseudo-inverse dropped
    it: the test had G degrees of freedom for G - 1 dimensions."""
    values, vectors = np.linalg.eigh(covariance)  # (..., G), (..., G, G)
    size = np.abs(values)  # (..., G)
    kept = size > RCOND * size.max(axis=-1, keepdims=True)  # (..., G) directions the outcome varies in
    reciprocal = np.where(kept, 1 / np.where(kept, values, 1), 0.0)  # (..., G)
    inverse = np.einsum("...gk,...k,...lk->...gl", vectors, reciprocal, vectors)  # (..., G, G)
    return inverse, kept.sum(axis=-1)


def cmh_statistic(outcomes: np.ndarray, design: Design) -> tuple[np.ndarray, int]:
    """Generalized CMH statistic for each row of `outcomes` (B, N), and its degrees of freedom
    (the rank of the first row's covariance)."""
    excess, covariance = cmh_parts(outcomes, design)  # (B, G), (B, G, G)
    inverse, rank = pseudo_inverse(covariance)  # (B, G, G), (B,)
    statistic = np.einsum("bg,bgk,bk->b", excess, inverse, excess)  # (B,)
    dof = int(rank[0]) if len(rank) else 0
    return np.clip(statistic, 0, None), dof


def _shuffled_within(values: np.ndarray, strata: np.ndarray, n: int, rng: np.random.Generator):
    """`n` shuffles of `values` within every stratum, one class of equal-sized strata at a
    time: yields the targets of those strata (H_s, size) and their shuffled values (n, H_s, size).
    Targets may come in any order; a stratum is whatever shares a code."""
    order = np.argsort(strata, kind="stable")  # (N,) targets grouped by stratum
    _, starts, sizes = np.unique(strata[order], return_index=True, return_counts=True)  # (H,), (H,)
    for size in np.unique(sizes):  # strata of one size shuffle together, as short rows
        slots = order[starts[sizes == size][:, None] + np.arange(size)]  # (H_s, size) target indices
        picks = np.argsort(rng.random((n, *slots.shape)), axis=2)  # (n, H_s, size) a random order in each stratum
        yield slots, np.take_along_axis(np.broadcast_to(values[slots], picks.shape), picks, axis=2)


def permuted_group_sums(outcome: np.ndarray, design: Design, n: int, rng: np.random.Generator) -> np.ndarray:
    """Each group's outcome sum (n, G) in `n` arrangements with the outcomes shuffled within
    every stratum."""
    sums = np.zeros((n, design.n_groups))  # (n, G)
    for slots, shuffled in _shuffled_within(np.asarray(outcome, dtype=float), design.strata, n, rng):
        in_group = np.eye(design.n_groups)[design.groups[slots].ravel()]  # (H_s * size, G)
        sums += shuffled.reshape(n, -1) @ in_group  # (n, G)
    return sums


def permutation_p(outcome: np.ndarray, design: Design, observed: float, seed: int,
                  permutations: int = PERMUTATIONS) -> float:
    """Share of within-context permutations whose CMH statistic reaches the observed one
    (counting the observed arrangement itself, so p is never 0).

    Shuffling within strata keeps every stratum's sum and spread, so the expected group
    sums and the covariance are the observed ones: only the group sums move."""
    excess, covariance = cmh_parts(outcome, design)  # (1, G), (1, G, G)
    expected = np.bincount(design.groups, weights=np.asarray(outcome, dtype=float), minlength=design.n_groups) - excess[0]  # (G,)
    inverse, _ = pseudo_inverse(covariance[0])  # (G, G)
    chunk = max(1, min(permutations, _CHUNK_VALUES // len(outcome)))
    sizes = [min(chunk, permutations - start) for start in range(0, permutations, chunk)]

    def reached(size: int, seed_sequence: np.random.SeedSequence) -> int:
        moved = permuted_group_sums(outcome, design, size, np.random.default_rng(seed_sequence)) - expected  # (b, G)
        statistic = np.einsum("bg,gk,bk->b", moved, inverse, moved)  # (b,)
        return int((statistic >= observed * (1 - 1e-9) - 1e-12).sum())

    # one seed per chunk, so the p-value is the same whatever the number of threads
    with ThreadPoolExecutor(max_workers=default_threads()) as pool:
        counts = pool.map(reached, sizes, np.random.SeedSequence(seed).spawn(len(sizes)))
        return (sum(counts) + 1) / (permutations + 1)


def stratified_test(outcome: np.ndarray, design: Design, binary: bool, seed: int = 0) -> StratifiedTest:
    """CMH test that the outcome is the same in every group, stratified by context."""
    kind = "residue x correct" if binary else "answer log-probability by residue"
    name = (f"Cochran-Mantel-Haenszel test stratified by context ({kind})" if design.strata.max() > 0
            else f"chi-square test of homogeneity, independent targets ({kind})")
    statistic, dof = cmh_statistic(outcome, design)
    if dof == 0:
        return StratifiedTest(name, 0.0, 0, 1.0, "no context holds two targets that differ, so nothing varies "
                              "within a context")
    p, exact = _p_values(np.atleast_2d(outcome), design, binary, seed, PERMUTATIONS, statistic, dof)
    if not exact[0]:
        return StratifiedTest(name, float(statistic[0]), dof, float(p[0]),
                              f"chi-square law (df = {dof}); every expected count is at least {MIN_EXPECTED}")
    why = f"an expected count is below {MIN_EXPECTED}" if binary else "log-probabilities are heavy-tailed"
    return StratifiedTest(name, float(statistic[0]), dof, float(p[0]),
                          f"p from {PERMUTATIONS} permutations of residue labels within contexts ({why})", PERMUTATIONS)


def stratified_p_values(outcomes: np.ndarray, design: Design, binary: bool, seed: int = 0,
                        permutations: int = PERMUTATIONS) -> tuple[np.ndarray, np.ndarray]:
    """p-values of the stratified test for each row of `outcomes` (B, N), and whether each
    came from permutations. A 0/1 outcome uses the chi-square law when every group's
    expected number of successes and failures is at least MIN_EXPECTED; a continuous one
    (heavy-tailed log-probabilities) always takes its p from within-context permutations."""
    statistic, dof = cmh_statistic(outcomes, design)  # (B,)
    return _p_values(outcomes, design, binary, seed, permutations, statistic, dof)


def _p_values(outcomes: np.ndarray, design: Design, binary: bool, seed: int, permutations: int,
              statistic: np.ndarray, dof: int) -> tuple[np.ndarray, np.ndarray]:
    from scipy import stats  # imported here: scipy.stats alone takes seconds, and most commands never test

    p = stats.chi2.sf(statistic, max(dof, 1))  # (B,)
    exact = np.ones(len(outcomes), dtype=bool) if not binary else np.array(
        [_expected_extremes(row, design) < MIN_EXPECTED for row in outcomes])  # (B,)
    for i in np.flatnonzero(exact):
        p[i] = permutation_p(outcomes[i], design, statistic[i], seed, permutations)
    return p, exact


def _expected_extremes(correct: np.ndarray, design: Design) -> float:
    """The smallest expected count of successes or failures of any group, given each
    stratum's own success rate."""
    table = design.counts  # (H, G)
    rate = np.bincount(design.strata, weights=correct) / table.sum(axis=1)  # (H,)
    successes = rate @ table  # (G,)
    return float(min(successes.min(), (table.sum(axis=0) - successes).min()))


def noncentrality_for_power(dof: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The non-centrality at which a chi-square test with `dof` degrees of freedom at level
    `alpha` rejects with probability `power`."""
    from scipy import optimize, stats

    critical = stats.chi2.isf(alpha, dof)
    return float(optimize.brentq(lambda lam: stats.ncx2.sf(critical, dof, lam) - power, 1e-9, 1e4))


@dataclass(frozen=True)
class Detectable:
    """What the run could have seen: the smallest one-residue dip the accuracy test finds with
    POWER, or None when even the largest dip that fits (the hardest residue down to 0%) is found
    less often; `largest` is that dip and `power_at_largest` how often it is found."""

    dip: float | None  # fraction of targets
    largest: float  # fraction: the room a dip has above 0% (the accuracy, or the lower end of its interval)
    power_at_largest: float  # at the hardest residue
    residue: int | None = None  # the hardest residue's label (None when no residue was tried)


POWER_DRAWS = 4_000  # Gaussian draws per power evaluation (Monte Carlo SE 0.6% at 80% power)
POWER_CANDIDATES = 4  # residues tried for the hardest: those with the least information under the null
DIP_STEPS = 16  # bisection steps on the dip (resolution: the room / 65,536)


def alternative_moments(table: np.ndarray, base: np.ndarray, group: int, dip: float, mean: float,
                        own_share: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Under one residue's dip: the CMH differences' expectation (G,), their covariance (G, G) and
    the covariance the test will estimate from such data (G, G).

    Every stratum keeps its own rate `base` (H,) except the dipped group, which loses the same share
    of it everywhere (rate x (1 - dip / mean), `mean` the group's own accuracy at those rates): its
    accuracy falls by `dip` and no rate falls below 0. Targets are independent given their rates, so a stratum's group sums S_h have covariance
    diag(n_hk v_hk), and its differences are (I - n_h 1' / N_h) S_h. `table`: targets per stratum and
    group (H, G), a design's counts."""
    size = table.sum(axis=1)  # (H,)
    n_groups = table.shape[1]
    rates = np.repeat(base[:, None], n_groups, axis=1)  # (H, G)
    rates[:, group] *= 1 - dip / mean
    sums = table * rates  # (H, G) expected group sums
    stratum_mean = sums.sum(axis=1) / size  # (H,)
    expected = (sums - table * stratum_mean[:, None]).sum(axis=0)  # (G,)
    # the strata's rates are estimates from N_h targets (`own_share` of each is the stratum's own reading),
    # and r (1 - r) of an estimate is low by its variance, w^2 r (1 - r) / (N_h - 1) on average: the variance
    # each target is given takes that back out, else the dip reported is too small
    share = np.ones(len(size)) if own_share is None else own_share  # (H,)
    scale = np.where(np.arange(n_groups) == group, 1 - dip / mean, 1.0)  # (G,)
    noise = np.outer(share**2 * base * (1 - base) / np.maximum(size - 1, 1), scale**2)  # (H, G)
    weights = table * (rates * (1 - rates) + noise)  # (H, G) n_hk v_hk
    total = weights.sum(axis=1)  # (H,)
    mixed = np.einsum("hg,hk->gk", weights, table / size[:, None])  # (G, G) sum_h w_h n_h' / N_h
    covariance = (np.diag(weights.sum(axis=0)) - mixed - mixed.T
                  + np.einsum("h,hg,hk->gk", total / size**2, table, table))  # (G, G)
    # the test's own covariance: each stratum's sample variance, whose expectation under these rates is
    # ((1 - 1/N) sum v + sum (r - m)^2) / (N - 1), times the permutation shape diag(n_h) - n_h n_h' / N_h
    deviations = (table * (rates - stratum_mean[:, None]) ** 2).sum(axis=1)  # (H,)
    spread = np.where(size > 1, ((1 - 1 / size) * total + deviations) / np.maximum(size - 1, 1), 0.0)  # (H,)
    estimated = (np.diag(spread @ table)
                 - np.einsum("h,hg,hk->gk", spread / size, table, table))  # (G, G)
    return expected, covariance, estimated


def dip_power(table: np.ndarray, base: np.ndarray, group: int, dip: float, mean: float, draws: np.ndarray,
              alpha: float = ALPHA, own_share: np.ndarray | None = None) -> float:
    """How often the stratified test rejects at `alpha` when residue `group` dips by `dip`: its
    statistic is Z' V^+ Z with Z ~ N(expected, covariance) and V the covariance the test estimates,
    a quadratic form evaluated on the standard normal `draws` (D, G) (fixed, so that power is a
    smooth function of the dip)."""
    from scipy import stats

    expected, covariance, estimated = alternative_moments(table, base, group, dip, mean, own_share)
    inverse, dof = pseudo_inverse(estimated)  # (G, G), ()
    if dof == 0:
        return 0.0
    # covariance = root root'; it is singular (the differences sum to 0), so a jitter far below its scale
    jitter = 1e-12 * max(float(np.trace(covariance)), 1e-300) * np.eye(len(covariance))  # (G, G)
    root = np.linalg.cholesky(covariance + jitter)  # (G, G)
    z = expected + draws @ root.T  # (D, G)
    statistic = ((z @ inverse) * z).sum(axis=1)  # (D,)
    return float((statistic > stats.chi2.isf(alpha, int(dof))).mean())


def hardest_groups(table: np.ndarray, base: np.ndarray) -> np.ndarray:
    """The POWER_CANDIDATES residues a dip is hardest to see in under the null (the least
    non-centrality per unit drop at the strata's own rates): the hardest under the alternative is
    among them unless the design is very uneven, and trying every residue at M = 128 costs minutes."""
    size = table.sum(axis=1)  # (H,)
    spread = base * (1 - base)  # (H,)
    null = np.diag(spread @ table) - np.einsum("h,hg,hk->gk", spread / size, table, table)  # (G, G)
    inverse, dof = pseudo_inverse(null)  # (G, G)
    share = table / size[:, None]  # (H, G)
    shifts = (share * base[:, None]).T @ table - np.diag((table * base[:, None]).sum(axis=0))  # (G, G) row g: u_g
    per_unit = np.einsum("gk,kl,gl->g", shifts, inverse, shifts)  # (G,)
    # residues alike in the design (a balanced one: all) need one try between them
    _, distinct = np.unique(np.round(per_unit / max(per_unit.max(), 1e-300), 9), return_index=True)
    return distinct[np.argsort(per_unit[distinct], kind="stable")][:POWER_CANDIDATES]


def stratum_rates(outcome: np.ndarray, design: Design) -> tuple[np.ndarray, np.ndarray]:
    """Each stratum's accuracy (H,), its observed rate shrunk toward the run's by how little its own
    targets say (the beta-binomial's empirical Bayes weight tau^2 / (tau^2 + p (1 - p) / N_h), tau^2
    the spread of the strata's rates beyond what sampling gives): a context of two targets reads 0, 50
    or 100%, and taken at its word it would hold no dip at 0% and no variance at 100%. Also returns the
    weights (H,): how much of each rate is the stratum's own reading."""
    size = design.counts.sum(axis=1)  # (H,)
    observed = np.bincount(design.strata, weights=outcome, minlength=len(size)) / size  # (H,)
    mean = float(outcome.mean())
    sampling = mean * (1 - mean) / size  # (H,) each observed rate's variance were all strata alike
    spread = max(float(np.average((observed - mean) ** 2, weights=size)) - float(np.average(sampling, weights=size)),
                 0.0) if len(size) > 1 else 0.0
    weight = spread / (spread + sampling) if spread > 0 else np.zeros_like(sampling)  # (H,)
    weight = np.where(sampling > 0, weight, 1.0)  # (H,) a run at 0% or 100% has nothing to shrink
    return weight * observed + (1 - weight) * mean, weight


def detectable(outcome: np.ndarray, design: Design, alpha: float = ALPHA, power: float = POWER,
               seed: int = 0, room: float | None = None) -> Detectable:
    """The smallest one-residue dip the stratified test detects with `power`, computed under the
    alternative (the dipped residue's own variance, the test's variance as it would estimate it) at
    the strata's observed rates, for the residue where a dip is hardest to see; None when no dip
    that fits reaches `power` (a run at its floor, or too small). A dip fits when it is at most
    `room` (a fraction; default the mean accuracy): a report passes the lower end of the mean's
    interval, so that a run whose accuracy came out high by chance does not print a dip larger
    than the model's true accuracy."""
    y = np.asarray(outcome, dtype=float)  # (N,)
    table = design.counts  # (H, G)
    base, own_share = stratum_rates(y, design)  # (H,), (H,)
    mean = float(y.mean())
    largest = mean if room is None else min(max(room, 0.0), mean)
    draws = np.random.default_rng(seed).standard_normal((POWER_DRAWS, design.n_groups))  # (D, G)
    if largest == 0 or design.n_groups < 2:
        return Detectable(None, largest, 0.0)
    candidates = hardest_groups(table, base)
    # a group whose contexts do worse than the run's (an unbalanced design) has less room: the same share of it
    own = (table.T @ base) / table.sum(axis=0)  # (G,) each group's accuracy at the strata's rates
    room_of = {group: largest * own[group] / mean for group in candidates}
    at_largest = [dip_power(table, base, group, room_of[group], own[group], draws, alpha, own_share)
                  for group in candidates]
    if min(at_largest) < power:
        weakest = int(np.argmin(at_largest))
        return Detectable(None, largest, at_largest[weakest], int(design.labels[candidates[weakest]]))
    dips = [smallest_dip(lambda dip: dip_power(table, base, group, dip, own[group], draws, alpha, own_share),
                         room_of[group], power) for group in candidates]
    hardest = int(np.argmax(dips))
    return Detectable(dips[hardest], largest, at_largest[hardest], int(design.labels[candidates[hardest]]))


def smallest_dip(power_of: Callable[[float], float], largest: float, power: float) -> float:
    """The smallest dip in (0, largest] whose power reaches `power` (bisection: power grows with the dip)."""
    low, high = 0.0, largest
    for _ in range(DIP_STEPS):
        middle = (low + high) / 2
        low, high = (low, middle) if power_of(middle) >= power else (middle, high)
    return high


def detectable_dip(outcome: np.ndarray, design: Design, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """`detectable(...).dip`: the smallest one-residue dip (a fraction) found with `power`, or None."""
    return detectable(outcome, design, alpha, power).dip


def balanced_power(per_residue: int, modulus: int, dip: float, alpha: float = ALPHA,
                   seed: int = 0) -> float:
    """The power `dip_power` gives a one-residue `dip` (a fraction) in a design of `per_residue`
    independent targets per residue, at the base accuracy where a dip is hardest to see: 0.5 + dip / 2,
    where the undipped residues' variance p (1 - p) and the dipped one's (p - dip) (1 - p + dip) are
    both 1/4 - dip^2 / 4, their largest sum."""
    if per_residue < 1:
        return 0.0
    table = np.full((1, modulus), float(per_residue))  # (1, M): one stratum of independent targets
    base = min(1.0, 0.5 + dip / 2)
    draws = np.random.default_rng(seed).standard_normal((POWER_DRAWS, modulus))  # (D, M)
    return dip_power(table, np.array([base]), 0, dip, base, draws, alpha)


def per_residue_for_dip(dip: float, modulus: int, alpha: float = ALPHA, power: float = POWER) -> int:
    """Targets per residue for which a balanced design detects a one-residue drop of `dip` (a
    fraction) with `power` at any accuracy, by the rule the report's detectable dip follows
    (`balanced_power`); a multiple of the modulus below WHOLE_ROUNDS_BELOW.

    Small moduli round up so that contexts holding several targets of every residue come out in
    whole rounds; from WHOLE_ROUNDS_BELOW on a context holds fewer than M targets (tasks hold at most
    16), the placement balances any count, and rounding would add up to M - 1 targets per residue
    (at M = 128, 16,384 targets where 5,888 detect a 50-point dip).
    """
    if not 0 < dip < 1:
        raise ValueError(f"expected a dip between 0 and 1 (a fraction of targets), got {dip}")
    high = 1
    while balanced_power(high, modulus, dip, alpha) < power:
        high *= 2
    low = high // 2  # below `power` (or 0)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if balanced_power(middle, modulus, dip, alpha) >= power else (middle, high)
    step = modulus if modulus < WHOLE_ROUNDS_BELOW else 1
    return -(-high // step) * step


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


def gap_interval(outcome: np.ndarray, design: Design, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """The gap's interval (points) from simultaneous intervals on every pairwise difference between
    residue accuracies: with every difference d_rs inside d_rs +- c se_rs at once (c: the `level`
    quantile of the largest |Z_r - Z_s| / se_rs over pairs, Z the residue means' normal law), the gap,
    max |d_rs|, lies in [max (|d_rs| - c se_rs), max (|d_rs| + c se_rs)]. The lower end can be 0 or
    less (the data allow no gap at all); it is reported as computed.

    The standard errors come from the variance within each context (a stratum of `design`), as the
    test's do: a context's effect moves all of its residues alike and leaves their differences. A
    bootstrap of the best - worst difference over whole contexts (the interval kvphase printed before)
    does not cover near 0, and resampling 8 contexts misjudges the spread: its interval held a true gap
    of 0 in 70-82% of simulated runs without an effect (bench/bench_power.py)."""
    y = np.asarray(outcome, dtype=float)  # (N,)
    table = design.counts  # (H, G)
    size = table.sum(axis=1)  # (H,)
    sums = np.bincount(design.strata, weights=y, minlength=len(table))  # (H,)
    squares = np.bincount(design.strata, weights=y * y, minlength=len(table))  # (H,)
    spread = np.where(size > 1, np.clip(squares - sums**2 / size, 0, None) / np.maximum(size - 1, 1), 0.0)  # (H,)
    # a stratum all right or all wrong shows no spread, which would claim a gap known exactly: its variance
    # is taken no lower than that of its rate with half a target added each way (as Agresti-Coull do)
    settled = (sums + 0.5) / (size + 1)  # (H,)
    spread = np.maximum(spread, settled * (1 - settled))  # (H,)
    per_group = table.sum(axis=0)  # (G,)
    accuracy = 100 * np.bincount(design.groups, weights=y, minlength=design.n_groups) / per_group  # (G,)
    variance = 100**2 * (spread @ table) / per_group**2  # (G,) of each residue's accuracy
    first, second = np.triu_indices(design.n_groups, k=1)  # (P,), (P,) each pair once
    shown = np.abs(accuracy[first] - accuracy[second])  # (P,)
    error = np.sqrt(variance[first] + variance[second])  # (P,)
    varies = error > 0
    z = np.random.default_rng(seed).standard_normal((GAP_DRAWS, design.n_groups)) * np.sqrt(variance)  # (D, G)
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
