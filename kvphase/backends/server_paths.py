"""What a llama-server may run differently from kvphase's in-process scoring, by the model's
architecture: settings a server's /props does not tell (llama.cpp 0.3.36 reports its
slots, not its flash attention or whether its cache is unified), and paths measured to differ
(docs/conform.md), so the sweep says so once per server instead of scoring a different model in
silence."""

from __future__ import annotations

from kvphase.engines.llamacpp import SPARSE_NEEDS_FLASH_ONE_STREAM

AUTO_SLOTS = 4  # llama-server's -np auto: 4 slots sharing one unified cache (tools/server/server.cpp)
# architectures whose answers moved when two slots decoded at once (docs/conform.md, reports/conform/paths)
SLOTS_MOVE = {"glm5-next": 0.27}  # the largest move measured, nats (glm5-next-random through two workers)


def path_warnings(backend) -> list[str]:
    """One line per server (`backend.servers`, ServerInfo) whose model's answers depend on settings
    /props hides or on a path measured to differ; `backend.vocab` names the architecture (a test's
    vocabulary may name none), `backend.slots` the workers per server (None: every slot)."""
    architecture = getattr(backend.vocab, "architecture", "")
    lines = []
    for server in backend.servers:
        if architecture in SPARSE_NEEDS_FLASH_ONE_STREAM:
            lines.append(f"{server.url}: llama.cpp runs {architecture}'s sparse attention only with flash attention "
                         "on and one KV stream per slot (llama-server -fa on, and -np given or --no-kv-unified); "
                         "otherwise dense attention, which moved a tiny model's 4-token answers by 1.4-1.8 nats "
                         "(scripts/engine_paths_repro.py); its /props does not say which it runs"
                         + (f", and its {AUTO_SLOTS} slots are what -np auto gives, with a unified cache: dense"
                            if server.slots == AUTO_SLOTS else ""))
        workers = backend.slots or server.slots
        if architecture in SLOTS_MOVE and workers > 1:
            lines.append(f"{server.url}: {workers} of its slots score at once, and llama.cpp moved {architecture}'s "
                         f"answers by up to {SLOTS_MOVE[architecture]:g} nats when two slots decoded together "
                         "(docs/conform.md, engine paths); --slots 1 scores one context at a time")
    return lines
