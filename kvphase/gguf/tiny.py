"""Tiny random-weight GGUF models of the compressed architectures, for tests and validation,
and of the dense llama-family layouts the numpy reference model runs: writing one file from an
architecture's spec (`kvphase.gguf.tiny_archs`), with random weights, a donor's tokenizer, a
released model's indexer shape or YaRN scaling.

Each model is a few hundred kilobytes of F32 weights that llama.cpp (as vendored in
llama-cpp-python 0.3.36) loads and runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from kvphase.errors import ModelFileError, PlanError
from kvphase.gguf.keys import Keys
from kvphase.gguf.limits import INT32_MAX
from kvphase.gguf.tiny_archs import (  # noqa: F401  (the architectures' names, where callers import them)
    DENSE_TINY_ARCHS, TINY_ARCHS, TINY_CONTEXT, TINY_VOCAB, DSV4Layout, Glm5Layout, TinySpec, deepseek4_spec,
    glm5_next_spec, minimax_m3_spec)
from kvphase.gguf.writer import write_gguf
from kvphase.runfolder.files import cannot_write


def init_tensor(rng: np.random.Generator, ne: tuple[int, ...], kind: str) -> np.ndarray:
    shape = tuple(reversed(ne))  # numpy is row-major: ggml's ne0 is the last numpy axis
    if kind == "ones":
        return np.ones(shape, np.float32)
    if kind == "small":
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "freq":  # Llama-3 RoPE frequency divisors: positive, mostly above 1
        return (1.0 + 3.0 * rng.random(shape)).astype(np.float32)
    if kind == "neg":  # KDA's ssm_a holds -exp(A_log)
        return -np.exp(0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind in ("ape", "embd"):  # unit scale: the gate bias must matter, embeddings must differ
        return rng.standard_normal(shape).astype(np.float32)
    return (rng.standard_normal(shape) / np.sqrt(ne[0])).astype(np.float32)  # fan-in scaled weight


class ReleasedShape(NamedTuple):
    """A released model's indexer and window settings, written over a tiny model's (same tensors)."""

    arch: str
    keys: dict[str, object]  # keys of `kvphase.gguf.keys.Keys`, `{arch}` filled by `TinySpec.key`
    source: str  # where the values come from


# Each key as the converter vendored in llama-cpp-python 0.3.36 writes it from the released config.json
# (vendor/llama.cpp/conversion/glm.py:496-498, deepseek.py:665-680, minimax.py:184-189).
RELEASED_SHAPES: dict[str, ReleasedShape] = {
    "glm-5.3-flash": ReleasedShape("glm5-next", {
        Keys.Attention.Indexer.TOP_K: 2048, Keys.Attention.Indexer.KPOOL: 4, Keys.Attention.Indexer.KPOOL_SELECT_TAIL: True},
        "GLM-5.3-Flash's config: index_topk 2048, index_kpool 4, the tail pool always selected"),
    "deepseek-v4-flash": ReleasedShape("deepseek4", {
        Keys.Attention.Indexer.TOP_K: 512, Keys.Attention.SLIDING_WINDOW: 128},
        "DeepSeek-V4-Flash's config: index_topk 512, sliding_window 128 (ratio-4 and ratio-128 layers)"),
    "minimax-m3": ReleasedShape("minimax-m3", {
        Keys.Attention.Indexer.TOP_K: 16, Keys.Attention.Indexer.BLOCK_SIZE: 128, Keys.Attention.Indexer.LOCAL_BLOCKS: 1},
        "MiniMax-M3's sparse_attention_config: sparse_topk_blocks 16, sparse_block_size 128, sparse_local_block 1"),
}
SHAPED_CONTEXT = 16384  # a shaped file's declared context: room for the plans that reach its indexer

YARN_ARCHS = ("deepseek4",)  # where `validate` models YaRN RoPE
YARN_ORIGINAL_CONTEXT = 4096  # puts the YaRN ramp mid-way through the tiny deepseek4's 8 rotary pairs


TOKENIZER_PREFIX = "tokenizer."


def _take_tokenizer(spec: TinySpec, donor: Path) -> None:
    """Copy the donor's tokenizer keys into `spec` and size its vocabulary rows to match."""
    from kvphase.gguf.header import read_gguf_header

    header = read_gguf_header(donor, in_full=(TOKENIZER_PREFIX,))  # a damaged donor: one GGUFError
    if Keys.Tokenizer.LIST_COUNT not in header.fields:
        raise PlanError(f"{donor} has no tokenizer to give")
    keys = {name: header.fields[name] for name in header.types if name.startswith(TOKENIZER_PREFIX)}
    n_vocab = len(keys[Keys.Tokenizer.LIST])
    spec.keys.update(keys)
    spec.key(Keys.LLM.VOCAB_SIZE, n_vocab)
    vocab_rows = ("token_embd.weight", "output.weight")
    spec.tensors = [(name, ne[:-1] + (n_vocab,) if name in vocab_rows else ne, kind) for name, ne, kind in spec.tensors]


