"""Where generation starts (issue 70, items 1-3): each target's answer planned at its own residue,
balanced within every context and crossed with the target's; `answer_pos` in every row; the verdict
that reads both axes and their interaction with Holm's rule and names the one carrying an effect.

The engine fault is a stand-in with the real tokenizer (`AnswerFaultBackend`): it spoils every answer
that starts at one residue mod 4 and scores the rest by the answer's first token alone, so nothing but
where the answer starts moves its accuracy; the statistics are read as a real run's are."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvphase.backends.base import Score
from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.gguf.modelinfo import read_model_info
from kvphase.statistics.stratified import holm
from kvphase.sweep.context_settings import ContextSettings
from kvphase.sweep.contexts import build_contexts, plan_fingerprint
from kvphase.sweep.plan import SweepPlan, make_plan
from kvphase.sweep.records import RecordMaker
from kvphase.sweep.report import build_report
from kvphase.sweep.run import execute_sweep, load_results
from kvphase.sweep.tasks import load_task
from tests.helpers.cli_checks import one_line_error
from tests.helpers.paths import EXAMPLE

M = 8


class AnswerFaultBackend:
    """The real tokenizer; a target is right when its answer's first token id is in a fixed 60% of ids
    (a property of the answer alone), and wrong wherever its answer starts at `faulty` mod 4."""

    def __init__(self, tokenizer, faulty: int | None):
        self._tokenizer, self.faulty = tokenizer, faulty
        self.starts: list[int] = []  # where each scored answer started, as the engine saw it
        self.tokens_evaluated, self.n_threads = 0, None

    prefix_ids = property(lambda self: self._tokenizer.prefix_ids)

    def tokenize(self, text):
        return self._tokenizer.tokenize(text)

    def detokenize(self, ids):
        return self._tokenizer.detokenize(ids)

    def score(self, context, queries):
        scores = []
        for query in queries:
            start = len(context) + len(query.prompt)
            self.starts.append(start)
            right = (query.answer[0] * 2654435761) % 100 < 60 and start % 4 != self.faulty
            scores.append(Score(right, 0.0 if right else -3.0, tuple(query.answer) if right else (0,)))
        return scores

    def engine_info(self):
        return {"engine": "answer-fault stand-in"}

    def close(self):
        pass


def _contexts(backend, answer_phases: bool, per_residue: int = 32):
    settings = ContextSettings(1024, 4, M, per_residue, "prefix", 0, "task", answer_phases=answer_phases)
    return build_contexts(load_task("records"), backend, settings)


@pytest.fixture(scope="module")
def planned(llama_backend):
    return _contexts(llama_backend, False), _contexts(llama_backend, True)


def test_answers_start_at_every_residue_in_every_context_crossed_with_the_targets(llama_backend, planned):
    fixed, varied = planned
    maker = RecordMaker(load_task("records"), llama_backend)
    space, newline = llama_backend.tokenize(" "), llama_backend.tokenize("\n")
    assert len(space) == len(newline) == 1
    assert [c.tokens for c in fixed] == [c.tokens for c in varied]  # the contexts, every target, unchanged
    pairs = Counter()
    for context in varied:
        starts = Counter()
        for target in context.targets:
            question = maker.make(target.key, target.answer).query.prompt
            assert 0 <= target.filler < M and context.tokens[-1:] == tuple(newline)
            # a space, or spaces and a newline, then the question: it follows a newline as without a pad
            pad = space * target.filler if target.filler < 2 else space * (target.filler - 1) + newline
            assert target.query.prompt == tuple(pad) + tuple(question) and target.query.pad == target.filler
            answer_residue = (len(context.tokens) + len(target.query.prompt)) % M
            starts[answer_residue] += 1
            pairs[target.residue, answer_residue] += 1
        assert starts == {a: len(context.targets) // M for a in range(M)}, (context.index, starts)
    lengths = {len(maker.make(t.key, t.answer).query.prompt) for c in varied for t in c.targets}
    assert len(lengths) > 1, lengths  # the questions differ in length: the filler, not luck, balances them
    assert set(pairs.values()) == {2 * 32 // (M * M) * M // 2} and len(pairs) == M * M, pairs  # a Latin square


def test_the_fingerprint_of_a_plan_without_answer_phases_is_unchanged(planned):
    fixed, varied = planned
    assert all(t.filler == 0 for c in fixed for t in c.targets)
    assert plan_fingerprint(fixed) != plan_fingerprint(varied)  # its queries are others: so is its sum


def test_queries_that_share_a_pad_decode_it_once_and_score_as_if_each_decoded_its_own(llama_backend, planned):
    """llama.cpp decodes a pad once for the queries of a context that start with it (`Query.pad`): that
    spends exactly the repeated pads' tokens less (a hand count), and scores every query as when each
    query decodes its whole prompt."""
    context = planned[1][0]
    queries = [t.query for t in context.targets]
    llama_backend.score(context.tokens, queries[:1])  # the context decoded before anything is counted

    def spent(batch):
        before = llama_backend.tokens_evaluated
        return llama_backend.score(context.tokens, batch), llama_backend.tokens_evaluated - before

    shared, spent_shared = spent(queries)
    alone, spent_alone = spent([q._replace(pad=0) for q in queries])
    pads = {q.prompt[:q.pad] for q in queries}
    assert len(pads) == M and spent_alone - spent_shared == sum(q.pad for q in queries) - sum(map(len, pads))
    assert [s.correct for s in shared] == [s.correct for s in alone]
    assert [s.logprob for s in shared] == pytest.approx([s.logprob for s in alone], rel=1e-4, abs=1e-3)


@pytest.fixture(scope="module")
def info(default_model):
    return read_model_info(default_model)


def _plan(info, **changes):
    fields = dict(model=str(info.path), task="records", stride=4, modulus=M, context=1024, per_residue=96,
                  padding="prefix", seed=0, control=True, backend="fake", targets_per_context="auto",
                  answer_phases=True)
    return SweepPlan(**{**fields, **changes})


@pytest.fixture(scope="module")
def faulty_run(info, llama_backend, tmp_path_factory):
    """The default design (24 contexts of 32 targets) through a 60-point fault at answers starting at 3 mod 4."""
    folder = tmp_path_factory.mktemp("fault") / "run"
    backend = AnswerFaultBackend(llama_backend, faulty=3)
    results = execute_sweep(_plan(info), backend, folder, info)
    return folder, results, backend, build_report(folder)


def test_answer_pos_is_where_the_engine_saw_the_answer_start(faulty_run):
    folder, results, backend, _ = faulty_run
    assert list(results["answer_pos"]) == backend.starts  # row by row, in the order they were scored
    rows = load_results(folder)
    assert not rows.loc[rows["answer_pos"] % 4 == 3, "correct"].any()  # every spoiled answer is recorded at 3 mod 4
    assert rows.loc[rows["answer_pos"] % 4 != 3, "correct"].mean() > 0.4


def test_the_verdict_names_where_generation_starts(faulty_run):
    folder, results, _, summary = faulty_run
    assert summary.verdict == "effect"
    headline = summary.headline()
    assert headline.startswith("Accuracy depends on where generation starts: answers starting at residue ")
    assert int(headline.split("residue ")[1].split()[0]) % 4 == 3, headline
    assert summary.answer_axis.test.p_value < 1e-6
    assert "target's token phase" not in headline  # the targets' residues carry no fault
    assert "Holm" in headline and "their interaction p" in headline
    report = (folder / "report.md").read_text()
    assert report.splitlines()[2].strip("*") == headline
    assert "## Per answer residue (where generation starts)" in report
    assert (folder / "accuracy_by_answer_residue.png").stat().st_size > 1000


def test_the_same_run_without_the_fault_names_no_axis(info, llama_backend, tmp_path):
    backend = AnswerFaultBackend(llama_backend, faulty=None)
    execute_sweep(_plan(info), backend, tmp_path, info)
    summary = build_report(tmp_path)
    assert summary.verdict != "effect", summary.headline()
    assert "where generation starts" in summary.headline()  # it says what it could have seen at that axis
    assert summary.answer_axis.detectable_dip is not None


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.04: x3, x2, x1 = 0.03, 0.04, 0.04 (monotone)
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_a_plan_whose_contexts_cannot_balance_names_the_option(info, tmp_path):
    with pytest.raises(PlanError, match="--no-answer-phases"):
        make_plan(info, stride=4, modulus=M, context=256, per_residue=8, padding="prefix", task="records", seed=0,
                  answer_phases=True)
    result = CliRunner().invoke(app, ["sweep", "--context", "256", "--per-residue", "8", "--answer-phases",
                                      "--out", str(tmp_path / "x")])
    one_line_error(result, "targets per context a multiple of the modulus", "--no-answer-phases")


def test_opting_out_on_a_folder_planned_with_answer_phases_is_one_line(faulty_run, info):
    folder = faulty_run[0]
    result = CliRunner().invoke(app, ["sweep", "--backend", "llama.cpp", "--no-answer-phases", "--context", "1024",
                                      "--out", str(folder)])
    one_line_error(result, "holds a different run", "answer_phases")


def test_a_folder_from_before_answer_phases_reads_as_not_planned(tmp_path):
    import shutil

    folder = tmp_path / "old"
    shutil.copytree(EXAMPLE, folder)
    result = CliRunner().invoke(app, ["report", str(folder)])
    assert result.exit_code == 0
    assert "answer phase was not planned" in result.output
    assert "answer_phases" not in (folder / "config.json").read_text()
    assert (folder / "report.md").read_text() == (EXAMPLE / "report.md").read_text()


def test_answer_phases_are_planned_when_asked_wherever_the_contexts_balance(info, tiny_deepseek4):
    asked = dict(stride=None, modulus=None, per_residue=None, padding="prefix", task="records", seed=0,
                 targets_per_context="auto", answer_phases=True)
    assert make_plan(info, context=1024, **asked).answer_phases  # a control run included
    assert not make_plan(info, context=1024, **{**asked, "answer_phases": None}).answer_phases  # not yet the default
    assert make_plan(read_model_info(tiny_deepseek4), context=512, **asked).answer_phases
    with pytest.raises(PlanError, match="--no-answer-phases"):
        make_plan(info, context=256, **{**asked, "per_residue": 8, "targets_per_context": "task"})


def _default_design():
    """The default plan's shape (24 contexts of 32 at M = 8: `plan_contexts`), each answer where the planner puts it."""
    from kvphase.sweep.positions import answer_residue, plan_contexts

    slots = plan_contexts(40, 40 + 8 * 99, M, 3 * 32, 32)  # three rounds of 8 contexts
    residues = np.concatenate([s % M for s in slots])
    contexts = np.repeat(np.arange(len(slots)), [len(s) for s in slots])
    answers = np.array([answer_residue(int(r), c, lane, M) for c, s in enumerate(slots)
                        for lane, r in enumerate(s % M)])
    return residues, answers, contexts


