"""The context-stratified statistics against calculations written independently here:
the textbook Mantel-Haenszel formula for 2 x 2 x K tables, a stratum-by-stratum loop for
the generalized statistic, the two-proportion sample-size formula, scipy's non-central
chi-square, and Monte Carlo power."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from scipy import optimize, stats

from kvphase.statistics.intervals import basic_interval, bootstrap_gaps, percentile_interval
from kvphase.statistics.power import detectable, detectable_dip, per_residue_for_dip
from kvphase.statistics.stratified import (Stratification, cmh_statistic, permutation_p, permuted_group_sums, stratified_p_values,
                                          stratified_test)
from tests.helpers.by_hand import generalized_cmh_loop, simulated_power


def _report(got, want):
    diff = np.abs(np.asarray(got, float) - np.asarray(want, float))
    return f"max diff {diff.max():.3g}, mean diff {diff.mean():.3g}"


def _mantel_haenszel_2x2(y, groups, strata):
    """Cochran-Mantel-Haenszel chi-square (no continuity correction), Agresti (2013) eq. 6.6."""
    num, var = 0.0, 0.0
    for h in np.unique(strata):
        yh, gh = y[strata == h], groups[strata == h]
        n, n1, m1 = len(yh), (gh == 0).sum(), yh.sum()
        if n < 2:
            continue
        num += yh[gh == 0].sum() - n1 * m1 / n
        var += n1 * (n - n1) * m1 * (n - m1) / (n * n * (n - 1))
    return num * num / var


def test_two_groups_match_the_mantel_haenszel_formula():
    rng = np.random.default_rng(1)
    strata = rng.integers(0, 12, 300)
    groups = rng.integers(0, 2, 300)
    y = (rng.random(300) < 0.3 + 0.04 * strata).astype(float)
    stratification = Stratification.of(groups, strata)
    (q,), dof = cmh_statistic(y, stratification)
    want = _mantel_haenszel_2x2(y, groups, strata)
    assert dof == 1
    assert q == pytest.approx(want, rel=1e-9), _report(q, want)


@pytest.mark.parametrize("binary", [True, False])
def test_many_groups_match_a_stratum_by_stratum_loop(binary):
    rng = np.random.default_rng(2)
    strata = rng.integers(0, 20, 400)  # unbalanced: residues fall into contexts at random
    groups = rng.integers(0, 5, 400)
    y = (rng.random(400) < 0.6).astype(float) if binary else rng.normal(-2, 1, 400) + 0.3 * strata
    (q,), dof = cmh_statistic(y, Stratification.of(groups, strata))
    want = generalized_cmh_loop(y, groups, strata, 5)
    assert dof == 4
    assert q == pytest.approx(want, rel=1e-9), _report(q, want)


def test_one_stratum_is_pearson_chi_square_times_n_minus_1_over_n():
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(4), 50)
    y = (rng.random(200) < 0.5).astype(float)
    table = np.array([[y[groups == g].sum(), 50 - y[groups == g].sum()] for g in range(4)])
    chi2 = stats.chi2_contingency(table, correction=False)[0]
    (q,), _ = cmh_statistic(y, Stratification.of(groups, np.zeros(200)))
    assert q == pytest.approx(chi2 * 199 / 200, rel=1e-9)


def test_single_target_contexts_share_one_stratum():
    stratification = Stratification.of([0, 1, 0, 1, 2, 2], [7, 8, 9, 9, 3, 5])
    assert stratification.strata.tolist() == [0, 0, 1, 1, 0, 0]  # contexts 7, 8, 3, 5 hold one target each
    assert stratification.labels.tolist() == [0, 1, 2]


def test_balanced_means_equal_counts_within_every_context():
    assert Stratification.of([0, 1, 0, 1], [0, 0, 1, 1]).balanced
    assert Stratification.of([0, 1, 2, 0, 1, 2], [0, 0, 0, 1, 1, 1]).balanced
    assert not Stratification.of([0, 0, 1, 0, 1, 1], [0, 0, 0, 1, 1, 1]).balanced


def test_contexts_serving_fewer_residues_than_m_are_balanced_when_each_is_served_equally():
    """Short contexts hold fewer targets than M = 4 residues and serve a rotating subset, each once."""
    assert Stratification.of([0, 1, 2, 3, 0, 1, 2, 3], [0, 0, 1, 1, 2, 2, 3, 3]).balanced
    assert Stratification.of([0, 1, 2, 3, 0, 0, 2, 2], [0, 0, 0, 0, 1, 1, 1, 1]).balanced  # residues 0 and 2, twice each
    assert not Stratification.of([0, 1, 2, 3, 0, 0, 2], [0, 0, 0, 0, 1, 1, 1]).balanced  # residue 0 twice, 2 once


def _every_arrangement(y, strata):
    """Every arrangement of `y` shuffled within its strata, enumerated (A, N)."""
    members = [np.flatnonzero(strata == h) for h in np.unique(strata)]
    for orders in itertools.product(*(itertools.permutations(m) for m in members)):
        arranged = y.copy()
        for m, order in zip(members, orders):
            arranged[m] = y[list(order)]
        yield arranged


# three contexts of 3, 2 and 4 targets (strata of unequal sizes), rows not in context order, as the
# server backend writes them (contexts in the order they finish)
_STRATA = np.array([2, 0, 1, 2, 0, 2, 1, 2, 0])
_GROUPS = np.array([0, 1, 0, 1, 2, 2, 1, 0, 0])
_Y = np.array([0.5, -1.0, 2.0, -0.3, 1.5, 0.9, -2.2, 0.1, 3.0])


def test_permuted_group_sums_follow_the_exact_within_context_law():
    stratification = Stratification.of(_GROUPS, _STRATA)
    exact = {}
    for arranged in _every_arrangement(_Y, _STRATA):  # 3! 2! 4! = 288, equally likely
        key = tuple(np.round(np.bincount(_GROUPS, weights=arranged), 9))
        exact[key] = exact.get(key, 0) + 1 / 288
    sums = permuted_group_sums(_Y, stratification, 40_000, np.random.default_rng(0))  # (n, G)
    drawn = {}
    for row in np.round(sums, 9):
        drawn[tuple(row)] = drawn.get(tuple(row), 0) + 1 / len(sums)
    assert set(drawn) <= set(exact), "an arrangement that moves an outcome out of its context"
    worst = max(abs(drawn.get(k, 0) - p) for k, p in exact.items())
    assert worst < 0.01, f"largest frequency difference {worst:.4f} over {len(exact)} sum vectors"


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("chunk", [None, 25 * len(_Y)], ids=["one-chunk", "chunks-of-25"])
def test_permutation_p_is_the_exact_permutation_p(binary, chunk, monkeypatch):
    if chunk:  # many chunks, as a run of thousands of targets takes them: each must draw its own shuffles
        monkeypatch.setattr("kvphase.statistics.stratified._CHUNK_VALUES", chunk)
    y = (_Y > 0.4).astype(float) if binary else _Y
    (observed,), _ = cmh_statistic(y, Stratification.of(_GROUPS, _STRATA))
    statistics = np.array([generalized_cmh_loop(a, _GROUPS, _STRATA, 3) for a in _every_arrangement(y, _STRATA)])
    exact = (statistics >= observed - 1e-9).mean()
    got = permutation_p(y, Stratification.of(_GROUPS, _STRATA), observed, seed=0, permutations=20_000)
    assert got == pytest.approx(exact, abs=4 * np.sqrt(exact * (1 - exact) / 20_000) + 1e-4), (got, exact)


def test_permutation_p_never_falls_below_one_over_permutations_plus_one():
    strata = np.repeat(np.arange(40), 2)
    groups = np.tile([0, 1], 40)
    y = (groups == 0).astype(float)  # every context: residue 0 right, residue 1 wrong; a shuffle matches it at 2^-40
    stratification = Stratification.of(groups, strata)
    (observed,), _ = cmh_statistic(y, stratification)
    assert permutation_p(y, stratification, observed, seed=0, permutations=999) == 1 / 1000


def test_permutation_and_chi_square_p_values_agree_on_large_samples():
    rng = np.random.default_rng(4)
    strata = np.repeat(np.arange(40), 16)
    groups = np.tile(np.repeat(np.arange(8), 2), 40)
    y = rng.normal(size=640) + 0.15 * (groups == 3)
    stratification = Stratification.of(groups, strata)
    permuted = stratified_test(y, stratification, binary=False).p_value
    asymptotic = stats.chi2.sf(cmh_statistic(y, stratification)[0][0], 7)
    assert permuted == pytest.approx(asymptotic, abs=0.02)


def test_small_binary_samples_take_the_permutation_p_value():
    groups = np.tile(np.arange(4), 6)
    strata = np.repeat(np.arange(6), 4)
    y = (groups % 2 == 0).astype(float)  # residues 0 and 2 always right, 1 and 3 always wrong
    test = stratified_test(y, Stratification.of(groups, strata), binary=True)
    assert "permutations" in test.note and test.p_value < 0.01


@pytest.mark.parametrize("accuracy", ["high", "low"])
def test_a_large_run_near_ceiling_or_floor_takes_the_permutation_p_value(accuracy):
    """320 targets, but 6 failures in all (or 6 successes): each residue expects 0.75 of them, far
    below 5, so the chi-square law does not hold however many targets there are."""
    groups = np.tile(np.arange(8), 40)  # (320,)
    strata = np.repeat(np.arange(40), 8)  # (320,)
    y = np.ones(320)
    y[[3, 11, 19, 27, 35, 43]] = 0  # residue 3 fails six times
    y = y if accuracy == "high" else 1 - y
    stratification = Stratification.of(groups, strata)
    p, exact = stratified_p_values(y[None], stratification, binary=True, permutations=2000)
    assert exact.tolist() == [True]
    assert "permutations" in stratified_test(y, stratification, binary=True).note


def test_the_chi_square_law_is_used_from_five_expected_per_group_on():
    """By hand: 40 contexts of 8 residues; with 40 failures in all, spread so each context fails
    once, every residue expects 40/8 = 5 failures (each context's own rate is 1/8): the law holds.
    With 39, a residue expects 39/8 < 5: permutations."""
    groups, strata = np.tile(np.arange(8), 40), np.repeat(np.arange(40), 8)
    stratification = Stratification.of(groups, strata)
    for failures, exact in ((40, False), (39, True)):
        y = np.ones(320)
        y[np.arange(failures) * 8 + np.arange(failures) % 8] = 0  # context c fails at residue c mod 8
        assert stratified_p_values(y[None], stratification, binary=True, permutations=200)[1].tolist() == [exact], failures


def test_expected_counts_use_each_contexts_own_rate():
    """20 copies of: a context (residues 0, 1) always right, one (residues 2, 3, 2, 3) always
    wrong, 24 single-target contexts (residues 0-3) all right. Residue 0 sits only where nothing
    fails, so it expects 0 failures: permutations. A rate pooled over the run (80 of 640 wrong)
    would expect 17.5 failures of residue 0 and take the chi-square law."""
    groups = np.concatenate([[0, 1], [2, 3, 2, 3], np.tile(np.arange(4), 6)])
    strata = np.concatenate([[0, 0], [1, 1, 1, 1], np.arange(2, 26)])
    y = np.concatenate([[1, 1], [0, 0, 0, 0], np.ones(24)])
    groups = np.concatenate([groups] * 20)
    strata = np.concatenate([strata + 26 * k for k in range(20)])
    y = np.concatenate([y] * 20)
    assert stratified_p_values(y[None], Stratification.of(groups, strata), binary=True, permutations=200)[1].tolist() == [True]


def test_constant_outcome_gives_p_one():
    test = stratified_test(np.ones(16), Stratification.of(np.arange(16) % 8, np.arange(16) // 8), binary=True)
    assert test.p_value == 1.0 and test.dof == 0


def _fleiss_power(dip, p, n, alpha=0.05):
    """Power of the two-sided two-proportion test of n targets per group at p against p - dip, with
    the pooled variance in the test and each group's own under the alternative (Fleiss, Statistical
    Methods for Rates and Proportions, 3rd ed., eq. 4.14)."""
    q = p - dip
    pooled = (p + q) / 2
    null = np.sqrt(2 * pooled * (1 - pooled) / n)
    alternative = np.sqrt((p * (1 - p) + q * (1 - q)) / n)
    z = stats.norm.isf(alpha / 2)
    return stats.norm.cdf((dip - z * null) / alternative) + stats.norm.cdf((-dip - z * null) / alternative)


@pytest.mark.parametrize("p", [0.6, 0.1, 0.95])
def test_detectable_dip_for_two_groups_is_fleiss_formula_under_the_alternative(p):
    """Two groups of independent targets: the dip where Fleiss' power reaches 80%. Under the null's
    variance (the old rule) the dip at p = 0.1 is 20% smaller and at 0.95 30% larger."""
    n = 400
    y = np.r_[np.ones(round(n * p)), np.zeros(n - round(n * p))]
    y = np.r_[y, y]  # (2n,) both groups at p exactly
    groups = np.repeat([0, 1], n)
    dip = detectable_dip(y, Stratification.of(groups, np.arange(2 * n)))  # every target its own context
    want = optimize.brentq(lambda d: _fleiss_power(d, p, n) - 0.8, 1e-6, p)
    assert dip == pytest.approx(want, rel=0.02), f"dip {dip:.4f}, Fleiss {want:.4f}"


def test_detectable_dip_has_80_percent_power_by_simulation():
    """2,000 simulated runs of 16 balanced contexts x 16 targets with residue 3 dipped by
    the reported detectable dip: about 80% reject (Monte Carlo SE 0.9%)."""
    rng = np.random.default_rng(5)
    groups = np.tile(np.repeat(np.arange(8), 2), 16)
    strata = np.repeat(np.arange(16), 16)
    stratification = Stratification.of(groups, strata)
    p = np.full(256, 0.64)
    dip = detectable_dip((rng.random(256) < p).astype(float), stratification)
    p[groups == 3] -= dip
    power = simulated_power(stratification, p)
    assert 0.76 <= power <= 0.86, f"detectable dip {100 * dip:.1f} points, simulated power {power:.3f}"


def test_the_dip_is_the_hardest_residues_in_an_unbalanced_design():
    """Two targets per context at M = 8, residue 0 in 32 contexts and the others in 48 or more: the
    dip reported is the one the hardest residue needs. Planted on the residue it names, it is found
    80-90% of the time, and on no residue less often. Taken for the easiest residue instead (the
    bug the issue planted: 21 points against 58), the hardest residue finds it rarely."""
    rng = np.random.default_rng(11)
    pairs = [(0, 1)] * 32 + [(r, s) for r in range(1, 8) for s in range(1, 8) if r < s] * 8  # residue 0 rare
    groups = np.array(pairs).ravel()  # (N,)
    strata = np.repeat(np.arange(len(pairs)), 2)  # (N,)
    stratification = Stratification.of(groups, strata)
    base = 0.6
    seen = detectable((rng.random(len(groups)) < base).astype(float), stratification)
    assert seen.dip is not None
    powers = [simulated_power(stratification, np.where(groups == residue, base - seen.dip, base), runs=1500)
              for residue in range(8)]
    named = powers[seen.residue]
    # two targets a context estimate each context's rate poorly, and the rule errs on the safe side (89%)
    assert 0.74 <= named <= 0.92, f"dip {100 * seen.dip:.1f} at residue {seen.residue}, powers {np.round(powers, 3)}"
    assert min(powers) >= named - 0.04, f"a residue harder than the one named: {np.round(powers, 3)}"


def test_a_run_at_its_floor_has_no_dip_that_fits():
    """The 8K design's shape at 1.6% accuracy (8 contexts of 328, M = 8): even residue 0 falling to 0%
    is found less than 80% of the time, so no dip is reported; the power stated for that dip agrees
    with the test's own power by simulation; at 30% accuracy a dip is reported, and it fits."""
    groups = np.tile(np.arange(8), 8 * 41)
    strata = np.repeat(np.arange(8), 328)
    stratification = Stratification.of(groups, strata)
    rng = np.random.default_rng(3)
    floor = detectable((rng.random(len(groups)) < 0.016).astype(float), stratification)
    assert floor.dip is None and floor.power_at_largest < 0.8
    rates = np.where(groups == floor.residue, 0.0, floor.largest)
    simulated = simulated_power(stratification, rates, runs=1500)
    assert abs(simulated - floor.power_at_largest) < 0.12, (simulated, floor.power_at_largest)
    middle = detectable((rng.random(len(groups)) < 0.3).astype(float), stratification)
    assert middle.dip is not None and 0 < middle.dip <= middle.largest


