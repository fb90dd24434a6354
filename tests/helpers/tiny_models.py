"""Tiny random-weight models of the compressed architectures, made as a user makes them: by the command."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

COMPRESSED_ARCHS = ("glm5-next", "deepseek4", "minimax-m3")  # llama.cpp's compressed graphs make-tiny writes


def made_by_make_tiny(folder: Path, vocab_from: Path, archs=COMPRESSED_ARCHS) -> Path:
    """`kvphase make-tiny ARCH FOLDER/ARCH.gguf --vocab-from MODEL` for each architecture: the folder."""
    from kvphase.cli import app

    for arch in archs:
        made = CliRunner().invoke(app, ["make-tiny", arch, str(folder / f"{arch}.gguf"), "--vocab-from", str(vocab_from)])
        assert made.exit_code == 0, made.output
    return folder
