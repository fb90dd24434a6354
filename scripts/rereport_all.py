"""Rebuild every committed run folder's summary, report and figure with the current rules.

Every folder under the given roots (default: reports/) that holds a config.json is rebuilt by
`kvphase report`, in process and deepest first (a training folder's own sweep before it), and
every folder `kvphase compare` wrote is compared again from its runs. Prints one line per folder
and, at the end, which folders' verdicts changed. Run after a change to the statistics or the
report's words: `python scripts/rereport_all.py [ROOT ...]`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.errors import KvphaseError
from kvphase.sweep.compare import CSV_FILE, write_comparison

ROOT = Path(__file__).resolve().parents[1]


def verdict(folder: Path) -> str | None:
    try:
        return json.loads((folder / "summary.json").read_text(encoding="utf-8")).get("verdict")
    except (OSError, ValueError, AttributeError):
        return None


def main(roots: list[str]) -> int:
    os.chdir(ROOT)
    # only what was reported before: some probe folders keep their rows and no report of their own
    folders = sorted({path.parent for root in roots or ["reports"] for path in (ROOT / root).rglob("config.json")
                      if (path.parent / "summary.json").exists()},
                     key=lambda folder: (-len(folder.parts), str(folder)))
    runner, changed, failed = CliRunner(), [], []
    for number, folder in enumerate(folders, 1):
        before = verdict(folder)
        result = runner.invoke(app, ["report", str(folder)])
        after = verdict(folder)
        if result.exit_code:
            failed.append(f"{folder.relative_to(ROOT)}: {result.output.strip().splitlines()[-1:]}")
        elif before != after:
            changed.append(f"{folder.relative_to(ROOT)}: {before} -> {after}")
        print(f"[{number}/{len(folders)}] {folder.relative_to(ROOT)}: exit {result.exit_code}, {after}", flush=True)
    for number, table in enumerate(sorted(path for root in roots or ["reports"] for path in (ROOT / root).rglob(CSV_FILE)), 1):
        try:
            # the runs as the table names them (relative to the repository, as compared)
            write_comparison([Path(run) for run in pd.read_csv(table)["run_dir"]], table.parent)
        except KvphaseError as error:
            failed.append(f"{table.parent.relative_to(ROOT)}: {error}")
        print(f"[compare {number}] {table.parent.relative_to(ROOT)}", flush=True)
    print("\nverdicts changed:\n" + "\n".join(changed or ["none"]))
    print("\nnot rebuilt:\n" + "\n".join(failed or ["none"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
