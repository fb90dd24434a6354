"""Throughput through servers (issue 40, part 6): targets per second scored in process, through
1, 2 and 4 llama-server processes (one slot and one thread each) and through one llama-server
whose layers are split over two rpc-servers (llama.cpp's RPC, one thread each), as ratios against
in-process measured in one run. The same contexts go through every setup, the rounds interleaved so that load
from other work on the machine falls on all; each ratio is of the best round of each.

    .venv/bin/python bench/bench_servers.py [--contexts 8] [--rounds 2] [--quick] [MODEL]

Default model: SmolLM2-135M-Instruct (the bundled default) at 512-token contexts. On a machine
with fewer cores than servers the servers share them: the ratio then says what the cores allow,
not what the servers could do apart. The RPC split runs on localhost: what it costs is the
layers' hand-over between processes, without a network's latency.
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack
from pathlib import Path

SERVERS = (1, 2, 4)


def main() -> None:
    from kvphase.backends.fleet import open_server_backend
    from kvphase.defaults import default_model_path
    from kvphase.engines.llama_server import find_llama_server, llama_server, rpc_options, rpc_server
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.sweep.backend_setup import open_backend
    from kvphase.sweep.contexts import build_contexts
    from kvphase.sweep.plan import SweepPlan, query_room
    from kvphase.sweep.tasks import load_task

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", type=Path, default=None)
    parser.add_argument("--contexts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2 contexts, one round, 1 and 2 servers (CI)")
    args = parser.parse_args()
    servers = SERVERS[:2] if args.quick else SERVERS
    if args.quick:
        args.contexts, args.rounds = 2, 1
    info = read_model_info(args.model or default_model_path())
    plan = SweepPlan(model=str(info.path), task="records", stride=4, modulus=8, context=512, per_residue=2,
                     padding="prefix", seed=0, control=True, backend="llama.cpp")
    n_ctx = plan.context + query_room(info)
    binary = find_llama_server()
    with ExitStack() as stack:
        local = stack.enter_context(open_backend(plan, info, threads=1))
        contexts = build_contexts(load_task(plan.task), local, plan.context_settings)[:args.contexts]
        jobs = [(c.tokens, [t.query for t in c.targets]) for c in contexts]
        targets = sum(len(queries) for _, queries in jobs)
        running = [stack.enter_context(llama_server(info.path, binary=binary, threads=1, slots=1,
                                                    n_ctx_per_slot=n_ctx + 64)) for _ in range(max(servers))]
        rpcs = [stack.enter_context(rpc_server()) for _ in range(2)]
        split = stack.enter_context(llama_server(info.path, binary=binary, threads=1, slots=1, n_ctx_per_slot=n_ctx + 64,
                                                 extra=rpc_options([rpc.url for rpc in rpcs])))
        setups = {"in process (1 thread)": local}
        for n in servers:
            setups[f"{n} llama-server{'s' if n > 1 else ''} (1 thread each)"] = open_server_backend(
                info, n_ctx=n_ctx, urls=[server.url for server in running[:n]])
        setups["1 llama-server over 2 rpc-servers"] = open_server_backend(info, n_ctx=n_ctx, urls=[split.url])
        best = {name: float("inf") for name in setups}
        for _ in range(args.rounds):
            for name, backend in setups.items():
                started = time.perf_counter()
                for _ in backend.score_many(jobs) if hasattr(backend, "score_many") else (
                        backend.score(*job) for job in jobs):
                    pass
                best[name] = min(best[name], time.perf_counter() - started)
    print(f"{info.path.name}, {len(jobs)} contexts of {plan.context} tokens, {targets} targets, best of {args.rounds}\n")
    print("| setup | targets/s | x in process |\n|---|---|---|")
    base = targets / best["in process (1 thread)"]
    for name, seconds in best.items():
        print(f"| {name} | {targets / seconds:.1f} | {targets / seconds / base:.2f} |", flush=True)


if __name__ == "__main__":
    main()
