"""What a second query on the same context costs in llama-server, per architecture.

For each model: a context of random token ids is evaluated alone on a slot
(`cache_prompt: false`), then two queries follow as a sweep sends them (the context
again plus a few query tokens, the answer forced by a token-id grammar). The server's
own `timings.prompt_n` says how many prompt tokens it evaluated for each request: a
dense model reuses the whole context; recurrent/hybrid (glm5-next) and sliding-window
(deepseek4's iSWA cache) models can reuse a prefix only through a checkpoint near the
end of a prompt.

Tiny `make-tiny` models get the default model's tokenizer (llama-server aborts on a
model without one when it renders a token), and token ids are sent directly.

    python scripts/server_prefix_reuse.py [--context 512] [--arch glm5-next deepseek4 llama]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from kvphase.backends.transport import Http, Retry
from kvphase.defaults import default_model_path
from kvphase.engines.llama_server import llama_server
from kvphase.gguf.tiny import TINY_VOCAB, write_tiny_model


def measure(model: Path, context_len: int, query_len: int = 6, answer_len: int = 2) -> list[int]:
    """Prompt tokens the server evaluated for: the context alone, a first and a second query."""
    rng = np.random.default_rng(0)
    context = [int(t) for t in rng.integers(1, TINY_VOCAB, context_len)]
    with llama_server(model, n_ctx_per_slot=context_len + 64, threads=1) as server:
        http = Http(server.url, Retry())
        evaluated = [http.post("/completion", {"prompt": context, "n_predict": 0, "id_slot": 0,
                                               "cache_prompt": False})["timings"]["prompt_n"]]
        for _ in range(2):
            query = [int(t) for t in rng.integers(1, TINY_VOCAB, query_len)]
            answer = [int(t) for t in rng.integers(1, TINY_VOCAB, answer_len)]
            out = http.post("/completion", {"prompt": context + query, "n_predict": answer_len, "id_slot": 0,
                                            "cache_prompt": True, "temperature": 0.0, "n_probs": 1,
                                            "grammar": "root ::= " + " ".join(f"<[{t}]>" for t in answer)})
            evaluated.append(out["timings"]["prompt_n"])
    return evaluated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--arch", nargs="+", default=["llama", "glm5-next", "deepseek4"])
    args = parser.parse_args()
    print(f"prompt tokens llama-server evaluates, {args.context}-token context, 6-token queries")
    print(f"{'model':<14}{'context alone':>15}{'1st query':>11}{'2nd query':>11}")
    with tempfile.TemporaryDirectory() as folder:
        for arch in args.arch:
            path = write_tiny_model(arch, Path(folder) / f"{arch}.gguf", tokenizer_from=default_model_path())
            alone, first, second = measure(path, args.context)
            print(f"{arch:<14}{alone:>15}{first:>11}{second:>11}")


if __name__ == "__main__":
    main()
