"""The engine paths of every reference model as llama.cpp 0.3.36 runs them (issue 62): `kvphase
conform` in process (one thread), and through kvphase's own llama-server launcher with two slots
(one server per reference model, one thread), each run folder under OUT, for docs/conform.md's
paths table (scripts/claims.py reads their conform.json).

    .venv/bin/python scripts/conform_paths_study.py [OUT]   (default reports/conform/paths)
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvphase.conform.check import EngineChoice, conform
from kvphase.conform.references import DEFAULT_REFERENCES
from kvphase.engines.llama_server import find_llama_server, llama_server

CONTEXTS = 64  # of each folder's plan: the model-level check beside the paths, whole rounds of residues


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "reports/conform/paths")
    conform(DEFAULT_REFERENCES, EngineChoice("llama.cpp", threads=1, contexts=CONTEXTS), out / "unpatched-llama.cpp",
            print)
    binary = find_llama_server()
    for reference in DEFAULT_REFERENCES:
        with llama_server(reference.model, binary=binary, threads=1, slots=2, n_ctx_per_slot=512) as server:
            choice = EngineChoice("server", urls=(server.url,), contexts=CONTEXTS)
            conform((reference,), choice, out / "unpatched-server" / reference.name, print)


if __name__ == "__main__":
    main()
