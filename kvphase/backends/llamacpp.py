"""Scoring through llama.cpp's low-level API (llama-cpp-python).

A context is decoded once into sequence 0 with no logits requested. Each query then
gets a copy of that sequence (`llama_memory_seq_cp`: metadata only in a unified KV
cache, a state copy for recurrent layers), is decoded with logits requested only at the
rows that predict answer tokens, and its sequence is removed again. That leaves the
context untouched for the next query, also for models whose recurrent layers cannot
roll back part of a sequence. Queries that start with the same pad (`Query.pad`: answer phases'
filler before the question) branch from one copy of the context that holds the pad, decoded once
per pad, so the queries of a context decode their pads once each (the same tokens at the same
positions, in one more decode). minimax-m3 is the exception: llama.cpp runs its sparse attention
only under flash attention with one KV stream per sequence (dense attention otherwise), so it
gets a one-sequence context, flash attention, and each query decoded after the context in its
own sequence and removed again (`engines.llamacpp.SPARSE_NEEDS_FLASH_ONE_STREAM`).

One query per decode: with several queries' sequences in one batch, llama.cpp 0.3.36
gave some queries log-probabilities up to 0.19 away from the same query scored as its
own prompt (tests/backends/test_scoring.py checks the equality). scripts/batched_queries_repro.py
narrows it: without flash attention in a unified cache, every sequence of the batch but the
first moves (the default model); with flash attention, or one stream per sequence, none does;
and one batch saved under a tenth of the queries' decode time there (their decode is compute-
bound on a CPU), so the queries stay one per decode. The session itself (load, context,
batches, decode, logits) is `kvphase.engines.llamacpp`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from kvphase.backends.base import Query, Score, cut_at, log_softmax_rows, score_from_logits
from kvphase.defaults import default_threads
from kvphase.engines import llamacpp as engine
from kvphase.errors import BackendError, PlanError
from kvphase.gguf.keys import Keys
from kvphase.gguf.modelinfo import ModelInfo, as_model_info

CONTEXT_SEQ, QUERY_SEQ, PAD_SEQ = 0, 1, 2
UNLOADABLE = "unsupported architecture or corrupt file"


class LlamaCppBackend:
    """A GGUF model in llama.cpp, scoring teacher-forced queries after a shared context."""

    def __init__(
        self,
        model: str | Path | ModelInfo,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        flash_attn: bool = False,
        head_tap: bool = False,
        cache_type: str = "f16",
        n_gpu_layers: int = 0,
    ):
        """`head_tap`: install a `TapPoint` (`self.tap_point`): its tap (`engines.taps`) sees, and
        may overwrite, the graph nodes it selects (knockouts). `cache_type`: the K and V cache
        type (`engines.llamacpp.CACHE_TYPES`); a quantized one runs under flash attention."""
        import llama_cpp

        self._lc = llama_cpp
        info = self.info = as_model_info(model)  # a twin with a graph tap opens the same (conform.ties)
        self.n_gpu_layers = n_gpu_layers  # a twin with a graph tap opens the same (conform.ties)
        self._model = engine.load_model(info, n_gpu_layers=n_gpu_layers)
        if not self._model:
            raise BackendError(f"llama.cpp could not load {self.info.path} "
                               f"({_out_of_memory(info, n_ctx, cache_type, 'weights') or UNLOADABLE})")
        self.vocab = engine.Vocab(self._model)
        self.n_vocab = self.vocab.n_vocab
        self.n_batch = n_batch
        # n_seq_max 3: the context, a copy of it holding a pad, and the query scored on a copy of either; an architecture whose
        # sparse attention needs one KV stream scores the query on the context's own sequence and
        # removes it again (rollback: its cache is attention only)
        self.architecture = engine.model_meta(self._model, Keys.General.ARCHITECTURE)
        self.one_sequence = self.architecture in engine.SPARSE_NEEDS_FLASH_ONE_STREAM
        self.flash_attn = flash_attn or self.one_sequence
        self.n_threads = n_threads or default_threads()  # recorded in a run's manifest
        self.cache_type = cache_type
        self.tap_point = self._tap_point() if head_tap else None
        self._context_tap = None  # the every-decode tap the cached context was decoded under
        try:
            self._ctx = engine.new_context(self._model, n_ctx=n_ctx, n_batch=n_batch, n_threads=self.n_threads,
                                           n_seq_max=1 if self.one_sequence else 3, flash_attn=self.flash_attn,
                                           kv_unified=not self.one_sequence, cache_type=cache_type,
                                           label=str(self.info.path),
                                           cb_eval=self.tap_point.c_callback if head_tap else None)
        except BackendError as exc:
            memory = _out_of_memory(info, n_ctx, cache_type, "context")
            self.close()
            if memory is None:
                raise
            raise BackendError(f"llama.cpp could not create a context of {n_ctx} tokens for {self.info.path} "
                               f"({memory})") from exc
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(max(n_batch, 1), 0, 1)
        self._context: tuple[int, ...] = ()
        self._pad: tuple[int, ...] = ()  # the pad PAD_SEQ holds after the context
        self.tokens_evaluated = 0

    def _tap_point(self):
        from kvphase.engines.taps import TapPoint, head_output_node

        self.head_node, self.n_head = head_output_node(self.architecture), self._lc.llama_model_n_head(self._model)
        return TapPoint()

    def meta(self, key: str) -> str:
        """A metadata value of the model as llama.cpp reads it ("" when absent)."""
        return engine.model_meta(self._model, key)

    def layers_where(self, locate) -> list[int]:
        """The layers in which `locate` (name, layer, tensor -> layer or None; `engines.taps.named`)
        finds a node of llama.cpp's graph, found by decoding one token (the context cache is cleared)."""
        from kvphase.engines.taps import NodeFinder

        if self.tap_point is None:
            raise BackendError("this llama.cpp backend was opened without a head tap")
        finder, kept = NodeFinder(locate), self.tap_point.tap
        self._lc.llama_memory_clear(self._memory, True)
        self._context, self.tap_point.tap = (), finder
        try:
            self._decode([(self.prefix_ids[0] if self.prefix_ids else 0, 0, self._query_seq, True)], query=True)
        finally:
            self.tap_point.tap = kept
            self._lc.llama_memory_clear(self._memory, True)
        return sorted(finder.layers)

    # -- tokenizer: the model's own vocabulary ------------------------------------------

    @property
    def n_ctx_train(self) -> int:
        return self.vocab.n_ctx_train

    @property
    def prefix_ids(self) -> list[int]:
        return self.vocab.prefix_ids

    def tokenize(self, text: str) -> list[int]:
        return self.vocab.tokenize(text)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.vocab.detokenize(ids)

    # -- scoring ---------------------------------------------------------------------

    def score(self, context: Sequence[int], queries: Sequence[Query]) -> list[Score]:
        """Decode `context` once (kept while the next call passes the same one), then score
        each query after it."""
        self._check_and_load(context, queries)
        return self._in_pad_order(queries, lambda query: score_from_logits(self._query_logits(len(context), query),
                                                                           query.answer))

    def answer_logprobs(self, context: Sequence[int], queries: Sequence[Query],
                        cuts: Sequence[int] = ()) -> list[np.ndarray]:
        """What `score` evaluates, as each query's log-softmax rows (n_answer, n_vocab); `cuts`:
        offsets into the query's rows (prompt + answer[:-1]) where a new decode starts."""
        self._check_and_load(context, queries)
        return self._in_pad_order(queries, lambda query: log_softmax_rows(self._query_logits(len(context), query, cuts)))

    def _in_pad_order(self, queries: Sequence[Query], evaluate) -> list:
        """`evaluate(query)` of every query, made in the order of their pads (each pad decoded once),
        returned in the queries' order; the pad's copy of the context is dropped afterwards."""
        order = sorted(range(len(queries)), key=lambda i: queries[i].prompt[:queries[i].pad])
        results: list = [None] * len(queries)
        try:
            for i in order:
                results[i] = evaluate(queries[i])
        finally:
            self._drop_pad()
        return results

    def _check_and_load(self, context: Sequence[int], queries: Sequence[Query]) -> None:
        if any(not q.prompt or not q.answer for q in queries):
            raise PlanError("every query needs a non-empty prompt and answer")
        room = min(self.n_batch, self.n_ctx - len(context))
        for query in queries:
            if len(query.prompt) + len(query.answer) - 1 > room:
                raise PlanError(f"a {len(query.prompt) + len(query.answer)}-token query does not fit beside a "
                                f"{len(context)}-token context in the {self.n_ctx}-token llama.cpp context")
        self._load_context(tuple(context))

    def _load_context(self, context: tuple[int, ...]) -> None:
        """Decode the context into sequence 0 in n_batch chunks from position 0.

        A cached context is reused only when it is the same one: decoding a partial tail
        would change the batch shapes, and llama.cpp's quantized kernels round differently
        by batch shape, so scores would drift from a separate prompt's.
        """
        tap = self.tap_point.tap if self.tap_point is not None else None
        context_tap = tap if getattr(tap, "every_decode", False) else None
        if context == self._context and context_tap is self._context_tap:
            return
        self._context_tap = context_tap
        # clear, not seq_rm(-1, -1, -1): glm5-next's hybrid (KDA + k-pool) memory refuses that removal
        # after a query was copied off the context, and the next context then fails to decode (status -1)
        self._lc.llama_memory_clear(self._memory, True)
        self._context, self._pad = (), ()
        for start in range(0, len(context), self.n_batch):
            chunk = context[start:start + self.n_batch]
            self._decode([(t, start + i, CONTEXT_SEQ, False) for i, t in enumerate(chunk)])
        self._context = context

    def _query_logits(self, n_context: int, query: Query, cuts: Sequence[int] = ()) -> np.ndarray:
        """Decode the query on a copy of the context's sequence (in one batch, or in the parts
        `cuts` makes), then drop the copy; the logit rows that predict the answer tokens:
        (n_answer, n_vocab)."""
        pad = query.pad if not (self.one_sequence or cuts) else 0  # cuts count from the query's first token
        if not self.one_sequence:
            self._lc.llama_memory_seq_cp(self._memory, self._pad_seq(n_context, query.prompt[:pad]), QUERY_SEQ, -1, -1)
        first_scored = len(query.prompt) - 1 - pad
        rows = [(t, n_context + pad + i, self._query_seq, i >= first_scored)
                for i, t in enumerate(query.prompt[pad:] + query.answer[:-1])]
        try:
            return np.concatenate([self._decoded(rows[part.start:part.stop]) for part in cut_at(len(rows), cuts)])
        finally:
            self._lc.llama_memory_seq_rm(self._memory, self._query_seq, n_context if self.one_sequence else -1, -1)

    def _pad_seq(self, n_context: int, pad: tuple[int, ...]) -> int:
        """The sequence a query that starts with `pad` branches from: the context's (no pad), or its copy
        holding the pad, decoded when it is not the pad it holds already."""
        if not pad:
            return CONTEXT_SEQ
        if pad != self._pad:
            self._drop_pad()
            self._lc.llama_memory_seq_cp(self._memory, CONTEXT_SEQ, PAD_SEQ, -1, -1)
            self._decode([(t, n_context + i, PAD_SEQ, False) for i, t in enumerate(pad)])
            self._pad = pad
        return PAD_SEQ

    def _drop_pad(self) -> None:
        if self._pad:
            self._pad = ()
            self._lc.llama_memory_seq_rm(self._memory, PAD_SEQ, -1, -1)

    @property
    def _query_seq(self) -> int:
        return CONTEXT_SEQ if self.one_sequence else QUERY_SEQ

    def _decoded(self, rows: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """Decode query rows as one batch; the logits of those that asked: (n_requested, n_vocab)."""
        self._decode(rows, query=True)
        return self._requested_logits(rows)

    def _decode(self, rows: list[tuple[int, int, int, bool]], query: bool = False) -> None:
        """Decode (token, position, sequence, wants logits) rows as one batch; the tap, if any,
        sees query decodes, and the context's when it taps every decode."""
        point = self.tap_point
        if point is not None:
            point.active = query or getattr(point.tap, "every_decode", False)
            point.positions = np.array([row[1] for row in rows])
        try:
            status = engine.decode(self._ctx, self._batch, rows)
        finally:
            if point is not None:
                point.active = False
        if point is not None:
            point.raise_errors()
        if status != 0:
            raise BackendError(f"llama_decode failed with status {status} on a batch of {len(rows)} tokens")
        self.tokens_evaluated += len(rows)

    def _requested_logits(self, rows) -> np.ndarray:
        return engine.logits(self._ctx, rows, self.n_vocab)  # (n_scored_rows, n_vocab)

    def engine_info(self) -> dict:
        """llama-cpp-python's version and the CPU features its llama.cpp was built with."""
        return {"engine": "llama-cpp-python", "version": self._lc.__version__,
                "system_info": self._lc.llama_print_system_info().decode().strip(),
                **({"flash_attn": True} if self.flash_attn else {}),
                **({"cache_type": self.cache_type} if self.cache_type != "f16" else {})}

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            self._lc.llama_batch_free(self._batch)
            self._lc.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            self._lc.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _out_of_memory(info: ModelInfo, n_ctx: int, cache_type: str, stage: str) -> str | None:
    """Memory named as the likely cause of a failed load (`stage` "weights") or context
    ("context", the weights loaded already), when the estimate exceeds what is available."""
    from kvphase.engines.memory import available_memory, memory_need, shortfall

    need = memory_need(info, n_ctx, cache_type=cache_type)
    clause = shortfall(need.weights if stage == "weights" else need.kv_cache + need.compute, available_memory())
    remedy = "a smaller or more quantized model" if stage == "weights" else "a shorter --context"
    return clause and f"not enough memory, the likely cause: the {stage}: {clause}; use {remedy} or a machine with " \
                      "more memory"

