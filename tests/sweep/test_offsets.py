"""Fixes at inference time (issue 20, item 3): `kvphase sweep --offsets K --combine mean|max`,
`--shift D` and `--random-offset` score targets with every token's phase moved (`sweep.offsets`).

An ensemble scores exactly what K separate shifted sweeps score, and combines them as the rules
say; over a model with no weak spot it changes nothing beyond noise; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.helpers.cli_checks import one_line_error
from tests.helpers.fakes import CharBackend
from kvphase.backends.base import Query, score_from_logits
from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.sweep.analysis import gap_difference, summarize
from kvphase.sweep.offsets import (OffsetPlan, ShiftedScorer, combine_scores, offset_plan_from_options,
                                   prefix_pad)
from kvphase.sweep.run import load_offsets, load_results
from tests.helpers.paths import TRAINED

runner = CliRunner()
CSA = TRAINED / "csa-disjoint.gguf"  # deepseek4 layout through llama.cpp: a 48-point weak spot at residue 3
GLM_DENSE = TRAINED / "glm-dense.gguf"  # glm5-next layout, dense: no weak spot
GATED = TRAINED / "gated.gguf"  # gpt2 layout with a gated compressor: the numpy reference, window shifts


def sweep(model: Path, out: Path, *args: str) -> Path:
    result = runner.invoke(app, ["sweep", str(model), "--threads", "1", "--quiet", "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return out


# -- the combine rules, by hand ---------------------------------------------------------------

def _rows(*probabilities) -> np.ndarray:
    """Log-probability rows from probability rows: (n_answer, n_vocab)."""
    return np.log(np.asarray(probabilities, dtype=float))


def test_mean_averages_the_log_probability_rows_and_scores_their_argmax():
    # shift 0 says token 1 (0.5 against 0.4), shift 1 says token 0 (0.9): the average says 0
    rows = [_rows([0.4, 0.5, 0.1]), _rows([0.9, 0.05, 0.05])]
    score = combine_scores("mean", rows, answer=[0])
    averaged = (np.log([0.4, 0.5, 0.1]) + np.log([0.9, 0.05, 0.05])) / 2
    assert score.correct and score.predicted == (0,)
    assert score.logprob == pytest.approx(averaged[0], abs=1e-12)
    assert not combine_scores("mean", rows, answer=[1]).correct


def test_mean_needs_every_answer_token_right_and_sums_over_them():
    rows = [_rows([0.6, 0.4], [0.3, 0.7]), _rows([0.8, 0.2], [0.45, 0.55])]
    score = combine_scores("mean", rows, answer=[0, 1])
    assert score.correct and score.predicted == (0, 1)
    expected = (np.log(0.6) + np.log(0.8)) / 2 + (np.log(0.7) + np.log(0.55)) / 2
    assert score.logprob == pytest.approx(expected, abs=1e-12)
    assert not combine_scores("mean", rows, answer=[0, 0]).correct


def test_max_takes_the_shift_whose_top_probabilities_sum_highest():
    unsure_right = _rows([0.5, 0.45, 0.05])  # top probability 0.5
    sure_wrong = _rows([0.1, 0.85, 0.05])  # 0.85: this shift decides
    score = combine_scores("max", [unsure_right, sure_wrong], answer=[0])
    assert not score.correct and score.predicted == (1,)
    assert score.logprob == pytest.approx(np.log(0.1), abs=1e-12)
    tie = combine_scores("max", [unsure_right, unsure_right[:, [1, 0, 2]]], answer=[0])
    assert tie.correct  # a tie goes to the first shift


def test_an_unknown_rule_is_a_plan_error():
    with pytest.raises(PlanError, match="--combine must be one of mean, max"):
        combine_scores("median", [_rows([0.5, 0.5])], answer=[0])


# -- the shifts, on a fake backend ---------------------------------------------------------------

class RowBackend(CharBackend):
    """Answer rows that depend on the context's length: a prefix shift of d tokens gives rows
    made from d, so a test knows which shift each row came from."""

    def __init__(self):
        super().__init__(prefix_ids=[1])
        self.contexts: list[tuple[int, ...]] = []

    def answer_logprobs(self, context, queries):
        self.contexts.append(tuple(context))
        d = len(context) - 10
        return [np.log(np.full((len(q.answer), 4), 0.1) + np.eye(4)[[(d + a) % 4 for a in q.answer]] * 0.6)
                for q in queries]


def test_a_prefix_shift_puts_filler_after_bos_and_keeps_the_rest():
    backend = RowBackend()
    plan = OffsetPlan(shifts=(0, 2), combine="mean")
    context = (1, *range(20, 29))  # BOS, then nine tokens: ten in all
    scorer = ShiftedScorer(backend, plan, filler=[7, 8, 9], seed=0, stride=4)
    combined, each = scorer.score(0, context, [Query((5,), (0,))])
    assert backend.contexts == [context, (1, 7, 8, *range(20, 29))]
    assert [s.shift for s in each[0]] == [0, 2]
    assert each[0][0].score.predicted == (0,) and each[0][1].score.predicted == (2,)
    assert combined[0].predicted in {(0,), (2,)}  # equal rows tie: the lowest index
    assert prefix_pad([7, 8], 5) == (7, 8, 7, 8, 7)


def test_a_single_shift_scores_through_score_without_rows():
    backend = CharBackend(prefix_ids=[1])
    scorer = ShiftedScorer(backend, OffsetPlan(shifts=(3,)), filler=[7], seed=0, stride=4)
    combined, each = scorer.score(0, (1, 50, 51), [Query((52,), (54,))])
    assert backend.tokens_evaluated == 6  # BOS, three filler tokens, two context tokens
    assert combined[0].correct and each[0][0].shift == 3


def test_an_ensemble_needs_a_backend_that_returns_rows():
    with pytest.raises(PlanError, match="--offsets needs a backend that returns answer"):
        ShiftedScorer(CharBackend(), OffsetPlan(shifts=(0, 2), combine="mean"), filler=[7], seed=0, stride=4)


def test_random_offsets_are_drawn_per_context_from_the_seed():
    plan = OffsetPlan(random=True)
    drawn = [plan.shifts_for(i, seed=0, stride=4) for i in range(64)]
    assert drawn == [plan.shifts_for(i, seed=0, stride=4) for i in range(64)]
    assert {d for (d,) in drawn} == {0, 1, 2, 3}
    assert drawn != [plan.shifts_for(i, seed=1, stride=4) for i in range(64)]


def test_k_offsets_are_spread_over_the_stride_and_name_the_folder():
    plan = offset_plan_from_options(2, None, None, False, stride=4, shift_by="prefix")
    assert plan.shifts == (0, 2) and plan.combine == "mean" and plan.folder_suffix() == "-offsets2-mean"
    assert offset_plan_from_options(4, "max", None, False, 4, "prefix").shifts == (0, 1, 2, 3)
    assert offset_plan_from_options(None, None, 3, False, 4, "window").folder_suffix() == "-shift3"
    assert offset_plan_from_options(None, None, None, True, 4, "prefix").folder_suffix() == "-random-offset"
    assert offset_plan_from_options(None, None, None, False, 4, "prefix").to_json() == {}


# -- the ensemble against separate shifted sweeps: llama.cpp (prefix shifts) ------------------------

SMALL = ["--per-residue", "8"]


@pytest.fixture(scope="module")
def csa_runs(tmp_path_factory) -> dict:
    """csa-disjoint swept plain, as an ensemble of 4 under each rule, and at each shift alone."""
    work = tmp_path_factory.mktemp("csa-offsets")
    runs = {"plain": sweep(CSA, work / "plain", *SMALL)}
    for rule in ("mean", "max"):
        runs[rule] = sweep(CSA, work / rule, *SMALL, "--offsets", "4", "--combine", rule)
    for d in range(4):
        runs[d] = sweep(CSA, work / f"shift{d}", *SMALL, "--shift", str(d))
    return runs


def test_the_ensemble_scores_each_shift_exactly_as_its_own_shifted_sweep(csa_runs):
    for rule in ("mean", "max"):
        offsets = load_offsets(csa_runs[rule])
        for d in range(4):
            alone = load_results(csa_runs[d]).set_index("target_id")
            mine = offsets[offsets["shift"] == d].set_index("target_id").loc[alone.index]
            assert np.abs(mine["logprob"].to_numpy() - alone["logprob"].to_numpy()).max() <= 1e-6
            assert (mine["correct"].to_numpy() == alone["correct"].to_numpy()).all()
            assert (mine["predicted"].to_numpy() == alone["predicted"].to_numpy()).all()
    plain, zero = load_results(csa_runs["plain"]), load_results(csa_runs[0])
    assert np.abs(plain["logprob"].to_numpy() - zero["logprob"].to_numpy()).max() <= 1e-6  # shift 0 is the plain sweep


def test_max_combines_the_separate_sweeps_by_hand(csa_runs):
    offsets = load_offsets(csa_runs["max"])
    chosen = offsets.sort_values(["target_id", "confidence", "shift"], ascending=[True, False, True])
    chosen = chosen.drop_duplicates("target_id").set_index("target_id")
    combined = load_results(csa_runs["max"]).set_index("target_id").loc[chosen.index]
    assert np.abs(combined["logprob"].to_numpy() - chosen["logprob"].to_numpy()).max() <= 1e-6
    assert (combined["correct"].to_numpy() == chosen["correct"].to_numpy()).all()


def test_mean_combines_the_shifted_contexts_rows_by_hand(csa_runs):
    """Each target's context shifted by hand (the filler after BOS), scored at each shift through
    llama.cpp, and the log-softmax rows averaged by hand."""
    from kvphase.backends.llamacpp import LlamaCppBackend
    from kvphase.sweep.contexts import build_contexts
    from kvphase.sweep.run import load_plan
    from kvphase.sweep.tasks import load_task

    plan = load_plan(csa_runs["mean"])
    backend = LlamaCppBackend(CSA, n_ctx=72, n_threads=1)
    try:
        task = load_task(plan.task)
        contexts = build_contexts(task, backend, plan.context_settings)
        filler = backend.tokenize(task.filler.strip() + " ")
        results = load_results(csa_runs["mean"]).set_index("target_id")
        for context in contexts[:4]:
            queries = [t.query for t in context.targets]
            shifted = [[*context.tokens[:1], *(filler * 4)[:d], *context.tokens[1:]] for d in range(4)]
            rows = [backend.answer_logprobs(tokens, queries) for tokens in shifted]  # [shift][query]
            for i, target in enumerate(context.targets):
                mean = np.mean([_log_softmax(r[i][0]) for r in rows], axis=0)  # (n_vocab,): one answer token
                answer = target.query.answer[0]
                row = results.loc[target.target_id]
                assert bool(row["correct"]) == (int(mean.argmax()) == answer)
                assert row["logprob"] == pytest.approx(mean[answer], abs=1e-5)
    finally:
        backend.close()


def _log_softmax(row: np.ndarray) -> np.ndarray:
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def test_the_offsets_are_in_the_plan_and_the_folder_resumes(csa_runs, tmp_path):
    config = json.loads((csa_runs["mean"] / "config.json").read_text())
    assert config["offsets"] == {"shifts": [0, 1, 2, 3], "combine": "mean", "random": False, "shift_by": "prefix"}
    assert "offsets" not in json.loads((csa_runs["plain"] / "config.json").read_text())
    # cut the last context's rows off both tables, as a kill between contexts would, and resume
    out = tmp_path / "resumed"
    out.mkdir()
    for name in ("config.json", "manifest.json", "results.csv", "offsets.csv"):
        (out / name).write_bytes((csa_runs["mean"] / name).read_bytes())
    results = pd.read_csv(out / "results.csv")
    last = results["context"].max()
    kept = results[results["context"] != last]
    kept.to_csv(out / "results.csv", index=False)
    sweep(CSA, out, *SMALL, "--offsets", "4")
    again, before = load_results(out).set_index("target_id"), load_results(csa_runs["mean"]).set_index("target_id")
    assert np.abs(again.loc[before.index, "logprob"] - before["logprob"]).max() <= 1e-6
    assert len(load_offsets(out)) == 4 * len(before)  # the rescored context's shift rows are not doubled
    assert "## Phase shifts" in (out / "report.md").read_text()
    refused = runner.invoke(app, ["sweep", str(CSA), "--threads", "1", "--quiet", "--out", str(out), *SMALL,
                                  "--offsets", "4", "--combine", "max"])
    one_line_error(refused, "differs in: offsets")


def test_random_offsets_score_each_context_at_its_recorded_shift(csa_runs, tmp_path):
    out = sweep(CSA, tmp_path / "random", *SMALL, "--random-offset")
    offsets = load_offsets(out).set_index("target_id")
    results = load_results(out).set_index("target_id")
    assert results.groupby("context").apply(lambda g: offsets.loc[g.index, "shift"].nunique()).eq(1).all()
    assert offsets["shift"].nunique() > 1
    for d in range(4):
        at_d = offsets.index[offsets["shift"] == d]
        alone = load_results(csa_runs[d]).set_index("target_id").loc[at_d]
        assert np.abs(results.loc[at_d, "logprob"].to_numpy() - alone["logprob"].to_numpy()).max() <= 1e-6
    config = json.loads((out / "config.json").read_text())
    assert config["offsets"]["random"] is True


# -- the numpy reference of a trained gpt2-layout file: window shifts -------------------------------

@pytest.mark.slow
def test_window_shifts_score_each_shift_as_its_own_sweep(tmp_path):
    args = ["--per-residue", "2"]
    ensemble = sweep(GATED, tmp_path / "ensemble", *args, "--offsets", "2")
    offsets = load_offsets(ensemble)
    assert json.loads((ensemble / "config.json").read_text())["offsets"]["shift_by"] == "window"
    for d in (0, 2):
        alone = load_results(sweep(GATED, tmp_path / f"shift{d}", *args, "--shift", str(d))).set_index("target_id")
        mine = offsets[offsets["shift"] == d].set_index("target_id").loc[alone.index]
        assert np.abs(mine["logprob"].to_numpy() - alone["logprob"].to_numpy()).max() <= 1e-6
    shifted, plain = load_results(tmp_path / "shift2"), load_results(sweep(GATED, tmp_path / "plain", *args))
    assert np.abs(shifted["logprob"].to_numpy() - plain["logprob"].to_numpy()).max() > 1e-3  # the windows moved


# -- a model with no weak spot -----------------------------------------------------------------------

@pytest.mark.slow
def test_an_ensemble_over_a_model_without_a_weak_spot_changes_nothing_beyond_noise(tmp_path):
    args = ["--per-residue", "64"]
    plain = load_results(sweep(GLM_DENSE, tmp_path / "plain", *args))
    ensemble = load_results(sweep(GLM_DENSE, tmp_path / "ensemble", *args, "--offsets", "4"))
    difference = gap_difference(plain, ensemble, seed=0)
    assert not difference.differs, difference
    before, after = summarize(plain, 4, 4), summarize(ensemble, 4, 4)
    assert after.mean_ci[0] <= before.mean_accuracy <= after.mean_ci[1]
    assert after.test.p_value > 0.05


# -- bad input, in one line --------------------------------------------------------------------------

@pytest.mark.parametrize("args, fragments", [
    (["--offsets", "0"], ["--offsets must be from 2 to the stride 4", "got 0"]),
    (["--offsets", "5"], ["--offsets must be from 2 to the stride 4", "got 5"]),
    (["--combine", "max"], ["--combine applies to --offsets K only"]),
    (["--offsets", "2", "--combine", "median"], ["--combine must be one of mean, max", "'median'"]),
    (["--offsets", "2", "--combine", ""], ["--combine must be one of mean, max", "''"]),
    (["--offsets", "2", "--random-offset"], ["choose one of --offsets, --shift and --random-offset"]),
    (["--shift", "1", "--offsets", "2"], ["choose one of --offsets, --shift and --random-offset"]),
    (["--shift", "4"], ["--shift must be from 0 to 3", "got 4"]),
    (["--shift", "-1"], ["--shift must be from 0 to 3", "got -1"]),
    (["--offsets", "2", "--dry-run"], ["--dry-run times plain scoring"]),
    (["--offsets", "2", "--calibrate"], ["--calibrate chooses a difficulty by plain scoring"]),
])
def test_bad_offset_options_are_one_line(args, fragments, tmp_path):
    result = runner.invoke(app, ["sweep", str(CSA), "--out", str(tmp_path / "run"), "--quiet", *args])
    one_line_error(result, *fragments)
    assert not (tmp_path / "run").exists()


def test_offsets_larger_than_the_context_allows_are_one_line(tiny_deepseek4, tmp_path):
    from kvphase.gguf.modelinfo import read_model_info

    longest = read_model_info(tiny_deepseek4).context_length - 64  # the whole context but the query's room
    result = runner.invoke(app, ["sweep", str(tiny_deepseek4), "--context", str(longest), "--offsets", "4",
                                 "--out", str(tmp_path / "run"), "--quiet"])
    one_line_error(result, "shifts up to 3 tokens do not fit", "fewer --offsets")


def test_a_damaged_offsets_entry_in_config_json_is_one_line(csa_runs, tmp_path):
    out = tmp_path / "damaged"
    out.mkdir()
    config = json.loads((csa_runs["mean"] / "config.json").read_text())
    config["offsets"]["shift_by"] = "sideways"
    (out / "config.json").write_text(json.dumps(config))
    result = runner.invoke(app, ["report", str(out)])
    one_line_error(result, "shift_by must be one of prefix, window", "'sideways'")


def test_plain_scoring_is_unchanged_by_the_rows_refactor():
    logits = np.array([[1.0, 3.0, 2.0], [0.5, -1.0, 4.0]], dtype=np.float32)
    score = score_from_logits(logits, [1, 2])
    by_hand = sum(np.log(np.exp(row[a]) / np.exp(row).sum()) for row, a in zip(logits.astype(float), [1, 2]))
    assert score.correct and score.logprob == pytest.approx(by_hand, abs=1e-12)


def test_a_window_shift_moves_every_start_back_by_the_shift():
    from kvphase.reference.policy import make_policy

    policy = make_policy("meanpool", window=4, stride=4, start=1)
    assert [policy.shifted(d).design_for(0, 0, 2).start for d in range(4)] == [1, 0, 3, 2]  # (1 - d) mod 4
    assert policy.design_for(0, 0, 2).start == 1 and policy.phase_shift == 0  # the original is untouched


def test_an_ensemble_through_servers_is_one_line(tmp_path):
    result = runner.invoke(app, ["sweep", str(CSA), "--offsets", "2", "--backend", "server", "--url",
                                 "http://127.0.0.1:1", "--out", str(tmp_path / "run"), "--quiet"])
    one_line_error(result, "--offsets needs each answer's log-probability rows")


def test_the_default_folder_names_the_fix(csa_runs):
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.sweep.run import default_run_dir, load_plan

    info = read_model_info(CSA)
    assert default_run_dir(info, load_plan(csa_runs["max"])).name.endswith("-L64-offsets4-max")
    assert default_run_dir(info, load_plan(csa_runs[2])).name.endswith("-L64-shift2")
    assert default_run_dir(info, load_plan(csa_runs["plain"])).name.endswith("-L64")
