"""Capture llama.cpp's intermediate tensors while it evaluates a prompt.

llama.cpp names the tensors of its compute graph `<name>-<layer>` (`llama_context::graph_get_cb`)
and hands each node to `llama_context_params.cb_eval` twice: once with `ask=True` (return
True to see it), then with `ask=False` once its data is computed
(`ggml_backend_sched_compute_splits`). This module installs such a callback through ctypes,
copies the wanted tensors into numpy arrays, and drives the low-level llama.cpp API with a
batch split chosen by the caller, one ubatch per `llama_decode` call.

Input tensors (masks, index maps) are not graph nodes and never reach the callback; a
caller that needs them rebuilds them from positions.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np

from kvphase.defaults import default_threads
from kvphase.engines import llamacpp as engine
from kvphase.errors import BackendError, ModelFileError
from kvphase.gguf.modelinfo import ModelInfo, as_model_info

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64

# ggml_type values (ggml/include/ggml.h) this module can turn into numpy arrays
_NUMPY_TYPES = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


class GgmlTensor(ctypes.Structure):
    """`struct ggml_tensor` of ggml/include/ggml.h (the vendored llama.cpp of llama-cpp-python 0.3.36)."""


GgmlTensor._fields_ = [
    ("type", ctypes.c_int),
    ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
    ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
    ("op", ctypes.c_int),
    ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
    ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(GgmlTensor) * GGML_MAX_SRC),
    ("view_src", ctypes.POINTER(GgmlTensor)),
    ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p),
    ("name", ctypes.c_char * GGML_MAX_NAME),
    ("extra", ctypes.c_void_p),
    ("padding", ctypes.c_char * 8),
]

_EVAL_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.POINTER(GgmlTensor), ctypes.c_bool, ctypes.c_void_p)


class CapturedTensor(NamedTuple):
    """One graph node as computed by llama.cpp during one ubatch."""

    name: str  # without the layer suffix, e.g. "indexer_pool_k"
    layer: int  # -1 for tensors that belong to no layer
    ubatch: int  # index of the ubatch (llama_decode call) that computed it
    op: str  # ggml op name, e.g. "MUL_MAT"
    array: np.ndarray  # numpy order: ggml's ne reversed, (ne3, ne2, ne1, ne0)


@dataclass
class Ubatch:
    """The tokens of one llama_decode call."""

    index: int
    positions: np.ndarray  # (n_tokens,) absolute positions
    tokens: np.ndarray  # (n_tokens,) token ids


@dataclass
class CaptureRun:
    """Everything one evaluation produced: the ubatches and the captured tensors, in order."""

    ubatches: list[Ubatch] = field(default_factory=list)
    tensors: list[CapturedTensor] = field(default_factory=list)

    def get(self, name: str, layer: int, ubatch: int) -> np.ndarray:
        """The last capture of `name-layer` in a ubatch; BackendError if llama.cpp never produced it."""
        found = [t.array for t in self.tensors if t.name == name and t.layer == layer and t.ubatch == ubatch]
        if not found:
            raise BackendError(f"llama.cpp computed no tensor {name}-{layer} in ubatch {ubatch}")
        return found[-1]

    def find(self, name: str, layer: int, ubatch: int) -> np.ndarray | None:
        found = [t.array for t in self.tensors if t.name == name and t.layer == layer and t.ubatch == ubatch]
        return found[-1] if found else None

    def all(self, name: str, layer: int, ubatch: int) -> list[CapturedTensor]:
        """Every capture of `name-layer` in a ubatch, in graph order (a name can be reused)."""
        return [t for t in self.tensors if t.name == name and t.layer == layer and t.ubatch == ubatch]

    def layers(self, name: str) -> list[int]:
        return sorted({t.layer for t in self.tensors if t.name == name})


# --------------------------------------------------------------------------- ggml access


def _ggml_library() -> ctypes.CDLL:
    """libggml-base from the llama_cpp package: it exports ggml_nbytes, ggml_op_name, ggml_backend_tensor_get/set."""
    import llama_cpp

    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    candidates = sorted(lib_dir.glob("libggml-base*.so*")) + sorted(lib_dir.glob("libggml-base*.dylib")) + sorted(
        lib_dir.glob("ggml-base*.dll")
    )
    if not candidates:
        candidates = sorted(lib_dir.glob("libggml*.so*"))
    if not candidates:
        raise BackendError(f"no ggml library found in {lib_dir}")
    lib = ctypes.CDLL(str(candidates[0]))
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_nbytes.argtypes = [ctypes.POINTER(GgmlTensor)]
    lib.ggml_op_name.restype = ctypes.c_char_p
    lib.ggml_op_name.argtypes = [ctypes.c_int]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_backend_tensor_get.argtypes = [ctypes.POINTER(GgmlTensor), ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.ggml_backend_tensor_set.restype = None
    lib.ggml_backend_tensor_set.argtypes = [ctypes.POINTER(GgmlTensor), ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    return lib


_LIB: ctypes.CDLL | None = None


def ggml() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        _LIB = _ggml_library()
    return _LIB


def tensor_name(t: GgmlTensor) -> str:
    return t.name.decode("utf-8", "replace")


def split_name(name: str) -> tuple[str, int]:
    """`indexer_q-3` -> ("indexer_q", 3); a name without a layer suffix gets layer -1."""
    m = re.fullmatch(r"(.*)-(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, -1)


def tensor_to_numpy(t: GgmlTensor) -> np.ndarray:
    """Copy a computed tensor out of its backend buffer; views are read through their strides.

    `ggml_backend_tensor_get` copies a byte range starting at the tensor's data; for a
    non-contiguous view `ggml_nbytes` is the span from its first to its last element, so
    copying that span and striding over it with `nb` reads exactly the view's elements.
    """
    dtype = _NUMPY_TYPES.get(t.type)
    if dtype is None:
        raise BackendError(f"tensor {tensor_name(t)} has ggml type {t.type}, which capture does not read")
    lib = ggml()
    n_bytes = lib.ggml_nbytes(ctypes.byref(t))
    raw = np.empty(n_bytes, dtype=np.uint8)
    if n_bytes:
        lib.ggml_backend_tensor_get(ctypes.byref(t), raw.ctypes.data, 0, n_bytes)
    shape = tuple(int(t.ne[i]) for i in reversed(range(GGML_MAX_DIMS)))
    strides = tuple(int(t.nb[i]) for i in reversed(range(GGML_MAX_DIMS)))
    if any(d == 0 for d in shape):
        return np.zeros(shape, dtype)
    # (ne3, ne2, ne1, ne0) over the copied bytes, with ggml's byte strides
    return np.ndarray(shape, dtype=dtype, buffer=raw, strides=strides).copy()


def numpy_to_tensor(array: np.ndarray, t: GgmlTensor) -> None:
    """Overwrite a computed, contiguous tensor with `array` (its shape as `tensor_to_numpy`
    gives it); the nodes llama.cpp computes after the eval callback returns read the new values."""
    dtype = _NUMPY_TYPES.get(t.type)
    shape = tuple(int(t.ne[i]) for i in reversed(range(GGML_MAX_DIMS)))
    contiguous = all(int(t.nb[i]) == int(t.nb[i - 1]) * int(t.ne[i - 1]) for i in range(1, GGML_MAX_DIMS))
    if dtype is None or not contiguous or int(t.nb[0]) != np.dtype(dtype).itemsize or array.shape != shape:
        raise BackendError(f"cannot overwrite tensor {tensor_name(t)} (ggml type {t.type}, shape {shape}, "
                           f"contiguous: {contiguous}) with a {array.dtype} array of shape {array.shape}")
    data = np.ascontiguousarray(array, dtype=dtype)
    ggml().ggml_backend_tensor_set(ctypes.byref(t), data.ctypes.data, 0, data.nbytes)


# --------------------------------------------------------------------------- driving llama.cpp


@dataclass(frozen=True)
class EngineSettings:
    """How llama.cpp is set up for a capture run."""

    n_ctx: int = 512
    n_threads: int = field(default_factory=default_threads)
    flash_attn: bool = True  # minimax-m3's sparse path runs only with flash attention
    kv_f32: bool = True  # an F16 cache would round the indexer keys before pooling
    n_gpu_layers: int = 0


# (name, layer, tensor) -> the (name, layer) to record it under, or None to skip it. A
# selector may label unnamed nodes by walking their sources (see `source_chain`).
Selector = Callable[[str, int, GgmlTensor], "tuple[str, int] | None"]


def by_name(names: Sequence[str]) -> Selector:
    """A selector for the layer tensors llama.cpp named `<name>-<layer>`."""
    wanted = frozenset(names)
    return lambda name, layer, t: (name, layer) if layer >= 0 and name in wanted else None


def op_name(t: GgmlTensor) -> str:
    return ggml().ggml_op_name(t.op).decode()


def source_chain(t: GgmlTensor, depth: int) -> Iterator[GgmlTensor]:
    """The tensor's first source, its first source, and so on, `depth` steps at most."""
    for _ in range(depth):
        if not t.src[0]:
            return
        t = t.src[0].contents
        yield t


