"""The two scoring routes of `--engine openai` through a real vLLM (issue 72): targets per second of
the prefix-cached "generate" route against the "forced" route (prompt logprobs, which vLLM serves
without its prefix cache, so each query evaluates its whole context again), on the same contexts, in
one run; and how often their exact-match flags agree (and where they differ, which targets).

    .venv/bin/python bench/bench_vllm_routes.py [--url http://127.0.0.1:PORT] [--contexts 4] [--quick] [MODEL]

Default: the bundled SmolLM2 at 2048-token contexts with the task's default density, through a vLLM
that scripts/setup_vllm.sh installs and starts (eager, with prompt token details) unless --url names
one serving the HF copy of the same model. Not in `make bench`: vLLM takes minutes to install and start.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import time
from pathlib import Path

SETUP = Path(__file__).resolve().parents[1] / "scripts" / "setup_vllm.sh"


@contextlib.contextmanager
def vllm_at(url):
    """`url`, or a vLLM started here on a free port (stopped at the end)."""
    if url:
        yield url
        return
    from kvphase.engines.llama_server import _running, free_port

    subprocess.run([str(SETUP)], check=True, stdout=subprocess.DEVNULL)
    port = free_port()
    with _running([str(SETUP), "serve", str(port), "--enforce-eager", "--enable-prompt-tokens-details"],
                  f"http://127.0.0.1:{port}", 900.0) as server:
        yield server.url


def main() -> None:
    from kvphase.backends.fleet import open_server_backend
    from kvphase.defaults import default_model_path
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.sweep.contexts import build_contexts
    from kvphase.sweep.plan import SweepPlan, query_room
    from kvphase.sweep.tasks import load_task

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", type=Path, default=None)
    parser.add_argument("--url", default=None)
    parser.add_argument("--contexts", type=int, default=4)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--quick", action="store_true", help="512-token contexts, 2 of them")
    args = parser.parse_args()
    if args.quick:
        args.context, args.contexts = 512, 2
    info = read_model_info(args.model or default_model_path())
    plan = SweepPlan(model=str(info.path), task="records", stride=4, modulus=8, context=args.context, per_residue=4,
                     padding="prefix", seed=0, control=True, backend="server")
    with vllm_at(args.url) as url:
        backends = {route: open_server_backend(info.path, n_ctx=plan.context + query_room(info), engine="openai",
                                               urls=[url], scoring=route) for route in ("forced", "generate")}
        contexts = build_contexts(load_task(plan.task), backends["forced"], plan.context_settings)[:args.contexts]
        targets = sum(len(c.targets) for c in contexts)
        measured = {}
        for route, backend in backends.items():
            tokens, started = backend.tokens_evaluated, time.perf_counter()
            scores = [backend.score(c.tokens, [t.query for t in c.targets]) for c in contexts]
            measured[route] = (time.perf_counter() - started, backend.tokens_evaluated - tokens,
                               [s for per_context in scores for s in per_context])
    (forced_s, forced_tokens, forced), (generate_s, generate_tokens, generated) = measured["forced"], measured["generate"]
    differ = [i for i, (a, b) in enumerate(zip(forced, generated)) if a.correct != b.correct]
    known = [abs(a.logprob - b.logprob) for a, b in zip(forced, generated) if b.logprob == b.logprob]  # not NaN
    print(f"vLLM at {url}: {len(contexts)} contexts of {plan.context} tokens, {targets} targets "
          f"({targets / len(contexts):.0f} per context)")
    print("| route | seconds | targets/s | tokens evaluated |")
    print("| --- | --- | --- | --- |")
    for route, (seconds, tokens, _) in measured.items():
        print(f"| {route} | {seconds:.1f} | {targets / seconds:.2f} | {tokens:,} |")
    print(f"generate / forced targets/s: {forced_s / generate_s:.1f}x; tokens evaluated: "
          f"{forced_tokens / max(generate_tokens, 1):.1f}x fewer")
    print(f"exact-match flags equal on {targets - len(differ)} of {targets} targets"
          + (f"; they differ at target indices {differ}" if differ else ""))
    print(f"answer log-probability given by the generate route on {len(known)} of {targets} targets (where it "
          f"generated the answer); largest difference from the forced route's there: {max(known, default=0):.2g} nats")


if __name__ == "__main__":
    main()
