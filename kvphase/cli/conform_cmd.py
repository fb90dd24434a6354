"""`kvphase conform`: does an engine run the compressed reference models right? PASS, FAIL or
cannot run per model, written to a run folder; exit 1 on any FAIL (a CI gate)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kvphase.cli import app, raise_if_interrupted
from kvphase.cli.options import own_folder
from kvphase.backends.transport import Retry
from kvphase.cli.sweep_cmd import BackendName, Say, ServerEngine
from kvphase.cli.text import plain
from kvphase.conform.check import EngineChoice


@app.command()
def conform(
    backend: BackendName = typer.Option(EngineChoice.backend, help="The engine: llama.cpp in process, the numpy reference, "
                                        "or servers (--url) holding the reference model --model names."),
    url: list[str] = typer.Option([], "--url", help="--backend server: a server holding the model, repeatable."),
    engine: ServerEngine = typer.Option(EngineChoice.server_engine, help="--backend server: llama-server, an "
                                        "OpenAI-compatible engine (vLLM), or SGLang's native API."),
    model: list[str] = typer.Option([], "--model", "-m", help="A reference model to check, by name or as a file "
                                    "identical to one, repeatable; default every reference (--backend server: the "
                                    "one its servers hold, asked of them)."),
    references: Optional[Path] = typer.Option(None, help="A JSON list of references ({name, model, folder, check, "
                                              "what}, paths relative to the file); default kvphase's own."),
    contexts: int = typer.Option(EngineChoice.contexts, help="Contexts of each folder's plan to run (its first whole "
                                 "rounds of residues); 0: all of them."),
    margin: float = typer.Option(EngineChoice.margin, help="Points of accuracy a residue may move and still pass (the "
                                 "equivalence test's margin)."),
    logprob_tolerance: float = typer.Option(EngineChoice.logprob_tolerance, "--logprob-tolerance", help="Nats a target's "
                                            "log-probability may move (the random-weight references' check)."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    request_timeout: Optional[float] = typer.Option(None, "--request-timeout", metavar="SECONDS", help="--backend "
                                                    f"server: the longest one request may take; default {Retry.request_timeout:g}."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/conform-<backend>."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the summary line."),
) -> None:
    """Check an engine: run each reference model on its committed folder's plan and compare, residue by residue."""
    from kvphase.conform.check import chosen_references, conform as run_conform
    from kvphase.conform.page import headline

    choice = EngineChoice(backend.value, tuple(url), engine.value, threads, request_timeout, contexts, margin,
                          logprob_tolerance)

    def say(line: str) -> None:
        raise_if_interrupted()
        if not quiet:
            typer.echo(plain(line))

    run = run_conform(chosen_references(choice, model, references), choice, out, say, on_notice=Say(quiet=False))
    typer.echo(plain(headline(run)))
    typer.echo(f"Report: {plain(run.folder / 'report.md')}")
    if run.failed:
        raise typer.Exit(1)
