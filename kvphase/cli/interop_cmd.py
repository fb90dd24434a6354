"""`kvphase export lm-eval` and `kvphase import lm-eval`: a plan as an lm-evaluation-harness task,
and that task's logged samples back as a run folder (kvphase.interop.lm_eval)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kvphase.cli import app
from kvphase.cli.text import plain

export_app = typer.Typer(help="A sweep's plan as another harness's task.", no_args_is_help=True)
import_app = typer.Typer(help="Another harness's logged samples as a run folder.", no_args_is_help=True)
app.add_typer(export_app, name="export")
app.add_typer(import_app, name="import")


@export_app.command("lm-eval")
def export_lm_eval(
    source: Path = typer.Argument(..., help="A run folder (or its config.json): the plan whose targets become docs."),
    out: Path = typer.Argument(..., help="The folder for kvphase.yaml, docs.jsonl and export.json."),
    model: Optional[Path] = typer.Option(None, "--model", help="The plan's model file, where the path config.json "
                                         "names is not this machine's (the tokenizer checks each doc)."),
    name: Optional[str] = typer.Option(None, "--name", help="The task's name; default kvphase_ and the plan's hash."),
    flag_mismatches: bool = typer.Option(False, "--flag-mismatches", help="Keep the docs whose text does not "
                                         "re-tokenize to the planned ids, flagged, with where the re-tokenized "
                                         "text puts each target (default: refuse them)."),
) -> None:
    """Write an lm-eval task (generate_until) of the plan: run it with `lm_eval --model local-completions
    --include_path OUT --tasks NAME --log_samples`."""
    from kvphase.interop.lm_eval import export_task

    summary = export_task(source, out, model=model, name=name, flag_mismatches=flag_mismatches)
    refused = (f"; {summary['refused']} refused: their text does not tokenize back to the planned ids "
               f"(export.json lists them)") if summary["refused"] else ""
    flagged = (f", {summary['flagged']} flagged: their text tokenizes otherwise (each says where the "
               "re-tokenized text puts its target)") if summary["flagged"] else ""
    typer.echo(f"Task {summary['task']}: {summary['docs']} docs, {summary['retokenize_exactly']} re-tokenized to "
               f"their planned ids with {summary['model']}'s tokenizer{flagged}{refused}.")
    typer.echo(f"Run: lm_eval --model local-completions --include_path {plain(out)} --tasks {summary['task']} "
               "--log_samples --output_path OUT --model_args model=NAME,base_url=URL/v1/completions,"
               "tokenizer_backend=None,tokenized_requests=False")


@import_app.command("lm-eval")
def import_lm_eval(
    samples: Path = typer.Argument(..., help="lm-eval's samples_<task>_<date>.jsonl of an exported task."),
    out: Path = typer.Argument(..., help="The run folder to write (kvphase report reads it)."),
) -> None:
    """Turn lm-eval's logged samples into a run folder, with the sweep's statistics and report."""
    from kvphase.interop.lm_eval import import_samples
    from kvphase.sweep.api import report as rebuild_report

    run = rebuild_report(import_samples(samples, out))
    typer.echo(run.summary.headline())
    typer.echo(f"Report: {plain(run.report_path)}")
