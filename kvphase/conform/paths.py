"""The engine paths where compressed-attention engines were found broken, each checked against the
same text scored as one prompt in one batch.

Every path scores one answer after a context of random token ids, and must give the answer's
log-probabilities that the whole text gives when it is decoded as its own prompt in one batch:

- `branch`: kvphase's own scoring, a first query on a copy of the context's sequence (llama.cpp)
  or after the context's cached prefix (the reference), removed again, then the query checked on
  what is left, as every query after a context's first is scored; after a context that ends at
  every residue mod the stride (and at the lengths `extra` names, around deepseek4's 128-token HCA
  block), so the query starts mid-block at every phase. Breaks where a copy or a reused prefix
  drops a compressor's incomplete block (llama.cpp #25259, #26063; jundot/omlx #1888);
- `token by token`: the whole text up to the answer in one decode, then each answer token in a
  decode of its own, as generation runs, so a block completes inside a one-token decode (vLLM
  #55927);
- `micro-batch cut`: the whole text in two decodes cut inside a block of the query, at least two
  tokens on each side (llama.cpp #26471, #26509).

The branch has a decode boundary where the context ends as well as the copy; the other two paths
copy nothing. Through llama-server (`server_paths`): a prefix-cache hit after a context ending at
every residue, and two slots scoring at once (llama.cpp #26741).

Random weights make the comparison sharp: nothing but the path changes the numbers, so the
tolerance is rounding's (flash attention's F16 products and kernel choice by batch shape). One thing
besides rounding moves a right path: an indexer whose scores tie at the edge of its kept set, which
llama.cpp breaks by slot order (`conform.ties`). A path that moved only after such a tie is
UNDECIDED, not FAIL: neither side is shown wrong, and the check says where the tie was.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np

from kvphase.backends.base import Query
from kvphase.backends.dialects import logprob_of
from kvphase.conform.ties import IndexerTie, first_tie, recorded, tapped

PATHS = ("branch", "token by token", "micro-batch cut")
PROMPT_TOKENS = ANSWER_TOKENS = 4
BASE_CONTEXT = 64  # the shortest context: several blocks of every reference's stride before the query
# nats per answer token: several times the largest rounding difference between right paths measured
# (1.5e-3, minimax-m3 under flash attention), far below a planted path defect's (tenths of a nat)
PATH_TOLERANCE = 0.01


@dataclass(frozen=True)
class PathCheck:
    """One path's result: the context where it differed most from one prompt, and by how much."""

    path: str
    length: int  # the context's length there (the query starts at this position)
    stride: int
    max_difference: float  # nats, over the answer tokens of every context tried
    mean_difference: float
    tolerance: float
    failed_lengths: tuple[int, ...] = ()  # the contexts where the path moved beyond the tolerance
    tried: int = 0  # contexts tried
    reason: str = ""  # why the path cannot run here ("" when it ran)
    ties: tuple[tuple[int, IndexerTie], ...] = ()  # (length, tie) for the failed contexts an indexer tie explains

    @property
    def status(self) -> str:
        if self.reason:
            return "cannot run"
        if not self.failed_lengths:
            return "PASS"
        return "UNDECIDED" if len(self.ties) == len(self.failed_lengths) else "FAIL"

    @property
    def about_residues(self) -> bool:
        """A failure at some context ends and not others: a residue to name."""
        return 0 < len(self.failed_lengths) < self.tried

    @property
    def where(self) -> str:
        """The context where the path differed most, or none for a failure after every context."""
        if self.about_residues or not self.failed_lengths:
            return f"after a {self.length}-token context (residue {self.length % self.stride} mod {self.stride})"
        return "after every context tried"

    def line(self, with_tie: bool = True) -> str:
        """The console's line: PASS / FAIL / UNDECIDED naming the path, where, and the largest difference
        (and the tie's note, unless the console prints it on a line of its own)."""
        if self.reason:
            return f"{self.path}: cannot run: {self.reason}"
        said = (f"{self.path}: {self.status} {self.where}: largest log-probability difference from one prompt "
                f"{self.max_difference:.3g} nats (mean {self.mean_difference:.2g}; tolerance {self.tolerance:g})")
        if self.about_residues:
            said += f"; beyond it after {len(self.failed_lengths)} of {self.tried} contexts"
        return said + (f"; {self.tie_note}" if self.ties and with_tie else "")

    @property
    def tie_note(self) -> str:
        """What the indexer ties explain ("" without one)."""
        if not self.ties:
            return ""
        length, tie = self.ties[0]
        tied = "every one" if self.status == "UNDECIDED" else f"{len(self.ties)} of them"
        return f"an indexer tie explains {tied}: after the {length}-token context, {tie.phrase()}"

    def to_json(self) -> dict:
        return {"path": self.path, "status": self.status, "length": self.length, "stride": self.stride,
                "max_difference": self.max_difference, "mean_difference": self.mean_difference,
                "tolerance": self.tolerance, "failed_lengths": list(self.failed_lengths), "tried": self.tried,
                "reason": self.reason, "ties": [{"length": n, **tie.to_json()} for n, tie in self.ties]}


