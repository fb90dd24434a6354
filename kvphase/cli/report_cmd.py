"""`kvphase report RUN_DIR`: rebuild a run's summary, report and figure from its files."""

from __future__ import annotations

from pathlib import Path

import typer

from kvphase.cli import app
from kvphase.cli.text import plain


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run folder written by `kvphase sweep` or `kvphase train`.")) -> None:
    """Rebuild summary.json, report.md and the figure from config.json and results.csv."""
    from kvphase.probes.folder import rebuild_probe_report
    from kvphase.runfolder import REPORT_FILE

    if (headline := rebuild_probe_report(run_dir)) is not None:  # a `kvphase gates` (or other probe) folder
        typer.echo(plain(headline, limit=2000))
        typer.echo(f"Report: {plain(run_dir / REPORT_FILE)}")
        return
    if _is_theory_dir(run_dir):  # `kvphase theory` keeps no gate logits: its study runs again (seconds, deterministic)
        from kvphase.theory.report import headline as theory_headline
        from kvphase.theory.study import rerun_study

        typer.echo(plain(theory_headline(rerun_study(run_dir)), limit=2000))
        typer.echo(f"Report: {plain(run_dir / REPORT_FILE)}")
        return
    from kvphase.train.run import is_train_dir

    if is_train_dir(run_dir):
        from kvphase.train.report import build_training_report, headline

        typer.echo(headline(build_training_report(run_dir)))
        typer.echo(f"Report: {run_dir / REPORT_FILE}")
        return
    from kvphase.sweep.api import report as rebuild_report  # scipy: imported when used, not at start-up

    from kvphase.cli.sweep_cmd import echo_run

    echo_run(rebuild_report(run_dir))


def _is_theory_dir(run_dir: Path) -> bool:
    """A folder `kvphase theory` wrote: its config.json holds a "theory" object."""
    import json

    try:
        return "theory" in json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False  # the sweep's reader says what is wrong with the folder
