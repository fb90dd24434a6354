"""The smallest in-process reproduction of how llama.cpp 0.3.36 scores one answer on each path
(issue 62, item 5): a tiny random-weight model, a context of random token ids, and the answer's
log-probability (summed over its tokens) under

- flash attention off / on,
- one sequence (`n_seq_max 1`) / kvphase's in-process cache until issue 62 (`n_seq_max 2`,
  unified), which is also llama-server's at its defaults (`-np` auto: 4 slots, unified),
- the whole text decoded in one batch / the answer decoded one token per `llama_decode`.

Every row is compared with the first (flash attention on, one sequence, one batch: the only
setting in which minimax-m3 runs its sparse attention, MSA, on every path). For minimax-m3,
src/models/minimax-m3.cpp builds MSA only when `cparams.flash_attn && (n_seq_max == 1 ||
!kv_unified)` and otherwise runs dense attention over every cached token (it logs a warning
once, which a silenced log hides): so the rows without flash attention, and the rows with a
unified two-sequence cache, are a different model.

    python scripts/engine_paths_repro.py [--arch minimax-m3 deepseek4 glm5-next] [--context 256 258]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from kvphase.engines import llamacpp as engine
from kvphase.gguf.tiny import TINY_VOCAB, write_tiny_model

ANSWER = 4
SETTINGS = [  # (flash attention, n_seq_max, unified)
    (True, 1, False), (False, 1, False), (True, 2, True), (False, 2, True), (True, 2, False),
]


def answer_logprob(model, tokens: list[int], n_answer: int, *, flash_attn: bool, n_seq_max: int, unified: bool,
                   one_batch: bool) -> float:
    """log P(last n_answer tokens | the rest), the text decoded in one batch or the context in one
    batch and each answer-predicting token in a decode of its own."""
    import llama_cpp

    ctx = engine.new_context(model, n_ctx=1024, n_batch=len(tokens), n_threads=1, n_seq_max=n_seq_max,
                             flash_attn=flash_attn, kv_unified=unified)
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    first = len(tokens) - n_answer - 1  # the row that predicts the first answer token
    rows = [(t, i, 0, i >= first) for i, t in enumerate(tokens[:-1])]
    try:
        if one_batch:
            logits = _decoded(ctx, batch, rows)
        else:
            _decoded(ctx, batch, rows[:first])
            logits = np.concatenate([_decoded(ctx, batch, [row]) for row in rows[first:]])
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    logits = logits.astype(np.float64)  # (n_answer, n_vocab)
    logsoftmax = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    return float(logsoftmax[np.arange(n_answer), tokens[-n_answer:]].sum())


def _decoded(ctx, batch, rows) -> np.ndarray:
    status = engine.decode(ctx, batch, rows)
    if status != 0:
        raise SystemExit(f"llama_decode failed with status {status}")
    return engine.logits(ctx, rows, TINY_VOCAB)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", default=["minimax-m3", "deepseek4", "glm5-next"])
    parser.add_argument("--context", nargs="+", type=int, default=[256, 258])
    args = parser.parse_args()
    import llama_cpp

    with tempfile.TemporaryDirectory() as folder:
        for arch in args.arch:
            path = write_tiny_model(arch, Path(folder) / f"{arch}.gguf")
            model = engine.load_model(path)
            try:
                for n_context in args.context:
                    tokens = np.random.default_rng(n_context).integers(0, TINY_VOCAB, n_context + ANSWER).tolist()
                    print(f"\n{arch}, {n_context}-token context, {ANSWER}-token answer: log P(answer)")
                    reference = None
                    for flash_attn, n_seq_max, unified in SETTINGS:
                        for one_batch in (True, False):
                            lp = answer_logprob(model, tokens, ANSWER, flash_attn=flash_attn, n_seq_max=n_seq_max,
                                                unified=unified, one_batch=one_batch)
                            reference = lp if reference is None else reference
                            print(f"  fa {'on ' if flash_attn else 'off'}  n_seq_max {n_seq_max}"
                                  f"{' unified' if unified else ' streams'}  "
                                  f"{'one batch    ' if one_batch else 'token by token'}  {lp:9.4f}  "
                                  f"diff {lp - reference:+.4f}")
            finally:
                llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
