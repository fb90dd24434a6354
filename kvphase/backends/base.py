"""The interface every backend offers, and the teacher-forced scoring they share."""

from __future__ import annotations

import math
from typing import Callable, Iterator, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np

from kvphase.errors import BackendError


class Query(NamedTuple):
    """Tokens placed right after a context, followed by the answer to score."""

    prompt: tuple[int, ...]  # the question: e.g. the target key and separator
    answer: tuple[int, ...]  # the tokens that must follow
    pad: int = 0  # leading prompt tokens other queries after the context share (answer phases): evaluated once, then branched


class Score(NamedTuple):
    """Teacher-forced result for one query."""

    correct: bool  # every answer token was the argmax given the answer tokens before it
    logprob: float  # sum of log p(answer token | everything before it)
    predicted: tuple[int, ...]  # the argmax token at each answer position


class Tokenizer(Protocol):
    """A model's vocabulary as a sweep uses it: every backend is one, and so is llama.cpp's
    vocabulary read alone (`engines.llamacpp.Vocab`), which plans and the server backend use."""

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, ids: Sequence[int]) -> str: ...

    @property
    def prefix_ids(self) -> list[int]:
        """Tokens every sequence starts with (BOS where the model adds one)."""
        ...

    @property
    def n_ctx_train(self) -> int: ...


@runtime_checkable
class Backend(Tokenizer, Protocol):
    """An engine that tokenizes and scores queries against a shared context. The abilities only
    some backends have are the protocols below, asked for with `isinstance`."""

    tokens_evaluated: int  # tokens decoded so far (the manifest's cost of a session)
    n_threads: int | None  # CPU threads it decodes with; None where it does not choose them

    def score(self, context: Sequence[int], queries: Sequence[Query]) -> list[Score]:
        """Evaluate `context` once and each query after it; equal to scoring each
        `context + query.prompt + query.answer` as its own prompt."""
        ...

    def engine_info(self) -> dict:
        """What the engine says about its own build, for the manifest."""
        ...

    def close(self) -> None:
        """Free what it holds (a second call does nothing)."""
        ...


@runtime_checkable
class ScoresMany(Protocol):
    """Scores several contexts at once (the server backend's fleet of slots)."""

    def score_many(self, jobs: Sequence[tuple[Sequence[int], Sequence[Query]]]
                   ) -> Iterator[tuple[int, list[Score]]]: ...


@runtime_checkable
class AnswerLogprobs(Protocol):
    """Gives the log-softmax rows that predict each answer token, one (n_answer, n_vocab) array
    per query, from the same evaluation `score` makes (offset ensembling, `sweep.offsets`)."""

    def answer_logprobs(self, context: Sequence[int], queries: Sequence[Query],
                        cuts: Sequence[int] = ()) -> list[np.ndarray]: ...


@runtime_checkable
class ShiftsWindows(Protocol):
    """Moves its compressor's window starts while positions stay (window shifts, `sweep.offsets`)."""

    def shift_windows(self, phase_shift: int) -> None: ...


@runtime_checkable
class ServerFleet(Protocol):
    """Scores on servers, some of which may leave mid-run; `on_lost` is told one warning line for
    each that does."""

    servers: list  # ServerInfo of each server that passed its checks
    on_lost: Callable[[str], None]


@runtime_checkable
class TapsGraph(Protocol):
    """llama.cpp in process: its metadata, and its graph, which a tap reads and overwrites where
    `tap_point` is not None (opened with a head tap; `engines.taps`)."""

    architecture: str
    tap_point: object | None

    def meta(self, key: str) -> str: ...

    def layers_where(self, locate) -> list[int]: ...


@runtime_checkable
class RunsPolicy(Protocol):
    """The numpy reference: its `model` and the attention `policy` a probe may wrap or swap
    (None for a model that runs the file's own compressor)."""

    model: object
    policy: object | None


