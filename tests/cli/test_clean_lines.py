"""Smaller cases of issue 77, each one clean line: a missing indexer key named missing by `inspect`,
garbage scoring answers not blamed on the server's version, `--engine openai` against a llama-server
named as the engine mismatch it is, conflicting or unknown sweep options, a flag given both ways."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.gguf.tiny import write_tiny_model
from tests.helpers.cli_checks import one_line_error

runner = CliRunner()
TOP_K = b"deepseek4.attention.indexer.top_k"


def test_inspect_names_a_missing_indexer_key_missing_not_zero(tmp_path):
    model = write_tiny_model("deepseek4", tmp_path / "ds4.gguf", seed=0)
    data = model.read_bytes()
    assert data.count(TOP_K) == 1
    renamed = tmp_path / "no-top-k.gguf"
    renamed.write_bytes(data.replace(TOP_K, TOP_K[:-1] + b"X"))  # the same length: the file stays well-formed
    result = runner.invoke(app, ["inspect", str(renamed)])
    one_line_error(result, "deepseek4.attention.indexer.top_k is missing, expected a positive whole number")