def test_the_power_rule_rejects_at_alpha_without_a_dip():
    """dip_power at a dip of nothing is the test's size, 5%: the critical value takes the test's own
    degrees of freedom (M - 1 = 3 here; with M it would be about 3%)."""
    from kvphase.statistics.power import POWER_DRAWS, dip_power

    stratification = Stratification.of(np.tile(np.arange(4), 256), np.repeat(np.arange(256), 4))
    draws = np.random.default_rng(0).standard_normal((POWER_DRAWS, 4))
    size = dip_power(stratification.counts, np.full(256, 0.5), 0, 1e-9, 0.5, draws)
    assert size == pytest.approx(0.05, abs=0.012)


def test_per_residue_for_dip_has_the_power_it_plans_for_by_simulation():
    """--detect 20 at M = 8: the sample it plans detects a 20-point dip 80% of the time at the
    hardest accuracy (0.6 against 0.4), simulated with the real test; a round fewer does not."""
    n = per_residue_for_dip(0.20, 8)
    assert n % 8 == 0

    def simulated(per_residue):
        groups = np.repeat(np.arange(8), per_residue)
        stratification = Stratification.of(groups, np.arange(len(groups)))
        return simulated_power(stratification, np.where(groups == 0, 0.4, 0.6), runs=2000)

    assert simulated(n) >= 0.77 and simulated(n - 16) < 0.8
    with pytest.raises(ValueError, match="between 0 and 1"):
        per_residue_for_dip(20, 8)


