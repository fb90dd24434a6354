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
from kvphase.gguf.modelinfo import _ranges

PATHS = ("branch", "token by token", "micro-batch cut")
PROMPT_TOKENS = ANSWER_TOKENS = 4
BASE_CONTEXT = 64  # the shortest context: several blocks of every reference's stride before the query
# nats per answer token: several times the largest rounding difference between right paths measured
# (1.5e-3, minimax-m3 under flash attention), far below a planted path defect's (tenths of a nat)
PATH_TOLERANCE = 0.01


@dataclass(frozen=True)
class PathCheck:
    """One path's result: the context where it differed most from its baseline, and by how much.
    Each context is followed by the query (`PROMPT_TOKENS`), so its answer starts `PROMPT_TOKENS`
    after it: the residues a check names are the answers' (where generation starts)."""

    path: str
    length: int  # the context's length there (the query starts at this position)
    stride: int  # the modulus of the residues named: the reference's largest stride
    max_difference: float  # nats, over the answer tokens of every context tried
    mean_difference: float
    tolerance: float
    failed_lengths: tuple[int, ...] = ()  # the contexts where the path moved beyond the tolerance
    tried: int = 0  # contexts tried
    reason: str = ""  # why the path cannot run here ("" when it ran)
    ties: tuple[tuple[int, IndexerTie], ...] = ()  # (length, tie) for the failed contexts an indexer tie explains
    baseline: str = "one prompt"  # what the path's answers are compared with
    lengths: tuple[int, ...] = ()  # every context tried, ascending

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
    def failed_residues(self) -> tuple[int, ...]:
        """The residues mod `stride` where the failed answers start, ascending."""
        return tuple(sorted({answer_residue(n, self.stride) for n in self.failed_lengths}))

    @property
    def moved(self) -> str:
        """Which answers moved: those starting at the failed residues, or every one tried."""
        if not self.about_residues:
            return "answers after every context tried"
        residues = self.failed_residues
        return (f"answers starting at residue{'s' if len(residues) > 1 else ''} "
                f"{', '.join(map(str, residues))} mod {self.stride}")

    @property
    def covered(self) -> str:
        """Where the answers tried start: every residue mod `stride` (and the positions), or which."""
        starts = sorted(n + PROMPT_TOKENS for n in self.lengths) or [self.length + PROMPT_TOKENS]
        residues = sorted({s % self.stride for s in starts})
        which = (f"every residue mod {self.stride}" if len(residues) == self.stride else
                 f"residue{'s' if len(residues) > 1 else ''} {', '.join(map(str, residues))} mod {self.stride}")
        return f"answers starting at {which} (positions {_ranges(tuple(starts))})"

    @property
    def where(self) -> str:
        """The context where the path differed most, or none for a failure after every context."""
        if self.about_residues or not self.failed_lengths:
            return (f"after a {self.length}-token context (the answer starting at residue "
                    f"{answer_residue(self.length, self.stride)} mod {self.stride})")
        return "after every context tried"

    def line(self, with_tie: bool = True) -> str:
        """The console's line: PASS naming the answer residues tried, FAIL / UNDECIDED naming the
        path and the residues its moved answers start at, with the largest difference (and the
        tie's note, unless the console prints it on a line of its own)."""
        if self.reason:
            return f"{self.path}: cannot run: {self.reason}"
        numbers = f"mean {self.mean_difference:.2g}; tolerance {self.tolerance:g}"
        if self.status == "PASS":
            return (f"{self.path}: PASS at {self.covered.removeprefix('answers starting at ')}: largest "
                    f"log-probability difference from {self.baseline} {self.max_difference:.3g} nats ({numbers})")
        said = (f"{self.path}: {self.status}: {self.moved} moved by up to {self.max_difference:.3g} nats from "
                f"{self.baseline} ({numbers})")
        if self.about_residues:
            said += (f"; beyond it after {len(self.failed_lengths)} of {self.tried} contexts, the most after a "
                     f"{self.length}-token context")
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
                "reason": self.reason, "ties": [{"length": n, **tie.to_json()} for n, tie in self.ties],
                "baseline": self.baseline, "answer_starts": [n + PROMPT_TOKENS for n in self.lengths],
                "failed_answer_residues": list(self.failed_residues)}


