"""`validate`: the reference designs equal llama.cpp on tiny models, and a wrong reference fails."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.tiny import write_tiny_model
from kvphase.validate import default_splits, validate_model

pytestmark = pytest.mark.slow
VALIDATED = ["glm5-next", "minimax-m3"]


def _describe(report) -> str:
    """Every layer's max and mean differences, so a failing assertion says how far off it was."""
    lines = []
    for layer in report.layers:
        lines.append(
            f"layer {layer.layer}: keys max {layer.keys.max:.3g} mean {layer.keys.mean:.3g}; "
            f"scores max {layer.scores.max:.3g} mean {layer.scores.mean:.3g} (largest {layer.score_scale:.3g}); "
            f"sets {layer.exact}+{layer.ties} ties of {layer.rows}; {layer.failures(report.tolerances)} {layer.notes[:2]}"
        )
    return "\n".join(lines)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    return {arch: write_tiny_model(arch, folder / f"{arch}.gguf") for arch in VALIDATED + ["deepseek4"]}


@pytest.mark.parametrize("arch", VALIDATED)
def test_reference_equals_llama_cpp(arch, models):
    report = validate_model(models[arch], n_tokens=64)
    assert report.passed, _describe(report)
    assert len(report.layers) == 2
    for layer in report.layers:
        assert layer.rows > 0 and layer.scores.count > 0
        assert layer.exact + layer.ties == layer.rows
    if arch == "glm5-next":
        assert all(layer.keys.count > 0 for layer in report.layers)


@pytest.mark.parametrize("arch", VALIDATED)
def test_a_phase_shifted_reference_fails(arch, models):
    # glm5-next: the per-phase gate bias rolled by one offset; minimax-m3: blocks start one position late
    report = validate_model(models[arch], n_tokens=48, splits=[[48]], perturb=1)
    assert not report.passed
    for layer in report.layers:
        reasons = " ".join(layer.failures(report.tolerances))
        assert "scores differ by up to" in reasons and "mean" in reasons


def test_default_splits_straddle_pools_and_decode():
    splits = default_splits(64, 4)
    assert all(sum(s) == 64 for s in splits)
    assert any(any(size > 16 for size in s) and any(size % 4 for size in s) for s in splits)
    assert any(all(size <= 16 for size in s[1:]) and s[-1] > 1 for s in splits)
    with pytest.raises(PlanError):
        default_splits(10, 4)


def test_validate_cli_pass_and_fail_exit_codes(models):
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(models["glm5-next"]), "--tokens", "40"])
    assert ok.exit_code == 0, ok.output
    assert "PASS" in ok.output and "FAIL" not in ok.output
    bad = runner.invoke(app, ["validate", str(models["glm5-next"]), "--tokens", "40", "--split", "40", "--perturb", "1"])
    assert bad.exit_code == 1, bad.output
    assert "FAIL" in bad.output and "keys differ by up to" in bad.output


def test_validate_cli_usage_errors(models, tmp_path):
    runner = CliRunner()
    wrong = runner.invoke(app, ["validate", str(models["glm5-next"]), "--tokens", "40", "--split", "10,10"])
    assert wrong.exit_code == 1 and "must be positive sizes summing to 40" in wrong.output
    missing = runner.invoke(app, ["validate", str(tmp_path / "none.gguf")])
    assert missing.exit_code == 1 and "not found" in missing.output
    unsupported = runner.invoke(app, ["validate", str(models["deepseek4"])])
    assert unsupported.exit_code == 1 and "validation supports" in unsupported.output


def test_validate_help():
    result = CliRunner().invoke(app, ["validate", "--help"])
    assert result.exit_code == 0 and "--split" in result.output
