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