_KEEP_ALIVE: list[object] = []  # ctypes callbacks llama.cpp holds pointers to; never freed


def run_and_capture(
    model: str | Path | ModelInfo,
    tokens: Sequence[int],
    split: Sequence[int],
    want: Selector,
    settings: EngineSettings = EngineSettings(),
    start_pos: int = 0,
) -> CaptureRun:
    """Evaluate `tokens` in ubatches of the sizes in `split` and capture the nodes `want` selects.

    Each ubatch is its own `llama_decode` call with `n_batch = n_ubatch` = the largest
    split, so llama.cpp cannot regroup tokens. Positions run from `start_pos`. `model`: a path, or
    a model already opened (its header is not read again).
    """
    import llama_cpp

    if not isinstance(model, ModelInfo) and not Path(model).is_file():
        raise ModelFileError(f"model file not found: {model}")
    if sum(split) != len(tokens) or any(n <= 0 for n in split):
        raise BackendError(f"batch split {list(split)} does not cover the {len(tokens)} tokens")
    info = as_model_info(model)
    run = CaptureRun()
    current = {"ubatch": -1}
    errors: list[BaseException] = []

    def callback(t_ptr, ask, user_data):  # noqa: ARG001
        try:
            t = t_ptr.contents
            name, layer = split_name(tensor_name(t))
            label = want(name, layer, t)
            if ask:
                return label is not None
            if label is not None:
                run.tensors.append(CapturedTensor(label[0], label[1], current["ubatch"], op_name(t), tensor_to_numpy(t)))
            return True
        except BaseException as exc:  # an exception must not unwind through C
            errors.append(exc)
            return True

    c_callback = _EVAL_CALLBACK(callback)
    loaded = engine.load_model(info, n_gpu_layers=settings.n_gpu_layers)
    if not loaded:
        raise ModelFileError(f"llama.cpp could not load {info.path}")
    try:
        ctx = _new_context(loaded, max(split), settings, c_callback)
        try:
            _decode_all(ctx, tokens, split, start_pos, run, current, errors)
        finally:
            llama_cpp.llama_free(ctx)
    finally:
        llama_cpp.llama_model_free(loaded)
    return run


