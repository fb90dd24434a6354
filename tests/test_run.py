"""Run folders: resume after an interruption, refuse a different plan, rebuild the report."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvphase.errors import RunFolderError
from kvphase.gguf.modelinfo import read_model_info
from kvphase.sweep.report import build_report
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.run import execute_sweep, load_results
from tests.fakes import CharBackend


@pytest.fixture
def info(default_model):
    return read_model_info(default_model)


def _plan(info, **changes):
    fields = dict(model=str(info.path), task="records", stride=4, modulus=8, context=1500, per_residue=8,
                  padding="prefix", seed=1, control=True, backend="fake")
    fields.update(changes)
    return SweepPlan(**fields)


def test_interrupted_run_keeps_finished_rows_and_resumes_without_duplicates(tmp_path, info):
    plan = _plan(info)
    with pytest.raises(KeyboardInterrupt):
        execute_sweep(plan, CharBackend(interrupt_after=2), tmp_path, info)
    partial = load_results(tmp_path)
    assert len(partial) > 0 and len(partial) < 64
    backend = CharBackend()
    full = execute_sweep(plan, backend, tmp_path, info)
    raw = pd.read_csv(tmp_path / "results.csv")
    assert len(raw) == len(full) == 64 == raw["target_id"].nunique()
    assert len(backend.scored) == 64 - len(partial)  # finished targets are not scored again
    uninterrupted = execute_sweep(plan, CharBackend(), tmp_path / "fresh", info)
    assert full.sort_values("target_id")["correct"].tolist() == uninterrupted.sort_values("target_id")["correct"].tolist()
    assert json.loads((tmp_path / "manifest.json").read_text())["sessions"] == 2


def test_a_half_written_row_is_dropped_and_rescored(tmp_path, info):
    plan = _plan(info)
    execute_sweep(plan, CharBackend(), tmp_path, info)
    path = tmp_path / "results.csv"
    text = path.read_text()
    path.write_text(text[: text.rfind("\n", 0, len(text) - 1) + 1] + "63,9,3,3,1")  # crash mid-row
    backend = CharBackend()
    results = execute_sweep(plan, backend, tmp_path, info)
    assert len(results) == 64 and len(backend.scored) == 1


@pytest.mark.parametrize("damage, fragment", [
    (b"garbage,,,,,,,,,,\n", "target_id is 'garbage', expected a number"),
    (b"\xff\xfe\x00 not text\n", "is not a readable results file"),
])
def test_a_damaged_results_file_is_named_not_a_traceback(tmp_path, info, damage, fragment):
    execute_sweep(_plan(info, per_residue=1), CharBackend(), tmp_path, info)
    with (tmp_path / "results.csv").open("ab") as results:
        results.write(damage)
    with pytest.raises(RunFolderError, match=fragment):
        load_results(tmp_path)


def test_a_folder_with_a_different_plan_is_refused(tmp_path, info):
    execute_sweep(_plan(info), CharBackend(), tmp_path, info)
    with pytest.raises(RunFolderError, match="differs in: modulus, stride"):
        execute_sweep(_plan(info, stride=2, modulus=4), CharBackend(), tmp_path, info)


def test_report_is_rebuilt_from_config_and_results_alone(tmp_path, info):
    execute_sweep(_plan(info), CharBackend(), tmp_path, info)
    first = build_report(tmp_path)
    summary_text = (tmp_path / "summary.json").read_text()
    for name in ["summary.json", "report.md", "accuracy_by_residue.png", "manifest.json"]:
        (tmp_path / name).unlink()
    again = build_report(tmp_path)
    assert again == first
    assert (tmp_path / "summary.json").read_text() == summary_text
    report = (tmp_path / "report.md").read_text()
    assert report.splitlines()[2].startswith("**") and "control run" in report
    assert (tmp_path / "accuracy_by_residue.png").read_bytes()[:4] == b"\x89PNG"


def test_results_have_the_documented_columns(tmp_path, info):
    results = execute_sweep(_plan(info, padding="in-sequence"), CharBackend(), tmp_path, info)
    for column in ["residue", "phase", "target_pos", "correct", "logprob", "answer", "predicted"]:
        assert column in results.columns
    assert (results["target_pos"] % 8 == results["residue"]).all()
    assert (results["query_pos"] == 1500).all()


def test_rows_from_a_different_probe_layout_are_refused(tmp_path, info):
    plan = _plan(info)
    execute_sweep(plan, CharBackend(), tmp_path, info)
    path = tmp_path / "results.csv"
    frame = pd.read_csv(path)
    frame.loc[0, "target_pos"] += 1
    frame.to_csv(path, index=False)
    with pytest.raises(RunFolderError, match="not the one this version of kvphase plans"):
        execute_sweep(plan, CharBackend(), tmp_path, info)
