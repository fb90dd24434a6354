"""`validate_model`: run a model through llama.cpp under several batch splits and compare
every compressed layer with its family's checker (see `kvphase.validate`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from kvphase.engines.capture import EngineSettings, run_and_capture
from kvphase.defaults import DEFAULT_GPU_LAYERS, default_threads
from kvphase.errors import ModelFileError, PlanError
from kvphase.gguf.limits import check_llama_limits
from kvphase.gguf.modelinfo import ModelInfo, as_model_info, read_model_info
from kvphase.validate.common import FamilyCheck
from kvphase.validate.dsv4 import DSV4Check
from kvphase.validate.kpool import KPoolCheck
from kvphase.validate.msa import MSACheck
from kvphase.validate.options import CACHE_TYPES, DEFAULT_CACHE_TYPE, DEFAULT_SEED, NO_PERTURBATION, Tolerances
from kvphase.validate.report import LayerCheck, ValidationReport


# --------------------------------------------------------------------------- batch splits


def default_splits(n_tokens: int, stride: int) -> list[list[int]]:
    """One prefill; batches that cut pools in the middle; a prefill followed by small decode batches.

    Batches above 16 tokens take llama.cpp's scatter (mask) path, 16 or fewer its gather path
    (`build_inp_kpool`: max_ub = 16), so each split mixes both.
    """
    if n_tokens < 24:
        raise PlanError(f"validation needs at least 24 tokens, got {n_tokens}")
    straddle, left = [], n_tokens
    for size in _cycle([17 + stride // 2, stride + 1, 2 * stride + 3, 3]):
        size = min(size, left)
        straddle.append(size)
        left -= size
        if not left:
            break
    tail = [1, 1, 1, 5]
    return [[n_tokens], straddle, [n_tokens - sum(tail)] + tail]


def _cycle(values: list[int]):
    while True:
        yield from values


def _check_split(split: Sequence[int], n_tokens: int) -> list[int]:
    split = [int(s) for s in split]
    if sum(split) != n_tokens or any(s <= 0 for s in split):
        raise PlanError(f"batch split {split} must be positive sizes summing to {n_tokens}")
    return split


FAMILIES: dict[str, Callable[..., FamilyCheck]] = {"kpool": KPoolCheck, "msa": MSACheck, "dsv4": DSV4Check}


# --------------------------------------------------------------------------- entry point




def validate_model(
    model: str | Path | ModelInfo,
    n_tokens: int | None = None,
    seed: int = DEFAULT_SEED,
    splits: Sequence[Sequence[int]] | None = None,
    tolerances: Tolerances = Tolerances(),
    settings: EngineSettings | None = None,
    perturb: int = NO_PERTURBATION,
    cache: str = DEFAULT_CACHE_TYPE,
    on_split: Callable[[int, int, Sequence[int]], None] | None = None,
) -> ValidationReport:
    """Run the model through llama.cpp under several batch splits and compare every compressed layer.

    `perturb` != 0 makes the reference deliberately wrong (its per-phase gate bias, or its
    block grid, shifted by that many positions) to show that the check can fail. `n_tokens`
    defaults to the family's need (64; deepseek4: two ratio-128 blocks and a tail), or the file's
    whole context where that is shorter.
    `on_split(index, count, split)` is called before each batch split runs.
    """
    info = as_model_info(model)
    family = info.compression.family
    if family not in FAMILIES:
        raise PlanError(
            f"{info.architecture} declares compression {family!r}; validation supports "
            f"{', '.join(sorted(FAMILIES))} (deepseek4, glm5-next, minimax-m3)"
        )
    if cache not in CACHE_TYPES:
        raise PlanError(f"unknown cache type {cache!r}; expected one of {', '.join(CACHE_TYPES)}")
    check_llama_limits(info.header)  # what llama.cpp would abort on, refused before it loads the file
    try:
        checker = FAMILIES[family](info, perturb, cache_dtype=cache)
    except ValueError as exc:  # a design refuses the file's compression settings
        raise ModelFileError(f"{info.path.name}: {exc}") from None
    if n_tokens is None:  # the family's need, within what the file holds (a trained model's context is short)
        n_tokens = min(checker.default_tokens, info.context_length or checker.default_tokens)
    n_tokens = int(n_tokens)
    if n_tokens < 1 or seed < 0:
        raise PlanError(f"--tokens must be at least 1 and --seed at least 0, got {n_tokens} and {seed}")
    if info.context_length and n_tokens > info.context_length:
        raise PlanError(f"--tokens {n_tokens} does not fit: {info.path.name} has a {info.context_length}-token context")
    stride = int(info.compression.stride or 4)
    plan = [_check_split(s, n_tokens) for s in splits] if splits else default_splits(n_tokens, stride)
    settings = settings or EngineSettings()
    settings = replace(settings, n_ctx=max(settings.n_ctx, _round_up(n_tokens + 16, 256)), kv_f32=cache == "f32")
    tokens = np.random.default_rng(seed).integers(0, max(info.vocab_size, 2), size=n_tokens)
    checks: dict[int, LayerCheck] = {}
    for i, split in enumerate(plan):
        if on_split is not None:
            on_split(i, len(plan), split)
        run = run_and_capture(info, tokens.tolist(), split, checker.want, settings)
        checker.compare(run, checks)
    for layer, reasons in checker.uncompared(n_tokens).items():
        checks.setdefault(layer, LayerCheck(layer)).uncompared.extend(reasons)
    return ValidationReport(
        model=info.path,
        architecture=info.architecture,
        family=family,
        n_tokens=n_tokens,
        splits=plan,
        tolerances=tolerances,
        layers=[checks[k] for k in sorted(checks)],
    )


def validate_file(model: str | Path, n_tokens: int | None = None, seed: int = DEFAULT_SEED,
                  splits: Sequence[Sequence[int]] | None = None, tolerances: Tolerances = Tolerances(),
                  threads: int | None = None, gpu_layers: int = DEFAULT_GPU_LAYERS, perturb: int = NO_PERTURBATION,
                  cache: str = DEFAULT_CACHE_TYPE,
                  on_split: Callable[[int, int, Sequence[int]], None] | None = None) -> ValidationReport:
    """`kvphase validate`: `validate_model` on a file with weights, through llama.cpp with `threads` (default
    the CPUs this process may use) and `gpu_layers`; PlanError or ModelFileError before anything runs."""
    from kvphase.engines.llamacpp import check_threads
    from kvphase.gguf.header_only import require_weights

    info = read_model_info(model)
    require_weights(info.header, "validate")  # a header-only file is refused before anything is said or planned
    threads = default_threads() if threads is None else threads  # 0 is refused, not read as "the default"
    check_threads(threads)
    settings = EngineSettings(n_threads=threads, n_gpu_layers=gpu_layers)
    return validate_model(info, n_tokens, seed, splits, tolerances, settings, perturb, cache, on_split=on_split)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
