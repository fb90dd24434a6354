"""The statistics at the planner's auto density (tens to hundreds of targets per context):

- the intra-context correlation against a hand computation and against beta-binomial
  data of known correlation; the design effect against the simulated variance of a mean;
- the summary and the report carry them; a summary.json from before them still builds;
- the CMH degrees of freedom never count the null direction rounding leaves over 256 strata;
- false positive rate of the stratified test on designs `plan_contexts` makes (1K, 4K and
  16K contexts at M = 8) with context effects of 0, 1 and 2 logits and a lost-in-the-middle
  depth curve: at most alpha within Monte Carlo error, and not far below it either (a
  statistic that ignores contexts is that conservative here);
- power: a 15-point dip at one residue of a 4K design is found most of the time.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from functools import lru_cache

import numpy as np
import pandas as pd
import pytest
from scipy import optimize, special, stats

from kvphase.sweep.analysis import Summary, summarize
from kvphase.sweep.positions import plan_contexts
from kvphase.sweep.report import _clustering_line, render_markdown
from kvphase.sweep.run import load_plan
from kvphase.statistics.intervals import design_effect, intra_context_correlation
from kvphase.statistics.power import detectable_dip
from kvphase.statistics.stratified import (ALPHA, MIN_EXPECTED, Stratification, StratifiedTest, cmh_parts, cmh_statistic,
                                          stratified_test)
from tests.helpers.by_hand import generalized_cmh_loop
from tests.helpers.paths import EXAMPLE

LOWEST = 50  # first token a target may take (after the task's preamble)
BASE_ACCURACY = 0.65
NULL_RUNS, POWER_RUNS = 8_000, 1_000
CHUNK = 1_000  # simulated runs held at once: 16K contexts hold 5,376 targets each run
MONTE_CARLO = 2.5  # standard errors a simulated rate may stray from its target

# name -> (context length, targets per context, rounds of M contexts), M = 8: the auto density's designs
PLAN_SHAPES = {"1K: 16 x 32": (1024, 32, 2), "4K: 8 x 160": (4096, 160, 1), "16K: 8 x 672": (16384, 672, 1)}


def _plan_shape(context: int, per_context: int, rounds: int, modulus: int = 8):
    """Every target's position and context (N,), (N,) as `plan_contexts` places them, and the
    span of depths they were placed in."""
    highest = LOWEST + 99 * 8 * context // 1024  # records fill about 80% of the context
    planned = plan_contexts(LOWEST, highest, modulus, rounds * per_context, per_context)
    positions = np.concatenate(planned)  # (N,)
    contexts = np.repeat(np.arange(len(planned)), [len(c) for c in planned])  # (N,)
    return positions, contexts, (LOWEST, highest)


def _probabilities(positions, contexts, span, context_sd, depth, runs, rng):
    """Each target's chance of being right in `runs` runs (runs, N): BASE_ACCURACY on the logit
    scale, plus a normal effect per context, plus (with `depth`) a U-curve in depth, 1.5 logits
    from the middle to either end, as lost-in-the-middle retrieval has it."""
    effects = context_sd * rng.standard_normal((runs, contexts.max() + 1))  # (runs, H)
    logit = special.logit(BASE_ACCURACY) + effects[:, contexts]  # (runs, N)
    if depth:
        middle, half = (span[0] + span[1]) / 2, (span[1] - span[0]) / 2
        logit = logit + 1.5 * ((positions - middle) / half) ** 2 - 0.75  # (runs, N)
    return special.expit(logit)


def _smallest_expected_count(outcomes: np.ndarray, stratification: Stratification) -> float:
    """Over runs and groups, the smallest expected number of successes or failures given each
    context's own rate: below MIN_EXPECTED the report would take a permutation p-value."""
    table = stratification.counts  # (H, G)
    in_stratum = np.eye(len(table))[stratification.strata]  # (N, H)
    rates = outcomes @ in_stratum / table.sum(axis=1)  # (B, H)
    successes = rates @ table  # (B, G)
    return float(min(successes.min(), (table.sum(axis=0) - successes).min()))


