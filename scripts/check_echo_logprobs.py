"""Can llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`) teacher-force a
query? Its `/v1/completions` with `echo` and `logprobs` calls `Llama.create_completion`; this
script asks that function for the prompt's log-probabilities and compares them with the
teacher-forced ones computed from a plain evaluation of the same tokens (issue 40, part 4).

    .venv/bin/python scripts/check_echo_logprobs.py [MODEL.gguf]

With llama-cpp-python 0.3.36 it prints two defects: a prompt given as token ids (what kvphase
sends, so that the server cannot tokenize differently) fails with a TypeError when `echo` is
on, and for a text prompt each token's echoed log-probability is the one its own position
gives it (the distribution over the *next* token), not the one the previous position gives it.
Exit 0 when both are fixed, 1 while either remains.
"""

from __future__ import annotations

import sys

import numpy as np

from kvphase.defaults import default_model_path
from kvphase.engines.llamacpp import high_level_llama

TEXT = "The capital of France is Paris. The capital of Italy is Rome."


def log_softmax(scores: np.ndarray) -> np.ndarray:  # (n, vocab) -> (n, vocab)
    top = scores.max(axis=1, keepdims=True)
    return scores - top - np.log(np.exp(scores - top).sum(axis=1, keepdims=True))


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else default_model_path()
    llm = high_level_llama(path, logits_all=True, verbose=False, n_ctx=256)
    ids = llm.tokenize(TEXT.encode(), add_bos=True)
    try:
        llm.create_completion(ids, max_tokens=1, echo=True, logprobs=1, temperature=0)
        ids_work = True
    except TypeError as exc:
        ids_work = False
        print(f"a prompt of token ids with echo: TypeError ({exc})")
    echoed = llm.create_completion(TEXT, max_tokens=1, echo=True, logprobs=1, temperature=0)
    echo = np.array(echoed["choices"][0]["logprobs"]["token_logprobs"][1:len(ids)], dtype=np.float64)  # (n - 1,)
    plain = high_level_llama(path, logits_all=True, verbose=False, n_ctx=256)
    plain.eval(ids)
    rows = log_softmax(np.array(plain.scores[:len(ids)], dtype=np.float64))  # (n, vocab): row i predicts token i + 1
    forced = np.array([rows[i - 1, ids[i]] for i in range(1, len(ids))])  # log p(token i | tokens before it)
    own_row = np.array([rows[i, ids[i]] for i in range(1, len(ids))])
    off = np.abs(echo - forced)
    print(f"echoed against teacher-forced log-probabilities, {len(forced)} tokens: max |diff| {off.max():.3f}, "
          f"mean {off.mean():.3f}")
    print(f"echoed against each token's own row: max |diff| {np.abs(echo - own_row).max():.2e}")
    return 0 if ids_work and off.max() < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
