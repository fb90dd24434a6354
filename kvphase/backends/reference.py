"""Scoring through the numpy reference transformer, with llama.cpp's tokenizer.

The context is evaluated once into a KV cache (reusing the prefix it shares with the
previous context); each query runs after it and the cache is rolled back. Tokens come
from llama.cpp's own vocabulary (`Llama(vocab_only=True)`), so prompts are identical
to the llama.cpp backend's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from kvphase.backends.base import Query, Score, cut_at, log_softmax_rows, score_from_logits
from kvphase.engines.llamacpp import silence_llama_logs
from kvphase.errors import BackendError, PlanError
from kvphase.gguf.header_only import require_weights
from kvphase.gguf.limits import check_llama_limits
from kvphase.gguf.modelinfo import ModelInfo, as_model_info
from kvphase.reference import open_model
from kvphase.reference.model import AttentionPolicy
from kvphase.reference.policy import PhaseShiftable, begin_context, check_policy_layers, make_policy

__all__ = ["ReferenceBackend", "make_policy"]


class ReferenceBackend:
    """A llama-family GGUF model in numpy, optionally under a KV-compression policy."""

    def __init__(self, model: str | Path | ModelInfo, policy: AttentionPolicy | None = None):
        import llama_cpp

        silence_llama_logs()
        info = as_model_info(model)
        self.model_path = info.path
        check_llama_limits(info.header)  # the vocabulary below is read by llama.cpp
        require_weights(info.header, "the reference model")
        self.model = open_model(info, policy=policy)
        check_policy_layers(self.model.policy, self.model.config.n_layer)
        self._vocab = llama_cpp.Llama(str(self.model_path), vocab_only=True, verbose=False)
        self._cache = self.model.new_cache()
        self._context: tuple[int, ...] = ()
        self._policy_key: tuple | None = None
        self.tokens_evaluated = 0
        self.n_threads = None  # numpy's BLAS picks its own

    @property
    def policy(self) -> AttentionPolicy:
        return self.model.policy

    @policy.setter
    def policy(self, policy: AttentionPolicy) -> None:
        """Swap the attention policy; the cached context is evaluated again under it."""
        self.model.policy = policy

    def shift_windows(self, phase_shift: int) -> None:
        """Move the compressor's window starts back by `phase_shift` tokens (0: as the policy
        was opened), so every token's phase moves by it while positions stay (offset ensembling,
        `sweep.offsets`); a policy without windows (dense) is left as it is. The next context is
        evaluated whole: numpy's float32 sums depend on how many rows one forward holds, so a
        context continued from a cached prefix scores about 1e-6 away from one evaluated whole,
        and every shift of an ensemble must score as its own shifted sweep does."""
        self._policy_key = None  # no cached prefix is reused (`_load_context`)
        if isinstance(self.policy, PhaseShiftable):  # the shift is absolute: shifted(0) undoes any earlier one
            self.policy = self.policy.shifted(phase_shift)

    # -- tokenizer -------------------------------------------------------------------

    @property
    def n_ctx_train(self) -> int:
        return self.model.config.n_ctx_train

    @property
    def bos_id(self) -> int | None:
        bos = self._vocab.token_bos()
        return bos if bos >= 0 else None

    @property
    def prefix_ids(self) -> list[int]:
        """What llama.cpp puts before a prompt: BOS when the vocabulary asks for it."""
        import llama_cpp

        vocab = llama_cpp.llama_model_get_vocab(self._vocab.model)
        return [self.bos_id] if llama_cpp.llama_vocab_get_add_bos(vocab) and self.bos_id is not None else []

    def tokenize(self, text: str) -> list[int]:
        return list(self._vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._vocab.detokenize([int(t) for t in ids]).decode("utf-8", errors="replace")

    # -- scoring ---------------------------------------------------------------------

    def score(self, context: Sequence[int], queries: Sequence[Query]) -> list[Score]:
        """Evaluate `context` once, then each query after it with the cache rolled back
        in between; equal to scoring each `context + query` as its own prompt."""
        return [score_from_logits(logits, query.answer)
                for logits, query in zip(self._answer_logits(context, queries), queries)]

    def answer_logprobs(self, context: Sequence[int], queries: Sequence[Query],
                        cuts: Sequence[int] = ()) -> list[np.ndarray]:
        """What `score` evaluates, as each query's log-softmax rows (n_answer, n_vocab); `cuts`:
        offsets into the query's rows (prompt + answer[:-1]) where a new forward pass starts."""
        return [log_softmax_rows(logits) for logits in self._answer_logits(context, queries, cuts)]

    def _answer_logits(self, context: Sequence[int], queries: Sequence[Query],
                       cuts: Sequence[int] = ()) -> Iterator[np.ndarray]:
        """Each query's logit rows that predict its answer tokens, (n_answer, n_vocab), one at a time."""
        if any(not q.prompt or not q.answer for q in queries):
            raise PlanError("every query needs a non-empty prompt and answer")
        self._load_context(tuple(int(t) for t in context))
        n = len(self._context)
        for query in queries:
            tokens = tuple(query.prompt) + tuple(query.answer[:-1])
            first_scored = len(query.prompt) - 1
            try:
                yield np.concatenate([self._forward(tokens[part.start:part.stop],
                                                    [i - part.start for i in part if i >= first_scored])
                                      for part in cut_at(len(tokens), cuts)])  # (n_answer, n_vocab)
            finally:
                self._cache.truncate(n)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Every row's next-token logits for one prompt from position 0: (n_tokens, n_vocab)."""
        self._cache.truncate(0)
        self._context = ()
        return self._forward(tuple(int(t) for t in tokens), None)

    def _load_context(self, context: tuple[int, ...]) -> None:
        # another policy, or a per-context one (randomized offsets), changes every cached state
        policy = self.policy
        key = (policy, begin_context(policy, context))
        same = self._policy_key is not None and key[0] is self._policy_key[0] and key[1] == self._policy_key[1]
        keep = _common_prefix(self._context, context) if same else 0
        self._policy_key = key
        self._cache.truncate(min(keep, self._cache.n))
        self._context = ()
        if keep < len(context):
            self._forward(context[keep:], [])
        self._context = context

    def _forward(self, tokens: tuple[int, ...], rows) -> np.ndarray:
        try:
            out = self.model.forward(tokens, self._cache, logits_for=rows)
        except MemoryError as exc:
            raise BackendError(f"the reference model ran out of memory on {len(tokens)} tokens") from exc
        self.tokens_evaluated += len(tokens)
        return out

    def engine_info(self) -> dict:
        """The manifest's name for it (numpy's version is the manifest's "versions")."""
        return {"engine": type(self).__name__}

    def close(self) -> None:
        vocab = getattr(self, "_vocab", None)
        if vocab is not None:
            vocab.close()
            self._vocab = None


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
