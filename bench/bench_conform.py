"""The whole conformance check (issue 55): `kvphase conform` over every reference model through
llama.cpp in process (one thread), and through llama-server (one server per reference model, one
slot and one thread each, started and stopped here), with the wall time of each; the target is the
whole check under 3 minutes on 2 cores.

    .venv/bin/python bench/bench_conform.py [--quick] [--backend llama.cpp|server|both] [--out DIR]

--quick: 16 contexts per model (CI: nothing may rot; the times are not judged). A server's
libllama can be another build (scripts/conform_engine_bugs.sh sets LD_LIBRARY_PATH for that).
Exit status 1 when a model FAILs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def through_llamacpp(references, contexts: int, out: Path):
    from kvphase.conform.check import EngineChoice, conform

    return conform(references, EngineChoice("llama.cpp", threads=1, contexts=contexts), out, print).outcomes


def through_servers(references, contexts: int, out: Path):
    """Each reference through its own llama-server; the outcomes of every model, in one list."""
    from kvphase.conform.check import EngineChoice, conform
    from kvphase.engines.llama_server import find_llama_server, llama_server

    binary, outcomes = find_llama_server(), []
    for reference in references:
        with llama_server(reference.model, binary=binary, threads=1, slots=1, n_ctx_per_slot=512) as server:
            choice = EngineChoice("server", urls=(server.url,), contexts=contexts)
            outcomes += conform((reference,), choice, out / reference.name, print).outcomes
    return outcomes


def main() -> int:
    from kvphase.conform.check import DEFAULT_CONTEXTS
    from kvphase.conform.references import DEFAULT_REFERENCES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 contexts per model (CI)")
    parser.add_argument("--backend", choices=("llama.cpp", "server", "both"), default="both")
    parser.add_argument("--out", type=Path, default=None, help="run folders here (default: a temporary folder)")
    args = parser.parse_args()
    contexts = 16 if args.quick else DEFAULT_CONTEXTS
    runs = {"llama.cpp": through_llamacpp, "server": through_servers}
    chosen = list(runs) if args.backend == "both" else [args.backend]
    failed = False
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        for name in chosen:
            started = time.monotonic()
            outcomes = runs[name](DEFAULT_REFERENCES, contexts, out / name)
            seconds = time.monotonic() - started
            counts = {s: sum(o.status == s for o in outcomes) for s in ("PASS", "FAIL", "cannot run")}
            print(f"{name}: {len(outcomes)} models, {counts['PASS']} PASS, {counts['FAIL']} FAIL, "
                  f"{counts['cannot run']} cannot run in {seconds:.1f} s wall ({contexts} contexts per model)")
            paths = [p.status for o in outcomes for p in o.paths]  # issue 62's engine paths, each model's
            print(f"  engine paths: {paths.count('PASS')} PASS, {paths.count('FAIL')} FAIL, "
                  f"{paths.count('cannot run')} cannot run (docs/conform.md: what llama.cpp 0.3.36 does on each)")
            failed |= counts["FAIL"] > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
