"""`kvphase compare`: several run folders in one table and one figure, a gap difference against the first.

The run folders are written here (config.json as `kvphase sweep --context 512 --per-residue 8` writes it,
results.csv with a chosen hit pattern), so no model runs.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from typer.testing import CliRunner

from tests.helpers.cli_checks import one_line_error
from kvphase.cli import app
from kvphase.sweep.compare import CSV_FILE, FIGURE_FILE, MARKDOWN_FILE, load_runs
from kvphase.errors import PlanError
from kvphase.sweep.run import RESULT_COLUMNS
from tests.helpers.by_hand import generalized_cmh_loop

WIDE = {"COLUMNS": "250"}  # so rich does not fold the numbers the tests look for


def write_run(folder: Path, hits: list[int], per_residue: int = 16, stride: int = 4, modulus: int = 8,
              backend: str = "llama.cpp", options: dict | None = None,
              model: str = "/models/SmolLM2-135M-Instruct.Q4_1.gguf") -> Path:
    """A run folder whose residue r has hits[r] correct targets out of per_residue."""
    folder.mkdir(parents=True)
    config = {"model": model, "task": "records", "stride": stride,
              "modulus": modulus, "context": 512, "per_residue": per_residue, "padding": "prefix", "seed": 0,
              "control": True, "backend": backend, "backend_options": options or {}}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    with (folder / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RESULT_COLUMNS)
        writer.writeheader()
        for i in range(per_residue * modulus):
            residue, k = i % modulus, i // modulus
            pos = 40 + modulus * k + residue
            writer.writerow({"target_id": i, "context": k, "residue": residue, "phase": pos % stride,
                             "target_pos": pos, "query_pos": 512, "correct": k < hits[residue],
                             "logprob": -0.5 - 0.01 * i, "key": f"key{i}", "answer": "Laura",
                             "predicted": "Laura" if k < hits[residue] else "Alex"})
    return folder


@pytest.fixture
def two_runs(tmp_path):
    flat = write_run(tmp_path / "flat", [10, 9, 10, 9, 10, 9, 10, 9])
    dipped = write_run(tmp_path / "dipped", [2, 14, 15, 14, 3, 14, 15, 13], backend="reference",
                       options={"design": "kpool", "stride": 4})
    return [flat, dipped]


def invoke(args):
    return CliRunner().invoke(app, ["compare", *map(str, args)], env=WIDE)


def test_help():
    result = CliRunner().invoke(app, ["compare", "--help"])
    assert result.exit_code == 0
    assert "[RUN_DIR]..." in result.output and "--out" in result.output
    assert "reports/comparison" in result.output


def test_writes_table_figure_and_csv(two_runs, tmp_path):
    out = tmp_path / "cmp"
    result = invoke([*two_runs, "--out", out])
    assert result.exit_code == 0, result.output
    assert f"Table: {out / MARKDOWN_FILE}" in result.output
    assert f"Figure: {out / FIGURE_FILE}" in result.output
    assert f"CSV: {out / CSV_FILE}" in result.output
    assert (out / FIGURE_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = pd.read_csv(out / CSV_FILE)
    assert list(table["label"]) == ["flat", "dipped"]
    assert list(table["backend"]) == ["llama.cpp", "reference"]
    markdown = (out / MARKDOWN_FILE).read_text()
    assert f"![accuracy by residue]({FIGURE_FILE})" in markdown
    assert "| flat | SmolLM2-135M-Instruct.Q4_1.gguf | llama.cpp | records | 4 | 512 | 128 |" in markdown
    assert "reference (design=kpool, stride=4)" in markdown and "reference (design=kpool, stride=4)" in result.output


def test_numbers_against_the_hit_patterns(two_runs, tmp_path):
    """Every number in comparison.csv from the hit patterns directly: accuracies by hand,
    the statistic from the stratum-by-stratum loop of tests/statistics/test_stratified.py."""
    out = tmp_path / "cmp"
    result = invoke([*two_runs, "--out", out])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / CSV_FILE, keep_default_na=False).set_index("label")
    flat, dipped = table.loc["flat"], table.loc["dipped"]
    assert (flat["n"], flat["mean_accuracy"], flat["worst_accuracy"], flat["worst_residue"]) == (128, 59.375, 56.25, 1)
    assert (flat["best_accuracy"], flat["gap"], flat["periodicity"]) == (62.5, 6.25, 0.0)
    hits = [2, 14, 15, 14, 3, 14, 15, 13]
    assert dipped["mean_accuracy"] == pytest.approx(100 * np.mean(hits) / 16) == pytest.approx(70.3125)
    assert (dipped["worst_accuracy"], dipped["worst_residue"], dipped["gap"]) == (12.5, 0, 81.25)
    assert dipped["periodicity"] == pytest.approx(100 * np.mean([1, 0, 0, 1]) / 16)
    folder = two_runs[0]
    frame = pd.read_csv(folder / "results.csv")
    statistic = generalized_cmh_loop(frame["correct"].to_numpy(float), frame["residue"].to_numpy(),
                                  frame["context"].to_numpy(), 8)
    assert flat["p_value"] == pytest.approx(stats.chi2.sf(statistic, 7), rel=1e-9)
    assert dipped["p_value"] < 1e-3 and "stratified by context" in dipped["test"]
    assert float(dipped["gap_minus_first"]) == 75.0 and float(dipped["gap_minus_first_ci_low"]) > 0  # the dip is real
    assert flat["gap_minus_first"] == ""
    # and the terminal shows the same numbers
    for shown in ["59.38", "56.25 (r=1)", "12.50 (r=0)", f"{float(flat['p_value']):.2g}"]:
        assert shown in result.output
    markdown = (out / MARKDOWN_FILE).read_text()
    assert "- **dipped**: +75.00 points (95% CI" in markdown and "the gaps differ" in markdown


def test_two_runs_of_one_model_show_no_gap_difference(tmp_path):
    a = write_run(tmp_path / "a", [10, 9, 10, 9, 10, 9, 10, 9])
    b = write_run(tmp_path / "b", [9, 10, 9, 10, 11, 9, 10, 8])
    (_, second) = load_runs([a, b])
    assert second.versus_first.ci_low < 0 < second.versus_first.ci_high and not second.versus_first.differs


def test_small_runs_show_the_permutation_p_value(tmp_path):
    # 8 targets per residue: the permutation p-value path, as `kvphase sweep --per-residue 8` gives
    folder = write_run(tmp_path / "small", [3, 5, 6, 5, 4, 6, 5, 5], per_residue=8)
    result = invoke([folder, "--out", tmp_path / "cmp"])
    assert result.exit_code == 0, result.output
    (run,) = load_runs([folder])
    assert "permutations" in run.summary.test.note
    assert f"{run.summary.test.p_value:.2g}" in result.output


def test_default_out_is_reports_comparison(two_runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke(two_runs)
    assert result.exit_code == 0, result.output
    for name in (MARKDOWN_FILE, FIGURE_FILE, CSV_FILE):
        assert (tmp_path / "reports" / "comparison" / name).is_file()


def test_a_folder_that_is_not_a_run(two_runs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(invoke([two_runs[0], empty, "--out", tmp_path / "cmp"]), "is not a run folder", "config.json")
    assert not (tmp_path / "cmp").exists()


def test_a_missing_folder(tmp_path):
    one_line_error(invoke([tmp_path / "nope", "--out", tmp_path / "cmp"]), "no such directory")


def test_a_run_with_no_results(tmp_path):
    folder = write_run(tmp_path / "fresh", [0] * 8)
    (folder / "results.csv").write_text("")
    one_line_error(invoke([folder, "--out", tmp_path / "cmp"]), "has no scored targets")


def test_no_folder(tmp_path):
    one_line_error(invoke(["--out", tmp_path / "cmp"]), "at least one run folder")


def test_different_moduli_share_one_figure(tmp_path):
    a = write_run(tmp_path / "m8", [8] * 8)
    b = write_run(tmp_path / "m16", [8] * 16, stride=8, modulus=16)
    result = invoke([a, b, "--out", tmp_path / "cmp"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cmp" / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    table = pd.read_csv(tmp_path / "cmp" / "comparison.csv")
    assert sorted(table["modulus"]) == [8, 16]


def test_a_folder_given_twice(two_runs, tmp_path):
    one_line_error(invoke([two_runs[0], two_runs[0], "--out", tmp_path / "cmp"]), "given twice")


def test_different_strides_share_a_figure(tmp_path):
    a = write_run(tmp_path / "s4", [8] * 8)
    b = write_run(tmp_path / "s2", [8] * 8, stride=2)
    result = invoke([a, b, "--out", tmp_path / "cmp"])
    assert result.exit_code == 0, result.output
    assert "strides differ (2, 4)" in (tmp_path / "cmp" / MARKDOWN_FILE).read_text()


def test_a_large_modulus_is_read_against_a_smaller_stride_of_the_same_model(tmp_path):
    """Stride 4 (mod 8) beside stride 2 of the same file: the mod-8 residues, weak at every odd
    position alike, are split by phase mod 2: a difference between the phases, none within them.
    A run of another model at stride 2 reads nothing."""
    small = write_run(tmp_path / "s2", [12] * 4, per_residue=32, stride=2, modulus=4)
    large = write_run(tmp_path / "s4", [30, 14, 30, 14, 30, 14, 30, 14], per_residue=32)
    result = invoke([small, large, "--out", tmp_path / "cmp"])
    assert result.exit_code == 0, result.output
    said = ("s4: Read against stride 2, which divides the modulus 8: pooled by position mod 2 the residues read "
            "93.8 and 43.8%")
    assert said in result.output and "the stride-2 phase seen through residues mod 8" in result.output
    markdown = (tmp_path / "cmp" / MARKDOWN_FILE).read_text()
    assert "## Large moduli read against a smaller stride" in markdown and said in markdown.replace("**", "")
    table = pd.read_csv(tmp_path / "cmp" / CSV_FILE)
    assert table["inner_stride"].isna().tolist() == [True, False] and table["inner_stride"].iloc[1] == 2
    assert table["within_phases_p_value"].iloc[1] == pytest.approx(1.0)  # residues of a phase are alike
    assert table["between_phases_p_value"].iloc[1] < 1e-6
    other = write_run(tmp_path / "other", [12] * 4, per_residue=32, stride=2, modulus=4, model="/models/other.gguf")
    assert [run.nested for run in load_runs([other, large])] == [None, None]
    results = pd.read_csv(large / "results.csv")  # interrupted before residue 7 was scored: nothing to split
    results[results["residue"] < 7].to_csv(large / "results.csv", index=False)
    assert [run.nested for run in load_runs([small, large])] == [None, None]


def test_same_folder_names_get_distinct_labels(tmp_path):
    a = write_run(tmp_path / "a" / "run", [8] * 8)
    b = write_run(tmp_path / "b" / "run", [9] * 8)
    assert [run.label for run in load_runs([a, b])] == ["a/run", "b/run"]


def test_library_raises_domain_errors():
    with pytest.raises(PlanError, match="at least one run folder"):
        load_runs([])
