"""`kvphase conform`: the paired comparison, a planted design defect caught through the numpy
reference (the quick version of the patched llama.cpp builds in scripts/conform_engine_bugs.sh), and
bad input refused in one line with nothing written."""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm
from typer.testing import CliRunner

from tests.helpers.cli_checks import one_line_error
from kvphase.cli import app
from kvphase.conform.check import check_served_model
from kvphase.conform.compare import compare_rows, paired_interval
from kvphase.conform.references import DEFAULT_REFERENCES
from kvphase.errors import BackendError

runner = CliRunner()
CSA_DISJOINT = next(r for r in DEFAULT_REFERENCES if r.name == "csa-disjoint")


def rows(correct: np.ndarray, logprob: np.ndarray | None = None, modulus: int = 4) -> pd.DataFrame:
    """results.csv-like rows, one target per context, residues in turn."""
    n = len(correct)
    return pd.DataFrame({"target_id": np.arange(n), "context": np.arange(n), "residue": np.arange(n) % modulus,
                         "correct": correct.astype(bool),
                         "logprob": np.zeros(n) if logprob is None else logprob})


def test_paired_interval_is_the_normal_interval_of_the_mean_difference():
    difference = np.array([1, 0, 0, -1, 1, 1, 0, 0, 0, 1])  # (10,)
    mean, low, high = paired_interval(difference)
    sd = np.sqrt(((difference - difference.mean()) ** 2).sum() / 9)  # by hand, ddof 1
    half = 100 * norm.ppf(0.95) * sd / np.sqrt(10)
    assert (mean, low, high) == pytest.approx((30.0, 30.0 - half, 30.0 + half), abs=1e-9), (mean, low, high)


def test_an_engine_that_reproduces_the_folder_passes_with_zero_intervals():
    committed = rows(np.random.default_rng(0).random(160) < 0.7)
    check = compare_rows("m", "profile", committed, committed.copy(), {})
    assert check.verdict == "PASS" and check.flags_differing == 0 and check.max_logprob_difference == 0
    assert all((r.difference, r.ci_low, r.ci_high) == (0, 0, 0) for r in check.residues), check.residues


def test_a_moved_residue_fails_and_is_named():
    committed = rows(np.ones(160))
    engine = committed.copy()
    engine.loc[engine["residue"].eq(2) & engine["target_id"].lt(80), "correct"] = False  # half of residue 2
    check = compare_rows("m", "profile", committed, engine, {})
    assert check.verdict == "FAIL" and check.flags_differing == 20, check
    assert check.reason.startswith("residue 2 moved -50.0 points"), check.reason
    assert [r.equivalent for r in check.residues] == [True, True, False, True]
    assert check.gap.difference == pytest.approx(50.0), check.gap


def test_a_random_weight_reference_fails_on_log_probabilities_beyond_the_tolerance():
    committed = rows(np.zeros(40), np.linspace(-9, -5, 40))
    engine = committed.copy()
    engine.loc[engine["target_id"].eq(7), "logprob"] += 0.5  # residue 3
    assert compare_rows("m", "logprobs", committed, committed.copy(), {}).verdict == "PASS"
    check = compare_rows("m", "logprobs", committed, engine, {}, logprob_tolerance=0.01)
    assert check.verdict == "FAIL" and check.reason.startswith("residue 3 moved"), check.reason
    assert check.max_logprob_difference == pytest.approx(0.5), check.max_logprob_difference
    everywhere = engine.assign(logprob=engine["logprob"] + 0.5)
    said = compare_rows("m", "logprobs", committed, everywhere, {}, logprob_tolerance=0.01).reason
    assert said.startswith("every residue moved") and "residue 3" not in said, said


def conform_reference(tmp_path, *extra: str):
    return runner.invoke(app, ["conform", "--backend", "reference", "--model", "csa-disjoint", "--contexts", "64",
                               "--out", str(tmp_path / "run"), *extra])


def test_the_reference_backend_reproduces_csa_disjoint(tmp_path):
    result = conform_reference(tmp_path)
    assert result.exit_code == 0, result.output
    assert "csa-disjoint: PASS (64 targets, 0 flags differ" in result.output, result.output
    saved = json.loads((tmp_path / "run" / "conform.json").read_text())
    assert [m["status"] for m in saved["models"]] == ["PASS"] and not saved["failed"]
    assert len(pd.read_csv(tmp_path / "run" / "csa-disjoint" / "results.csv")) == 64
    for path in ("branch", "token by token", "micro-batch cut"):
        assert f"csa-disjoint {path}: PASS" in result.output, result.output
    assert [p["status"] for p in saved["models"][0]["paths"]] == ["PASS"] * 3


def test_a_planted_prefix_reuse_defect_fails_the_branch_path_naming_its_residue(tmp_path, monkeypatch):
    """The reference's cache rolled back to a context also drops the context's incomplete block:
    the branch path FAILs at a residue other than 0, the other paths PASS, exit 1."""
    from kvphase.reference.deepseek4 import TokenCache

    rolled_back = TokenCache.truncate
    monkeypatch.setattr(TokenCache, "truncate", lambda self, n: rolled_back(self, n - n % 4))
    result = conform_reference(tmp_path)
    assert result.exit_code == 1, result.output
    branch = next(line for line in result.output.splitlines() if "csa-disjoint branch:" in line)
    # contexts of 61-64 tokens: the three ending mid-block (residues 1-3) lose tokens, and their
    # answers start 4 tokens later, at the same residues mod 4
    assert "branch: FAIL: answers starting at residues 1, 2, 3 mod 4 moved by up to" in branch, result.output
    assert "engine paths FAIL: csa-disjoint's branch (answers starting at residues 1, 2, 3 mod 4)" in result.output
    assert "csa-disjoint token by token: PASS" in result.output, result.output
    assert "csa-disjoint micro-batch cut: PASS" in result.output, result.output


