"""A headline's advice follows from its verdict's cause (issue 74): each class names only options that can change
that cause for the run's task and plan. `--calibrate` only where the task has a difficulty to walk; no dip larger
than the largest that fits; more targets where they would make a floor run readable, and never fewer than it held."""

from __future__ import annotations

import re

import pytest

from kvphase.statistics.stratified import StratifiedTest
from kvphase.sweep.analysis import Summary
from kvphase.sweep.plan import per_residue_for_detect

MODULUS = 8
CALIBRATE = "`kvphase sweep --calibrate` chooses one"


def _test(p: float) -> StratifiedTest:
    return StratifiedTest(name="t", statistic=1.0, dof=MODULUS - 1, p_value=p, note="")


def summary(mean=60.0, ci=(50.0, 70.0), dip=None, largest=None, power=0.3, knobs=("context",), calibrated=False,
            p=0.5, gap=10.0, gap_low=-5.0, n_per_residue=16, contexts=16, chance=0.0, answers=None) -> Summary:
    """A summary built by hand: residues at `mean` but one, `gap` points lower (counts of 100 targets each)."""
    rows = [{"residue": r, "n": 100, "correct": round(mean if r else mean - gap)} for r in range(MODULUS)]
    return Summary(n_targets=n_per_residue * MODULUS, n_contexts=contexts, balanced=True, control=False,
                   mean_accuracy=mean, mean_ci=ci, worst_accuracy=mean - gap, worst_residue=0, best_accuracy=mean,
                   best_residue=1, gap=gap, gap_ci=(gap_low, gap + 5), periodicity=None, detectable_dip=dip,
                   test=_test(p), logprob_test=_test(0.5), per_residue=rows, per_phase=[],
                   largest_dip=ci[0] - chance if largest is None else largest, power_at_floor=power,
                   answers=answers, chance=chance, knobs=None if knobs is None else list(knobs), calibrated=calibrated)


def detect_option(headline: str) -> int | None:
    found = re.search(r"--detect (\d+)", headline)
    return int(found.group(1)) if found else None


DEGENERATE = {"commonest": "Laura", "commonest_share": 1.0, "effective": 1.0, "truth_effective": 30.0}


@pytest.mark.parametrize("verdict, fields", [
    ("degenerate", {"answers": DEGENERATE}),
    ("uninformative at the floor", {"mean": 4.0, "ci": (0.5, 8.0)}),
])
def test_calibrate_is_advised_only_where_the_task_has_a_difficulty_to_walk(verdict, fields):
    """A records run (knobs) is told of `--calibrate`; a trained `pairs` run (no knobs) and a run `--calibrate`
    already set are not, and are told why."""
    walkable, fixed_task, calibrated = (summary(**fields), summary(**fields, knobs=()),
                                        summary(**fields, calibrated=True))
    assert walkable.verdict == fixed_task.verdict == calibrated.verdict == verdict
    assert CALIBRATE in walkable.headline(), walkable.headline()
    assert CALIBRATE not in fixed_task.headline() and "this task has no difficulty `--calibrate` can turn" in (
        fixed_task.headline()), fixed_task.headline()
    assert CALIBRATE not in calibrated.headline() and "`--calibrate` chose this setting" in calibrated.headline()


def test_a_floor_run_is_told_the_targets_that_would_make_it_readable():
    """At 12% over 0% chance with the lower end at 9.6: a dip of up to 9 whole points fits; the run held 16 targets
    per residue, `--detect 9` plans more, so the headline names them. Without room (lower end 0.5) it names none."""
    readable = summary(mean=12.0, ci=(9.6, 14.4), knobs=())
    assert readable.verdict == "uninformative at the floor"
    needed = per_residue_for_detect(9, MODULUS)
    assert needed > 16
    assert readable.headline().endswith(f"; or {needed} targets per residue would detect a 9-point dip, the largest "
                                        "whole-point dip that fits (`--per-residue auto --detect 9`)."), readable.headline()
    no_room = summary(mean=4.0, ci=(0.5, 8.0), knobs=())
    assert "targets per residue" not in no_room.headline() and detect_option(no_room.headline()) is None


def test_a_floor_run_that_held_as_many_targets_is_not_told_to_add_them():
    """A run that already held what `--detect 9` plans gains nothing from that advice."""
    held = summary(mean=12.0, ci=(9.6, 14.4), knobs=(), n_per_residue=per_residue_for_detect(9, MODULUS))
    assert held.verdict == "uninformative at the floor" and "targets per residue" not in held.headline()


@pytest.mark.parametrize("lower, dip", [(18.2, 18), (19.3, 19), (26.0, 20), (20.0, 20)])
def test_too_few_targets_sizes_for_no_dip_larger_than_the_largest_that_fits(lower, dip):
    """The two runs of issue 74 (largest dips 18.2 and 19.3) were told to size for 20 points; a run with more room
    is sized for the planned 20. The count is what the named option plans."""
    s = summary(mean=40.0, ci=(lower, 60.0), n_per_residue=2)
    assert s.verdict == "uninformative, too few targets"
    assert detect_option(s.headline()) == dip, s.headline()
    assert f"{per_residue_for_detect(dip, MODULUS)} targets per residue would detect a {dip}-point dip" in s.headline()
    assert CALIBRATE not in s.headline()


def test_too_few_targets_with_no_room_in_the_means_interval_is_told_more_contexts():
    """Two contexts leave the mean's interval 0.2 to 99.8%: the interval, not the accuracy, leaves no room."""
    s = summary(mean=50.0, ci=(0.2, 99.8), n_per_residue=2, contexts=2)
    assert s.verdict == "uninformative, too few targets"
    assert "more contexts narrow it" in s.headline() and "in more than 2 contexts" in s.headline()
    assert detect_option(s.headline()) == 20


def test_an_inconclusive_run_sizes_its_larger_sample_within_what_fits():
    """Gap 30 points, its interval above 0, the test not rejecting: a larger sample decides, sized for the gap
    unless the largest dip that fits (18.2) is smaller."""
    wide = summary(dip=25.0, gap=30.0, gap_low=2.0, ci=(50.0, 70.0))
    tight = summary(dip=25.0, gap=30.0, gap_low=2.0, ci=(18.2, 70.0))
    assert wide.verdict == tight.verdict == "inconclusive"
    assert (detect_option(wide.headline()), detect_option(tight.headline())) == (30, 18)


@pytest.mark.parametrize("fields, verdict", [({"dip": 8.0, "p": 0.001}, "effect"),
                                             ({"dip": 8.0, "p": 0.5}, "no effect at this power")])
def test_a_tested_run_is_advised_no_option(fields, verdict):
    s = summary(**fields)
    assert s.verdict == verdict and "--" not in s.headline(), s.headline()
