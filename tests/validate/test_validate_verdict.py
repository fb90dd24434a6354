"""`validate`'s verdict right at its tolerances, without a model: a layer whose differences sit
just under a tolerance passes, just over it fails, and the command's last line and exit code
say so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.validate import Tolerances, ValidationReport
from kvphase.validate.report import LayerCheck
from tests.helpers.fakes import validate_without_a_model_file

SCALE = 20.0  # the largest score llama.cpp produced on the layer


@pytest.fixture(autouse=True)
def no_weights_check(monkeypatch):
    validate_without_a_model_file(monkeypatch)


def _layer(score_error: float = 0.0, key_error: float = 0.0) -> LayerCheck:
    """One layer whose scores differ by `score_error` x SCALE and keys by `key_error`."""
    layer = LayerCheck(layer=0, score_scale=SCALE, rows=4, exact=4)
    scores = np.linspace(-SCALE, SCALE, 16)
    layer.scores.add(scores + score_error * SCALE, scores)
    layer.keys.add(np.full(8, key_error), np.zeros(8))
    return layer


@pytest.mark.parametrize("relative, fails", [(0.5e-4, False), (1.5e-4, True), (3e-4, True)])
def test_scores_tolerance_is_1e_4_of_the_largest_score(relative, fails):
    failures = _layer(score_error=relative).failures(Tolerances())
    assert bool(failures) == fails, failures
    if fails:
        assert failures[0].startswith("scores differ by up to")


@pytest.mark.parametrize("error, fails", [(0.5e-5, False), (2e-5, True)])
def test_keys_tolerance_is_1e_5(error, fails):
    assert bool(_layer(key_error=error).failures(Tolerances())) == fails


@pytest.mark.parametrize("relative, verdict, code", [(0.5e-4, "PASS", 0), (2e-4, "FAIL", 1)])
def test_the_last_line_and_exit_code_follow_the_tolerance(relative, verdict, code, monkeypatch, tmp_path):
    def fake_validate(model, tokens, seed, splits, tolerances, *args, **kwargs):
        return ValidationReport(model.path, "glm5-next", "kpool", 64, [[64]], tolerances, [_layer(relative)])

    monkeypatch.setattr("kvphase.validate.run.validate_model", fake_validate)
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "m.gguf")])
    assert result.exit_code == code, result.output
    assert result.output.strip().splitlines()[-1] == verdict, result.output


def _report(*layers: LayerCheck) -> ValidationReport:
    return ValidationReport(Path("m.gguf"), "deepseek4", "dsv4", 64, [[64]], Tolerances(), list(layers))


def test_one_failing_layer_fails_the_model_and_is_the_one_named(monkeypatch, tmp_path):
    bad = _layer(score_error=3e-4)
    bad.layer = 2
    layers = [_layer(), _layer(), bad, _layer()]
    for i, layer in enumerate(layers):
        layer.layer = i
    assert not _report(*layers).passed and _report(*layers[:2], layers[3]).passed
    assert [bool(layer.failures(Tolerances())) for layer in layers] == [False, False, True, False]
    monkeypatch.setattr("kvphase.validate.run.validate_model", lambda *a, **k: _report(*layers))
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "m.gguf")])
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1] == "FAIL", result.output
    assert result.output.count("scores differ by up to") == 1, result.output


def test_a_report_without_layers_does_not_pass():
    assert not _report().passed


@pytest.mark.parametrize("spoil, reason", [
    (lambda l: l.gates.add(np.full(4, 2e-5), np.zeros(4)), "gate logits differ"),
    (lambda l: setattr(l, "mask_mismatch", 1), "1 scores are masked in one and not the other"),
    (lambda l: l.not_compared("the block mask"), "not compared: the block mask"),
    (lambda l: l.count("exact", False, "query 3"), "1 of 5 selected sets differ beyond ties"),
    (lambda l: l.count("tie", False, "query 3", tie_needs_equal_tokens=True), "1 of 5 selected sets differ"),
    (lambda l: l.count("differ", True, "query 3"), "1 of 5 selected sets differ"),
], ids=["gates", "mask", "uncompared", "exact-other-tokens", "tie-other-tokens-read-back", "differ"])
def test_each_kind_of_difference_fails_its_layer(spoil, reason):
    layer = _layer()
    assert not layer.failures(Tolerances())
    spoil(layer)
    failures = layer.failures(Tolerances())
    assert any(f.startswith(reason) for f in failures), failures


def test_a_tie_among_equal_scores_passes_unless_tokens_are_read_back():
    layer = _layer()
    layer.count("tie", False, "query 1")  # the reference chose other tokens among exactly tied scores
    layer.count("tie", True, "query 2", tie_needs_equal_tokens=True)
    assert (layer.rows, layer.exact, layer.ties, layer.failures(Tolerances())) == (6, 4, 2, [])


@pytest.mark.parametrize("relative, fails", [(4e-3, False), (6e-3, True)])
def test_attention_tolerance_is_relative_to_the_largest_output(relative, fails):
    layer = _layer()
    layer.attention_scale = 50.0
    outputs = np.linspace(-50.0, 50.0, 32)
    layer.attention.add(outputs + relative * 50.0, outputs)
    assert bool(layer.failures(Tolerances())) == fails


def test_a_layer_that_compared_nothing_fails():
    assert LayerCheck(layer=0).failures(Tolerances()) == ["nothing was compared"]


def test_each_rows_verdict_follows_its_own_layers_numbers(monkeypatch, tmp_path):
    """The table's last column, row by row (the final verdict and exit code are checked above):
    layers 1 and 3 over a tolerance, 0 and 2 under."""
    layers = [_layer(), _layer(score_error=3e-4), _layer(), _layer(key_error=2e-5)]
    for i, layer in enumerate(layers):
        layer.layer = i
    monkeypatch.setattr("kvphase.validate.run.validate_model", lambda *a, **k: _report(*layers))
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["validate", str(tmp_path / "m.gguf")])
    cells = [[cell.strip() for cell in line.strip("│┃ ").split("│")] for line in result.output.splitlines()
             if line.startswith("│")]
    verdicts = {int(row[0]): row[-1] for row in cells if row[0].isdigit()}
    assert verdicts == {0: "PASS", 1: "FAIL", 2: "PASS", 3: "FAIL"}, result.output
