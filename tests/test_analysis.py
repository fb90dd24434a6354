"""Statistics against values computed elsewhere: scipy's Wilson interval and binomial
tests, numpy moments, and the textbook stratified statistic written out in
tests/test_stratified.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from kvphase.sweep.analysis import gap_difference, homogeneity_test, summarize, wilson_interval
from kvphase.sweep.stratified import noncentrality_for_power
from tests.test_stratified import _generalized_loop

# scipy.stats.binomtest(correct, n).proportion_ci(0.95, method="wilson"), to 10 digits
WILSON_KNOWN = [
    (0, 10, 0.0, 0.2775327999),
    (1, 10, 0.0178762131, 0.4041500268),
    (5, 10, 0.2365930905, 0.7634069095),
    (10, 10, 0.7224672001, 1.0),
    (81, 263, 0.2552885199, 0.3662095770),
]


@pytest.mark.parametrize("correct, n, low, high", WILSON_KNOWN)
def test_wilson_interval_matches_known_values(correct, n, low, high):
    got = wilson_interval(correct, n)
    assert got == pytest.approx((low, high), abs=1e-9)


def _frame(accuracies, n=40, stride=4, spread=8):
    """Residue r has round(accuracies[r] * n) hits; context k holds target k of every residue;
    target k of residue r sits at 1000 + spread * k + r."""
    rows = []
    for residue, acc in enumerate(accuracies):
        hits = int(round(acc * n))
        for i in range(n):
            rows.append({"residue": residue, "phase": residue % stride, "target_pos": 1000 + i * spread + residue,
                         "context": i, "correct": i < hits, "logprob": -1.0 - 0.01 * ((i * 7 + residue) % 13)})
    return pd.DataFrame(rows)


def test_summary_numbers_by_hand():
    accuracies = [0.5, 0.25, 1.0, 0.75, 0.5, 0.25, 0.75, 0.75]
    summary = summarize(_frame(accuracies), stride=4, modulus=8)
    assert summary.mean_accuracy == round(100 * np.mean(accuracies), 2)  # percent, two decimals
    assert (summary.worst_residue, summary.worst_accuracy) == (1, 25.0)
    assert (summary.best_residue, summary.best_accuracy) == (2, 100.0)
    assert summary.gap == 75.0
    assert summary.periodicity == pytest.approx(100 * np.mean([0, 0, 0.25, 0]))
    assert (summary.n_targets, summary.n_contexts, summary.balanced) == (320, 40, True)
    assert "depends on the token phase" in summary.headline()


def test_per_residue_intervals_and_position_moments_against_scipy():
    frame = _frame([13 / 32, 24 / 32, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5], n=32, spread=24)
    rows = {row["residue"]: row for row in summarize(frame, stride=4, modulus=8).per_residue}
    for residue, hits in [(0, 13), (1, 24)]:
        wilson = stats.binomtest(hits, 32).proportion_ci(0.95, method="wilson")
        assert (rows[residue]["ci_low"], rows[residue]["ci_high"]) == (
            round(100 * wilson.low, 2), round(100 * wilson.high, 2))
        positions = 1000 + 24 * np.arange(32) + residue
        described = stats.describe(positions)
        assert rows[residue]["position_mean"] == round(described.mean, 2)
        assert rows[residue]["position_sd"] == round(np.sqrt(described.variance * 31 / 32), 2)  # population SD
    assert (rows[0]["ci_low"], rows[0]["ci_high"]) == (25.52, 57.74)  # 95%, not 90% (28.2, 54.6)


def test_accuracy_test_is_the_context_stratified_statistic():
    rng = np.random.default_rng(0)
    frame = _frame([0.5] * 8, n=48)
    frame["correct"] = rng.random(len(frame)) < 0.55 + 0.2 * (frame["residue"] == 5)
    summary = summarize(frame, stride=4, modulus=8)
    statistic = _generalized_loop(frame["correct"].to_numpy(float), frame["residue"].to_numpy(),
                                  frame["context"].to_numpy(), 8)
    assert summary.test.statistic == pytest.approx(statistic, rel=1e-9)
    assert summary.test.p_value == pytest.approx(stats.chi2.sf(statistic, 7), rel=1e-9)
    assert "stratified by context" in summary.test.name and "chi-square law" in summary.test.note


def test_logprob_test_finds_a_shift_accuracy_cannot_see():
    frame = _frame([0.0] * 8, n=24)  # accuracy at the floor everywhere
    frame["logprob"] = frame["logprob"] - 0.5 * (frame["residue"] == 3)
    summary = summarize(frame, stride=4, modulus=8)
    assert summary.test.p_value == 1.0 and summary.detectable_dip is None
    assert summary.logprob_test.p_value < 0.001 and "permutations" in summary.logprob_test.note
    assert summary.verdict == "inconclusive"  # the two tests disagree: not "no effect"
    assert summary.headline().startswith("Inconclusive: the accuracy test finds no phase effect (p = 1), but the "
                                         "answer's log-probability depends on the phase (p = 0.00025)")
    assert summary.headline().endswith("accuracy never varies within a context here: --calibrate finds a difficulty "
                                       "where it does.")


def test_detectable_dip_in_a_balanced_run_by_hand():
    rng = np.random.default_rng(1)
    frame = _frame([0.5] * 8, n=32)
    frame["correct"] = rng.random(len(frame)) < 0.64
    summary = summarize(frame, stride=4, modulus=8)
    # one target per residue and context: noncentrality of a unit dip is H^2 (1 - 1/M) / sum of within-context variances
    variances = frame.groupby("context")["correct"].var(ddof=1).to_numpy()
    unit = 32**2 * (1 - 1 / 8) / variances.sum()
    expected = np.sqrt(noncentrality_for_power(7) / unit)
    critical = stats.chi2.isf(0.05, 7)
    assert stats.ncx2.sf(critical, 7, expected**2 * unit) == pytest.approx(0.80, abs=1e-6)
    assert summary.detectable_dip == round(100 * expected, 2)
    assert summary.headline().startswith(f"No phase effect larger than {summary.detectable_dip:.1f} points")


def test_no_effect_when_every_residue_is_the_same():
    summary = summarize(_frame([0.5] * 8), stride=4, modulus=8)  # every context all right or all wrong
    assert summary.test.p_value == pytest.approx(1.0)
    assert summary.headline().startswith("No phase effect can be detected")


def test_a_control_run_never_headlines_a_phase_effect_alone():
    frame = _frame([0.5, 0.25, 1.0, 0.75, 0.5, 0.25, 0.75, 0.75])
    summary = summarize(frame, stride=4, modulus=8, control=True)
    line = summary.headline()
    assert summary.test.p_value < 0.05
    assert line.startswith("Control run: the model declares no KV-cache compression")
    assert f"Chance alone gives a p this small in {100 * summary.test.p_value:.1f}% of runs" in line


def test_gap_interval_brackets_the_gap():
    summary = summarize(_frame([0.5, 0.25, 1.0, 0.75, 0.5, 0.25, 0.75, 0.75]), stride=4, modulus=8)
    low, high = summary.gap_ci
    assert low < summary.gap <= high


def test_gap_difference_of_a_run_with_itself_and_with_a_flat_run():
    dipped = _frame([0.75, 0.75, 0.1, 0.75, 0.75, 0.75, 0.75, 0.75], n=64)
    flat = _frame([0.75] * 8, n=64)
    same = gap_difference(dipped, dipped)
    assert same.difference == 0 and same.ci_low < 0 < same.ci_high and not same.differs
    fixed = gap_difference(dipped, flat)
    assert fixed.difference == pytest.approx(-65.62, abs=0.01)  # 100 * (0 - (48 - 6) / 64)
    assert fixed.differs and fixed.ci_high < 0


def test_homogeneity_of_independent_targets_is_pearson_chi_square():
    correct = np.r_[np.ones(30), np.zeros(10), np.ones(18), np.zeros(22)]  # 75% and 45%, 40 each
    groups = np.repeat([0, 1], 40)
    chi2 = stats.chi2_contingency([[30, 10], [18, 22]], correction=False)[0]
    test = homogeneity_test(correct, groups)
    assert test.statistic == pytest.approx(chi2 * 79 / 80, rel=1e-9) and "independent targets" in test.name
    assert test.p_value == pytest.approx(stats.chi2.sf(chi2 * 79 / 80, 1), rel=1e-9)


# --- the verdict's three classes (issue 41) ------------------------------------------------

def _with(summary, p=0.5, logprob_p=0.5, gap_ci=(0.0, 10.0)):
    from dataclasses import replace

    return replace(summary, test=replace(summary.test, p_value=p),
                   logprob_test=replace(summary.logprob_test, p_value=logprob_p), gap_ci=gap_ci)


@pytest.mark.parametrize("p, logprob_p, gap_ci, verdict, opening", [
    (0.01, 0.5, (0.0, 10.0), "effect", "Accuracy depends on the token phase"),
    (0.2, 0.5, (1.8, 13.2), "inconclusive", "Inconclusive: the accuracy test finds no phase effect (p = 0.2), but "
                                            "the gap's 95% interval excludes 0 (1.8 to 13.2)"),
    (0.2, 0.01, (0.0, 13.2), "inconclusive", "Inconclusive: the accuracy test finds no phase effect (p = 0.2), but "
                                             "the answer's log-probability depends on the phase (p = 0.01)"),
    (0.2, 0.5, (0.0, 13.2), "no effect at this power", "No phase effect larger than"),
])
def test_each_verdict_class_has_its_own_words(p, logprob_p, gap_ci, verdict, opening):
    summary = _with(summarize(_frame([0.5, 0.25, 1.0, 0.75, 0.5, 0.25, 0.75, 0.75]), stride=4, modulus=8),
                    p, logprob_p, gap_ci)
    assert summary.verdict == verdict
    assert summary.headline().startswith(opening), summary.headline()
    assert summary.to_json()["verdict"] == verdict


def test_the_folder_once_read_as_learned_without_a_weak_spot_is_inconclusive():
    """reports/trained/meanpool-gated-start-seed1: p = 0.075 but a gap of 8.6 points whose
    interval, 1.8 to 13.2, excludes 0 (issue 41: its prose said it learned without one)."""
    from pathlib import Path

    from kvphase.sweep.run import load_plan, load_results

    folder = Path(__file__).resolve().parents[1] / "reports" / "trained" / "meanpool-gated-start-seed1" / "sweep"
    plan = load_plan(folder)
    summary = summarize(load_results(folder), plan.stride, plan.modulus, plan.seed, control=plan.control)
    assert (summary.verdict, summary.gap_ci) == ("inconclusive", (1.81, 13.22))


def test_the_basic_interval_is_scipys_basic_bootstrap_interval():
    """`basic_interval` on scipy's own bootstrap distribution gives scipy's basic interval."""
    from kvphase.sweep.stratified import basic_interval

    data = np.random.default_rng(3).exponential(size=60)
    result = stats.bootstrap((data,), np.mean, method="basic", n_resamples=2000, random_state=5)
    low, high = basic_interval(result.bootstrap_distribution, float(np.mean(data)))
    assert (low, high) == pytest.approx((result.confidence_interval.low, result.confidence_interval.high), abs=1e-9)