def callback_error(error: BaseException, failed: str) -> BaseException:
    """What a decode raises for the first exception its eval callback caught (none may unwind through C):
    an interrupt as it was (a Ctrl-C landing inside the callback is the CLI's Interrupted, wherever it lands),
    and a BackendError; anything else a BackendError "<failed>: <error>"."""
    if isinstance(error, BackendError) or not isinstance(error, Exception):
        return error
    wrapped = BackendError(f"{failed}: {error!r}")
    wrapped.__cause__ = error
    return wrapped


def _new_context(model, n_batch: int, settings: EngineSettings, c_callback):
    _KEEP_ALIVE.append(c_callback)
    return engine.new_context(model, n_ctx=settings.n_ctx, n_batch=n_batch, n_threads=settings.n_threads,
                              flash_attn=settings.flash_attn, kv_f32=settings.kv_f32, cb_eval=c_callback)


def _decode_all(ctx, tokens, split, start_pos, run, current, errors) -> None:
    import llama_cpp

    batch = llama_cpp.llama_batch_init(max(split), 0, 1)
    try:
        offset = 0
        for index, n in enumerate(split):
            chunk = tokens[offset : offset + n]
            positions = np.arange(start_pos + offset, start_pos + offset + n)
            # one output keeps the graph's output narrowing realistic
            rows = [(int(chunk[i]), int(positions[i]), 0, i == n - 1) for i in range(n)]
            current["ubatch"] = index
            run.ubatches.append(Ubatch(index, positions, np.asarray(chunk)))
            rc = engine.decode(ctx, batch, rows)
            if errors:
                raise callback_error(errors[0], "capture callback failed")
            if rc != 0:
                raise BackendError(f"llama_decode failed with code {rc} on ubatch {index} ({n} tokens)")
            offset += n
    finally:
        llama_cpp.llama_batch_free(batch)
