"""Statistics against values computed elsewhere (statsmodels' proportion_confint, scipy)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from kvphase.sweep.analysis import homogeneity_test, summarize, wilson_interval

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


def _frame(accuracies, n=40, stride=4):
    rows = []
    for residue, acc in enumerate(accuracies):
        hits = int(round(acc * n))
        for i in range(n):
            rows.append({"residue": residue, "phase": residue % stride, "target_pos": 1000 + i * 8 + residue,
                         "correct": i < hits, "logprob": -1.0})
    return pd.DataFrame(rows)


def test_summary_numbers_by_hand():
    accuracies = [0.5, 0.25, 1.0, 0.75, 0.5, 0.25, 0.75, 0.75]
    summary = summarize(_frame(accuracies), stride=4, modulus=8)
    assert summary.mean_accuracy == round(100 * np.mean(accuracies), 2)  # percent, two decimals
    assert (summary.worst_residue, summary.worst_accuracy) == (1, 25.0)
    assert (summary.best_residue, summary.best_accuracy) == (2, 100.0)
    assert summary.gap == 75.0
    assert summary.periodicity == pytest.approx(100 * np.mean([0, 0, 0.25, 0]))
    assert "depends on the token phase" in summary.headline()


def test_chi_square_agrees_with_scipy_when_counts_are_large():
    frame = _frame([0.5, 0.6, 0.4, 0.55], n=50, stride=2)
    table = pd.crosstab(frame["residue"], frame["correct"]).to_numpy()
    chi2, p, dof, _ = stats.chi2_contingency(table, correction=False)
    test = homogeneity_test(frame["correct"].to_numpy(), frame["residue"].to_numpy())
    assert (test.statistic, test.p_value, test.dof) == (pytest.approx(chi2), pytest.approx(p), dof)


def test_no_effect_when_every_residue_is_the_same():
    summary = summarize(_frame([0.5] * 8), stride=4, modulus=8)
    assert summary.test.p_value == pytest.approx(1.0)
    assert summary.headline().startswith("No phase effect detected")


def test_constant_outcomes_give_p_one():
    test = homogeneity_test(np.ones(16, bool), np.arange(16) % 8)
    assert test.p_value == 1.0 and "same outcome" in test.note


def test_small_counts_use_a_permutation_p_value():
    frame = _frame([0.0, 1.0, 0.0, 1.0], n=4, stride=2)
    test = homogeneity_test(frame["correct"].to_numpy(), frame["residue"].to_numpy())
    assert "permutation" in test.name and test.p_value < 0.01
