"""A statistic is rounded once, where it is printed (issue 74): summary.json keeps it whole, and report.md,
`kvphase compare` and scripts/claims.py print it through `statistics.printed.fixed`."""

from __future__ import annotations

import importlib.util
import json

import pytest

from kvphase.statistics.printed import fixed
from kvphase.statistics.stratified import StratifiedTest
from kvphase.sweep.analysis import Summary, summarize
from kvphase.sweep.report import _overview_rows
from tests.helpers.by_hand import results_frame
from tests.helpers.paths import REPO

spec = importlib.util.spec_from_file_location("claims", REPO / "scripts" / "claims.py")
claims = importlib.util.module_from_spec(spec)
spec.loader.exec_module(claims)


@pytest.mark.parametrize("value, once, before", [
    (-7.2514, "-7.3", "-7.2"),  # the example's gap interval end (issue 74): stored -7.25, printed -7.2
    (43.947, "43.9", "44.0"),  # a post-hoc interval's upper end
    (7.147, "7.1", "7.2"),  # a detectable dip
    (19.25, "19.3", "19.2"),  # exactly halfway in binary: away from zero, where the format rounds to even
    (-0.04, "0.0", "-0.0"),  # no "-0.0"
])
def test_one_rounding_against_the_two_decimal_copy(value, once, before):
    """Each value rounded to one decimal by hand; `before`: what the pages printed from its two-decimal copy."""
    assert fixed(value) == once
    assert f"{round(value, 2):.1f}" == before


def _summary(**fields) -> Summary:
    test = StratifiedTest(name="t", statistic=1.0, dof=3, p_value=0.59, note="")
    base = dict(n_targets=768, n_contexts=24, balanced=True, control=False, mean_accuracy=62.24, mean_ci=(56.4, 67.7),
                worst_accuracy=55.2, worst_residue=3, best_accuracy=68.75, best_residue=0, gap=13.54,
                gap_ci=(-7.2514, 34.3), periodicity=None, detectable_dip=20.4, test=test, logprob_test=test,
                per_residue=[{"residue": r, "n": 96, "correct": c} for r, c in enumerate((66, 61, 56, 53))],
                per_phase=[])
    return Summary(**{**base, **fields})


def test_an_interval_end_at_x_x5_prints_once_in_the_headline_the_report_and_the_claims():
    """The example's lower gap end, -7.2514, through summary.json (kept whole) to every printer: -7.3 everywhere,
    where its two-decimal copy -7.25 printed -7.2 (README, study-highlights and the example's report.md)."""
    stored = json.loads(json.dumps(_summary().to_json()))
    assert stored["gap_ci"][0] == -7.2514
    assert "95% CI -7.3 to 34.3" in stored["headline"], stored["headline"]
    assert "95% CI -7.3 to 34.3" in dict(_overview_rows(_summary()))["gap (best - worst)"]
    assert claims._gap(stored) == "13.5 (-7.3-34.3)"


def test_a_summarized_gap_is_stored_whole_and_printed_once():
    """Residues at 140, 100, 120 and 120 of 210: the gap is 400/21 = 19.0476 points; its two-decimal copy 19.05
    would print 19.1. summary.json keeps it whole; the headline, the report's table (two decimals) and claims
    print it rounded once."""
    summary = summarize(results_frame([140 / 210, 100 / 210, 120 / 210, 120 / 210], n=210), stride=2, modulus=4)
    stored = json.loads(json.dumps(summary.to_json()))
    assert stored["gap"] == pytest.approx(400 / 21, abs=1e-12), stored["gap"]
    assert "(gap 19.0 points," in stored["headline"]
    assert dict(_overview_rows(summary))["gap (best - worst)"].startswith("19.05 points")
    assert claims._gap(stored).startswith("19.0 (")
