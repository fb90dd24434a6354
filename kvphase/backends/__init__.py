"""Backends score teacher-forced queries after a shared context (`base.Backend`).

`BACKENDS` maps the name a plan records (`SweepPlan.backend`) to a factory
`factory(model, *, n_ctx, n_threads, options) -> Backend`; `model` is the opened model (a
`ModelInfo`, whose header is not read again) or a path, `options` the plan's `backend_options`.
Factories import their engine only when called, so importing this package loads neither
llama.cpp nor the reference model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from kvphase.backends.base import Backend
from kvphase.errors import PlanError
from kvphase.gguf.modelinfo import ModelInfo

Model = ModelInfo | str | Path


def llamacpp_backend(model: Model, *, n_ctx: int, n_threads: int | None = None,
                     options: dict | None = None) -> Backend:
    """The model in llama.cpp (`backends.llamacpp.LlamaCppBackend`). Options, each recorded by a
    plan only when it is not llama.cpp's default: `cache_type` (q8_0 or q4_0: the K and V cache
    type) and `gpu_layers` (layers offloaded to a GPU, 0: none); `selection` True (not recorded in
    backend_options: a plan's own field) installs the graph tap that selection records read."""
    from kvphase.backends.llamacpp import LlamaCppBackend
    from kvphase.engines.llamacpp import CACHE_TYPES

    options = dict(options or {})
    selection = options.pop("selection", False)
    cache_type = options.pop("cache_type", "f16")
    gpu_layers = options.pop("gpu_layers", 0)
    if options:
        raise PlanError(f"the llama.cpp backend takes no options but cache_type and gpu_layers, got {', '.join(options)}")
    if not isinstance(gpu_layers, int) or isinstance(gpu_layers, bool) or gpu_layers < -1:
        raise PlanError(f"gpu_layers must be a count of layers (0 or more, -1 for all), got {str(gpu_layers)[:40]!r}")
    if not isinstance(cache_type, str) or cache_type not in CACHE_TYPES:
        raise PlanError(f"cache_type must be one of {', '.join(CACHE_TYPES)}, got {str(cache_type)[:40]!r}")
    return LlamaCppBackend(model, n_ctx=n_ctx, n_threads=n_threads, cache_type=cache_type, n_gpu_layers=gpu_layers,
                           head_tap=selection)


def reference_backend(model: Model, *, n_ctx: int, n_threads: int | None = None,
                      options: dict | None = None) -> Backend:
    """The numpy reference model under the policy `options` names (`design` and its options);
    `n_ctx` and `n_threads` do not apply (numpy's BLAS picks its threads)."""
    from kvphase.backends.reference import ReferenceBackend
    from kvphase.reference.policy import make_policy

    options = dict(options or {})
    options.pop("selection", None)  # the file's own reference model records its selection when asked
    if options.get("design") == "trained":  # the compressor the file declares (kvphase train models)
        return ReferenceBackend(model, policy=None)
    return ReferenceBackend(model, policy=make_policy(**options))


def server_backend(model: Model, *, n_ctx: int, n_threads: int | None = None,
                   options: dict | None = None) -> Backend:
    """Running servers that hold the model (`backends.fleet.ServerBackend`). Options:
    `engine` ("llama-server" or "openai"; the plan records it), `urls` and `slots` (where
    it runs); `n_ctx` is checked against each server's, `n_threads` does not apply."""
    from kvphase.backends.fleet import open_server_backend

    return open_server_backend(model, n_ctx=n_ctx, **(options or {}))


def transformers_backend(model: Model, *, n_ctx: int, n_threads: int | None = None,
                         options: dict | None = None) -> Backend:
    """The model through transformers' own modeling code (`backends.hf.TransformersBackend`, the hf
    extra): an HF checkpoint folder, or a GGUF file transformers dequantizes; takes no options, and
    `n_ctx` does not apply (the cache grows as the context does)."""
    from kvphase.backends.hf import TransformersBackend
    from kvphase.gguf.modelinfo import as_model_info

    options = dict(options or {})
    options.pop("selection", None)
    if options:
        raise PlanError(f"the transformers backend takes no options, got {', '.join(options)}")
    return TransformersBackend(as_model_info(model), n_threads=n_threads)


BACKENDS: dict[str, Callable[..., Backend]] = {
    "llama.cpp": llamacpp_backend,
    "reference": reference_backend,
    "server": server_backend,
    "transformers": transformers_backend,
}

__all__ = ["BACKENDS", "Backend", "llamacpp_backend", "reference_backend", "server_backend", "transformers_backend"]
