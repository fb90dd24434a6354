"""Results a report cannot read a phase from, through `kvphase report` as a user meets them
(issue 53): a missing answers column is one line naming it; answers all empty or all one value
read degenerate; a run of one context reads uninformative (too few targets); never an effect, never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from tests.helpers.paths import EXAMPLE

runner = CliRunner()


def _folder(tmp_path: Path, change) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(EXAMPLE, folder)
    results = pd.read_csv(folder / "results.csv", dtype=str, keep_default_na=False)
    change(results).to_csv(folder / "results.csv", index=False)
    return folder


def test_a_results_table_without_answers_is_one_line(tmp_path):
    folder = _folder(tmp_path, lambda rows: rows.drop(columns="predicted"))
    result = runner.invoke(app, ["report", str(folder)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [f"Error: {folder / 'results.csv'} lacks columns: predicted"]


@pytest.mark.parametrize("answer, words", [("", "the model gives an empty answer to 100.0% of the 768 targets"),
                                           ("Laura", 'the model answers "Laura" to 100.0% of the 768 targets')])
def test_one_answer_for_every_target_reads_degenerate(tmp_path, answer, words):
    folder = _folder(tmp_path, lambda rows: rows.assign(predicted=answer, correct=rows["answer"] == answer))
    result = runner.invoke(app, ["report", str(folder)])
    assert result.exit_code == 0, result.output
    assert " ".join(result.output.split()).startswith(f"Degenerate: {words}")
    summary = (folder / "summary.json").read_text()
    assert '"verdict": "degenerate"' in summary and "Accuracy depends" not in (folder / "report.md").read_text()


def test_a_run_of_one_context_reads_uninformative(tmp_path):
    folder = _folder(tmp_path, lambda rows: rows.assign(context="0"))
    result = runner.invoke(app, ["report", str(folder)])
    assert result.exit_code == 0, result.output
    assert " ".join(result.output.split()).startswith(
        "Uninformative, too few targets: at a mean accuracy of 62.2% (95% interval 0.0 to 100.0%, from 1 context; "
        "chance 0.51%)")  # a guess among the 197 names of task records
