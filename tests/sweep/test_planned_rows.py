"""`kvphase report` and a resume check a folder's rows against its plan (issue 56): a residue,
position, phase, query position, target id or context the plan cannot produce, or more rows of a
residue than it plans, is one line naming the file's line, never a summary of made-up targets."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.errors import RunFolderError
from kvphase.gguf.modelinfo import read_model_info
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.report import build_report
from kvphase.sweep.run import check_run_dir, execute_sweep
from tests.helpers.cli_checks import one_line_error
from tests.helpers.fakes import CharBackend

PER_RESIDUE, MODULUS, STRIDE, CONTEXT = 2, 8, 4, 1500


@pytest.fixture(scope="module")
def clean(tmp_path_factory, default_model):
    """A finished run of 16 targets (the fake backend: no model runs), its plan and model info."""
    info = read_model_info(default_model)
    plan = SweepPlan(model=str(info.path), task="records", stride=STRIDE, modulus=MODULUS, context=CONTEXT,
                     per_residue=PER_RESIDUE, padding="prefix", seed=1, control=True, backend="fake")
    out = tmp_path_factory.mktemp("planned") / "run"
    execute_sweep(plan, CharBackend(), out, info)
    return out, plan, info


def _damaged(clean, tmp_path, damage) -> tuple:
    """A copy of the clean run whose results.csv `damage(frame)` changed (every cell as text)."""
    out, plan, info = clean
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    frame = pd.read_csv(copy / "results.csv", dtype=str, keep_default_na=False)
    damage(frame)
    frame.to_csv(copy / "results.csv", index=False)
    return copy, plan, info


def _row_of_residue(frame: pd.DataFrame, residue: int) -> int:
    return int(frame.index[frame["residue"].astype(int) == residue][0])


def _set(frame: pd.DataFrame, row: int, **cells) -> None:
    for column, value in cells.items():
        frame.loc[row, column] = str(value)


def _moved_into_residue_0(frame: pd.DataFrame) -> int:
    """A residue-1 row moved 7 tokens on, into residue 0 with its phase: residue 0 now has one row
    more than the plan's PER_RESIDUE (every cell of it consistent)."""
    row = _row_of_residue(frame, 1)
    position = int(frame.loc[row, "target_pos"]) + 7
    _set(frame, row, target_pos=position, residue=position % MODULUS, phase=position % STRIDE)
    return row


DAMAGES = {  # what is changed -> (the change, the column named, what it expects)
    "residue 99": (lambda f: _set(f, 3, residue=99), 3, "residue", f"target_pos mod {MODULUS}"),
    "a target id beyond the plan": (lambda f: _set(f, 5, target_id=99999), 5, "target_id",
                                    f"below {PER_RESIDUE * MODULUS}"),
    "a position past the context": (lambda f: _set(f, 0, target_pos=CONTEXT + 8), 0, "target_pos",
                                    f"below the plan's context of {CONTEXT} tokens"),
    "a phase not the position's": (lambda f: _set(f, 7, phase=(int(f.loc[7, "target_pos"]) + 1) % STRIDE), 7, "phase",
                                   f"target_pos mod {STRIDE}"),
    "a query elsewhere": (lambda f: _set(f, 2, query_pos=CONTEXT - 1), 2, "query_pos", f"{CONTEXT}, the plan's context"),
    "a context beyond the targets": (lambda f: _set(f, 4, context=10**6), 4, "context", "below 16"),
}


@pytest.mark.parametrize("name", DAMAGES)
def test_report_and_resume_name_the_first_row_the_plan_cannot_make(clean, tmp_path, name):
    damage, row, column, expected = DAMAGES[name]
    out, plan, info = _damaged(clean, tmp_path, damage)
    line = f"{out / 'results.csv'} line {row + 2}: {column} is "
    for check in (lambda: build_report(out), lambda: check_run_dir(out, plan, info)):
        with pytest.raises(RunFolderError) as error:
            check()
        assert str(error.value).startswith(line) and f"expected {expected}" in str(error.value), str(error.value)


def test_more_rows_of_a_residue_than_planned_are_named(clean, tmp_path):
    """Every cell consistent, but residue 0 holds one row more than the plan's PER_RESIDUE (it was
    summarized as n_targets 17 of 16)."""
    moved = []
    out, plan, info = _damaged(clean, tmp_path, lambda f: moved.append(_moved_into_residue_0(f)))
    frame = pd.read_csv(out / "results.csv")
    third = int(frame.index[frame["residue"] == 0][PER_RESIDUE])  # the row past the plan's count, in file order
    with pytest.raises(RunFolderError, match=f"line {third + 2}: residue is '0', expected a residue with fewer than "
                                             f"the plan's {PER_RESIDUE} rows so far"):
        build_report(out)


def test_made_up_rows_are_not_summarized(clean, tmp_path):
    """A thousand hand-made rows after a 16-target run's (they were summarized as 1016 targets)."""
    out, *_ = _damaged(clean, tmp_path, lambda f: None)
    rows = pd.read_csv(out / "results.csv", dtype=str, keep_default_na=False)
    made_up = pd.concat([rows.iloc[[0]]] * 1000, ignore_index=True)
    made_up["target_id"] = [str(16 + i) for i in range(1000)]
    pd.concat([rows, made_up], ignore_index=True).to_csv(out / "results.csv", index=False)
    result = CliRunner().invoke(app, ["report", str(out)])
    one_line_error(result, f"line {len(rows) + 2}: target_id is '16', expected below 16")
    assert not (out / "summary.json").exists()  # nothing summarized


def test_the_clean_run_passes(clean):
    out, plan, info = clean
    build_report(out)
    check_run_dir(out, plan, info)


def _scored_again(frame: pd.DataFrame) -> None:
    """Row 3 appended again with the other outcome (a second scoring of target 3's target id)."""
    again = frame.iloc[[3]].copy()
    again["correct"] = "False" if frame.loc[3, "correct"] == "True" else "True"
    frame.loc[len(frame)] = again.iloc[0]


def test_a_target_scored_twice_is_refused_naming_both_lines(clean, tmp_path):
    """The second row of a target id with the other outcome was ignored (the first counted)."""
    out, plan, info = _damaged(clean, tmp_path, _scored_again)
    rows = pd.read_csv(out / "results.csv", dtype=str)
    target = rows.loc[3, "target_id"]
    for check in (lambda: build_report(out), lambda: check_run_dir(out, plan, info)):
        with pytest.raises(RunFolderError) as error:
            check()
        assert str(error.value).startswith(f"{out / 'results.csv'} lines 5 and {len(rows) + 1} both hold target_id "
                                           f"{target};"), str(error.value)
    before = {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()}
    one_line_error(CliRunner().invoke(app, ["report", str(out)]), "lines 5 and", "both hold target_id")
    assert {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()} == before  # nothing rewritten
