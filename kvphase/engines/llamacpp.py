"""The one llama.cpp session: log silencing, model load, context, batches, decode, logits.

Everything that talks to llama-cpp-python's low-level API goes through these functions:
the llama.cpp backend (`kvphase.backends.llamacpp`) scores queries with them, and
`kvphase.engines.capture` adds a `cb_eval` callback to the same context setup. Modules
below the backends (capture, the reference model's tokenizer, the agreement study)
silence llama.cpp's log from here, never through a backend.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Sequence

import numpy as np

from kvphase.errors import BackendError, PlanError
from kvphase.gguf.keys import Keys
from kvphase.gguf.limits import check_llama_limits
from kvphase.gguf.header_only import require_weights
from kvphase.gguf.modelinfo import ModelInfo, as_model_info
from kvphase.gguf.tensors import GGML_TYPE_F32

MAX_THREADS = 512  # GGML_MAX_N_THREADS (ggml/include/ggml.h); more threads crash llama.cpp
# K and V cache types a sweep may ask for, by name: ggml_type ids (ggml/include/ggml.h). f16 is
# llama_context_default_params' own; the quantized ones store blocks of 32 values with a scale.
CACHE_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}
CACHE_BLOCK = 32  # values per q8_0 / q4_0 block: every head's K and V width must be a multiple

# (token, position, sequence, wants logits): one row of a llama_batch
Row = tuple[int, int, int, bool]

# Architectures whose compressed attention llama.cpp 0.3.36 builds only under flash attention and
# with one KV stream per sequence (`msa_enabled` in src/models/minimax-m3.cpp: flash_attn and
# n_seq_max == 1 or no unified cache); anywhere else it runs dense attention over every cached token
# and only logs a warning, a different model (scripts/engine_paths_repro.py: 1.4-1.8 nats per answer)
SPARSE_NEEDS_FLASH_ONE_STREAM = frozenset({"minimax-m3"})


def silence_llama_logs() -> None:
    """Drop llama.cpp's log, which it writes to stderr from C on every load."""
    import llama_cpp

    if getattr(silence_llama_logs, "keepalive", None):
        return

    @llama_cpp.llama_log_callback
    def _drop(level, text, user_data):
        return None

    llama_cpp.llama_log_set(_drop, ctypes.c_void_p(0))
    silence_llama_logs.keepalive = _drop  # the C side keeps the pointer


