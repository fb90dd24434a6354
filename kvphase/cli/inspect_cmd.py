"""`kvphase inspect MODEL`: what a GGUF file declares, from metadata only."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from kvphase.cli import app
from kvphase.cli.text import markup, plain
from kvphase.gguf.reach import reach_of
from kvphase.sweep.api import inspect as read_model_info


@app.command()
def inspect(model: str = typer.Argument(..., help="A .gguf model file (or its head, cut after the tensor table), "
                                                    "its http(s) URL, or an HF checkpoint folder.")) -> None:
    """Show a model's architecture, size, context and compression spec (reads no weights)."""
    info = read_model_info(model, partial=True)
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    rows = [
        ("file", str(info.path)),
        ("name", info.name),
        ("architecture", info.architecture),
        ("file size", file_size(info.file_size)),
        *([("weights", f"not in this file (header-only, kvphase header); the model: {file_size(info.weights_size)}")]
          if info.weights_size is not None else []),
        *([("weights", f"cut short: the file ends inside its tensor data, which runs to {info.needed_size / 2**20:,.1f} MiB")]
          if info.needed_size is not None else []),
        ("parameters", f"{info.n_params / 1e6:,.1f} M"),
        ("quantization", info.quantization),
        ("layers", str(info.n_layer)),
        ("context length", f"{info.context_length} tokens"),
        ("tokenizer", f"{info.tokenizer_model}, {info.vocab_size} tokens"),
        ("compression", info.compression.describe()),
        *(("reach", line) for line in reach_of(info.compression, info.declared_keys).lines()),
    ]
    for name, value in rows:
        table.add_row(name, markup(value))
    Console().print(table)


@app.command()
def header(
    model: str = typer.Argument(..., help="A .gguf model file or the first shard of a split model (or its head, cut "
                                          "after the tensor table), or its http(s) URL."),
    out: Path = typer.Argument(..., help="Where to write the header-only .gguf file."),
) -> None:
    """Write a model's metadata and vocabulary without its weights: MBs that `sweep --backend server`,
    `--dry-run` and `inspect` read in place of a model held elsewhere."""
    from kvphase.gguf.header_only import write_header_only

    written = write_header_only(model, out)
    shards = f" in {written.n_shards} shards" if written.n_shards > 1 else ""
    typer.echo(f"wrote {plain(written.path)}: {file_size(written.size)}, the header of a "
               f"{file_size(written.source_size)} model ({written.n_tensors} tensors{shards} listed, no weights)")


def file_size(n_bytes: int) -> str:
    """MiB to one decimal, or KiB below a tenth of a MiB (a tiny model's header would read 0.0 MiB)."""
    if n_bytes < 2**20 / 10:
        return f"{n_bytes / 2**10:,.1f} KiB"
    return f"{n_bytes / 2**20:,.1f} MiB"