def test_large_moduli_take_the_smallest_sample_size_not_a_whole_round():
    """At M = 128 (deepseek4's HCA stride under --stride all) a context holds fewer than M
    targets, so the count is not rounded to a multiple of M (128 per residue: 16,384 targets);
    the count planned for a 50-point dip finds it about 80% of the time (simulated, the real test)."""
    n = per_residue_for_dip(0.5, 128)
    assert n < 64
    groups = np.repeat(np.arange(128), n)
    stratification = Stratification.of(groups, np.arange(len(groups)))
    power = simulated_power(stratification, np.where(groups == 0, 0.25, 0.75), runs=600)
    assert 0.74 <= power <= 0.88, (n, power)


def test_bootstrap_resamples_whole_contexts():
    # every context is all right or all wrong and serves every residue once: any resample of
    # whole contexts gives every residue the same accuracy, resampling targets would not
    residues = np.tile(np.arange(8), 20)
    contexts = np.repeat(np.arange(20), 8)
    correct = (contexts % 3 == 0).astype(float)
    gaps = bootstrap_gaps(correct, residues, contexts, seed=0)
    assert len(gaps) > 1900 and gaps.max() == 0


def test_bootstrap_interval_holds_the_gap_and_is_deterministic():
    rng = np.random.default_rng(6)
    residues = np.tile(np.arange(8), 64)
    contexts = np.repeat(np.arange(64), 8)
    correct = (rng.random(512) < 0.6 - 0.3 * (residues == 2)).astype(float)
    acc = np.array([correct[residues == r].mean() for r in range(8)])
    gap = 100 * np.ptp(acc)
    gaps = bootstrap_gaps(correct, residues, contexts, seed=1)
    low, high = percentile_interval(gaps)
    assert low < gap < high
    assert np.array_equal(gaps, bootstrap_gaps(correct, residues, contexts, seed=1))
    assert not np.array_equal(gaps, bootstrap_gaps(correct, residues, contexts, seed=2))


def test_percentile_interval_is_the_central_95_percent():
    assert percentile_interval(np.arange(1001.0)) == pytest.approx((25.0, 975.0), abs=1e-9)


def test_basic_interval_reflects_the_quantiles_about_the_observed_value():
    # resamples sit above the observed gap (biased upward): the interval moves down by as much
    assert basic_interval(np.arange(1001.0), 600.0) == pytest.approx((225.0, 1175.0), abs=1e-9)
