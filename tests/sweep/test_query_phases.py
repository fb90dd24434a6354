"""The query's phase as a second factor (issue 61, item 3): contexts that end at every residue with
their targets where the fixed-phase plan puts them, the rows and report that record it, and the two
tests that take whole contexts as their units."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.statistics.context_units import QUERY_PERMUTATIONS, ContextUnits, interaction_test, query_phase_test
from kvphase.sweep.contexts import build_contexts
from kvphase.sweep.context_settings import ContextSettings
from kvphase.sweep.query_phases import summarize_query_phases
from kvphase.sweep.report import build_report
from kvphase.sweep.tasks import load_task
from tests.helpers.fakes import WordBackend
from tests.helpers.paths import EXAMPLE
from tests.helpers.same_values import assert_same_values

M = 8


def _contexts(query_phases: bool, per_residue: int = 64, context: int = 1024):
    settings = ContextSettings(context, 4, M, per_residue, "in-sequence", 0, "auto", query_phases)
    return build_contexts(load_task("records"), WordBackend(), settings)


def test_queries_end_at_every_residue_with_the_fixed_plans_targets():
    fixed, varied = _contexts(False), _contexts(True)
    assert len(fixed) == len(varied) == 2 * M  # two rounds of M contexts of 32 targets
    query_residues = []
    for a, b in zip(fixed, varied):
        assert [(t.position, t.key, t.answer) for t in a.targets] == [(t.position, t.key, t.answer) for t in b.targets]
        extra = len(b.tokens) - len(a.tokens)
        assert 0 <= extra < M
        split = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), len(a.tokens))
        assert b.tokens[split + extra:] == a.tokens[split:]  # the footer and the demonstrations come after
        assert split >= max(t.position for t in a.targets) + 2  # the extra filler goes after every target
        query_residues.append(len(b.tokens) % M)
    assert Counter(query_residues) == {r: 2 for r in range(M)}, query_residues  # every residue, twice
    for round_start in range(0, len(varied), M):  # each round gives every query residue one context
        assert sorted(query_residues[round_start:round_start + M]) == list(range(M))
    for q in range(M):  # within a query residue every target residue has as many targets
        held = Counter(t.residue for c, r in zip(varied, query_residues) if r == q for t in c.targets)
        assert set(held.values()) == {2 * 32 // M}, (q, held)


def test_contexts_that_do_not_hold_every_residue_refuse_query_phases():
    with pytest.raises(PlanError, match="every residue equally"):
        _contexts(True, per_residue=4, context=256)


def _simulated(rounds: int, seed: int, query_dip: float = 0.0, cell_dip: float = 0.0, lanes: int = 32,
               depth: float = 1.5) -> pd.DataFrame:
    """Rows of a query-phase plan's design (positions.plan_contexts, query_phase): context c of a round
    holds residue (l + c) mod M in lane l; a context effect of 1 logit SD and a depth trend; a dip
    trend of `depth` logits from the first lane to the last; a dip of `query_dip` logits at query residue 5
    and of `cell_dip` at (query residue 5, target residue 3)."""
    from kvphase.sweep.positions import query_phase

    rng = np.random.default_rng(seed)
    rows = []
    for index in range(rounds * M):
        q, difficulty = query_phase(index, M), rng.normal()
        for lane in range(lanes):
            r = (lane + index) % M
            logit = 0.5 + difficulty - depth * lane / lanes - query_dip * (q == 5) - cell_dip * (q == 5 and r == 3)
            rows.append({"context": index, "residue": r, "query_pos": 1024 + q, "target_pos": 40 + 30 * lane + r,
                         "correct": rng.random() < 1 / (1 + np.exp(-logit)), "logprob": 0.0})
    return pd.DataFrame(rows)


def test_the_query_phase_test_takes_contexts_as_its_units():
    frame = _simulated(rounds=8, seed=1, query_dip=3.0)
    summary = summarize_query_phases(frame, M)
    accuracy = {row["query_residue"]: row["accuracy"] for row in summary.per_query}
    by_hand = frame.assign(q=frame["query_pos"] % M).groupby("q")["correct"].mean() * 100
    assert accuracy == pytest.approx(by_hand.to_dict())
    assert summary.query_test.p_value < 0.01, summary.query_test
    # a context effect of 1 logit SD alone moves whole contexts: a test that took targets as its units
    # would read it as a query-phase effect, one that takes contexts must not
    null = [query_phase_test(ContextUnits.of(_simulated(4, seed).assign(
        query_residue=lambda f: f["query_pos"] % M), M), seed).p_value for seed in range(20)]
    assert sum(p < 0.05 for p in null) <= 3, null


def test_the_interaction_test_finds_a_cell_and_not_a_depth_trend():
    planted = summarize_query_phases(_simulated(rounds=8, seed=2, cell_dip=4.0, lanes=64), M)
    assert planted.interaction_test.p_value < 0.01, planted.interaction_test
    # one target of each residue a context: residue r sits in lane r - c at place c of the round, so a
    # depth trend is a residue x place pattern; with no interaction the test must stay at its level
    depth_only = [summarize_query_phases(_simulated(rounds=4, seed=s, lanes=M, depth=3.0), M).interaction_test.p_value
                  for s in range(20)]
    assert sum(p < 0.05 for p in depth_only) <= 3, depth_only


def test_a_p_no_permutation_reaches_is_the_smallest_the_permutations_can_give_and_never_zero():
    summary = summarize_query_phases(_simulated(rounds=8, seed=1, query_dip=30.0), M)
    assert summary.query_test.p_value == pytest.approx(1 / (4_000 + 1)), summary.query_test
    assert summary.query_test.permutations == QUERY_PERMUTATIONS == 4_000


def test_one_round_gives_no_p_where_no_permutation_moves_the_statistic():
    summary = summarize_query_phases(_simulated(rounds=1, seed=0, query_dip=3.0), M)
    for test in (summary.query_test, summary.interaction_test):
        assert test.p_value is None and "one round" in test.note, test


def test_a_fixed_phase_folder_reports_as_before(tmp_path):
    """Re-reported from its own results.csv, the committed example says what it said: every word and
    count exactly, its floats as far as numpy's reductions reproduce on another CPU (same_values)."""
    folder = tmp_path / EXAMPLE.name
    shutil.copytree(EXAMPLE, folder)
    build_report(folder)
    assert_same_values(folder, EXAMPLE, ("report.md", "summary.json"))
    assert "query" not in json.loads((folder / "config.json").read_text())


