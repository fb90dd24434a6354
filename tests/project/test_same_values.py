"""tests/helpers/same_values.py, the one comparison of a committed folder's re-written files: what it lets
through (the last bits numpy rounds differently on another CPU) and what it must not (any word, count,
key, or a float beyond rounding). Values are pinned by hand, on the committed example's own files."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers.paths import EXAMPLE
from tests.helpers.same_values import assert_same_values, json_differences, text_differences

SUMMARY = json.loads((EXAMPLE / "summary.json").read_text())
REPORT = (EXAMPLE / "report.md").read_text()


def _summary_with(**test_fields) -> dict:
    return {**SUMMARY, "test": {**SUMMARY["test"], **test_fields}}


def test_the_issue_71_host_s_last_digits_pass():
    """The two hosts of issue 71 wrote the statistic and p-value apart in their 16th digit (the committed
    example was last re-reported on an AVX-512 host that writes the AVX2 host's ...762)."""
    assert SUMMARY["test"]["statistic"] == 5.541510845175762
    assert json_differences(_summary_with(statistic=5.541510845175764, p_value=0.5941817132399817), SUMMARY) == []


@pytest.mark.parametrize("changed, where", [
    (_summary_with(statistic=5.541510845175762 * (1 + 1e-8)), "test.statistic"),  # beyond rounding
    (_summary_with(dof=6), "test.dof"),  # a count
    (_summary_with(dof=7.0), "test.dof"),  # a count written as a float is another file
    (_summary_with(name="Cochran-Mantel-Haenszel test"), "test.name"),
    ({**SUMMARY, "verdict": "effect"}, "verdict"),
    ({**SUMMARY, "n_targets": 767}, "n_targets"),
    ({**SUMMARY, "balanced": 1}, "balanced"),  # True == 1 in Python
    ({**SUMMARY, "mean_ci": SUMMARY["mean_ci"][:1]}, "mean_ci"),
    ({key: value for key, value in SUMMARY.items() if key != "icc"}, "top level"),
])
def test_any_word_count_key_or_float_beyond_rounding_is_a_difference(changed, where):
    found = json_differences(changed, SUMMARY)
    assert len(found) == 1 and found[0].startswith(f"{where}:"), found


HEADLINE = "gap 13.5 points, 95% CI -7.3 to 34.3, which allows no gap; p = 0.59, log-probability p = 0.8"


@pytest.mark.parametrize("printed", [
    HEADLINE,
    HEADLINE.replace("p = 0.59", "p = 0.58"),  # one unit of the last printed digit: a rounding boundary
    HEADLINE.replace("-7.3", "-7.2"),
])
def test_a_page_s_numbers_agree_to_their_printed_precision(printed):
    assert HEADLINE in REPORT
    assert text_differences(REPORT.replace(HEADLINE, printed), REPORT) == []


@pytest.mark.parametrize("old, new", [
    ("p = 0.59", "p = 0.57"),  # two units
    ("13.5 points", "13.5 point"),
    ("allows no gap", "allows a gap"),
    ("95% CI", "94% CI"),  # a count, printed without decimals
    ("p = 0.59", "p = 1"),
])
def test_a_page_s_words_counts_and_moved_numbers_are_differences(old, new):
    changed = REPORT.replace(HEADLINE, HEADLINE.replace(old, new))
    found = text_differences(changed, REPORT)
    assert len(found) == 1 and found[0].startswith("line 3:"), found


def test_a_line_more_or_less_is_a_difference():
    assert text_differences(REPORT + "\nmore\n", REPORT) == [f"{len(REPORT.splitlines()) + 2} lines against "
                                                             f"{len(REPORT.splitlines())}"]


def test_a_folder_is_compared_file_by_file_and_every_difference_is_listed(tmp_path):
    folder = shutil.copytree(EXAMPLE, tmp_path / "run")
    assert_same_values(folder, EXAMPLE)
    (folder / "summary.json").write_text(json.dumps({**SUMMARY, "verdict": "effect", "n_contexts": 23}))
    (folder / "report.md").write_text(REPORT.replace("control run", "compression run"))
    with pytest.raises(AssertionError) as failed:
        assert_same_values(folder, EXAMPLE)
    said = str(failed.value)
    assert "summary.json: n_contexts: 23 against 24" in said and "summary.json: verdict: 'effect' against" in said
    assert "report.md: line 5:" in said
