"""Shared fixtures: the real default model through llama.cpp, and a fake backend."""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # BLAS threads beside llama.cpp's would fight over 2 cores

import pytest  # noqa: E402

from kvphase.defaults import default_model_path  # noqa: E402


@pytest.fixture(scope="session")
def default_model():
    return default_model_path()


@pytest.fixture(scope="session")
def llama_backend(default_model):
    from kvphase.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(default_model, n_ctx=2048, n_threads=2)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def tiny_llama(default_model, tmp_path_factory):
    """A two-layer llama (1.6 M parameters, F32) with SmolLM2's tokenizer, for the tests where the
    model is not the point: its sweeps take seconds where SmolLM2's take minutes."""
    from kvphase.gguf.tiny import write_tiny_model

    return write_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama") / "tiny-llama.gguf",
                            tokenizer_from=default_model)


@pytest.fixture(scope="session")
def default_sweep(tmp_path_factory):
    """`kvphase sweep` with no options (the README's main job, SmolLM2 at 1024 tokens), run once and
    read by every test that needs a real model's full run folder. Tests copy it before changing it."""
    from typer.testing import CliRunner

    from kvphase.cli import app

    out = tmp_path_factory.mktemp("default-sweep") / "demo"
    result = CliRunner().invoke(app, ["sweep", "--out", str(out), "--quiet"])
    assert result.exit_code == 0 and "Report:" in result.output, result.output
    return out
