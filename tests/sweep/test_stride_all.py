"""`kvphase sweep MODEL --stride all`: one run folder per stride the file declares (deepseek4's
compress ratios), each what `kvphase sweep --stride S` writes, then their comparison."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.helpers.cli_checks import one_line_error
from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.gguf.modelinfo import read_model_info
from kvphase.sweep.strides import ALL, comparison_dir, declared_strides, modulus_for, parse_stride, planned_dip

runner = CliRunner()
# S = M = 128 needs a 960-token context to lay out its records; one target per residue, each in a
# context of its own (so no resample of contexts holds every residue: the gap's interval is unknown)
SWEEP = ["--context", "960", "--per-residue", "1", "--threads", "1"]
NAMES = {4: "tiny-ds4-records-S4-L960", 128: "tiny-ds4-records-S128-L960"}
COMPARISON = "tiny-ds4-records-strides-L960"


@pytest.fixture(scope="module")
def every_stride(tiny_deepseek4, tmp_path_factory):
    """`--stride all` in a fresh working folder: (the folder, the command's result)."""
    work = tmp_path_factory.mktemp("strides")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        result = runner.invoke(app, ["sweep", str(tiny_deepseek4), *SWEEP, "-q", "--stride", "all"])
    assert result.exit_code == 0, result.output
    return work / "reports", result


@pytest.mark.slow
def test_every_declared_stride_gets_its_own_folder(every_stride):
    reports, result = every_stride
    assert sorted(p.name for p in reports.iterdir()) == sorted([*NAMES.values(), COMPARISON])
    for stride, modulus in ((4, 8), (128, 128)):  # M = S from stride 32 on
        config = json.loads((reports / NAMES[stride] / "config.json").read_text())
        assert (config["stride"], config["modulus"], config["control"]) == (stride, modulus, False)
        summary = json.loads((reports / NAMES[stride] / "summary.json").read_text())
        assert summary["n_targets"] == modulus and summary["n_contexts"] == modulus
        assert f"Report: {reports.name}/{NAMES[stride]}/report.md" in result.output
    # one context per residue: no resample of contexts holds them all, so the gap's interval is unknown
    low, high = json.loads((reports / NAMES[128] / "summary.json").read_text())["gap_ci"]
    assert low <= 0 < high  # one target per residue: no gap is excluded


@pytest.mark.slow
def test_the_strides_are_compared_beside_their_folders(every_stride):
    reports, result = every_stride
    table = pd.read_csv(reports / COMPARISON / "comparison.csv")
    assert table["stride"].tolist() == [4, 128] and table["modulus"].tolist() == [8, 128]
    assert table["n"].tolist() == [8, 128]
    assert table["gap_minus_first_ci_low"].tolist()[1:] == [-100.0]  # S = 128's interval is unknown
    assert table["run_dir"].tolist() == [f"reports/{NAMES[4]}", f"reports/{NAMES[128]}"]
    assert (reports / COMPARISON / "comparison.png").is_file()
    assert "The runs' strides differ (4, 128)" in (reports / COMPARISON / "comparison.md").read_text()
    assert f"Strides compared: reports/{COMPARISON}/comparison.md" in result.output
    # the 128 row, read against stride 4: its residues carry the phase mod 4
    assert table["inner_stride"].isna().tolist() == [True, False] and table["inner_stride"].iloc[1] == 4
    said = f"{NAMES[128]}: Read against stride 4, which divides the modulus 128: pooled by position mod 4"
    assert said in result.output and said in (reports / COMPARISON / "comparison.md").read_text().replace("**", "")


@pytest.mark.slow
def test_a_strides_folder_is_what_a_sweep_at_that_stride_writes(every_stride, tiny_deepseek4, tmp_path):
    reports, _ = every_stride
    out = tmp_path / "S4"
    result = runner.invoke(app, ["sweep", str(tiny_deepseek4), *SWEEP, "-q", "--stride", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    for name in ("config.json", "results.csv", "summary.json"):
        assert (out / name).read_bytes() == (reports / NAMES[4] / name).read_bytes(), name


@pytest.mark.slow
def test_the_plan_of_each_stride_is_said_before_anything_runs(tiny_deepseek4, tmp_path):
    """--dry-run with --stride all: each stride's targets and detectable dip, then each one's estimate."""
    result = runner.invoke(app, ["sweep", str(tiny_deepseek4), *SWEEP, "--stride", "all", "--dry-run", "--out",
                                 str(tmp_path / "runs")], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert planned_dip(1, 8) > 100 and planned_dip(1, 128) > 100  # one target per residue detects nothing
    assert "--stride all: stride 4, modulus 8: 8 targets (1 per residue) cannot detect even a 100-point" in out
    assert "--stride all: stride 128, modulus 128: 128 targets (1 per residue) cannot detect even" in out
    assert "--per-residue auto --detect GAP" not in out  # --per-residue was given
    assert out.index("stride 128, modulus 128") < out.index("Dry run for")
    assert f"Dry run for {tmp_path / 'runs' / NAMES[4]}" in out and f"Dry run for {tmp_path / 'runs' / NAMES[128]}" in out
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_per_residue_auto_sizes_each_stride_for_the_dip(tiny_deepseek4, tmp_path):
    """--per-residue auto --detect with --stride all: each stride gets the count that detects the
    dip at its own modulus, and S = 128 in the default context (room for one target depth, so
    one target per context) plans: the count once failed the depth check after a minute."""
    from kvphase.statistics.power import balanced_power  # the rule, simulated in test_stratified.py

    def power(n, m, dip=0.9):
        return balanced_power(n, m, dip)

    result = runner.invoke(app, ["sweep", str(tiny_deepseek4), "--per-residue", "auto", "--detect", "90", "--threads",
                                 "1", "--stride", "all", "--dry-run", "--out", str(tmp_path)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    counts = {int(m): int(n) for m, n in re.findall(r"modulus (\d+): \d+ targets \((\d+) per residue\)", result.output)}
    assert counts[8] % 8 == 0 and power(counts[8], 8) >= 0.8 > power(counts[8] - 8, 8)
    assert power(counts[128], 128) >= 0.8 > power(counts[128] - 1, 128)  # not rounded up to 128
    assert f"{128 * counts[128]} contexts, {128 * counts[128]} targets" in result.output


def test_large_strides_without_a_sample_size_are_told_how_to_size_them():
    """At the default 32 per residue, S = M = 128 is 4096 targets: the user is told what they detect
    and how to size the runs for a dip instead."""
    import io

    from rich.console import Console

    from kvphase.cli.sweep_cmd import say_stride_plans
    from kvphase.sweep.plan import SweepPlan

    def said(per_residue_given):
        plans = [SweepPlan(model="m.gguf", task="records", stride=s, modulus=m, context=1024, per_residue=32,
                           padding="prefix", seed=0, control=False) for s, m in ((4, 8), (128, 128))]
        console = Console(file=io.StringIO(), width=300)
        say_stride_plans(console, plans, per_residue_given)
        return console.file.getvalue()

    text = said(False)
    assert (f"stride 128, modulus 128: 4096 targets (32 per residue) detect a one-residue dip of "
            f"{planned_dip(32, 128):.1f} points with 80% power") in text
    assert f"stride 4, modulus 8: 256 targets (32 per residue) detect a one-residue dip of {planned_dip(32, 8):.1f}" in text
    assert "--per-residue auto --detect GAP" in text and "--per-residue auto" not in said(True)


@pytest.mark.slow
def test_a_folder_that_cannot_run_is_refused_before_the_first_stride_runs(tiny_deepseek4, tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / NAMES[128]).write_text("in the way")
    one_line_error(runner.invoke(app, ["sweep", str(tiny_deepseek4), *SWEEP, "-q", "--stride", "all", "--out",
                                        str(tmp_path / "runs")]), "is a file, not a run folder")
    assert not (tmp_path / "runs" / NAMES[4]).exists()


@pytest.mark.parametrize("stride, fragment", [
    ("all", "--stride all: tiny-llama.gguf is a llama model, which declares no KV-cache compression"),
    ("0", "--stride must be at least 2, got 0"),
    ("-3", "--stride must be at least 2, got -3"),
    ("abc", "--stride must be a whole number (the stride S) or 'all', got 'abc'"),
    ("4.5", "--stride must be a whole number (the stride S) or 'all', got '4.5'"),
    ("", "--stride must be a whole number (the stride S) or 'all', got ''"),
])
def test_a_stride_that_is_neither_a_number_nor_all_is_one_line(tiny_llama, tmp_path, stride, fragment):
    out = tmp_path / "run"
    one_line_error(runner.invoke(app, ["sweep", str(tiny_llama), "--context", "256", "--stride", stride, "--out",
                                        str(out)]), fragment)
    assert not out.exists()


def test_the_strides_a_file_declares(tmp_path):
    from kvphase.gguf.tiny import write_tiny_model

    for arch, strides in (("deepseek4", [4, 128]), ("glm5-next", [4]), ("minimax-m3", [4])):
        assert declared_strides(read_model_info(write_tiny_model(arch, tmp_path / f"{arch}.gguf"))) == strides
    with pytest.raises(PlanError, match="is a qwen2 model, which declares no KV-cache compression"):
        declared_strides(read_model_info(write_tiny_model("qwen2", tmp_path / "qwen2.gguf")))


def test_stride_parsing_and_the_large_stride_modulus(tmp_path):
    assert [parse_stride(s) for s in (None, "all", "ALL", " 8 ", "-3")] == [None, ALL, ALL, 8, -3]
    assert [modulus_for(4, None), modulus_for(16, None), modulus_for(32, None), modulus_for(128, None),
            modulus_for(128, 256)] == [None, None, 32, 128, 256]
    assert comparison_dir([tmp_path / "m-records-S4-L3000-cache-q8_0"], [4]) == tmp_path / "m-records-strides-L3000-cache-q8_0"


@pytest.mark.parametrize("modulus", [8, 128])
def test_the_planned_dip_is_what_per_residue_auto_would_size_for(modulus):
    """planned_dip inverts power.per_residue_for_dip: the sample size it sizes for a dip
    detects that dip, and the sample size it gives for the planned dip is the plan's."""
    from kvphase.statistics.power import per_residue_for_dip

    for per_residue in (modulus, 4 * modulus):
        dip = planned_dip(per_residue, modulus)
        assert per_residue_for_dip(dip / 100 * (1 + 1e-9), modulus) == per_residue
        assert per_residue_for_dip(dip / 100 * 0.99, modulus) > per_residue
