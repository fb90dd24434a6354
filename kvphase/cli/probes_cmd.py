"""Mechanism probes: `kvphase gates MODEL` (static gate concentration from weights)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kvphase.cli import app
from kvphase.cli.text import plain


@app.command()
def gates(
    model: Path = typer.Argument(..., help="A GGUF with per-phase gate biases: glm5-next, deepseek4 or a kvphase-trained gated/kpool model."),
    out: Optional[Path] = typer.Option(None, help="Run folder; default reports/<model>-gates."),
    layer: Optional[List[int]] = typer.Option(None, help="Only this layer (repeatable); default every layer with a gate bias."),
) -> None:
    """Static gate concentration: per layer and channel, the phase the per-phase bias favours, its share and entropy."""
    from kvphase.probes.folder import REPORT_FILE
    from kvphase.probes.gates import run_gates

    run_dir = out or Path("reports") / f"{model.name.removesuffix('.gguf')}-gates"
    typer.echo(plain(run_gates(model, run_dir, layer or None), limit=2000))
    typer.echo(f"Report: {plain(run_dir / REPORT_FILE)}")
