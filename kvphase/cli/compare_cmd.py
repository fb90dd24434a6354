"""`kvphase compare RUN_DIR...`: several runs in one table and one figure."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from kvphase.cli import app
from kvphase.sweep.compare import DEFAULT_OUT, display_table, write_comparison


@app.command()
def compare(
    run_dirs: Optional[List[Path]] = typer.Argument(None, metavar="RUN_DIR", show_default=False,
                                                    help="Run folders written by `kvphase sweep`."),
    out: Path = typer.Option(DEFAULT_OUT, help="Folder for comparison.md, comparison.png and comparison.csv."),
) -> None:
    """Put several runs side by side: one table and one accuracy-by-residue figure."""
    comparison = write_comparison(run_dirs or [], out)
    frame = display_table(comparison.runs)
    table = Table(title="Accuracy by residue, run by run")
    for column in frame.columns:
        table.add_column(column, justify="right" if column in {"S", "L", "n"} else "left", overflow="fold")
    for row in frame.itertuples(index=False):
        table.add_row(*(str(v) for v in row))
    Console().print(table)
    typer.echo(f"Table: {comparison.markdown}")
    typer.echo(f"Figure: {comparison.figure}")
    typer.echo(f"CSV: {comparison.csv}")
