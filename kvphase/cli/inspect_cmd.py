"""`kvphase inspect MODEL`: what a GGUF file declares, from metadata only."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from kvphase.cli import app
from kvphase.cli.text import markup, plain
from kvphase.sweep.api import inspect as read_model_info


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
        *([("weights", f"not in this file (header-only, kvphase header); the model: {info.weights_size / 2**20:,.1f} MiB")]
          if info.weights_size is not None else []),
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


@app.command()
def header(
    model: Path = typer.Argument(..., help="A .gguf model file, or the first shard of a split model."),
    out: Path = typer.Argument(..., help="Where to write the header-only .gguf file."),
) -> None:
    """Write a model's metadata and vocabulary without its weights: MBs that `sweep --backend server`,
    `--dry-run` and `inspect` read in place of a model held elsewhere."""
    from kvphase.gguf.header_only import write_header_only

    written = write_header_only(model, out)
    shards = f" in {written.n_shards} shards" if written.n_shards > 1 else ""
    typer.echo(f"wrote {plain(written.path)}: {written.size / 2**20:,.1f} MiB, the header of a "
               f"{written.source_size / 2**20:,.1f} MiB model ({written.n_tensors} tensors{shards} listed, no weights)")
