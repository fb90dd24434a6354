"""The mean accuracy's interval and the coverage a report states beside it: the interval's variance
against the spread of the contexts' means written out by hand and against a bootstrap over contexts,
and its simulated coverage against runs drawn from the law the data came from."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import special, stats

from kvphase.statistics.intervals import logit_intercept, mean_coverage, mean_intervals, wilson_interval
from kvphase.sweep.analysis import summarize
from kvphase.sweep.report import SHORT_COVERAGE, _clustering_line, _overview_rows
from kvphase.statistics.intervals import bootstrap_residue_accuracy
from kvphase.statistics.stratified import Stratification
from tests.helpers.by_hand import results_frame


def _clustered(n_contexts, per_context, modulus, accuracy, spread, seed):
    """Residues, contexts and 0/1 outcomes (N,) of a run whose contexts differ by a normal effect of
    `spread` logits, its targets spread over residues in turn."""
    rng = np.random.default_rng(seed)
    contexts = np.repeat(np.arange(n_contexts), per_context)  # (N,)
    residues = np.tile(np.arange(per_context) % modulus, n_contexts)  # (N,)
    chance = special.expit(logit_intercept(accuracy, spread) + spread * rng.standard_normal(n_contexts)[contexts])
    return residues, contexts, (rng.random(len(contexts)) < chance).astype(float)


def test_a_balanced_runs_interval_is_wilson_at_the_contexts_spread_of_means():
    residues, contexts, correct = _clustered(8, 32, 8, 0.4, 1.0, seed=3)
    means = np.bincount(contexts, weights=correct) / np.bincount(contexts)  # (H,) every context balanced
    h = len(means)
    widened = stats.t.isf(0.025, h - 1) / stats.norm.isf(0.025) * np.sqrt(h / (h - 1))  # t, not z, at 8 contexts
    variance = np.var(means) / h * widened**2  # the plug-in variance of a mean of 8 context means
    p = correct.mean()
    effective = p * (1 - p) / variance
    expected = 100 * np.array(wilson_interval(p * effective, effective))
    got = mean_intervals(correct, Stratification.of(residues, contexts), contexts)[0]
    assert got == pytest.approx(expected, abs=1e-9), f"max difference {np.max(np.abs(got - expected)):.3g}"


def test_an_unbalanced_runs_interval_has_the_width_a_bootstrap_over_contexts_gives():
    rng = np.random.default_rng(5)
    contexts = np.repeat(np.arange(30), rng.integers(3, 20, 30))  # (N,) contexts of unequal sizes
    residues = rng.integers(0, 4, len(contexts))  # (N,) residues unevenly spread
    chance = special.expit(-0.5 + rng.standard_normal(30)[contexts])
    correct = (rng.random(len(contexts)) < chance).astype(float)
    low, high = mean_intervals(correct, Stratification.of(residues, contexts), contexts)[0]
    resampled = bootstrap_residue_accuracy(correct, residues, contexts, seed=1, n=20_000).mean(axis=1)  # (n',)
    widened = stats.t.isf(0.025, 29) / stats.norm.isf(0.025) * np.sqrt(30 / 29)
    # Wilson's half-width at the effective n is z times the standard error, up to its small-n terms
    assert (high - low) / 2 == pytest.approx(stats.norm.isf(0.025) * np.std(resampled) * widened, rel=0.05)


def test_runs_given_together_get_the_intervals_they_get_alone():
    residues, contexts, correct = _clustered(6, 16, 4, 0.3, 1.0, seed=1)
    stratification = Stratification.of(residues, contexts)
    flipped = 1 - correct
    together = mean_intervals(np.stack([correct, flipped]), stratification, contexts)  # (2, 2)
    alone = np.concatenate([mean_intervals(c, stratification, contexts) for c in (correct, flipped)])
    assert together == pytest.approx(alone)


def test_independent_targets_are_covered_about_95_percent_of_the_time():
    residues, contexts, correct = _clustered(2000, 1, 4, 0.5, 0.0, seed=2)
    coverage = mean_coverage(correct, Stratification.of(residues, contexts), contexts, seed=4)
    assert 0.92 <= coverage <= 0.98  # 400 runs: Monte Carlo SE about 0.011


def test_the_stated_coverage_is_what_runs_of_the_datas_own_law_show():
    """Four contexts, 2 logits apart: the t-widened interval holds the mean well under 95% of the time.
    The coverage a report states (from the run's own spread of contexts) is compared with the coverage
    of intervals in runs drawn from the law the run was drawn from, each averaged over 30 runs."""
    stated, truth = [], []
    for seed in range(30):
        residues, contexts, correct = _clustered(4, 200, 8, 0.15, 2.0, seed=seed)
        stratification = Stratification.of(residues, contexts)
        stated.append(mean_coverage(correct, stratification, contexts, seed=seed))
        bounds = mean_intervals(correct, stratification, contexts)[0]
        truth.append(bounds[0] <= 15 <= bounds[1])
    assert np.mean(stated) < SHORT_COVERAGE and np.mean(truth) < SHORT_COVERAGE
    assert np.mean(stated) == pytest.approx(np.mean(truth), abs=0.15)


def test_a_run_all_right_or_of_one_context_states_no_coverage():
    residues, contexts, _ = _clustered(8, 8, 4, 0.5, 0.0, seed=0)
    stratification = Stratification.of(residues, contexts)
    assert mean_coverage(np.ones(len(contexts)), stratification, contexts) is None
    assert mean_coverage(np.tile([0.0, 1.0], 32), Stratification.of(residues, np.zeros(64)), np.zeros(64)) is None


@pytest.mark.parametrize("coverage, said", [(0.89, True), (SHORT_COVERAGE - 1e-4, True), (SHORT_COVERAGE, False),
                                            (0.96, False), (None, False)])
def test_the_report_says_a_short_coverage_in_words(coverage, said):
    summary = dataclasses.replace(summarize(results_frame([0.5, 0.25, 1.0, 0.75, 0.5, 0.25, 0.75, 0.75]), 4, 8),
                                  mean_coverage=coverage)
    line = _clustering_line(summary)
    assert ("falls short of 95%" in line) == said
    if said:
        assert f"held the true mean {coverage:.0%} of the time" in line
    row = dict(_overview_rows(summary))["mean accuracy over residues"]
    assert ("runs simulated like this one" in row) == (coverage is not None)
