"""What a llama-server may run differently from kvphase's in-process scoring, by the model's
architecture (issue 62): settings a server's /props does not tell (llama.cpp 0.3.36 reports its
slots, not its flash attention or whether its cache is unified), so the sweep says so once per
server instead of scoring a different model in silence."""

from __future__ import annotations

from typing import Sequence

from kvphase.engines.llamacpp import SPARSE_NEEDS_FLASH_ONE_STREAM

AUTO_SLOTS = 4  # llama-server's -np auto: 4 slots sharing one unified cache (tools/server/server.cpp)


def path_warnings(vocab, servers: Sequence) -> list[str]:
    """One line per server (ServerInfo) whose model's attention depends on settings /props hides;
    `vocab` is the model's (`engines.llamacpp.Vocab`, or a test's without an architecture)."""
    architecture = getattr(vocab, "architecture", "")
    if architecture not in SPARSE_NEEDS_FLASH_ONE_STREAM:
        return []
    return [f"{server.url}: llama.cpp runs {architecture}'s sparse attention only with flash attention on and "
            "one KV stream per slot (llama-server -fa on, and -np given or --no-kv-unified); otherwise dense "
            "attention, which moved a tiny model's 4-token answers by 1.4-1.8 nats (scripts/engine_paths_repro.py); "
            "its /props does not say which it runs"
            + (f", and its {AUTO_SLOTS} slots are what -np auto gives, with a unified cache: dense"
               if server.slots == AUTO_SLOTS else "") for server in servers]
