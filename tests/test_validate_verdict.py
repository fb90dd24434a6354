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

SCALE = 20.0  # the largest score llama.cpp produced on the layer


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
        return ValidationReport(Path(model), "glm5-next", "kpool", 64, [[64]], tolerances, [_layer(relative)])

    monkeypatch.setattr("kvphase.cli.validate_cmd.validate_model", fake_validate)
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "m.gguf")])
    assert result.exit_code == code, result.output
    assert result.output.strip().splitlines()[-1] == verdict, result.output
