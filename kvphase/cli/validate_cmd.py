"""`kvphase validate MODEL`: are the numpy reference designs equal to llama.cpp's compression?"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from kvphase.cli import app
from kvphase.cli.options import GPU_LAYERS
from kvphase.cli.text import markup
from kvphase.errors import PlanError
from kvphase.validate.options import (DEFAULT_CACHE_TYPE, DEFAULT_SEED, DEFAULT_TOKENS, NO_PERTURBATION, Tolerances,
                                     deepseek4_tokens)

HCA_RATIO = 128  # deepseek4's largest compress ratio, which its default prompt length is named by


@app.command()
def validate(
    model: Path = typer.Argument(..., help="GGUF model of glm5-next, minimax-m3 or deepseek4; or an HF checkpoint "
                                 "folder of glm5-next or minimax-m3 (its indexer run by transformers, one forward)."),
    tokens: Optional[int] = typer.Option(None, help="Prompt length (seeded random token ids); default: "
                                         f"{DEFAULT_TOKENS}, deepseek4 {deepseek4_tokens([HCA_RATIO])} (two "
                                         f"ratio-{HCA_RATIO} blocks and a tail)."),
    seed: int = typer.Option(DEFAULT_SEED, help="Seed of the prompt."),
    split: Optional[List[str]] = typer.Option(
        None, help="A batch split such as 19,5,11,29 (repeatable); default: three splits incl. decode batches."
    ),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    gpu_layers: int = GPU_LAYERS,
    keys_tol: float = typer.Option(Tolerances.keys_abs, "--keys-tol", help="Max absolute difference of compressed keys."),
    scores_tol: float = typer.Option(Tolerances.scores_rel, "--scores-tol", help="Max score difference, relative to the largest score."),
    attention_tol: float = typer.Option(Tolerances.attention_rel, "--attention-tol", help="Max attention output difference (deepseek4), "
                                        "relative to the largest output."),
    perturb: int = typer.Option(NO_PERTURBATION, help="Deliberately shift the reference's phase by this much (shows a FAIL)."),
    cache_type: str = typer.Option(DEFAULT_CACHE_TYPE, "--cache-type", help="KV/indexer cache type: f32, or f16 (llama.cpp's "
                                   "default; the reference rounds where llama.cpp rounds)."),
    cache: Optional[str] = typer.Option(None, "--cache", hidden=True, help="The former name of --cache-type."),
    engine: str = typer.Option("llama.cpp", help="llama.cpp, or transformers: a deepseek4 file exported to HF layout "
                               "(export-hf) and read through transformers' deepseek_v4 by forward hooks, one split."),
) -> None:
    """Run MODEL through llama.cpp under several batch splits; compare every compressed layer to the reference."""
    from kvphase.validate.run import validate_file

    cache = _cache_type(cache_type, cache)
    splits = [_parse_split(s) for s in split] if split else None
    status = Console(stderr=True)
    if engine not in ("llama.cpp", "transformers"):
        raise PlanError(f"--engine {engine!r}: expected llama.cpp or transformers")
    if engine == "transformers":
        from kvphase.validate.hf_dsv4 import validate_through_transformers

        report = validate_through_transformers(model, tokens, seed, Tolerances(keys_tol, scores_tol, attention_tol))
        _print(report)
        if not report.passed:
            raise typer.Exit(1)
        return

    def on_split(index: int, count: int, sizes) -> None:
        batches = f"{len(sizes)} batch" + ("es" if len(sizes) != 1 else "")
        status.print(f"[dim]split {index + 1}/{count}: {batches}, {sum(sizes)} tokens...[/dim]")

    tolerances = Tolerances(keys_tol, scores_tol, attention_tol)
    if model.is_dir():  # an HF checkpoint: its indexer as transformers runs it, against the same designs
        from kvphase.validate.transformers_indexer import validate_checkpoint

        report = validate_checkpoint(model, tokens, seed, tolerances)
    else:
        report = validate_file(model, tokens, seed, splits, tolerances, threads, gpu_layers, perturb, cache, on_split)
    _print(report)
    if not report.passed:
        raise typer.Exit(1)


def _cache_type(cache_type: str, former: Optional[str]) -> str:
    """--cache-type, the name `sweep` uses too; the former --cache still works, with a line saying so."""
    if former is None:
        return cache_type
    if cache_type not in (DEFAULT_CACHE_TYPE, former):  # both names given, with different values
        raise PlanError(f"--cache {former} and --cache-type {cache_type} disagree; give --cache-type only")
    typer.echo("kvphase validate: --cache is deprecated, use --cache-type (the name sweep uses)", err=True)
    return former


def _parse_split(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise PlanError(f"a batch split is comma-separated token counts such as 19,5,40; got {text!r}") from None


def _diff(diff) -> str:
    return f"{diff.max:.1e} / {diff.mean:.1e}" if diff.count else "-"


def _print(report) -> None:
    """The report (`validate.report.ValidationReport`) as a table and a verdict."""
    console = Console()
    tol = report.tolerances
    console.print(f"{markup(report.model.name)}: {markup(report.architecture)} ({report.family}), {report.n_tokens} tokens, "
                  f"splits {'; '.join(','.join(map(str, s)) for s in report.splits)}")
    table = Table()
    attention = any(layer.attention.count for layer in report.layers)
    columns = ["layer", "keys |d| max / mean", "scores |d| max / mean", "top score", "sets exact", "up to ties"]
    for column in columns + (["attention |d| max / mean"] if attention else []) + [""]:
        table.add_column(column, justify="right")
    for layer in report.layers:
        row = [str(layer.layer), _diff(layer.keys), _diff(layer.scores), f"{layer.score_scale:.3g}",
               f"{layer.exact}/{layer.rows}", f"{layer.exact + layer.ties}/{layer.rows}"]
        row += [_diff(layer.attention)] if attention else []
        table.add_row(*row, "[green]PASS[/green]" if not layer.failures(tol) else "[red]FAIL[/red]")
    console.print(table)
    console.print(f"tolerances: keys within {tol.keys_abs:g}; scores within {tol.scores_rel:g} x the largest score; "
                  "selected sets equal except exact ties"
                  + (f"; attention outputs within {tol.attention_rel:g} x the largest output" if attention else ""))
    for layer in report.layers:
        for reason in layer.failures(tol):
            console.print(f"layer {layer.layer}: {markup(reason, 2000)}")
        ties = [note for note in layer.notes if note.startswith("first tie")]  # where two right answers may part
        for note in layer.notes[:3] if layer.failures(tol) else ties:
            console.print(f"  {markup(note, 2000)}")
    console.print("[bold green]PASS[/bold green]" if report.passed else "[bold red]FAIL[/bold red]")
