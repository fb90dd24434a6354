"""What a model in llama.cpp needs in memory, and what this process may still use.

An estimate, from the file's header alone, so that it is known before anything loads:

- the weights: the file's size (llama.cpp maps it: address space, and pages it reads);
- the KV cache: for every layer, its KV heads x (key + value width) per token, at the cache
  type's bytes per value, for the context's tokens;
- the compute buffer: one batch's attention scores (batch x context x heads, F32) and its
  logits (batch x vocabulary, F32), llama.cpp's largest scratch without flash attention, and
  48 MiB of threads and buffers besides (measured: SmolLM2 at 1,088 tokens grew this process's
  address space by 280 MiB where the rest of the estimate says 233; at 8,192 tokens by 500
  where it says 514).

What may be used is the smallest of free memory (`MemAvailable`), a cgroup's limit less what
it holds (a container), and the address-space limit (`ulimit -v`) less what this process has
mapped already. Linux only; elsewhere nothing is known and nothing is claimed.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

from kvphase.gguf.keys import Keys
from kvphase.gguf.metadata import Metadata
from kvphase.gguf.modelinfo import ModelInfo, as_model_info

MIB = 1 << 20
RUNTIME = 48 * MIB  # llama.cpp's threads and small buffers (see above)


@dataclass(frozen=True)
class MemoryNeed:
    """Bytes a model needs in llama.cpp at one context length."""

    weights: int
    kv_cache: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute

    def describe(self) -> str:
        return (f"about {self.total / MIB:,.0f} MiB (weights {self.weights / MIB:,.0f}, KV cache "
                f"{self.kv_cache / MIB:,.0f}, compute {self.compute / MIB:,.0f})")


@dataclass(frozen=True)
class Available:
    """Bytes this process may still use, and which limit says so."""

    bytes: int
    limit: str

    def describe(self) -> str:
        return f"{self.bytes / MIB:,.0f} MiB available ({self.limit})"


def memory_need(model: str | Path | ModelInfo, n_ctx: int, n_batch: int = 512, cache_type: str = "f16") -> MemoryNeed:
    """The estimate of the module docstring for `model` at `n_ctx` tokens."""
    header = as_model_info(model).header
    meta = Metadata(header)
    arch = meta.text(Keys.General.ARCHITECTURE, "unknown")
    n_layer = meta.integer(Keys.LLM.BLOCK_COUNT.format(arch=arch), 0)
    n_head = max(meta.integers(Keys.Attention.HEAD_COUNT.format(arch=arch), [0]) or [0])
    n_embd = meta.integer(Keys.LLM.EMBEDDING_LENGTH.format(arch=arch), 0)
    head_dim = n_embd // n_head if n_head else 0
    kv_heads = _per_layer(meta.integers(Keys.Attention.HEAD_COUNT_KV.format(arch=arch), [n_head]), n_layer)
    width = meta.integer(Keys.Attention.KEY_LENGTH.format(arch=arch), head_dim) + meta.integer(Keys.Attention.VALUE_LENGTH.format(arch=arch),
                                                                                  head_dim)
    kv = sum(kv_heads) * width * n_ctx * bytes_per_value(cache_type)
    vocab = meta.integer(Keys.Tokenizer.LIST_COUNT, 0) or meta.integer(Keys.LLM.VOCAB_SIZE.format(arch=arch), 0)
    batch = min(n_batch, n_ctx)
    compute = 4 * batch * (n_ctx * n_head + vocab) + RUNTIME
    return MemoryNeed(header.source_size or header.file_size, int(kv), int(compute))


def bytes_per_value(cache_type: str) -> float:
    """A cache type's bytes per value, from ggml's block sizes as the gguf package lists them
    (f16 for a type llama.cpp does not know: the backend refuses it later in its own words)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    kind = GGMLQuantizationType.__members__.get(str(cache_type).upper(), GGMLQuantizationType.F16)
    values, size = GGML_QUANT_SIZES[kind]
    return size / values


def _per_layer(values: list[int], n_layer: int) -> list[int]:
    return values * n_layer if len(values) == 1 else values


def available_memory() -> Available | None:
    """The tightest of the limits the module docstring lists; None where none can be read."""
    found = [a for a in (_address_space(), _cgroup(), _free_memory()) if a is not None]
    return min(found, key=lambda a: a.bytes, default=None)


def _address_space() -> Available | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    mapped = _status_kib("VmSize")
    if soft == resource.RLIM_INFINITY or mapped is None:
        return None
    return Available(max(0, soft - mapped * 1024), "the address-space limit, ulimit -v")


def _cgroup(root: Path = Path("/sys/fs/cgroup")) -> Available | None:
    try:
        limit, used = (root / "memory.max").read_text().strip(), int((root / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    if not limit.isdigit():  # "max": no limit
        return None
    return Available(max(0, int(limit) - used), "the cgroup's memory.max, a container's limit")


def _free_memory() -> Available | None:
    kib = _status_kib("MemAvailable", Path("/proc/meminfo"))
    return None if kib is None else Available(kib * 1024, "free memory, MemAvailable")


def _status_kib(key: str, path: Path = Path("/proc/self/status")) -> int | None:
    """A "Key:   N kB" line of a /proc file, in KiB."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def shortfall(need_bytes: int, available: Available | None) -> str | None:
    """A clause naming memory when `need_bytes` exceeds what is available; None when it fits or
    nothing is known."""
    if available is None or need_bytes <= available.bytes:
        return None
    return f"about {need_bytes / MIB:,.0f} MiB needed, {available.describe()}"


def memory_warning(model: str | Path | ModelInfo, n_ctx: int, cache_type: str = "f16") -> str | None:
    """A warning to print before loading when the model will likely not fit; None when it will
    or nothing is known."""
    info = as_model_info(model)
    need, available = memory_need(info, n_ctx, cache_type=cache_type), available_memory()
    if shortfall(need.total, available) is None:
        return None
    return (f"{info.path.name} at {n_ctx} tokens needs {need.describe()} and has {available.describe()}: "
            "llama.cpp may fail to load it or the machine may swap; a shorter --context needs less")


TRAINING_ADDRESS_SPACE = 2048 * MIB  # JAX and XLA at start (measured: the smallest model trains at 1.8 GiB, not 1.6)


def training_address_space_error() -> str | None:
    """Why training cannot start under this process's address-space limit, or None: below it
    XLA aborts the process (std::bad_alloc), which no handler can turn into one line."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft >= TRAINING_ADDRESS_SPACE:
        return None
    return (f"training needs at least {TRAINING_ADDRESS_SPACE // MIB:,} MiB of address space (JAX and XLA reserve it "
            f"at start and abort below it); ulimit -v allows {soft // MIB:,} MiB")


def too_little_for_a_vocabulary() -> str | None:
    """Memory named when llama.cpp could not even read a vocabulary and this process has less
    room than llama.cpp's threads and buffers take; None otherwise."""
    available = available_memory()
    if available is None or available.bytes >= RUNTIME:
        return None
    return f"not enough memory, the likely cause: {available.describe()}"