def answer_residue(length: int, stride: int) -> int:
    """The residue mod `stride` where the answer after a `length`-token context and the query starts."""
    return (length + PROMPT_TOKENS) % stride


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
                seed: int = 0, paths: Sequence[str] = PATHS, base: int = BASE_CONTEXT,
                modulus: int = 0) -> list[PathCheck]:
    """Every path after every context length, each compared with the whole text as one prompt,
    scored again before each path (so each path starts from a cleared cache). The contexts end at
    every residue mod `modulus` (at least `stride`, the compressor's block, where the micro-batch cut
    falls), so the answers start at every residue too, and the residues named are the answers'."""
    modulus = max(stride, modulus)
    lengths = context_lengths(modulus, base, extra)
    rng = np.random.default_rng(seed)
    texts = {length: rng.integers(0, n_vocab, length + PROMPT_TOKENS + ANSWER_TOKENS).tolist() for length in lengths}
    differences: dict[str, dict[int, np.ndarray]] = {path: {} for path in paths}
    for length, tokens in texts.items():
        for path in paths:
            one_prompt = answer_rows(backend, tokens, length, None)  # (n_answer,)
            differences[path][length] = np.abs(answer_rows(backend, tokens, length, path, stride) - one_prompt)
    checks = [_summarise(path, differences[path], modulus, tolerance) for path in paths]
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


def _summarise(path: str, by_length: dict[int, np.ndarray], stride: int, tolerance: float,
               baseline: str = "one prompt") -> PathCheck:
    worst = max(by_length, key=lambda length: by_length[length].max())
    every = np.concatenate(list(by_length.values()))
    failed = tuple(sorted(length for length, d in by_length.items() if not d.max() <= tolerance))  # a NaN difference fails
    return PathCheck(path, worst, stride, float(every.max()), float(every.mean()), tolerance, failed, len(by_length),
                     baseline=baseline, lengths=tuple(sorted(by_length)))


def cannot_run(reason: str, paths: Sequence[str] = PATHS) -> list[PathCheck]:
    """Every path reported as not run, with the engine's reason."""
    return [PathCheck(path, 0, 1, 0.0, 0.0, 0.0, reason=reason) for path in paths]


# deepseek4's HCA blocks are 128 tokens: contexts ending just before, on and after two of them
AROUND_HCA = (127, 128, 129, 255, 256, 257)
HCA_BLOCK = 128
MIN_ANSWER_MODULUS = 4  # answers start at every residue mod at least this, whatever the reference's stride


def large_blocks(info) -> tuple[int, ...]:
    """The blocks longer than a reference's stride whose boundaries a path must straddle: deepseek4's
    HCA (128 tokens), minimax-m3's indexer blocks (the file's block size, when it exceeds the minimum
    modulus: MiniMax-M3's own are 256)."""
    if info.architecture == "deepseek4":
        return (HCA_BLOCK,)
    block = int(info.compression.params.get("block_size") or 0) if info.architecture == "minimax-m3" else 0
    return (block,) if block > MIN_ANSWER_MODULUS else ()


def around_blocks(blocks: Sequence[int], room: int) -> list[int]:
    """Contexts around the first two boundaries of each block that fit in `room`: ending just before,
    on and after each, and ending so that the answer starts just before, on and after each."""
    ends = {b * k + d for b in blocks for k in (1, 2) for d in (-1, 0, 1)}
    return sorted(n for n in ends | {end - PROMPT_TOKENS for end in ends} if 0 < n <= room)


def model_paths(backend, stride: int, n_vocab: int, n_ctx: int, modulus: int = 0,
                blocks: Sequence[int] = ()) -> list[PathCheck]:
    """Every path on a model through `backend`: contexts from 64 tokens (fewer for a model that
    holds fewer positions) ending at every residue mod `modulus` (at least 4), and around the
    boundaries of its `blocks` where they fit (`around_blocks`)."""
    modulus = max(MIN_ANSWER_MODULUS, stride, modulus)
    room = n_ctx - PROMPT_TOKENS - ANSWER_TOKENS
    base = min(BASE_CONTEXT, room - modulus + 1)
    if base < 1:
        return cannot_run(f"the model holds {n_ctx} positions, too few for a context of every residue and a query")
    return check_paths(backend, n_vocab, stride, around_blocks(blocks, room), base=base, modulus=modulus)


# --------------------------------------------------------------------------- through llama-server

SERVER_PATHS = ("one prompt", "prefix-cache hit", "two slots interleaved")
# what the one-prompt path is compared with through a server, where every answer is generated
GENERATION_MOVED = (f"the same last token generated after prompts 0-{ANSWER_TOKENS - 1} tokens longer "
                    "(their median)")