def _sweep(model: Path, out: Path, *extra: str, per_residue: int = 16):
    return CliRunner().invoke(app, ["sweep", str(model), "--context", "512", "--per-residue", str(per_residue),
                                    "--quiet", "--out", str(out), *extra])


def test_a_compressed_model_sweeps_every_query_phase_by_default(tiny_deepseek4, tiny_llama, tmp_path):
    out = tmp_path / "ds4"
    result = _sweep(tiny_deepseek4, out)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["query_phases"] is True
    rows = pd.read_csv(out / "results.csv")
    query_residues = rows.groupby("context")["query_pos"].first() % M
    counts = Counter(query_residues)
    assert set(counts) == set(range(M)) and len(set(counts.values())) == 1, counts
    assert "## Per query residue" in (out / "report.md").read_text()
    summary = json.loads((out / "summary.json").read_text())["query_phases"]
    assert [row["n"] for row in summary["per_query_residue"]] == [16] * M
    refused = _sweep(tiny_deepseek4, out, "--no-query-phases")
    assert refused.exit_code != 0 and "query_phases" in refused.output and "Traceback" not in refused.output
    fixed = tmp_path / "fixed"  # a folder written with one query phase, as before the option, resumes as one
    assert _sweep(tiny_deepseek4, fixed, "--no-query-phases").exit_code == 0
    config = (fixed / "config.json").read_bytes()
    assert b"query_phases" not in config
    resumed = _sweep(tiny_deepseek4, fixed)
    assert resumed.exit_code == 0, resumed.output
    assert (fixed / "config.json").read_bytes() == config
    control = tmp_path / "llama"
    assert _sweep(tiny_llama, control).exit_code == 0
    assert "query_phases" not in json.loads((control / "config.json").read_text())
    assert set(pd.read_csv(control / "results.csv")["query_pos"]) == {512}


def test_query_phases_asked_of_a_plan_without_room_is_one_line(tiny_llama, tmp_path):
    result = _sweep(tiny_llama, tmp_path / "x", "--query-phases", per_residue=2)
    assert result.exit_code != 0 and "every residue equally" in result.output and "Traceback" not in result.output