class NonFiniteScore(BackendError):
    """An engine scored a query with a log-probability that is not a finite number (NaN, inf, or a
    JSON null, which is how llama-server writes a NaN): refused before the score is used or written.
    `context` and `query` say which query it was, so that a sweep can name its target (`at`)."""

    def __init__(self, source: str, logprob: float, context: Sequence[int], query: Query, target: str = ""):
        self.source, self.logprob, self.context, self.query = source, logprob, tuple(context), query
        where = target or f"a query after a {len(self.context)}-token context"
        super().__init__(f"{source} scored {where} with a log-probability of {logprob}, not a finite number; "
                         "nothing of it was written: check the engine and its model, then run the same command again")

    def at(self, target: str) -> "NonFiniteScore":
        """The same refusal naming the target it scored."""
        return NonFiniteScore(self.source, self.logprob, self.context, self.query, target)


def finite_scores(scores: Sequence[Score], source: str, context: Sequence[int],
                  queries: Sequence[Query], route: str = "forced") -> list[Score]:
    """`scores` of `queries` after `context`, each checked finite (NonFiniteScore naming `source` otherwise):
    every engine's answers pass here before anything uses them (the server fleet, `sweep.run.result_row`)."""
    for query, score in zip(queries, scores):
        if not usable_logprob(score, route):
            raise NonFiniteScore(source, score.logprob, context, query)
    return list(scores)


def usable_logprob(score: Score, route: str) -> bool:
    """A finite log-probability, or one the scoring `route` leaves missing by design: "generate" knows
    the answer's log-probability only where the generation was the answer (NaN on a wrong one)."""
    missing = route == "generate" and not score.correct and math.isnan(score.logprob)
    return math.isfinite(score.logprob) or missing


def score_contexts(backend: Backend, jobs: Sequence[tuple[Sequence[int], Sequence[Query]]]
                   ) -> Iterator[tuple[int, list[Score]]]:
    """(job index, scores) for each (context, queries) job, in the order they finish:
    all at once where a backend scores several contexts together (`ScoresMany`), else one
    `score` call after the other, each made only when asked for."""
    if isinstance(backend, ScoresMany):
        yield from backend.score_many(jobs)
        return
    for index, (context, queries) in enumerate(jobs):
        yield index, backend.score(context, queries)


def cut_at(n_rows: int, cuts: Sequence[int] = ()) -> list[range]:
    """Rows [0, n_rows) split before each offset of `cuts` that falls inside: the parts a query is
    decoded in, one decode each (no cuts: one batch)."""
    edges = [0, *sorted({int(c) for c in cuts if 0 < c < n_rows}), n_rows]
    return [range(a, b) for a, b in zip(edges, edges[1:])]


def log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    """Each row's log-softmax in float64: (n_rows, n_vocab) -> (n_rows, n_vocab)."""
    logits = np.asarray(logits, dtype=np.float64)  # (n_rows, n_vocab)
    shifted = logits - logits.max(axis=1, keepdims=True)  # (n_rows, n_vocab)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))  # (n_rows, n_vocab)


def score_from_logits(logits: np.ndarray, answer: Sequence[int]) -> Score:
    """Teacher-forced score from the logit rows that predict each answer token.

    logits: (n_answer, n_vocab), row i predicts answer[i].
    """
    return score_from_logprobs(log_softmax_rows(logits), answer)


def score_from_logprobs(logprobs: np.ndarray, answer: Sequence[int]) -> Score:
    """Teacher-forced score from log-probability rows (normalized or averaged over several, as
    offset ensembling does): correct when each row's argmax is its answer token; logprob is the
    sum of the rows' values at the answer tokens.

    logprobs: (n_answer, n_vocab), row i predicts answer[i].
    """
    answer_arr = np.asarray(answer)  # (n_answer,)
    predicted = logprobs.argmax(axis=1)  # (n_answer,)
    return Score(
        correct=bool(np.all(predicted == answer_arr)),
        logprob=float(logprobs[np.arange(len(answer_arr)), answer_arr].sum()),
        predicted=tuple(int(t) for t in predicted),
    )
