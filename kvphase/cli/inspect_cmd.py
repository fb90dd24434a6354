"""`kvphase inspect MODEL`: what a GGUF file declares, from metadata only."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from kvphase.cli import app
from kvphase.cli.text import markup
from kvphase.gguf.modelinfo import read_model_info


@app.command()
def inspect(model: Path = typer.Argument(..., help="Path to a .gguf model file.")) -> None:
    """Show a model's architecture, size, context and compression spec (reads no weights)."""
    info = read_model_info(model)
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    rows = [
        ("file", str(info.path)),
        ("name", info.name),
        ("architecture", info.architecture),
        ("file size", f"{info.file_size / 2**20:,.1f} MiB"),
        ("parameters", f"{info.n_params / 1e6:,.1f} M"),
        ("quantization", info.quantization),
        ("layers", str(info.n_layers)),
        ("context length", f"{info.context_length} tokens"),
        ("tokenizer", f"{info.tokenizer_model}, {info.vocab_size} tokens"),
        ("compression", info.compression.describe()),
    ]
    for name, value in rows:
        table.add_row(name, markup(value))
    Console().print(table)
