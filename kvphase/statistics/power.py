"""Power and sample size of the stratified test: the smallest one-residue dip a run detects with
80% power, from the non-central chi-square law with the test's own variance (so the run's design
and the context effects it saw are in it), and the targets per residue a balanced run needs for a
dip."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kvphase.statistics.stratified import ALPHA, Stratification, pseudo_inverse

POWER = 0.80
WHOLE_ROUNDS_BELOW = 32  # moduli whose auto sample sizes are rounded to a multiple of M (per_residue_for_dip)


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
    group (H, G), a stratification's counts."""
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


def stratum_rates(outcome: np.ndarray, stratification: Stratification) -> tuple[np.ndarray, np.ndarray]:
    """Each stratum's accuracy (H,), its observed rate shrunk toward the run's by how little its own
    targets say (the beta-binomial's empirical Bayes weight tau^2 / (tau^2 + p (1 - p) / N_h), tau^2
    the spread of the strata's rates beyond what sampling gives): a context of two targets reads 0, 50
    or 100%, and taken at its word it would hold no dip at 0% and no variance at 100%. Also returns the
    weights (H,): how much of each rate is the stratum's own reading."""
    size = stratification.counts.sum(axis=1)  # (H,)
    observed = np.bincount(stratification.strata, weights=outcome, minlength=len(size)) / size  # (H,)
    mean = float(outcome.mean())
    sampling = mean * (1 - mean) / size  # (H,) each observed rate's variance were all strata alike
    spread = max(float(np.average((observed - mean) ** 2, weights=size)) - float(np.average(sampling, weights=size)),
                 0.0) if len(size) > 1 else 0.0
    weight = spread / (spread + sampling) if spread > 0 else np.zeros_like(sampling)  # (H,)
    weight = np.where(sampling > 0, weight, 1.0)  # (H,) a run at 0% or 100% has nothing to shrink
    return weight * observed + (1 - weight) * mean, weight


def detectable(outcome: np.ndarray, stratification: Stratification, alpha: float = ALPHA, power: float = POWER,
               seed: int = 0, room: float | None = None) -> Detectable:
    """The smallest one-residue dip the stratified test detects with `power`, computed under the
    alternative (the dipped residue's own variance, the test's variance as it would estimate it) at
    the strata's observed rates, for the residue where a dip is hardest to see; None when no dip
    that fits reaches `power` (a run at its floor, or too small). A dip fits when it is at most
    `room` (a fraction; default the mean accuracy): a report passes the lower end of the mean's
    interval, so that a run whose accuracy came out high by chance does not print a dip larger
    than the model's true accuracy."""
    y = np.asarray(outcome, dtype=float)  # (N,)
    table = stratification.counts  # (H, G)
    base, own_share = stratum_rates(y, stratification)  # (H,), (H,)
    mean = float(y.mean())
    largest = mean if room is None else min(max(room, 0.0), mean)
    draws = np.random.default_rng(seed).standard_normal((POWER_DRAWS, stratification.n_groups))  # (D, G)
    if largest == 0 or stratification.n_groups < 2:
        return Detectable(None, largest, 0.0)
    candidates = hardest_groups(table, base)
    # a group whose contexts do worse than the run's (an unbalanced design) has less room: the same share of it
    own = (table.T @ base) / table.sum(axis=0)  # (G,) each group's accuracy at the strata's rates
    room_of = {group: largest * own[group] / mean for group in candidates}
    at_largest = [dip_power(table, base, group, room_of[group], own[group], draws, alpha, own_share)
                  for group in candidates]
    if min(at_largest) < power:
        weakest = int(np.argmin(at_largest))
        return Detectable(None, largest, at_largest[weakest], int(stratification.labels[candidates[weakest]]))
    dips = [smallest_dip(lambda dip: dip_power(table, base, group, dip, own[group], draws, alpha, own_share),
                         room_of[group], power) for group in candidates]
    hardest = int(np.argmax(dips))
    return Detectable(dips[hardest], largest, at_largest[hardest], int(stratification.labels[candidates[hardest]]))


def smallest_dip(power_of: Callable[[float], float], largest: float, power: float) -> float:
    """The smallest dip in (0, largest] whose power reaches `power` (bisection: power grows with the dip)."""
    low, high = 0.0, largest
    for _ in range(DIP_STEPS):
        middle = (low + high) / 2
        low, high = (low, middle) if power_of(middle) >= power else (middle, high)
    return high


def detectable_dip(outcome: np.ndarray, stratification: Stratification, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """`detectable(...).dip`: the smallest one-residue dip (a fraction) found with `power`, or None."""
    return detectable(outcome, stratification, alpha, power).dip


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
