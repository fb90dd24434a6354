"""`kvphase compare RUN_DIR...`: several runs in one table and one figure."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from kvphase.cli import app
from kvphase.cli.options import own_folder
from kvphase.cli.text import markup, plain
from kvphase.sweep.options import COMPARISON_DIR

VERDICT_WIDTH = 16  # characters: the longest verdict word, "uninformative,", on a line of its own


@app.command()
def compare(
    run_dirs: Optional[List[Path]] = typer.Argument(None, metavar="RUN_DIR", show_default=False,
                                                    help="Run folders written by `kvphase sweep`."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Folder for comparison.md, comparison.png and comparison.csv; "
                                       f"default {COMPARISON_DIR}."),
) -> None:
    """Put several runs side by side: one table and one accuracy-by-residue figure."""
    from kvphase.sweep.api import compare as compare_runs
    from kvphase.sweep.compare import display_table  # scipy: imported when used

    comparison = compare_runs(run_dirs or [], out)
    frame = display_table(comparison.runs)
    table = Table(title="Accuracy by residue, run by run")
    for column in frame.columns:
        # a long verdict ("uninformative, too few targets") wraps at its words rather than squeezing the run's names
        table.add_column(column, justify="right" if column in {"S", "L", "n"} else "left", overflow="fold",
                         max_width=VERDICT_WIDTH if column == "verdict" else None)
    for row in frame.itertuples(index=False):
        table.add_row(*(markup(v) for v in row))
    Console().print(table)
    echo_readings(comparison)
    typer.echo(f"Table: {plain(comparison.markdown)}")
    typer.echo(f"Figure: {plain(comparison.figure)}")
    typer.echo(f"CSV: {plain(comparison.csv)}")


def echo_readings(comparison) -> None:
    """Each run read against a smaller stride, one line each (`Comparison.readings`)."""
    for label, reading in comparison.readings:
        typer.echo(f"{plain(label)}: {reading.sentence()}")