def test_a_planted_block_boundary_defect_fails_naming_the_moved_residue(tmp_path, monkeypatch):
    """The reference's deepseek4 compressor with its blocks starting one token late (the defect the
    llama.cpp patch deepseek4-block-boundary.patch plants): FAIL, exit 1, the residue named."""
    import kvphase.reference.deepseek4 as deepseek4

    monkeypatch.setattr(deepseek4, "DSV4", functools.partial(deepseek4.DSV4, start=1))
    result = conform_reference(tmp_path)
    assert result.exit_code == 1, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("csa-disjoint:"))
    assert "csa-disjoint: FAIL" in line and "residue " in line and " moved " in line, result.output
    saved = json.loads((tmp_path / "run" / "conform.json").read_text())
    assert saved["failed"] and saved["models"][0]["status"] == "FAIL"


def test_an_architecture_the_engine_lacks_cannot_run_and_never_passes(tmp_path):
    result = runner.invoke(app, ["conform", "--backend", "reference", "--model", "minimax-m3-random",
                                 "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "minimax-m3-random: cannot run: kvphase's numpy reference has no minimax-m3" in result.output
    assert "0 PASS, 0 FAIL, 1 cannot run" in result.output


def references_file(tmp_path, folder: str) -> str:
    path = tmp_path / "refs.json"
    path.write_text(json.dumps([{"name": "x", "model": str(CSA_DISJOINT.model), "folder": folder,
                                 "check": "profile"}]))
    return str(path)


def test_a_folder_without_its_plan_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["conform", "--references", references_file(tmp_path, str(tmp_path / "empty")),
                                 "--out", str(tmp_path / "run")])
    one_line_error(result, "reference x", "has no config.json")
    assert not (tmp_path / "run").exists()


def test_a_model_that_is_not_a_reference_is_refused(tmp_path):
    other = CSA_DISJOINT.model.parent / "dense.gguf"
    result = runner.invoke(app, ["conform", "--model", str(other), "--out", str(tmp_path / "run")])
    one_line_error(result, "is not one of the reference models")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("model", [["--model", "csa-disjoint"], []], ids=["named", "asked of the server"])
def test_an_engine_that_does_not_answer_is_refused_with_nothing_written(tmp_path, model):
    result = runner.invoke(app, ["conform", "--backend", "server", "--url", "http://127.0.0.1:9", *model,
                                 "--request-timeout", "2", "--out", str(tmp_path / "run")])
    one_line_error(result, "127.0.0.1:9", "does not answer")
    assert not (tmp_path / "run").exists()


def test_a_server_holding_another_model_is_refused(tmp_path):
    from kvphase.backends.dialects import ServerInfo

    served = ServerInfo("http://s", "llama-server", str(CSA_DISJOINT.model.parent / "csa-dense.gguf"), None, 128, 1, "")
    with pytest.raises(BackendError, match="serves another model .*csa-dense.gguf.*not reference csa-disjoint "
                       r"\(csa-disjoint.gguf\): its file .*csa-dense.gguf holds other bytes"):
        check_served_model(fleet_of(served), CSA_DISJOINT)
    same = ServerInfo("http://s", "llama-server", str(CSA_DISJOINT.model), None, 128, 1, "")
    check_served_model(fleet_of(same), CSA_DISJOINT)


def fleet_of(*servers):
    """A server backend (`backends.base.ServerFleet`) as far as the served-model check reads it."""
    return SimpleNamespace(servers=list(servers), on_lost=print)


def test_a_reference_file_its_folder_did_not_score_is_refused(tmp_path):
    path = tmp_path / "refs.json"
    path.write_text(json.dumps([{"name": "x", "model": str(CSA_DISJOINT.model.parent / "csa-dense.gguf"),
                                 "folder": str(CSA_DISJOINT.folder), "check": "profile"}]))
    result = runner.invoke(app, ["conform", "--references", str(path), "--out", str(tmp_path / "run")])
    one_line_error(result, "reference x", "is not the file its folder scored")
    assert not (tmp_path / "run").exists()


def test_through_llama_server_the_reference_it_holds_passes_and_another_is_refused(tmp_path):
    """A real llama-server holding csa-disjoint: conform asks it which reference it holds and passes
    it; asked about csa-dense (the same tokenizer, so a sweep's checks cannot tell) it refuses."""
    from kvphase.engines.llama_server import find_llama_server, llama_server

    with llama_server(CSA_DISJOINT.model, binary=find_llama_server(), threads=1, slots=1,
                      n_ctx_per_slot=256) as server:
        result = runner.invoke(app, ["conform", "--backend", "server", "--url", server.url, "--contexts", "16",
                                     "--out", str(tmp_path / "run")])
        assert result.exit_code == 0, result.output
        assert "csa-disjoint: PASS (16 targets, 0 flags differ" in result.output, result.output
        other = runner.invoke(app, ["conform", "--backend", "server", "--url", server.url, "--model", "csa-dense",
                                    "--out", str(tmp_path / "other")])
    # the fleet identifies a server's weights by their file's bytes when it is made (before conform's own
    # check of the reference it holds), so that is the line
    one_line_error(other, "serves other weights", "csa-disjoint.gguf), not csa-dense.gguf: its file holds other bytes")
    assert not (tmp_path / "other").exists()
