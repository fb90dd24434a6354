"""A sweep's rows checked against the plan that made them: what a hand-edited, mixed or damaged
results.csv holds that the plan cannot produce is named (its first row), never summarized."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from kvphase.errors import RunFolderError


class PlannedRun(Protocol):
    """What of a sweep's plan (`SweepPlan`) bounds its rows."""

    stride: int
    modulus: int
    context: int
    per_residue: int
    query_phases: bool

    def query_positions(self, contexts: np.ndarray) -> np.ndarray:
        """Where the plan starts the query of each of `contexts` (context indices)."""
        ...


def check_planned_rows(path: Path, rows: pd.DataFrame, plan: PlannedRun) -> None:
    """RunFolderError naming the first row of `path` the plan cannot have made: a target id beyond
    its per_residue x M targets, a position outside its context, a residue or phase that is not the
    position's, a query elsewhere than at the context's end, a context index beyond its targets, or
    more rows of one residue than it plans. `rows` as `load_results` reads them (numbers parsed, one
    row per target id, the file's row order in the index)."""
    if rows.empty:
        return
    targets = plan.per_residue * plan.modulus
    position = rows["target_pos"].to_numpy()  # (rows,)
    checks = [
        ("target_id", rows["target_id"].to_numpy() >= targets, f"below {targets} (the plan's {plan.per_residue} "
                                                              f"targets per residue x modulus {plan.modulus})"),
        ("target_pos", position >= plan.context, f"below the plan's context of {plan.context} tokens"),
        ("residue", rows["residue"].to_numpy() != position % plan.modulus, f"target_pos mod {plan.modulus}"),
        ("phase", rows["phase"].to_numpy() != position % plan.stride, f"target_pos mod {plan.stride}"),
        ("query_pos", rows["query_pos"].to_numpy() != plan.query_positions(rows["context"].to_numpy()),
         f"{plan.context}, the plan's context" if not plan.query_phases else
         f"{plan.context} plus the context's query phase"),
        ("context", rows["context"].to_numpy() >= targets, f"below {targets} (every context holds a target)"),
    ]
    for column, bad, expected in checks:
        _refuse_first(path, rows, column, bad, expected)
    seen = rows.groupby("residue").cumcount().to_numpy()  # (rows,) earlier rows of the same residue
    _refuse_first(path, rows, "residue", seen >= plan.per_residue,
                  f"a residue with fewer than the plan's {plan.per_residue} rows so far (more rows than targets)")


def _refuse_first(path: Path, rows: pd.DataFrame, column: str, bad: np.ndarray, expected: str) -> None:
    """One line naming the file's line of the first row flagged in `bad` (rows,)."""
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        line = int(rows.index[first]) + 2  # the header is line 1, the index is the file's row order
        value = _shown(rows[column].iloc[first])
        raise RunFolderError(f"{path} line {line}: {column} is {value!r}, expected {expected}; "
                             "the run's plan cannot have made this row (a hand-edited or mixed results file): "
                             "move the file away to score the run again")


def refuse_repeated_rows(path: Path, rows: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """`rows` (as `read_table` reads them: the file's row order in the index) when no two share
    `key`; RunFolderError naming the lines of the first two that do (a row scored twice with
    perhaps two outcomes: neither can be believed over the other)."""
    repeated = rows.duplicated(key, keep="first").to_numpy()  # (rows,) a later row of a key seen before
    if repeated.any():
        second = int(np.flatnonzero(repeated)[0])
        same = (rows[key] == rows[key].iloc[second]).all(axis=1).to_numpy()  # (rows,)
        first = int(np.flatnonzero(same)[0])
        named = ", ".join(f"{column} {_shown(rows[column].iloc[second])}" for column in key)
        raise RunFolderError(f"{path} lines {int(rows.index[first]) + 2} and {int(rows.index[second]) + 2} both hold "
                             f"{named}; a run scores each once (a hand-edited or mixed results file): move the file "
                             "away to score the run again")
    return rows


def _shown(value) -> str:
    """A cell as the file holds it (a numpy number as a Python one)."""
    return str(value.item() if hasattr(value, "item") else value)[:40]