@lru_cache(maxsize=None)
def _null_rate(name: str, context_sd: float, depth: bool) -> float:
    """The stratified test's rejection rate at ALPHA over NULL_RUNS runs without a residue effect."""
    positions, contexts, span = _plan_shape(*PLAN_SHAPES[name])
    stratification = Stratification.of(positions % 8, contexts)
    rng = np.random.default_rng([int(context_sd), int(depth), len(positions)])
    rejected = 0
    for _ in range(NULL_RUNS // CHUNK):
        outcomes = (rng.random((CHUNK, len(positions))) < _probabilities(
            positions, contexts, span, context_sd, depth, CHUNK, rng)).astype(float)  # (CHUNK, N)
        # the chi-square law is what `stratified_test` uses on every such run, so it is what is simulated
        assert _smallest_expected_count(outcomes, stratification) >= MIN_EXPECTED
        statistic, dof = cmh_statistic(outcomes, stratification)  # (CHUNK,)
        assert dof == 7
        rejected += int((stats.chi2.sf(statistic, dof) < ALPHA).sum())
    rate = rejected / NULL_RUNS
    print(f"\n{name}, context SD {context_sd} logits, depth curve {depth}: false positive rate {rate:.4f}")
    return rate


def _monte_carlo_error(rate: float, runs: int) -> float:
    return MONTE_CARLO * np.sqrt(rate * (1 - rate) / runs)


# --- intra-context correlation and design effect ---

def test_intra_context_correlation_by_hand():
    """Contexts [1, 1, 0], [0, 0], [1, 0, 1, 1]: N = 9, K = 3, grand mean 5/9.
    SSB = 3 (2/3 - 5/9)^2 + 2 (5/9)^2 + 4 (3/4 - 5/9)^2 = 29/36, MSB = 29/72;
    SSW = 3 (2/3)(1/3) + 0 + 4 (3/4)(1/4) = 17/12, MSW = 17/72;
    n0 = (9 - (9 + 4 + 16) / 9) / 2 = 26/9;
    ICC = (29 - 17) / (29 + (26/9 - 1) 17) = 108/550; design effect at m = 3: 1 + 2 x 108/550."""
    outcome = np.array([1, 1, 0, 0, 0, 1, 0, 1, 1])
    contexts = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    icc = intra_context_correlation(outcome, contexts)
    assert icc == pytest.approx(108 / 550, rel=1e-12)
    assert design_effect(icc, 3) == pytest.approx(1 + 216 / 550, rel=1e-12)


def test_contexts_less_alike_than_chance_clip_at_zero():
    # every context one right, one wrong: MSB = 0 < MSW, a negative estimate
    assert intra_context_correlation(np.tile([1, 0], 10), np.repeat(np.arange(10), 2)) == 0.0
    assert design_effect(0.0, 32) == 1.0


@pytest.mark.parametrize("outcome, contexts", [
    (np.ones(8), np.repeat(np.arange(4), 2)),  # never varies
    (np.tile([1, 0], 4), np.arange(8)),  # every context holds one target
    (np.tile([1, 0], 4), np.zeros(8)),  # one context
], ids=["constant", "singletons", "one-context"])
def test_intra_context_correlation_is_none_where_it_cannot_be_measured(outcome, contexts):
    assert intra_context_correlation(outcome, contexts) is None


@pytest.mark.parametrize("rho", [0.05, 0.2, 0.5])
@pytest.mark.parametrize("sizes", ["equal", "unequal"])
def test_intra_context_correlation_of_beta_binomial_contexts(rho, sizes):
    """A context's accuracy drawn from Beta(a, b), its targets right independently at that
    accuracy: two targets of one context are correlated by 1 / (a + b + 1) = rho."""
    rng = np.random.default_rng(int(100 * rho))
    n_contexts = 3_000
    counts = np.full(n_contexts, 8) if sizes == "equal" else rng.integers(2, 17, n_contexts)  # (K,)
    total = 1 / rho - 1  # a + b
    accuracy = rng.beta(BASE_ACCURACY * total, (1 - BASE_ACCURACY) * total, n_contexts)  # (K,)
    contexts = np.repeat(np.arange(n_contexts), counts)  # (N,)
    outcome = (rng.random(len(contexts)) < accuracy[contexts]).astype(float)  # (N,)
    icc = intra_context_correlation(outcome, contexts)
    print(f"\nrho {rho}, {sizes} sizes: estimated {icc:.4f}")
    assert icc == pytest.approx(rho, abs=0.03)


def test_design_effect_is_the_variance_ratio_of_a_mean():
    """20,000 runs of 16 contexts x 32 targets, beta-binomial with rho = 0.1: the variance of
    the run's mean over the binomial variance p (1 - p) / N is 1 + 31 x 0.1 = 4.1."""
    rng = np.random.default_rng(7)
    runs, n_contexts, per_context, rho = 20_000, 16, 32, 0.1
    total = 1 / rho - 1
    accuracy = rng.beta(BASE_ACCURACY * total, (1 - BASE_ACCURACY) * total, (runs, n_contexts))  # (runs, K)
    means = rng.binomial(per_context, accuracy).sum(axis=1) / (n_contexts * per_context)  # (runs,)
    ratio = means.var() / (BASE_ACCURACY * (1 - BASE_ACCURACY) / (n_contexts * per_context))
    assert ratio == pytest.approx(design_effect(rho, per_context), rel=0.05)


# --- summary and report ---

def _results(context_sd=1.0, seed=0) -> pd.DataFrame:
    """A results frame on the 1K design: 16 contexts of 32 targets, no residue effect."""
    positions, contexts, span = _plan_shape(*PLAN_SHAPES["1K: 16 x 32"])
    rng = np.random.default_rng(seed)
    correct = rng.random(len(positions)) < _probabilities(positions, contexts, span, context_sd, False, 1, rng)[0]
    return pd.DataFrame({"target_id": np.arange(len(positions)), "context": contexts, "residue": positions % 8,
                         "phase": positions % 4, "target_pos": positions, "correct": correct,
                         "logprob": np.where(correct, -0.1, -2.0), "predicted": ""})


def test_summary_reports_targets_per_context_and_clustering():
    results = _results()
    summary = summarize(results, stride=4, modulus=8)
    icc = intra_context_correlation(results["correct"].to_numpy(float), results["context"].to_numpy())
    assert (summary.n_contexts, summary.targets_per_context) == (16, 32.0)
    assert summary.icc == pytest.approx(icc) and summary.icc > 0.05  # a context SD of 1 logit shows
    assert summary.design_effect == pytest.approx(1 + 31 * icc)
    assert summary.to_json()["design_effect"] == summary.design_effect


def test_a_summary_json_from_before_the_clustering_fields_still_builds():
    summary = summarize(_results(), stride=4, modulus=8)
    old = {key: value for key, value in asdict(summary).items()
           if key not in ("targets_per_context", "icc", "design_effect")}  # what summary.json held before
    rebuilt = Summary(**{**old, "test": StratifiedTest(**old["test"]),
                         "logprob_test": StratifiedTest(**old["logprob_test"])})
    assert rebuilt.targets_per_context == 32.0  # n_targets / n_contexts
    assert rebuilt.icc is None and rebuilt.design_effect is None
    assert rebuilt.headline() == summary.headline()


def test_report_states_contexts_targets_per_context_and_design_effect():
    summary = summarize(_results(), stride=4, modulus=8)
    page = render_markdown(load_plan(EXAMPLE), summary, {})
    independent = round(512 / summary.design_effect)
    assert "in 16 contexts of 32 targets on average" in page
    assert (f"Intra-context correlation of correctness {summary.icc:.2g} (design effect "
            f"{summary.design_effect:.1f}: for the mean accuracy, 512 targets carry the information of "
            f"{independent} independent ones)") in page
    assert "so a context effect cancels there" in page


def test_report_says_why_no_correlation_was_measured():
    summary = summarize(_results(), stride=4, modulus=8)
    assert "one target" in _clustering_line(replace(summary, icc=None, design_effect=None, targets_per_context=1.0))
    assert "never varies" in _clustering_line(replace(summary, icc=None, design_effect=None))


# --- degrees of freedom ---

def _old_rank(outcome: np.ndarray, stratification: Stratification) -> int:
    """The degrees of freedom as the test took them before: numpy's default rank tolerance."""
    return int(np.linalg.matrix_rank(cmh_parts(outcome, stratification)[1][0], hermitian=True))


def test_degrees_of_freedom_never_count_the_null_direction_of_many_strata():
    """256 contexts of 4 targets, one per residue (M = 4): rounding over the strata leaves the
    covariance's null direction an eigenvalue of about 1e-15 of the largest, which numpy's
    default tolerance counted as a dimension (df 4) for about half of all outcomes."""
    stratification = Stratification.of(np.tile(np.arange(4), 256), np.repeat(np.arange(256), 4))
    outcomes = ((np.random.default_rng(seed).random(1024) < 0.5).astype(float) for seed in range(200))
    y = next((y for y in outcomes if _old_rank(y, stratification) == 4), None)
    assert y is not None, "no outcome in 200 gave the old rank 4: the case this test pins is gone"
    want = generalized_cmh_loop(y, stratification.groups, stratification.strata, 4)  # textbook: drop one group, solve
    (statistic,), dof = cmh_statistic(y, stratification)
    assert dof == 3
    assert statistic == pytest.approx(want, rel=1e-9)
    test = stratified_test(y, stratification, binary=True)
    assert (test.dof, test.p_value) == (3, pytest.approx(stats.chi2.sf(want, 3), rel=1e-9))


def test_detectable_dip_takes_the_same_degrees_of_freedom():
    """The design where the old rank tolerance counted a fourth dimension: the power rule's critical
    value takes the test's degrees of freedom (3), so at a dip of nothing it rejects 5% of the time
    (with df = 4 it would be about 3.5%)."""
    from kvphase.statistics.power import POWER_DRAWS, dip_power

    stratification = Stratification.of(np.tile(np.arange(4), 256), np.repeat(np.arange(256), 4))
    outcomes = ((np.random.default_rng(seed).random(1024) < 0.5).astype(float) for seed in range(200))
    y = next(y for y in outcomes if _old_rank(y, stratification) == 4)
    base = y.reshape(256, 4).mean(axis=1)  # (H,)
    draws = np.random.default_rng(0).standard_normal((POWER_DRAWS, 4))
    assert dip_power(stratification.counts, base, 0, 1e-9, float(y.mean()), draws) == pytest.approx(ALPHA, abs=0.01)
    assert detectable_dip(y, stratification) is not None


# --- false positive rate and power on the auto density's designs ---

@pytest.mark.parametrize("depth", [False, True], ids=["flat", "u-curve"])
@pytest.mark.parametrize("context_sd", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("name", list(PLAN_SHAPES))
def test_false_positive_rate_is_at_most_alpha(name, context_sd, depth):
    rate = _null_rate(name, context_sd, depth)
    assert rate <= ALPHA + _monte_carlo_error(ALPHA, NULL_RUNS)


@pytest.mark.parametrize("depth", [False, True], ids=["flat", "u-curve"])
@pytest.mark.parametrize("context_sd", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("name", list(PLAN_SHAPES))
def test_false_positive_rate_is_not_far_below_alpha(name, context_sd, depth):
    """At least half of alpha: a test this conservative throws power away. The depth curve
    alone makes the stratified test somewhat conservative (targets of one context then differ,
    and the permutation variance overstates the spread of a residue's sum); a statistic that
    ignores contexts rejects under 1% of null runs at a context SD of 2 logits."""
    rate = _null_rate(name, context_sd, depth)
    assert rate >= ALPHA / 2 - _monte_carlo_error(ALPHA / 2, NULL_RUNS)


def test_a_15_point_dip_at_one_residue_is_found_most_of_the_time():
    """4K design (8 contexts x 160), context SD 1 logit, the depth curve, residue 3's chance
    scaled down so that its accuracy drops by 15 points."""
    positions, contexts, span = _plan_shape(*PLAN_SHAPES["4K: 8 x 160"])
    stratification = Stratification.of(positions % 8, contexts)
    rng = np.random.default_rng(11)
    chance = _probabilities(positions, contexts, span, 1.0, True, POWER_RUNS, rng)  # (runs, N)
    dipped = positions % 8 == 3  # (N,)
    chance[:, dipped] *= 1 - 0.15 / chance[:, dipped].mean()
    outcomes = (rng.random(chance.shape) < chance).astype(float)  # (runs, N)
    statistic, dof = cmh_statistic(outcomes, stratification)
    power = (stats.chi2.sf(statistic, dof) < ALPHA).mean()
    print(f"\npower {power:.3f} against a 15-point dip, {POWER_RUNS} runs of {len(positions)} targets")
    assert power >= 0.6
