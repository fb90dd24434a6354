"""The context-stratified test that the outcome does not depend on the residue, and its p-value.

Targets that share a context are not independent: a context that confuses the model
pulls all of its targets down together (docs/protocol.md, "Statistics that respect the
design"). The test therefore compares residues *within* contexts: the generalized
Cochran-Mantel-Haenszel statistic stratified by context (Agresti, Categorical Data
Analysis, 3rd ed., section 8.4): within each context, each residue's outcome sum is
compared with what the context's own mean predicts, and the differences are weighed by
their variance under residue labels permuted within the context. For a 0/1 outcome it is
CMH's general-association statistic for residue x correct; for a continuous outcome (the
answer log-probability) its mean-score form. A context effect moves every residue of that
context alike, so it cancels. The p-value comes from the chi-square law where counts are
large, and otherwise from the permutations themselves (residue labels shuffled within each
context, fixed seed). Its power is in `statistics.power`, the intervals in
`statistics.intervals`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property

import math

import numpy as np

from kvphase.defaults import default_threads

ALPHA = 0.05
PERMUTATIONS = 4_000
MIN_EXPECTED = 5  # the chi-square law is used when every expected count reaches this
_CHUNK_VALUES = 1 << 22  # shuffled outcomes held at once (permutations x targets), to bound memory
# eigenvalues of the CMH covariance below this share of the largest are rounding, not a direction the
# outcome varies in: the pseudo-inverse drops them and the degrees of freedom do not count them
RCOND = 1e-10


@dataclass(frozen=True)
class Stratification:
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
    def of(cls, residues, contexts, blocks=None) -> "Stratification":
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
    permutations: int = 0  # how many the p came from (0: the chi-square law, and a summary.json without the key)


def one_hot(codes: np.ndarray, n: int):
    """Sparse (N, n) membership matrix of `codes`: a run's contexts are thousands of strata, and
    a dense one would be N x H numbers."""
    from scipy import sparse

    return sparse.csr_array((np.ones(len(codes)), (np.arange(len(codes)), codes)), shape=(len(codes), n))


def cmh_parts(outcomes: np.ndarray, stratification: Stratification) -> tuple[np.ndarray, np.ndarray]:
    """Per batch row: each group's outcome sum minus its expectation within strata, and
    the covariance of those differences under within-stratum permutation."""
    y = np.atleast_2d(np.asarray(outcomes, dtype=float))  # (B, N)
    in_stratum = one_hot(stratification.strata, stratification.strata.max() + 1)  # (N, H) sparse
    in_group = one_hot(stratification.groups, stratification.n_groups)  # (N, G) sparse
    table = stratification.counts  # (H, G)
    size = table.sum(axis=1)  # (H,)
    sums = (in_stratum.T @ y.T).T  # (B, H)
    means = sums / size  # (B, H)
    excess = (in_group.T @ y.T).T - means @ table  # (B, G)
    squares = np.clip((in_stratum.T @ (y * y).T).T - sums * means, 0, None)  # (B, H) sum of squared deviations
    spread = np.where(size > 1, squares / np.maximum(size - 1, 1), 0.0)  # (B, H) within-stratum variance
    shape = np.einsum("hg,gk->hgk", table, np.eye(stratification.n_groups)) - (
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


def cmh_statistic(outcomes: np.ndarray, stratification: Stratification) -> tuple[np.ndarray, int]:
    """Generalized CMH statistic for each row of `outcomes` (B, N), and its degrees of freedom
    (the rank of the first row's covariance)."""
    excess, covariance = cmh_parts(outcomes, stratification)  # (B, G), (B, G, G)
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


def permuted_group_sums(outcome: np.ndarray, stratification: Stratification, n: int, rng: np.random.Generator) -> np.ndarray:
    """Each group's outcome sum (n, G) in `n` arrangements with the outcomes shuffled within
    every stratum."""
    sums = np.zeros((n, stratification.n_groups))  # (n, G)
    for slots, shuffled in _shuffled_within(np.asarray(outcome, dtype=float), stratification.strata, n, rng):
        in_group = np.eye(stratification.n_groups)[stratification.groups[slots].ravel()]  # (H_s * size, G)
        sums += shuffled.reshape(n, -1) @ in_group  # (n, G)
    return sums


def permutation_p(outcome: np.ndarray, stratification: Stratification, observed: float, seed: int,
                  permutations: int = PERMUTATIONS) -> float:
    """Share of within-context permutations whose CMH statistic reaches the observed one
    (counting the observed arrangement itself, so p is never 0).

    Shuffling within strata keeps every stratum's sum and spread, so the expected group
    sums and the covariance are the observed ones: only the group sums move."""
    excess, covariance = cmh_parts(outcome, stratification)  # (1, G), (1, G, G)
    expected = np.bincount(stratification.groups, weights=np.asarray(outcome, dtype=float), minlength=stratification.n_groups) - excess[0]  # (G,)
    inverse, _ = pseudo_inverse(covariance[0])  # (G, G)
    chunk = max(1, min(permutations, _CHUNK_VALUES // len(outcome)))
    sizes = [min(chunk, permutations - start) for start in range(0, permutations, chunk)]

    def reached(size: int, seed_sequence: np.random.SeedSequence) -> int:
        moved = permuted_group_sums(outcome, stratification, size, np.random.default_rng(seed_sequence)) - expected  # (b, G)
        statistic = np.einsum("bg,gk,bk->b", moved, inverse, moved)  # (b,)
        return int((statistic >= observed * (1 - 1e-9) - 1e-12).sum())

    # one seed per chunk, so the p-value is the same whatever the number of threads
    with ThreadPoolExecutor(max_workers=default_threads()) as pool:
        counts = pool.map(reached, sizes, np.random.SeedSequence(seed).spawn(len(sizes)))
        return (sum(counts) + 1) / (permutations + 1)


def stratified_test(outcome: np.ndarray, stratification: Stratification, binary: bool, seed: int = 0) -> StratifiedTest:
    """CMH test that the outcome is the same in every group, stratified by context."""
    kind = "residue x correct" if binary else "answer log-probability by residue"
    name = (f"Cochran-Mantel-Haenszel test stratified by context ({kind})" if stratification.strata.max() > 0
            else f"chi-square test of homogeneity, independent targets ({kind})")
    statistic, dof = cmh_statistic(outcome, stratification)
    if dof == 0:
        return StratifiedTest(name, 0.0, 0, 1.0, "no context holds two targets that differ, so nothing varies "
                              "within a context")
    p, exact = _p_values(np.atleast_2d(outcome), stratification, binary, seed, PERMUTATIONS, statistic, dof)
    if not exact[0]:
        return StratifiedTest(name, float(statistic[0]), dof, float(p[0]),
                              f"chi-square law (df = {dof}); every expected count is at least {MIN_EXPECTED}")
    why = f"an expected count is below {MIN_EXPECTED}" if binary else "log-probabilities are heavy-tailed"
    return StratifiedTest(name, float(statistic[0]), dof, float(p[0]),
                          f"p from {PERMUTATIONS} permutations of residue labels within contexts ({why})", PERMUTATIONS)


def stratified_p_values(outcomes: np.ndarray, stratification: Stratification, binary: bool, seed: int = 0,
                        permutations: int = PERMUTATIONS) -> tuple[np.ndarray, np.ndarray]:
    """p-values of the stratified test for each row of `outcomes` (B, N), and whether each
    came from permutations. A 0/1 outcome uses the chi-square law when every group's
    expected number of successes and failures is at least MIN_EXPECTED; a continuous one
    (heavy-tailed log-probabilities) always takes its p from within-context permutations."""
    statistic, dof = cmh_statistic(outcomes, stratification)  # (B,)
    return _p_values(outcomes, stratification, binary, seed, permutations, statistic, dof)


def _p_values(outcomes: np.ndarray, stratification: Stratification, binary: bool, seed: int, permutations: int,
              statistic: np.ndarray, dof: int) -> tuple[np.ndarray, np.ndarray]:
    from scipy import stats  # imported here: scipy.stats alone takes seconds, and most commands never test

    p = stats.chi2.sf(statistic, max(dof, 1))  # (B,)
    exact = np.ones(len(outcomes), dtype=bool) if not binary else np.array(
        [_expected_extremes(row, stratification) < MIN_EXPECTED for row in outcomes])  # (B,)
    for i in np.flatnonzero(exact):
        p[i] = permutation_p(outcomes[i], stratification, statistic[i], seed, permutations)
    return p, exact


def _expected_extremes(correct: np.ndarray, stratification: Stratification) -> float:
    """The smallest expected count of successes or failures of any group, given each
    stratum's own success rate."""
    table = stratification.counts  # (H, G)
    rate = np.bincount(stratification.strata, weights=correct) / table.sum(axis=1)  # (H,)
    successes = rate @ table  # (G,)
    return float(min(successes.min(), (table.sum(axis=0) - successes).min()))


def homogeneity_test(correct: np.ndarray, groups: np.ndarray, seed: int = 0) -> StratifiedTest:
    """The accuracy test for targets independent of one another (each its own context, as
    a trained model's held-out questions): one stratum, so (N - 1) / N x Pearson's chi-square."""
    correct = np.asarray(correct, dtype=float)  # (N,)
    return stratified_test(correct, Stratification.of(groups, np.arange(len(correct))), binary=True, seed=seed)


def format_p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def unavailable_test(what: str, why: str) -> StratifiedTest:
    """A test that could not be run (its outcome is missing for some targets): no p, and never a rejection."""
    return StratifiedTest(f"{what}: unavailable", 0.0, 0, math.nan, why)


def p_text(test: StratifiedTest) -> str:
    """The test's p as a relation: "= 0.031", or "< 0.00025" where it is the smallest p its permutations
    can give (1 / (permutations + 1): no permutation reached the observed statistic); "unavailable"
    for a test that could not be run."""
    if math.isnan(test.p_value):
        return "unavailable"
    if test.permutations and test.p_value <= 1.000001 / (test.permutations + 1):
        return f"< {format_p(1 / (test.permutations + 1))}"
    return f"= {format_p(test.p_value)}"


INTERACTION_PERMUTATIONS = 2_000


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of `p_values` (in their order): the i-th smallest is multiplied by
    (m - i + 1), made monotone and capped at 1; rejecting where an adjusted p is below alpha holds the
    family-wise error at alpha whatever the tests' dependence."""
    m = len(p_values)
    order = np.argsort(p_values, kind="stable")
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted


def interaction_test(outcome: np.ndarray, rows: np.ndarray, columns: np.ndarray, contexts: np.ndarray,
                     seed: int = 0, permutations: int = INTERACTION_PERMUTATIONS) -> StratifiedTest:
    """Does the effect of one residue (`columns`, the answer's) depend on the other (`rows`, the target's)?

    Each outcome minus its context's mean and both residues' main effects (the additive fit of a balanced
    crossed design) leaves the interaction and noise; the statistic is the cells' squared residual sums
    over their sizes, and its p comes from the residuals permuted within contexts (which keeps every
    context's sum and spread; approximate, as permutation of residuals is). 0/1 or continuous alike."""
    y = np.asarray(outcome, dtype=float)  # (N,)
    _, r = np.unique(rows, return_inverse=True)
    _, a = np.unique(columns, return_inverse=True)
    _, h = np.unique(contexts, return_inverse=True)
    n_r, n_a = r.max() + 1, a.max() + 1
    cells = r * n_a + a  # (N,)
    centred = y - (np.bincount(h, weights=y) / np.bincount(h))[h]
    for codes in (r, a):
        centred = centred - (np.bincount(codes, weights=centred) / np.bincount(codes))[codes]
    sizes = np.bincount(cells, minlength=n_r * n_a).astype(float)  # (C,)
    filled = sizes > 0

    def statistic(sums: np.ndarray) -> np.ndarray:  # (..., C) -> (...)
        return (sums[..., filled] ** 2 / sizes[filled]).sum(axis=-1)

    observed = float(statistic(np.bincount(cells, weights=centred, minlength=n_r * n_a)))
    name = "interaction of the target's and the answer's residue, stratified by context"
    dof = int((n_r - 1) * (n_a - 1))
    if dof == 0 or observed <= 1e-12:
        return StratifiedTest(name, observed, dof, 1.0, "nothing varies beyond the two residues' own effects")
    rng = np.random.default_rng(seed)
    reached = 0
    for start in range(0, permutations, 250):
        n = min(250, permutations - start)
        sums = np.zeros((n, n_r * n_a))
        for slots, shuffled in _shuffled_within(centred, h, n, rng):  # (H_s, size), (n, H_s, size)
            flat = cells[slots].ravel()  # (H_s * size,)
            for b in range(n):
                sums[b] += np.bincount(flat, weights=shuffled[b].ravel(), minlength=n_r * n_a)
        reached += int((statistic(sums) >= observed * (1 - 1e-9)).sum())
    return StratifiedTest(name, observed, dof, (reached + 1) / (permutations + 1),
                          f"p from {permutations} permutations within contexts of the residuals after both residues' "
                          "main effects", permutations)
