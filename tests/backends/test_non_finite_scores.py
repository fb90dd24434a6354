"""A score that is not a finite number (issue 77): refused in one line naming the engine and the
target before anything uses or writes it, so that the folder resumes; conform FAILs such an engine.

Through a server: `hostile_servers.HostileServer("nan-scores")` answers null log-probabilities (how
llama-server writes a NaN) from its `finite`-th completion on. In process: a fake backend."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvphase.backends.base import NonFiniteScore, Score
from kvphase.cli import app
from kvphase.conform.compare import compare_rows
from kvphase.conform.references import DEFAULT_REFERENCES
from kvphase.gguf.modelinfo import read_model_info
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.run import execute_sweep, load_results
from tests.helpers.cli_checks import one_line_error
from tests.helpers.fakes import CharBackend
from tests.helpers.hostile_servers import HostileServer

pytestmark = pytest.mark.time_limit(60)
runner = CliRunner()
MODEL = {reference.name: reference for reference in DEFAULT_REFERENCES}["csa-disjoint"].model
CHECKS = 2  # completions the server's checks take (a context alone, then one forced query)
SWEEP = ["--context", "64", "--per-residue", "2", "--request-timeout", "5", "-q"]  # its 4 residues: 8 targets
PLANNED = 8


def sweep(url: str, out) -> list[str]:
    return ["sweep", str(MODEL), "--backend", "server", "--url", url, *SWEEP, "--out", str(out)]


def test_a_server_answering_nan_at_its_check_is_refused_before_any_folder_is_made(tmp_path):
    with HostileServer("nan-scores", model=MODEL, finite=0) as server:
        result = runner.invoke(app, sweep(server.url, tmp_path / "run"))
    one_line_error(result, server.url, "with a log-probability of nan, not a finite number")
    assert not (tmp_path / "run").exists()


def test_a_server_answering_nan_mid_sweep_writes_no_row_of_it_and_the_folder_resumes(tmp_path):
    out = tmp_path / "run"
    with HostileServer("nan-scores", model=MODEL, finite=CHECKS + 6) as server:
        result = runner.invoke(app, sweep(server.url, out))
        one_line_error(result, server.url, "scored target ", "with a log-probability of nan")
        kept = pd.read_csv(out / "results.csv")
        assert 0 < len(kept) < PLANNED, kept  # the contexts before the NaN, none of the one it came in
        assert kept["logprob"].map(math.isfinite).all(), kept
        assert (kept["logprob"] < 0).all()
        server.finite = 10**9  # the server mended: the same command resumes the folder
        again = runner.invoke(app, sweep(server.url, out))
    assert again.exit_code == 0, again.output
    rows = pd.read_csv(out / "results.csv")
    assert len(rows) == rows["target_id"].nunique() == PLANNED
    assert set(kept["target_id"]) <= set(rows["target_id"])


class NaNAfter(CharBackend):
    """CharBackend whose `bad`-th score() call answers `value` as its last query's log-probability."""

    def __init__(self, bad: int, value: float):
        super().__init__()
        self.bad, self.value = bad, value

    def score(self, context, queries):
        scores = super().score(context, queries)
        if self.calls == self.bad:
            scores[-1] = Score(scores[-1].correct, self.value, scores[-1].predicted)
        return scores


@pytest.mark.parametrize("value", [math.nan, -math.inf])
def test_an_in_process_engine_scoring_nan_is_refused_naming_the_target_and_resumes(tmp_path, default_model, value):
    info = read_model_info(default_model)
    plan = SweepPlan(model=str(info.path), task="records", stride=4, modulus=8, context=1500, per_residue=8,
                     padding="prefix", seed=1, control=True, backend="fake")
    with pytest.raises(NonFiniteScore, match=rf"NaNAfter scored target \d+ \(context 2, position \d+, key "
                                             rf"'\w+'\) with a log-probability of {value}"):
        execute_sweep(plan, NaNAfter(3, value), tmp_path, info)
    kept = load_results(tmp_path)
    assert set(kept["context"]) == {0, 1}  # the two contexts before it, none of the third
    assert len(execute_sweep(plan, CharBackend(), tmp_path, info)) == 64


def test_conform_fails_a_server_whose_scores_are_nan(tmp_path):
    with HostileServer("nan-scores", model=MODEL, finite=CHECKS) as server:
        result = runner.invoke(app, ["conform", "--backend", "server", "--url", server.url, "--model", "csa-disjoint",
                                     "--request-timeout", "5", "--out", str(tmp_path / "conform")])
    assert result.exit_code == 1, result.output
    assert "csa-disjoint: FAIL" in result.output and "0 PASS, 1 FAIL" in result.output, result.output
    assert "with a log-probability of nan" in result.output and server.url in result.output
    assert "FAIL" in (tmp_path / "conform" / "report.md").read_text()


@pytest.mark.parametrize("check", ["profile", "logprobs"])
def test_a_nan_difference_fails_either_check_where_it_exceeds_no_tolerance(check):
    committed = pd.DataFrame({"target_id": range(8), "context": [i // 2 for i in range(8)], "residue": [0, 1] * 4,
                              "correct": [True] * 8, "logprob": [-1.0] * 8})
    engine = committed.assign(logprob=[-1.0] * 7 + [math.nan])
    verdict = compare_rows("m", check, committed, engine, {})
    assert verdict.verdict == "FAIL", verdict
    assert "not a finite number" in verdict.reason
    assert compare_rows("m", check, committed, committed.copy(), {}).verdict == "PASS"


def test_an_engine_path_whose_difference_is_nan_fails():
    import numpy as np

    from kvphase.conform.paths import _summarise

    moved = {64: np.array([0.0, 0.001]), 65: np.array([math.nan, 0.0])}
    check = _summarise("prefix-cache hit", moved, 4, 0.01)
    assert check.status == "FAIL" and check.failed_lengths == (65,), check
    assert _summarise("prefix-cache hit", {64: np.array([0.0, 0.001])}, 4, 0.01).status == "PASS"
