"""`kvphase gates` on a large file: time and memory must not grow with the file.

A tiny glm5-next is written twice, as is and with a zero-filled padding tensor of
`--pad-gb` GB appended (written sparse where the file system allows). Measured in one run:

1. in process, `measure_gates` (header + bias tensors, no report): wall time, peak Python
   allocation (tracemalloc) and the growth of the process's peak RSS, on the padded file;
   the ratio padded / tiny wall time;
2. the whole command, `python -m kvphase.cli gates` in a fresh process (imports, tables,
   figure, report): wall time and peak RSS, padded and tiny.

The goal (issue 10): under 2 s and 200 MB on the padded file.

Run: `python bench/bench_gates.py` (or `--pad-gb 8`).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np


def write_padded(path: Path, pad_bytes: int) -> None:
    """The tiny glm5-next layout with random weights, plus `pad_bytes` of zeros as one last tensor."""
    from kvphase.gguf.tiny import glm5_next_spec
    from kvphase.gguf.writer import write_gguf

    spec, rng = glm5_next_spec(), np.random.default_rng(0)
    tensors = [(name, rng.standard_normal(tuple(reversed(ne))).astype(np.float32)) for name, ne, _ in spec.tensors]
    if pad_bytes:
        # a broadcast view: gguf writes its bytes without the 2 GB ever being allocated
        tensors.append(("padding.weight", np.broadcast_to(np.float32(0), (pad_bytes // 4,))))
    write_gguf(path, spec.arch, spec.keys, tensors)


def in_process(path: Path) -> tuple[float, float, float]:
    """(seconds, peak traced MB, peak RSS growth MB) of measure_gates on `path`."""
    from kvphase.probes.gates import measure_gates

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    tracemalloc.start()
    start = time.perf_counter()
    measure_gates(path)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return seconds, peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss_before


def whole_command(path: Path, out: Path) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS MB) of `python -m kvphase.cli gates` in a fresh process
    (CPU time as well: on a shared, loaded machine the wall time mostly measures the queue)."""
    script = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
              f"subprocess.run([sys.executable, '-m', 'kvphase.cli', 'gates', {str(path)!r}, '--out', {str(out)!r}], "
              "check=True, stdout=subprocess.DEVNULL); "
              "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
              "print(time.perf_counter() - t, u.ru_utime + u.ru_stime, u.ru_maxrss / 1024)")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1]), float(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pad-gb", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="a 0.05 GB padding (CI: the bench still runs)")
    args = parser.parse_args()
    if args.quick:
        args.pad_gb = 0.05
    with tempfile.TemporaryDirectory() as tmp:
        tiny, padded = Path(tmp) / "tiny.gguf", Path(tmp) / "padded.gguf"
        write_padded(tiny, 0)
        t0 = time.perf_counter()
        write_padded(padded, int(args.pad_gb * 1e9))
        print(f"padded file: {padded.stat().st_size / 1e9:.2f} GB, written in {time.perf_counter() - t0:.1f} s")
        in_process(tiny)  # warm-up: imports and first-call costs out of the timings
        tiny_s, _, _ = in_process(tiny)
        pad_s, traced, rss_growth = in_process(padded)
        print(f"measure_gates: tiny {tiny_s * 1e3:.1f} ms, padded {pad_s * 1e3:.1f} ms (ratio {pad_s / tiny_s:.2f}); "
              f"padded: peak traced {traced:.2f} MB, peak RSS growth {rss_growth:.1f} MB")
        cmd_tiny = whole_command(tiny, Path(tmp) / "run-tiny")
        cmd_pad = whole_command(padded, Path(tmp) / "run-padded")
        for label, (wall, cpu, rss) in (("tiny", cmd_tiny), ("padded", cmd_pad)):
            print(f"kvphase gates, {label} (fresh process: imports, report and figure included): "
                  f"wall {wall:.2f} s, CPU {cpu:.2f} s, peak RSS {rss:.0f} MB")
        print(f"padded / tiny: wall {cmd_pad[0] / cmd_tiny[0]:.2f}, CPU {cmd_pad[1] / cmd_tiny[1]:.2f}; "
              "goal on the padded file: < 2 s and < 200 MB")


if __name__ == "__main__":
    main()
