"""The machine a run's numbers came from, for its manifest.

Per-target log-probabilities are machine-bound: llama.cpp picks its CPU kernels by
instruction set (and rounds activations to 8 bits in them), so two CPUs give slightly
different logits, and now and then a near-tie flips a target's correctness. Plans,
contexts and target positions are not: they depend on the tokenizer and the seed only.
Recording the CPU, llama.cpp's build and system info, the thread count and numpy's BLAS
lets a reader tell why two runs of one plan differ.
"""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def machine_info(n_threads: int | None) -> dict:
    """CPU, threads, llama.cpp build and system info, numpy's BLAS, OS."""
    return {
        "cpu": cpu_info(),
        "threads": n_threads,
        "llama_cpp": llama_cpp_build(),
        "numpy_blas": numpy_blas(),
        "os": {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
               "node": platform.node()},
    }


def cpu_info(path: Path = CPUINFO) -> dict:
    """Model name, logical CPUs and instruction-set flags from /proc/cpuinfo (Linux), else
    what `platform` knows."""
    if not path.is_file():
        return {"model": platform.processor() or platform.machine(), "logical_cpus": None, "flags": []}
    fields: dict[str, str] = {}
    count = 0
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        count += key == "processor"
        fields.setdefault(key, value.strip())
    flags = fields.get("flags") or fields.get("Features") or ""  # x86 or ARM
    return {"model": fields.get("model name") or fields.get("CPU part") or platform.processor(),
            "logical_cpus": count or None, "flags": sorted(flags.split())}


def llama_cpp_build() -> dict:
    """llama-cpp-python's version, llama.cpp's own system line (the instruction sets its
    kernels use), and a digest of each shared library, which names the build."""
    try:
        import llama_cpp
    except ImportError:
        return {}
    libraries = sorted((Path(llama_cpp.__file__).parent / "lib").glob("*.so*"))
    return {
        "version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "libraries": {p.name: _sha256(p)[:16] for p in libraries if p.is_file()},
    }


def numpy_blas() -> dict:
    """The BLAS numpy was built with, and the thread pools loaded now (threadpoolctl, when
    installed): the numpy reference backend's matrix products run there."""
    import numpy

    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except (TypeError, KeyError):  # numpy < 1.25 has no mode="dicts"
        blas = {}
    out = {"numpy": numpy.__version__, "blas": {k: blas.get(k) for k in ("name", "version", "openblas configuration")
                                                if blas.get(k) is not None}}
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return out
    out["threadpools"] = [{k: pool.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
                          for pool in threadpool_info()]
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
