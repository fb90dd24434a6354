"""`--calibrate`: the pilot walks from easy to hard on contexts the sweep never scores, stops where
the accuracy reaches the band, costs at most its budget of the sweep it chooses, and what it chose
goes into config.json, from which the report and a re-run reproduce it."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from tests.helpers.fakes import WordBackend
from kvphase.backends.base import Score
from kvphase.errors import PlanError
from kvphase.sweep import calibrate as calibration
from kvphase.sweep.backend_setup import closed_after
from kvphase.sweep.calibrate import (PILOT_BUDGET, Band, Calibration, calibrate, calibrated_run_dir, easier_levels,
                                     harder_levels, plan_for_folder, tokens_of)
from kvphase.sweep.contexts import build_contexts
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.run import load_plan, prepare_run_dir
from kvphase.sweep.tasks import load_task

PLAN = SweepPlan(model="x.gguf", task="records", stride=4, modulus=8, context=1024, per_residue=32,
                 padding="prefix", seed=0, control=True)
BAND = Band(40, 80)


class KnownDifficulty(WordBackend):
    """A model whose accuracy is a known function of the context length: of each context's
    queries, the first round(accuracy x n) are answered."""

    def __init__(self, accuracy_at):
        super().__init__()
        self.accuracy_at = accuracy_at
        self.scored_contexts: list[tuple[int, ...]] = []

    def score(self, context, queries):
        self.scored_contexts.append(tuple(context))
        self.tokens_evaluated += len(context) + sum(len(q.prompt) + len(q.answer) - 1 for q in queries)
        answered = round(self.accuracy_at(len(context)) * len(queries))
        return [Score(i < answered, 0.0, tuple(q.answer)) for i, q in enumerate(queries)]


def falling(context: int) -> float:
    """95% up to 1024 tokens, 60% at 2048 and 10% beyond: from the default start (1024) the band
    (40-80) is reached at 2048."""
    return 0.95 if context <= 1100 else 0.6 if context <= 2100 else 0.1


def rising(context: int) -> float:
    """5% at 1024 tokens and beyond, 60% at 512, 95% below: the band is reached at 512."""
    return 0.05 if context > 600 else 0.6 if context > 300 else 0.95


def test_the_band_parses_and_refuses_what_is_not_a_band():
    assert Band.parse("40-80") == Band(40, 80) and Band.parse(" 10.5-20 ") == Band(10.5, 20)
    for bad in ("80-40", "50-50", "abc", "40", "40-120", "-5-50", ""):
        with pytest.raises(PlanError, match="--target-accuracy must be LOW-HIGH"):
            Band.parse(bad)


def test_harder_settings_double_the_context_up_to_the_longest_then_turn_to_harder_tasks():
    assert harder_levels(PLAN, ["context"], 5000) == [("records", 2048), ("records", 4096), ("records", 5000)]
    assert harder_levels(PLAN, [], 5000) == []
    assert harder_levels(PLAN, ["context"], 1024) == []  # the start is the longest already
    assert easier_levels(PLAN, ["context"]) == [("records", 512), ("records", 256)]
    assert easier_levels(PLAN, ["harder"]) == []
    chain = calibration._harder_tasks("records")
    assert len(chain) > 1, "records names a harder task"
    both = harder_levels(PLAN, ["context", "harder"], 4096)
    assert both == [("records", 2048), ("records", 4096)] + [(task, 4096) for task in chain[1:]]
    assert harder_levels(PLAN, ["harder"], 4096) == [(task, 1024) for task in chain[1:]]


def test_the_pilot_walks_from_the_start_to_the_band_and_the_sweep_takes_that_setting():
    harder = calibrate(PLAN, KnownDifficulty(falling), BAND, ["context"], 4096)
    assert [s.context for s in harder.steps] == [1024, 2048]
    assert harder.stopped == "in the band" and harder.choice.context == 2048 and 40 <= harder.choice.accuracy <= 80
    assert harder.steps[0].accuracy > 80
    easier = calibrate(PLAN, KnownDifficulty(rising), BAND, ["context"], 4096)
    assert [s.context for s in easier.steps] == [1024, 512] and easier.choice.context == 512
    assert easier.steps[0].accuracy < 40 and easier.stopped == "in the band"
    settled = calibrate(PLAN, KnownDifficulty(lambda n: 0.6), BAND, ["context"], 4096)
    assert [s.context for s in settled.steps] == [1024] and settled.stopped == "in the band"


def test_a_step_at_the_edge_of_the_band_walks_on_to_its_middle():
    """16 targets read 75% for a model at 82% as often as not (Gemma 3 at 2048 tokens did)."""
    edge = calibrate(PLAN, KnownDifficulty(lambda n: 0.81 if n < 1500 else 0.75 if n < 3000 else 0.6), BAND,
                     ["context"], 8192)
    assert [s.context for s in edge.steps] == [1024, 2048, 4096] and edge.choice.context == 4096


def test_a_walk_that_crosses_the_band_takes_the_step_nearest_it_that_the_budget_allows():
    down = calibrate(PLAN, KnownDifficulty(lambda n: 0.1 if n > 600 else 0.95), BAND, ["context"], 4096)
    assert [s.context for s in down.steps] == [1024, 512] and down.stopped == "after crossing the band"
    assert down.choice.context == 512  # 95% is nearer 40-80 than 10%
    small = SweepPlan(**{**asdict(PLAN), "per_residue": 16})  # 8 contexts
    up = calibrate(small, KnownDifficulty(lambda n: 0.85 if n < 1500 else 0.02), BAND, ["context"], 4096)
    assert [s.context for s in up.steps] == [1024, 2048] and up.stopped == "after crossing the band"
    # 85% is nearer, but after the step at 2048 the pilot has spent more than 30% of a sweep at 1024
    assert up.pilot_tokens > PILOT_BUDGET * up.steps[0].sweep_tokens and up.choice.context == 2048
    roomy = calibrate(PLAN, KnownDifficulty(lambda n: 0.85 if n < 1500 else 0.02), BAND, ["context"], 4096)
    assert up.pilot_tokens <= PILOT_BUDGET * roomy.steps[0].sweep_tokens and roomy.choice.context == 1024


def test_the_pilot_scores_no_context_the_sweep_scores():
    backend = KnownDifficulty(falling)
    result = calibrate(PLAN, backend, BAND, ["context"], 4096)
    chosen = SweepPlan(**{**asdict(PLAN), "context": result.choice.context, "padding": result.choice.padding})
    sweep = {c.tokens for c in build_contexts(load_task("records"), backend, chosen.context_settings)}
    assert backend.scored_contexts and not sweep & set(backend.scored_contexts)


def test_the_pilot_costs_at_most_its_budget_of_the_sweep_it_chooses():
    for accuracy_at in (falling, rising, lambda n: 1.0, lambda n: 0.0, lambda n: 0.9 if n < 2000 else 0.5):
        backend = KnownDifficulty(accuracy_at)
        result = calibrate(PLAN, backend, BAND, ["context"], 8192)
        chosen = SweepPlan(**{**asdict(PLAN), "context": result.choice.context, "padding": result.choice.padding})
        sweep = tokens_of(build_contexts(load_task("records"), backend, chosen.context_settings))
        assert backend.tokens_evaluated == result.pilot_tokens  # the pilot counts what it evaluated
        assert result.choice.sweep_tokens == sweep
        assert result.pilot_tokens <= PILOT_BUDGET * sweep, (result.pilot_tokens, sweep)


def test_a_model_outside_the_band_everywhere_ends_at_the_budget_or_the_settings_and_says_which():
    strong = calibrate(PLAN, KnownDifficulty(lambda n: 1.0), BAND, ["context"], 8192)
    assert strong.stopped in ("at the budget", "at the settings' end") and len(strong.steps) > 1
    assert strong.choice.context == max(s.context for s in strong.steps)  # the hardest it reached
    weak = calibrate(PLAN, KnownDifficulty(lambda n: 0.0), BAND, ["context"], 8192)
    assert weak.stopped in ("at the budget", "at the settings' end") and len(weak.steps) > 1
    assert weak.choice.context == min(s.context for s in weak.steps)  # the easiest it reached


def test_the_budget_stops_a_walk_whose_next_step_would_cost_more_than_it_allows():
    # 4 contexts (a plan of the task's density: auto keeps 8 at least): a step at 2048 after one at 1024 would
    # cost 3/8 of a sweep at 2048
    small = SweepPlan(**{**asdict(PLAN), "modulus": 4, "per_residue": 8})
    result = calibrate(small, KnownDifficulty(lambda n: 1.0), BAND, ["context"], 8192)
    assert [s.context for s in result.steps] == [1024] and result.stopped == "at the budget"


def test_a_sweep_too_small_for_any_pilot_step_is_refused_in_one_line():
    tiny = SweepPlan(**{**asdict(PLAN), "stride": 2, "modulus": 2, "per_residue": 1})  # 2 contexts: one is half
    with pytest.raises(PlanError, match="could not afford a pilot"):
        calibrate(tiny, KnownDifficulty(falling), BAND, ["context"], 4096)


def test_the_calibration_round_trips_through_config_json_and_a_rerun_reuses_it(tmp_path):
    opened = []

    def open_backend(longest):
        opened.append(longest)
        return closed_after(KnownDifficulty(falling))

    plan, resumed = plan_for_folder(PLAN, tmp_path, BAND, ["context"], 4096, open_backend)
    assert not resumed and opened == [4096] and plan.context == 2048 and plan.calibration["stopped"] == "in the band"
    prepare_run_dir(tmp_path, plan)
    assert load_plan(tmp_path) == plan
    assert Calibration.from_json(load_plan(tmp_path).calibration).choice.context == 2048
    again, resumed = plan_for_folder(PLAN, tmp_path, BAND, ["context"], 4096, open_backend)
    assert resumed and again == plan and opened == [4096]  # no second pilot
    other, resumed = plan_for_folder(PLAN, tmp_path, Band(20, 60), ["context"], 4096, open_backend)
    assert not resumed and opened == [4096, 4096]  # another band is another calibration


def test_a_damaged_calibration_is_named():
    with pytest.raises(PlanError, match="calibration is damaged"):
        Calibration.from_json({"band": [40, 80], "steps": [], "chosen": 0, "stopped": "x"})


def test_the_calibrated_folder_is_named_by_where_calibration_starts(tmp_path):
    default = tmp_path / "m-records-S4-L1024"
    assert calibrated_run_dir(default, PLAN, BAND).name == "m-records-S4-calibrated"
    assert calibrated_run_dir(default, PLAN, Band(30, 70)).name == "m-records-S4-calibrated-30-70"


# --- through the command line, on a tiny random-weight model (it answers nothing) -------------

def _sweep(*args):
    from typer.testing import CliRunner

    from kvphase.cli import app

    return CliRunner().invoke(app, ["sweep", *map(str, args)])


def test_a_calibrated_sweep_records_its_pilot_reports_it_and_resumes_without_a_new_one(tiny_llama, tmp_path):
    out = tmp_path / "run"
    first = _sweep(tiny_llama, "--calibrate", "--threads", 1, "--out", out)
    assert first.exit_code == 0, first.output
    # the model holds 1024 tokens, 64 of them the query's: the start is 960, and 0% walks to easier settings
    assert "calibration pilot: records at 960 tokens: 0.0%" in first.output
    held = load_plan(out)
    steps = held.calibration["steps"]
    assert [s["context"] for s in steps] == [960, 480] and held.context == steps[held.calibration["chosen"]]["context"]
    assert "contexts of 960 tokens, because the model's context is 1024" in held.calibration["requested"]["adjusted"]
    report = (out / "report.md").read_text()
    assert "Difficulty chosen by `--calibrate` for a mean accuracy in 40-80%" in report
    assert "too hard for this model" in report and "even the setting `--calibrate` chose" in report
    again = _sweep(tiny_llama, "--calibrate", "--threads", 1, "--out", out)
    assert again.exit_code == 0 and "calibration pilot" not in again.output, again.output
    assert "as this folder chose it before" in again.output and load_plan(out) == held
    other = _sweep(tiny_llama, "--calibrate", "--target-accuracy", "20-60", "--threads", 1, "--quiet", "--out", out)
    assert other.exit_code != 0 and "holds a different run" in other.output


def test_an_uncalibrated_report_says_so_and_names_calibrate_when_accuracy_is_at_the_floor(tiny_llama, tmp_path):
    result = _sweep(tiny_llama, "--context", 256, "--per-residue", 2, "--threads", 1, "--quiet", "--out", tmp_path / "r")
    assert result.exit_code == 0, result.output
    report = (tmp_path / "r" / "report.md").read_text()
    assert "not calibrated to this model" in report
    assert "too hard for this model" in report and "`kvphase sweep --calibrate` chooses" in report


@pytest.mark.parametrize("args, message", [
    (["--calibrate", "--target-accuracy", "80-40"], "--target-accuracy must be LOW-HIGH"),
    (["--target-accuracy", "40-80"], "--target-accuracy applies to --calibrate only"),
    (["--calibrate", "--dry-run"], "--dry-run cannot foresee"),
    (["--calibrate", "--context", "512", "--task", "records"], "--calibrate has nothing to turn"),
])
def test_calibration_options_it_cannot_take_are_one_line(tiny_llama, tmp_path, args, message):
    result = _sweep(tiny_llama, *args, "--out", tmp_path / "x")
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