def context_lengths(stride: int, base: int = BASE_CONTEXT, extra: Sequence[int] = ()) -> list[int]:
    """A context ending at every residue mod `stride` from `base` on, then the `extra` lengths."""
    return sorted({base + r for r in range(stride)} | set(extra))


def path_cuts(path: str, length: int, stride: int) -> list[int]:
    """Where the whole text's rows (context + prompt + answer[:-1]) are cut into decodes on `path`."""
    n_rows = length + PROMPT_TOKENS + ANSWER_TOKENS - 1
    if path == "token by token":  # context and prompt at once, then one row per decode
        return list(range(length + PROMPT_TOKENS, n_rows))
    if path == "micro-batch cut":  # inside the query, at the row nearest the middle of its block; two rows after it
        return [min(range(length + 1, n_rows - 1), key=lambda c: abs(c % stride - stride // 2))]
    return []


def answer_rows(backend, tokens: list[int], length: int, path: Optional[str], stride: int = 1) -> np.ndarray:
    """The answer tokens' log-probabilities (n_answer,) after `tokens[:length]`: on the branch, a
    query after the context's sequence; otherwise the whole text as one prompt, in one batch (path
    None) or in the decodes `path_cuts` makes, so each path differs from one prompt in one way."""
    prompt = tuple(tokens[length:length + PROMPT_TOKENS])
    answer = tuple(tokens[length + PROMPT_TOKENS:])
    if path == "branch":  # another query first, scored and removed
        queries, context, cuts = [Query(answer, prompt), Query(prompt, answer)], tokens[:length], []
    else:
        queries, context = [Query(tuple(tokens[:length]) + prompt, answer)], ()
        cuts = path_cuts(path, length, stride) if path else []
    rows = backend.answer_logprobs(context, queries, cuts=cuts)[-1]  # (n_answer, n_vocab)
    return rows[np.arange(len(answer)), list(answer)]


def check_paths(backend, n_vocab: int, stride: int, extra: Sequence[int] = (), tolerance: float = PATH_TOLERANCE,
                seed: int = 0, paths: Sequence[str] = PATHS, base: int = BASE_CONTEXT) -> list[PathCheck]:
    """Every path after every context length, each compared with the whole text as one prompt,
    scored again before each path (so each path starts from a cleared cache)."""
    lengths = context_lengths(stride, base, extra)
    rng = np.random.default_rng(seed)
    texts = {length: rng.integers(0, n_vocab, length + PROMPT_TOKENS + ANSWER_TOKENS).tolist() for length in lengths}
    differences: dict[str, dict[int, np.ndarray]] = {path: {} for path in paths}
    for length, tokens in texts.items():
        for path in paths:
            one_prompt = answer_rows(backend, tokens, length, None)  # (n_answer,)
            differences[path][length] = np.abs(answer_rows(backend, tokens, length, path, stride) - one_prompt)
    checks = [_summarise(path, differences[path], stride, tolerance) for path in paths]
    if not any(check.failed_lengths for check in checks):
        return checks
    with tapped(backend) as tapped_backend:
        if tapped_backend is None:
            return checks
        return [replace(check, ties=tuple((n, tie) for n in check.failed_lengths if (
            tie := indexer_tie(tapped_backend, texts[n], n, check.path, stride, tolerance)))) for check in checks]


def indexer_tie(backend, tokens: list[int], length: int, path: str, stride: int,
                tolerance: float = PATH_TOLERANCE) -> Optional[IndexerTie]:
    """The indexer tie behind `path`'s moved answer after `tokens[:length]`, through a `backend`
    with a graph tap: None unless the path moves beyond `tolerance` there too and a tie explains it."""
    one_prompt, one = recorded(backend, lambda b: answer_rows(b, tokens, length, None))
    on_path, other = recorded(backend, lambda b: answer_rows(b, tokens, length, path, stride))
    return first_tie(one, other) if np.abs(on_path - one_prompt).max() > tolerance else None


def _summarise(path: str, by_length: dict[int, np.ndarray], stride: int, tolerance: float) -> PathCheck:
    worst = max(by_length, key=lambda length: by_length[length].max())
    every = np.concatenate(list(by_length.values()))
    failed = tuple(length for length, d in by_length.items() if not d.max() <= tolerance)  # a NaN difference fails
    return PathCheck(path, worst, stride, float(every.max()), float(every.mean()), tolerance, failed, len(by_length))


def cannot_run(reason: str, paths: Sequence[str] = PATHS) -> list[PathCheck]:
    """Every path reported as not run, with the engine's reason."""
    return [PathCheck(path, 0, 1, 0.0, 0.0, 0.0, reason=reason) for path in paths]


# deepseek4's HCA blocks are 128 tokens: contexts ending just before, on and after two of them
AROUND_HCA = (127, 128, 129, 255, 256, 257)


def model_paths(backend, architecture: str, stride: int, n_vocab: int, n_ctx: int) -> list[PathCheck]:
    """Every path on a model through `backend`: contexts from 64 tokens (fewer for a model that
    holds fewer positions), deepseek4's around its HCA blocks where they fit."""
    room = n_ctx - PROMPT_TOKENS - ANSWER_TOKENS
    base = min(BASE_CONTEXT, room - stride + 1)
    if base < 1:
        return cannot_run(f"the model holds {n_ctx} positions, too few for a context of every residue and a query")
    extra = [n for n in AROUND_HCA if n <= room] if architecture == "deepseek4" else []
    return check_paths(backend, n_vocab, stride, extra, base=base)


# --------------------------------------------------------------------------- through llama-server

SERVER_PATHS = ("prefix-cache hit", "two slots interleaved")


def server_paths(engine, architecture: str, stride: int, words: Sequence[int], n_ctx: int, slots: int,
                 tolerance: float = PATH_TOLERANCE, seed: int = 0) -> list[PathCheck]:
    """llama-server's paths (`engine`: a `backends.dialects.LlamaServer`), each against the same text
    evaluated with nothing cached, the answer forced as kvphase's server scoring forces it:
    `prefix-cache hit`, the context evaluated on its own, then context + query reusing it (how a
    sweep scores through a server); `two slots interleaved`, slot 0 and slot 1 scoring the texts
    at the same time (in opposite orders), as two sweep workers do, so the server decodes both
    slots in one batch. The texts are drawn from `words`, token ids of ordinary text (a forced
    answer cannot hold a control token: llama-server's grammar refuses it)."""
    from kvphase.backends.transport import ServerRefused

    try:
        return _server_paths(engine, architecture, stride, words, n_ctx, slots, tolerance, seed)
    except ServerRefused as exc:
        return cannot_run(f"the server refused a request ({exc.message})", SERVER_PATHS)


def _server_paths(engine, architecture: str, stride: int, words: Sequence[int], n_ctx: int, slots: int,
                  tolerance: float, seed: int) -> list[PathCheck]:
    room = n_ctx - PROMPT_TOKENS - ANSWER_TOKENS
    base = min(BASE_CONTEXT, room - stride)
    if base < 1:
        return cannot_run(f"the server's slots hold {n_ctx} tokens, too few for a context of every residue "
                          "and a query", SERVER_PATHS)
    extra = [n for n in AROUND_HCA if n < room] if architecture == "deepseek4" else []
    lengths = context_lengths(stride, base, extra)
    rng = np.random.default_rng(seed)
    texts = {length: rng.choice(np.asarray(words), length + PROMPT_TOKENS + ANSWER_TOKENS).tolist()
             for length in lengths}
    fresh = {length: _forced(engine, 0, texts[length], length, prime=[_unlike(texts[length], words)])
             for length in lengths}
    cached, reason = {}, ""
    for length in lengths:
        cached[length], evaluated = _forced(engine, 0, texts[length], length, prime=texts[length][:length],
                                            counted=True)
        if evaluated > PROMPT_TOKENS + 1:  # the prompt's tail only, when the context's cache was reused
            reason = (f"the server evaluated {evaluated} prompt tokens after a {length}-token context it had just "
                      "evaluated: no prefix-cache hit (its prompt cache is off, or the model's memory cannot reuse "
                      "a prefix)")
            break
    checks = [cannot_run(reason, ("prefix-cache hit",))[0] if reason else
              _summarise("prefix-cache hit", {n: np.abs(cached[n] - fresh[n]) for n in lengths}, stride, tolerance)]
    if slots < 2:
        return checks + cannot_run(f"the server has {slots} slot (llama-server -np 2 gives two)", SERVER_PATHS[1:])
    both = _two_slots(engine, texts, lengths)
    moved = {n: np.maximum(np.abs(both[n, 0] - fresh[n]), np.abs(both[n, 1] - fresh[n])) for n in lengths}
    return checks + [_summarise("two slots interleaved", moved, stride, tolerance)]


def _unlike(text: list[int], words: Sequence[int]) -> int:
    """A token other than the text's first, so a slot holding it shares no prefix with the text."""
    return next(int(w) for w in words if w != text[0])


def _forced(engine, slot: int, text: list[int], length: int, prime: list[int], counted: bool = False):
    """The answer's per-token log-probabilities after the slot evaluated `prime` on its own (with
    `counted`, also the prompt tokens the server evaluated for the answer's request)."""
    engine.http.post("/completion", {"prompt": prime, "n_predict": 0, "id_slot": slot, "cache_prompt": False})
    response = engine._forced(slot, text[:length + PROMPT_TOKENS], text[length + PROMPT_TOKENS:])
    steps = np.array([logprob_of(step["logprob"]) for step in response["completion_probabilities"]])  # (n_answer,)
    return (steps, int((response.get("timings") or {}).get("prompt_n", 0))) if counted else steps


def _two_slots(engine, texts: dict[int, list[int]], lengths: list[int]) -> dict:
    """Slot 0 scores every text in order and slot 1 in reverse, at the same time, as two sweep
    workers do: (length, slot) -> the answer's per-token log-probabilities."""
    from concurrent.futures import ThreadPoolExecutor

    def worker(slot: int, order: list[int]) -> dict:
        return {(n, slot): _forced(engine, slot, texts[n], n, prime=texts[n][:n]) for n in order}

    with ThreadPoolExecutor(2) as pool:
        results = [pool.submit(worker, 0, lengths), pool.submit(worker, 1, lengths[::-1])]
        return {**results[0].result(), **results[1].result()}
