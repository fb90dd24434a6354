"""`kvphase make-tiny ARCH OUT.gguf`: a tiny random-weight model of a compressed architecture."""

from __future__ import annotations

from inspect import signature
from pathlib import Path
from typing import Optional

import typer

from kvphase.cli import app
from kvphase.cli.text import plain
from kvphase.gguf.tiny import DENSE_TINY_ARCHS, RELEASED_SHAPES, SHAPED_CONTEXT, TINY_ARCHS, write_tiny_model

TINY_DEFAULTS = {name: p.default for name, p in signature(write_tiny_model).parameters.items()}  # the writer's own


@app.command("make-tiny")
def make_tiny(
    arch: str = typer.Argument(..., help=f"Architecture: {', '.join(TINY_ARCHS)} (compressed, for `validate`), "
                                         f"or {', '.join(DENSE_TINY_ARCHS)} (layouts of the numpy reference model)."),
    out: Path = typer.Argument(..., help="Where to write the .gguf file."),
    seed: int = typer.Option(TINY_DEFAULTS["seed"], help="Seed of the random weights; the same seed writes the same file."),
    yarn_factor: float = typer.Option(TINY_DEFAULTS["yarn_factor"], help="Declare YaRN RoPE scaling by this factor (deepseek4 only)."),
    tokenizer_from: Optional[Path] = typer.Option(None, "--tokenizer-from", "--vocab-from", help="Take this GGUF's tokenizer, so "
                                                  "`kvphase sweep` runs on the tiny model (fast tests); `default`: "
                                                  "the bundled default model's."),
    shape: Optional[str] = typer.Option(None, help=f"A released model's indexer and window settings: "
                                                   f"{', '.join(RELEASED_SHAPES)} (the file then declares a "
                                                   f"{SHAPED_CONTEXT}-token context)."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="The indexer's top_k instead of the tiny or "
                                                              "released one (the same weights, another reach)."),
) -> None:
    """Write a tiny random-weight GGUF that llama.cpp loads and runs (for tests, `validate` and the reference model)."""
    if tokenizer_from == Path("default") and not tokenizer_from.exists():
        from kvphase.defaults import default_model_path

        tokenizer_from = default_model_path()
    path = write_tiny_model(arch, out, seed=seed, yarn_factor=yarn_factor, tokenizer_from=tokenizer_from,
                            shape=shape, top_k=top_k)
    yarn = f", YaRN x{yarn_factor:g}" if yarn_factor else ""
    shaped = f", {shape}'s indexer" if shape else ""
    typer.echo(f"wrote {plain(path)} ({path.stat().st_size / 1024:,.0f} KiB, {arch}, seed {seed}{yarn}{shaped})")