def test_answer_test_level_and_power_on_the_default_design_by_simulation():
    """A short run of bench/bench_answer_power.py's check (its 400-run table is in the report): with a
    context effect of 1 logit SD and a depth trend, the answer-residue test rejects about 5% of runs
    without a fault, and finds a 20-point fault at answers starting at 3 mod 4 in most."""
    from scipy import special

    from kvphase.statistics.stratified import Stratification, stratified_p_values

    residues, answers, contexts = _default_design()
    lanes = np.concatenate([np.arange(32)] * 24)
    rng = np.random.default_rng(70)
    by_answer = Stratification.of(answers, contexts)
    runs = 80
    chance = special.expit(rng.standard_normal((runs, 24))[:, contexts] + (0.5 - lanes / 31))  # (runs, N)
    null = (rng.random(chance.shape) < chance).astype(float)
    faulty = (rng.random(chance.shape) < np.where(answers % 4 == 3, chance * 0.6, chance)).astype(float)
    null_p, _ = stratified_p_values(null, by_answer, binary=True)
    fault_p, _ = stratified_p_values(faulty, by_answer, binary=True)
    # 80 runs at a true 5%: 12 or more rejections has probability 0.2%; the fault's power is about 95%
    assert (null_p < 0.05).sum() <= 11, np.sort(null_p)[:12]
    assert (fault_p < 0.05).mean() >= 0.8, np.sort(fault_p)[-20:]