def server_paths(engine, stride: int, words: Sequence[int], n_ctx: int, slots: int, modulus: int = 0,
                 blocks: Sequence[int] = (), tolerance: float = PATH_TOLERANCE, seed: int = 0) -> list[PathCheck]:
    """llama-server's paths (`engine`: a `backends.dialects.LlamaServer`) after contexts ending at
    every residue mod `modulus` (at least 4 and `stride`) and around the boundaries of `blocks`, the
    answer forced as kvphase's server scoring forces it. `one prompt`, the text evaluated with nothing
    cached: through a server its answer is generated, so a fault of where generation starts moves it,
    and its last token is compared with the same token generated after the prompt grown by 1, 2, ...
    answer tokens (generation started at each of the answer's positions, so at as many residues; the
    median of those stands for the right value, one residue's fault being one of them). The others
    against one prompt: `prefix-cache hit`, the context evaluated on its own, then context + query
    reusing it (how a sweep scores through a server); `two slots interleaved`, slot 0 and slot 1
    scoring the texts at the same time (in opposite orders), as two sweep workers do, so the server
    decodes both slots in one batch. The texts are drawn from `words`, token ids of ordinary text (a
    forced answer cannot hold a control token: llama-server's grammar refuses it)."""
    from kvphase.backends.transport import ServerRefused

    try:
        return _server_paths(engine, stride, words, n_ctx, slots, max(MIN_ANSWER_MODULUS, stride, modulus), blocks,
                             tolerance, seed)
    except ServerRefused as exc:
        return cannot_run(f"the server refused a request ({exc.message})", SERVER_PATHS)


def _server_paths(engine, stride: int, words: Sequence[int], n_ctx: int, slots: int, modulus: int,
                  blocks: Sequence[int], tolerance: float, seed: int) -> list[PathCheck]:
    room = n_ctx - PROMPT_TOKENS - ANSWER_TOKENS
    base = min(BASE_CONTEXT, room - modulus)
    if base < 1:
        return cannot_run(f"the server's slots hold {n_ctx} tokens, too few for a context of every residue "
                          "and a query", SERVER_PATHS)
    lengths = context_lengths(modulus, base, around_blocks(blocks, room - 1))
    rng = np.random.default_rng(seed)
    texts = {length: rng.choice(np.asarray(words), length + PROMPT_TOKENS + ANSWER_TOKENS).tolist()
             for length in lengths}
    fresh = {length: _forced(engine, 0, texts[length], length, prime=[_unlike(texts[length], words)])
             for length in lengths}
    checks = [_summarise("one prompt", _generation_moved(engine, texts, fresh, words), modulus, tolerance,
                         baseline=GENERATION_MOVED)]
    cached, reason = {}, ""
    for length in lengths:
        cached[length], evaluated = _forced(engine, 0, texts[length], length, prime=texts[length][:length],
                                            counted=True)
        if evaluated > PROMPT_TOKENS + 1:  # the prompt's tail only, when the context's cache was reused
            reason = (f"the server evaluated {evaluated} prompt tokens after a {length}-token context it had just "
                      "evaluated: no prefix-cache hit (its prompt cache is off, or the model's memory cannot reuse "
                      "a prefix)")
            break
    checks += [cannot_run(reason, ("prefix-cache hit",))[0] if reason else
               _summarise("prefix-cache hit", {n: np.abs(cached[n] - fresh[n]) for n in lengths}, modulus, tolerance)]
    if slots < 2:
        return checks + cannot_run(f"the server has {slots} slot (llama-server -np 2 gives two)", SERVER_PATHS[2:])
    both = _two_slots(engine, texts, lengths)
    moved = {n: np.maximum(np.abs(both[n, 0] - fresh[n]), np.abs(both[n, 1] - fresh[n])) for n in lengths}
    return checks + [_summarise("two slots interleaved", moved, modulus, tolerance)]


def _generation_moved(engine, texts: dict[int, list[int]], fresh: dict[int, np.ndarray],
                      words: Sequence[int]) -> dict[int, np.ndarray]:
    """Each text's last answer token generated with generation started at each of the answer's
    positions (the prompt grown by k = 0, 1, ... answer tokens, nothing cached; k = 0 is `fresh`),
    keyed as the context that puts the answer's start there (length + k): how far each is from the
    median of its text's."""
    moved: dict[int, list[float]] = {}
    for length, text in texts.items():
        last = [fresh[length][-1]] + [_forced(engine, 0, text, length + k, prime=[_unlike(text, words)])[-1]
                                      for k in range(1, ANSWER_TOKENS)]
        median = float(np.median(last))
        for k, value in enumerate(last):
            moved.setdefault(length + k, []).append(abs(value - median))
    return {n: np.array(values) for n, values in moved.items()}


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