@functools.lru_cache(maxsize=1)
def extra_buffers_safe(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether llama.cpp may repack weights into its extra buffer types (use_extra_bufts; the
    server's --repack). Not on a CPU with AMX: llama-cpp-python 0.3.36 compiled there
    (GGML_NATIVE) repacks Q4_0, Q4_1 and Q8_0 weights for its AMX kernels, which die with
    SIGSEGV at the first decode (measured on a Xeon with amx_int8: SmolLM2's Q4_1 file and the
    trained deepseek4 Q8_0 files; with repacking off both run). Elsewhere it stays on: it speeds
    up quantized matrices."""
    try:
        flags = set(cpuinfo.read_text(errors="replace").split())
    except OSError:
        return True
    return not flags & {"amx_tile", "amx_int8", "amx_bf16"}


def load_model(model: str | Path | ModelInfo, n_gpu_layers: int | None = None, vocab_only: bool = False):
    """Load a GGUF file into llama.cpp (logs silenced); None when llama.cpp refuses it.
    `vocab_only` reads the header and vocabulary and no weights.

    The file's header is checked first (`check_llama_limits`: GGUFError for what llama.cpp
    would abort on rather than refuse). The caller frees the model with `llama_model_free`
    and raises its own error on None."""
    import llama_cpp

    info = as_model_info(model)
    check_llama_limits(info.header)
    if not vocab_only:
        require_weights(info.header, "llama.cpp")
    silence_llama_logs()
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    if n_gpu_layers is not None:
        params.n_gpu_layers = n_gpu_layers
    params.vocab_only = vocab_only
    params.use_extra_bufts = extra_buffers_safe()
    return llama_cpp.llama_model_load_from_file(str(info.path).encode(), params) or None


def gpu_offload_note(n_gpu_layers: int) -> str | None:
    """Why `n_gpu_layers` > 0 does nothing here, or None: a CPU build of llama.cpp (this wheel compiled
    without CUDA, Metal or Vulkan) offloads nothing and runs every layer on the CPU."""
    import llama_cpp

    if n_gpu_layers != 0 and not llama_cpp.llama_supports_gpu_offload():
        return (f"this llama.cpp build has no GPU backend (llama_supports_gpu_offload is false): --gpu-layers "
                f"{n_gpu_layers} does nothing, every layer runs on the CPU")
    return None


def high_level_llama(model: str | Path | ModelInfo, **settings):
    """`llama_cpp.Llama(path, **settings)` with weight repacking as `extra_buffers_safe` allows: Llama
    (0.3.36) takes no use_extra_bufts and builds its model parameters from
    llama_model_default_params, which is swapped for ours for the time of the load."""
    import llama_cpp
    import llama_cpp.llama_cpp as low_level

    info = as_model_info(model)
    require_weights(info.header, "llama.cpp")
    defaults = low_level.llama_model_default_params

    def ours():
        params = defaults()
        params.use_extra_bufts = extra_buffers_safe()
        return params

    low_level.llama_model_default_params = ours
    try:
        return llama_cpp.Llama(str(info.path), **settings)
    finally:
        low_level.llama_model_default_params = defaults


def model_meta(model, key: str) -> str:
    """A metadata value of a loaded model as llama.cpp reads it (as text; "" when absent)."""
    import llama_cpp

    buffer = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
    return buffer.value.decode("utf-8", "replace") if n >= 0 else ""


class Vocab:
    """A model's tokenizer in llama.cpp: text <-> ids with no special-token parsing, and
    the ids every prompt starts with (a `backends.base.Tokenizer`, and its size `n_vocab`)."""

    def __init__(self, model, owned: bool = False):
        import llama_cpp

        self._lc = llama_cpp
        self._model = model
        self._owned = owned  # loaded by `Vocab.load`, freed with this object
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)

    @classmethod
    def load(cls, model: str | Path | ModelInfo) -> "Vocab":
        """The vocabulary of a GGUF file alone (fast even for a model too big to run here); of an HF
        checkpoint, its tokenizer.json (`checkpoint_vocab.CheckpointVocab`, no llama.cpp)."""
        info = as_model_info(model)
        if info.header is None:
            from kvphase.engines.checkpoint_vocab import CheckpointVocab

            return CheckpointVocab(info)
        loaded = load_model(info, vocab_only=True)
        if not loaded:
            from kvphase.engines.memory import too_little_for_a_vocabulary

            memory = too_little_for_a_vocabulary()
            raise BackendError(f"llama.cpp could not read the vocabulary of {info.path}"
                               + (f" ({memory})" if memory else ""))
        return cls(loaded, owned=True)

    @property
    def n_ctx_train(self) -> int:
        return self._lc.llama_model_n_ctx_train(self._model)

    @property
    def architecture(self) -> str:
        return model_meta(self._model, Keys.General.ARCHITECTURE)

    @property
    def prefix_ids(self) -> list[int]:
        if self._lc.llama_vocab_get_add_bos(self._vocab):
            return [self._lc.llama_vocab_bos(self._vocab)]
        return []

    def tokenize(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        out = (self._lc.llama_token * capacity)()
        n = self._lc.llama_tokenize(self._vocab, data, len(data), out, capacity, False, False)
        if n < 0:
            raise BackendError(f"llama.cpp could not tokenize {text[:40]!r}")
        return list(out[:n])

    def detokenize(self, ids: Sequence[int]) -> str:
        buffer = ctypes.create_string_buffer(64)
        pieces = []
        for token in ids:
            n = self._lc.llama_token_to_piece(self._vocab, int(token), buffer, len(buffer), 0, False)
            pieces.append(buffer.raw[: max(n, 0)])
        return b"".join(pieces).decode("utf-8", errors="replace")

    def __del__(self):
        if self._owned and self._model:
            self._lc.llama_model_free(self._model)
            self._model = None


def new_context(
    model,
    *,
    n_ctx: int,
    n_batch: int,
    n_threads: int,
    n_seq_max: int = 1,
    flash_attn: bool = False,
    kv_f32: bool = False,
    kv_unified: bool = False,
    cache_type: str = "f16",
    cb_eval=None,
    label: str = "the model",
):
    """A llama.cpp context with n_ubatch = n_batch, so llama.cpp cannot regroup a batch's tokens.

    `cache_type` (a `CACHE_TYPES` name) sets the K and the V cache together; a quantized one
    turns flash attention on, because llama.cpp stores a quantized V cache only under flash
    attention (`llama_init_from_model` in src/llama-context.cpp refuses it otherwise, and
    deepseek4 and MLA models refuse K and V of different types).
    `cb_eval` is a ctypes eval callback (see `kvphase.engines.capture`); the caller keeps
    it alive as long as the context. BackendError when llama.cpp cannot create it."""
    import llama_cpp

    check_threads(n_threads)
    if cache_type not in CACHE_TYPES or (kv_f32 and cache_type != "f16"):
        raise ValueError(f"expected a cache type from {', '.join(CACHE_TYPES)} (f16 with kv_f32), got {cache_type!r}")
    quantized = cache_type != "f16"
    flash_attn = flash_attn or quantized

    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = n_batch
    params.n_ubatch = n_batch
    params.n_seq_max = n_seq_max
    if kv_unified:
        params.kv_unified = True
    params.n_threads = n_threads
    params.n_threads_batch = n_threads
    params.flash_attn_type = (
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    if kv_f32:
        params.type_k = GGML_TYPE_F32  # K and V must be set together
        params.type_v = GGML_TYPE_F32
    if quantized:
        params.type_k = params.type_v = CACHE_TYPES[cache_type]
    if cb_eval is not None:
        params.cb_eval = ctypes.cast(cb_eval, llama_cpp.ggml_backend_sched_eval_callback)
        params.cb_eval_user_data = None
    ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx and quantized:
        raise BackendError(f"llama.cpp could not create a context of {n_ctx} tokens with a {cache_type} KV cache for "
                           f"{label}: it needs flash attention on this architecture and every attention head's K "
                           f"and V width a multiple of {CACHE_BLOCK}; use --cache-type f16")
    if not ctx:
        raise BackendError(f"llama.cpp could not create a context of {n_ctx} tokens for {label}")
    return ctx


def check_threads(n_threads: int, option: str = "--threads") -> None:
    """PlanError unless 1 <= n_threads <= MAX_THREADS."""
    if not 1 <= n_threads <= MAX_THREADS:
        raise PlanError(f"{option} must be from 1 to {MAX_THREADS} (llama.cpp's limit), got {n_threads}")


def decode(ctx, batch, rows: Sequence[Row]) -> int:
    """Fill `batch` with (token, position, sequence, wants logits) rows and decode it as one
    `llama_decode` call; returns llama.cpp's status (0 on success)."""
    import llama_cpp

    batch.n_tokens = len(rows)
    for i, (token, pos, seq, want_logits) in enumerate(rows):
        batch.token[i] = int(token)
        batch.pos[i] = int(pos)
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = want_logits
    return llama_cpp.llama_decode(ctx, batch)


def logits(ctx, rows: Sequence[Row], n_vocab: int) -> np.ndarray:
    """The logits of the rows that asked for them in the last decode: (n_requested_rows, n_vocab)."""
    import llama_cpp

    wanted = [i for i, row in enumerate(rows) if row[3]]
    out = np.empty((len(wanted), n_vocab), dtype=np.float32)  # (n_requested_rows, n_vocab)
    for k, i in enumerate(wanted):
        pointer = llama_cpp.llama_get_logits_ith(ctx, i)
        out[k] = np.ctypeslib.as_array(pointer, shape=(n_vocab,))
    return out