def _released_shape(arch: str, shape: str | None) -> ReleasedShape | None:
    if shape is None:
        return None
    released = RELEASED_SHAPES.get(shape)
    if released is None:
        raise PlanError(f"no released shape {shape!r}; expected one of {', '.join(RELEASED_SHAPES)}")
    if released.arch != arch:
        raise PlanError(f"shape {shape} is a {released.arch} model, not {arch}")
    return released


def write_tiny_model(arch: str, path: str | Path, seed: int = 0, yarn_factor: float = 0.0,
                     tokenizer_from: str | Path | None = None, context_length: int | None = None,
                     shape: str | None = None, top_k: int | None = None) -> Path:
    """Write a tiny random-weight GGUF of `arch` to `path`; the same seed gives the same bytes.

    `yarn_factor` > 0 declares YaRN RoPE scaling by that factor, as DeepSeek-V4 releases do.
    `tokenizer_from` gives the model another GGUF's tokenizer (every `tokenizer.*` key, and
    its vocabulary size), so that `kvphase sweep` can build prompts for it: a sweep through
    real llama.cpp in a fraction of a second. `context_length` is the context the file declares
    (TINY_CONTEXT, or SHAPED_CONTEXT for a shape). `shape` (a RELEASED_SHAPES name) writes a released
    model's indexer and window settings; `top_k` overrides the indexer's top_k (the same weights with an
    indexer that keeps more or fewer)."""
    specs = {**TINY_ARCHS, **DENSE_TINY_ARCHS}
    if arch not in specs:
        raise PlanError(f"no tiny model for architecture {arch!r}; expected one of {', '.join(specs)}")
    if seed < 0:
        raise PlanError(f"--seed must be a non-negative integer, got {seed}")
    if not 0 <= yarn_factor <= np.finfo(np.float32).max or (yarn_factor and arch not in YARN_ARCHS):  # NaN fails too
        raise PlanError(f"a YaRN factor must be positive and is offered for {', '.join(YARN_ARCHS)} only; "
                        f"got {yarn_factor} for {arch}")
    released = _released_shape(arch, shape)
    if context_length is None:
        context_length = SHAPED_CONTEXT if released else TINY_CONTEXT
    if not 1 <= context_length <= INT32_MAX:
        raise PlanError(f"a tiny model's context must be from 1 to {INT32_MAX} tokens, got {context_length}")
    spec = specs[arch]()
    spec.key(Keys.LLM.CONTEXT_LENGTH, int(context_length))
    for name, value in (released.keys if released else {}).items():
        spec.key(name, value)
    if top_k is not None:
        if arch not in TINY_ARCHS or not 1 <= top_k <= INT32_MAX:
            raise PlanError(f"--top-k applies to {', '.join(TINY_ARCHS)}, as a whole number from 1 to {INT32_MAX}; "
                            f"got {top_k} for {arch}")
        spec.key(Keys.Attention.Indexer.TOP_K, int(top_k))
    if tokenizer_from is not None:
        _take_tokenizer(spec, Path(tokenizer_from))
    if yarn_factor:
        spec.key(Keys.Rope.SCALING_TYPE, "yarn")
        spec.key(Keys.Rope.SCALING_FACTOR, float(yarn_factor))
        spec.key(Keys.Rope.SCALING_ORIG_CTX_LEN, YARN_ORIGINAL_CONTEXT)
    path = Path(path)
    rng = np.random.default_rng(seed)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(path, arch, spec.keys, ((name, init_tensor(rng, ne, kind)) for name, ne, kind in spec.tensors))
    except OSError as exc:
        raise ModelFileError(cannot_write(path, exc)) from None
    return path
