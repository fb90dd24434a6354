"""`make-tiny ARCH --vocab-from MODEL`: the compressed architectures swept end to end through
llama.cpp's own glm5-next, deepseek4 and minimax-m3 code. Random weights, so accuracy is
near zero; what is tested is that the whole path runs and the stride comes from the spec."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.gguf.modelinfo import read_model_info

runner = CliRunner()
SPEC_STRIDES = {"glm5-next": 4, "deepseek4": 4, "minimax-m3": 4}  # kpool, smallest compress ratio, block size in tiny.py


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(SPEC_STRIDES))
def test_compressed_tiny_model_sweeps_through_llama_cpp(arch, tiny_compressed, tmp_path):
    model, out = tiny_compressed / f"{arch}.gguf", tmp_path / "run"
    info = read_model_info(model)
    assert info.compression.stride == SPEC_STRIDES[arch] and info.vocab_size > 10_000
    result = runner.invoke(app, ["sweep", str(model), "--context", "256", "--per-residue", "1", "--quiet",
                                 "--threads", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["stride"] == SPEC_STRIDES[arch] and config["control"] is False and config["backend"] == "llama.cpp"
    assert json.loads((out / "summary.json").read_text())["n_targets"] == 2 * SPEC_STRIDES[arch]


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(SPEC_STRIDES))
def test_probes_run_through_llama_cpps_compressed_attention(arch, tiny_compressed, tmp_path):
    """flip on every compressed architecture, and cycle where the model has a per-phase gate
    bias (glm5-next, deepseek4): both through llama.cpp, the stride from the spec."""
    model = tiny_compressed / f"{arch}.gguf"
    flip = runner.invoke(app, ["flip", str(model), "--context", "256", "--targets", "2", "--cycles", "1",
                               "--threads", "1", "--out", str(tmp_path / "flip")])
    assert flip.exit_code == 0, flip.output
    shifts = json.loads((tmp_path / "flip" / "summary.json").read_text())["per_phase"]
    assert [p["n"] for p in shifts] == [2] * SPEC_STRIDES[arch]  # each target at every phase once
    cycle = runner.invoke(app, ["cycle", str(model), "--k", "1", "--context", "256", "--per-residue", "1",
                                "--threads", "1", "--out", str(tmp_path / "cycle")])
    if arch == "minimax-m3":
        assert cycle.exit_code == 1 and "declares no compressor with a per-phase gate bias" in cycle.output
        return
    assert cycle.exit_code == 0, cycle.output
    for run in ("k0", "k1"):
        config = json.loads((tmp_path / "cycle" / run / "config.json").read_text())
        assert config["stride"] == SPEC_STRIDES[arch] and config["backend"] == "llama.cpp", config


@pytest.mark.slow
def test_the_report_says_when_depth_confounds_residue(tiny_llama, tmp_path):
    """Residues mod 16 at one target each in 256 tokens leave room for one depth per residue, so the
    groups' mean positions differ (residues from M / 2 on sit M lower); the report must not claim
    they agree. At mod 8, the default plan, they do: at 32 targets per residue (a multiple of M, so equal
    means in `positions.residue_slots`; the fewest whose SDs the sweep's 2% check admits) as at the default's 72."""
    import pandas as pd

    def sweep(name, *options):
        result = runner.invoke(app, ["sweep", str(tiny_llama), "--context", "256", *options, "--threads", "1",
                                     "--out", str(tmp_path / name), "--quiet"])
        assert result.exit_code == 0, result.output
        means = pd.read_csv(tmp_path / name / "results.csv").groupby("residue")["target_pos"].mean()  # (M,)
        return (tmp_path / name / "report.md").read_text(), means

    report, means = sweep("confounded", "--modulus", "16", "--per-residue", "1")
    assert means.max() - means.min() > 1
    assert (f"do not have the same mean in every residue group (from {means.min():.0f} to {means.max():.0f}"
            in report), report
    assert "depth does not confound residue" not in report
    report, means = sweep("balanced", "--modulus", "8", "--per-residue", "32")
    assert means.max() - means.min() <= 1 and "depth does not confound residue" in report
