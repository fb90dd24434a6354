"""The server backend: a fleet of servers and their slots scoring a sweep's contexts (`ServerBackend`).

Each server is checked before anything is scored (tokenizer, model, context size, teacher
forcing); tokenizing is local, with the model's own vocabulary.

Contexts are spread over (server, slot) workers; a context and all its queries stay
on one worker, so its prefix is reused. Each worker keeps one HTTP connection alive
(`transport.Http`). A server that stops answering leaves and hands its contexts to the
others; when none is left the sweep stops with one line, keeping every finished context in
the run folder for a resume.
"""

from __future__ import annotations

import math
import queue
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from kvphase.backends.base import Query, Score, finite_scores
from kvphase.backends.dialects import (ENGINES, LlamaServer, ModelFacts, ServerInfo, compared_facts, other_bytes,
                                       served_model_line, served_model_mismatch)
from kvphase.backends.server_paths import path_warnings
from kvphase.backends.transport import Pace, Retry, ServerGone, ServerRefused
from kvphase.errors import BackendError, PlanError
from kvphase.options_check import check_seconds

if TYPE_CHECKING:  # an annotation only: llama.cpp's module loads when a vocabulary does
    from kvphase.engines.llamacpp import Vocab

# Strings both sides must tokenize alike: words, digits, code, accents, CJK, emoji and
# whitespace runs, where tokenizers of different models part ways.
TOKENIZER_PROBES = (
    "The quick brown fox jumps over the lazy dog.",
    " key-0042: value 1234567 | x_y = f(z) * 3.14;\n\tdef main():",
    "Ünïcödé naïve café, 東京タワー, 🙂👍 and  two  spaces\n\n",
)
# The probe query (`_check_forcing`) scored by the file in process, to tell a server's weights from another
# file's of the same shape: two tiny llamas differing only in their seed score it 13.4 nats apart, one file
# through llama-server and in process within 1e-3 (test_server_identity; another build or a GPU moves it more).
PROBE_TOLERANCE = 0.5  # nats the probe's answer may move between the server and the file in process
# requests per server at once: each is a worker thread here, and llama.cpp holds at most LLAMA_MAX_SEQ (256,
# src/llama-cparams.h) sequences, so no llama-server has more slots than that
MAX_SLOTS = 256
PROBE_MAX_BYTES = 1 << 30  # a larger file is not loaded here for the probe (the server is there to hold it)


@dataclass
class ServerBackend:
    """Scores on one or many servers; tokenizes locally with the model's own vocabulary,
    after checking that every server tokenizes the same way."""

    engines: list  # Engine, one per URL
    vocab: Vocab  # the model file's own, read by llama.cpp without weights (a fake in tests)
    n_ctx_needed: int  # context plus the room a query needs
    slots: int | None = None  # workers per server; default: every slot it has
    model: ModelFacts | None = None  # what each server's model must match (None: the vocabulary only)
    allow_other_model: bool = False  # a server whose model differs is scored, with a warning, not refused
    servers: list[ServerInfo] = field(init=False)
    tokens_evaluated: int = field(init=False, default=0)
    lost: list[dict] = field(init=False, default_factory=list)  # servers that left: url, when, why
    n_threads: int | None = field(init=False, default=None)  # the servers choose their own

    def __post_init__(self) -> None:
        """Each server checked; one that does not answer leaves as it would mid-run (the sweep goes
        on while one is left), one that answers wrongly stops everything (it is unfit, not lost)."""
        if self.slots is not None and not 1 <= self.slots <= MAX_SLOTS:
            raise PlanError(f"--slots must be 1 to {MAX_SLOTS} (a worker thread each; llama.cpp holds at most "
                            f"{MAX_SLOTS} sequences), got {self.slots}")
        self._lock = threading.Lock()
        self.identified: dict[str, str] = {}  # url -> how its weights were identified with the file's
        self._own: Score | None = None  # the probe query scored by the file in process
        self._tell: Callable[[str], None] | None = None
        self._untold: list[str] = []  # servers lost before anyone listened (at the checks)
        pace = Pace()  # one for the fleet: a server stalled on its first context is judged by the others' pace
        for engine in self.engines:
            engine.http.pace = pace
        checked = []
        for engine in self.engines:
            try:
                checked.append((engine, self._check(engine)))
            except ServerGone as exc:
                if len(self.engines) == 1:
                    raise
                self._leave(engine.http.url, exc)
        if not checked:
            raise self._every_server_gone()
        self.servers = [info for _, info in checked]
        self._untold += path_warnings(self)  # kvphase.backends.server_paths
        self.workers = [(engine, slot) for engine, info in checked for slot in range(self.slots or info.slots)]

    @property
    def on_lost(self) -> Callable[[str], None]:
        """Told one warning line per server that leaves while others remain, or whose model differs
        and is scored anyway (those of the checks when set)."""
        return self._tell or (lambda line: None)

    @on_lost.setter
    def on_lost(self, tell: Callable[[str], None]) -> None:
        self._tell = tell
        for line in self._untold:
            tell(line)
        self._untold.clear()

    def _check(self, engine) -> ServerInfo:
        """One line for each way a server can be unfit, before anything is scored."""
        try:
            info = engine.info()
            tokenized = [list(engine.tokenize(text)) for text in TOKENIZER_PROBES]
        except ServerRefused as exc:
            raise BackendError(f"{engine.http.url} does not look like a {engine.kind} server ({exc.message})") from None
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise BackendError(f"{engine.http.url} does not look like a {engine.kind} server "
                               f"(unexpected answer: {exc!r})") from None
        if info.n_vocab is not None and info.n_vocab != self.vocab.n_vocab:
            raise BackendError(f"{info.url} serves another model ({info.model}): its vocabulary has {info.n_vocab} "
                               f"tokens, the model file's {self.vocab.n_vocab}")
        for text, theirs in zip(TOKENIZER_PROBES, tokenized):
            ours = self.vocab.prefix_ids + self.vocab.tokenize(text)
            if theirs != ours:
                raise BackendError(f"{info.url} serves another model ({info.model}): it tokenizes {text[:24]!r} as "
                                   f"{theirs[:6]}..., the model file as {ours[:6]}...")
        self._check_model(info)
        if info.n_ctx and info.n_ctx < self.n_ctx_needed:
            raise BackendError(f"{info.url} holds {info.n_ctx} tokens per slot, the sweep needs {self.n_ctx_needed}; "
                               f"restart it with a larger -c (times -np slots)")
        self._check_weights(info, *self._check_forcing(engine))
        if self.slots is not None and engine.kind == LlamaServer.kind and self.slots > info.slots:
            raise BackendError(f"{info.url} has {info.slots} slots, --slots asks for {self.slots}; "
                               f"restart it with -np {self.slots}")
        return info

    def _check_model(self, info: ServerInfo) -> None:
        """The model the server states against the file's (MODEL_FACTS): refused, or with
        allow_other_model a warning."""
        line = served_model_line(info, self.model) if self.model is not None else ""
        if line:
            self._refuse_other_model(line)

    def _refuse_other_model(self, line: str) -> None:
        """BackendError with `line`, or with allow_other_model a warning."""
        if not self.allow_other_model:
            raise BackendError(f"{line}; `kvphase sweep --allow-model-mismatch` scores it anyway")
        self._warn(f"{line}; scored anyway (--allow-model-mismatch)")

    def _check_weights(self, info: ServerInfo, context: list[int], probe: list[Query], served: Score) -> None:
        """The server's weights against the file's (`self.model.weights`): the same bytes where the
        server's model path is a file here, else the probe query scored in process within PROBE_TOLERANCE;
        neither possible, a warning that only the metadata was compared. How: `self.identified`."""
        model = self.model
        if model is None or not (model.weights or model.no_weights):
            return
        why = model.no_weights
        if model.weights is not None and Path(info.model).is_file():
            differ = other_bytes(Path(info.model), model.weights)
            self.identified[info.url] = "other file bytes" if differ else "the same file bytes"
            if differ:
                self._refuse_other_model(f"{info.url} serves other weights ({info.model}), not {model.name}: its "
                                         f"file holds other bytes")
            return
        if not math.isfinite(served.logprob):
            why = "the scoring route gave no log-probability of the probe's answer (it generated another)"
        elif model.weights is not None and model.weights.stat().st_size > PROBE_MAX_BYTES:
            why = f"{model.name} is over {PROBE_MAX_BYTES >> 30} GiB, too large to score a probe in process here"
        elif model.weights is not None:
            own = self._own_probe(model.weights, context, probe)
            moved = abs(own.logprob - served.logprob)
            self.identified[info.url] = f"a probe query {moved:.3g} nats from the file's own score in process"
            if not moved <= PROBE_TOLERANCE:
                self._refuse_other_model(
                    f"{info.url} serves other weights ({info.model}), not {model.name}: it scores a probe query "
                    f"{served.logprob:.3f} nats, the file in process {own.logprob:.3f} (tolerance {PROBE_TOLERANCE:g})")
            return
        self.identified[info.url] = "metadata only"
        where = "" if Path(info.model).is_file() else ", and the server's file is not readable here"
        self._warn(f"{info.url}: only the metadata of its model was compared with {model.name} ({why}{where}): "
                   "other weights of the same shape would be scored as its")

    def _own_probe(self, weights: Path, context: list[int], probe: list[Query]) -> Score:
        """The probe query scored by the model file in process (once for every server)."""
        if self._own is None:
            from kvphase.backends.llamacpp import LlamaCppBackend

            backend = LlamaCppBackend(weights, n_ctx=max(64, len(context) + 8), n_threads=1)
            try:
                self._own = backend.score(context, probe)[0]
            finally:
                backend.close()
        return self._own

    def _warn(self, line: str) -> None:
        if self._tell is None:
            self._untold.append(line)
        else:
            self._tell(line)

    def _check_forcing(self, engine) -> tuple[list[int], list[Query], Score]:
        """Score one short query: a server that cannot teacher-force fails here, not mid-sweep.
        Returns the probe (context, query) and the server's score of it."""
        ids = self.vocab.prefix_ids + self.vocab.tokenize(TOKENIZER_PROBES[0])  # at least 5 tokens in any vocabulary
        context, probe = ids[:-3], [Query(tuple(ids[-3:-2]), tuple(ids[-2:]))]
        try:
            [served] = finite_scores(engine.score(0, context, probe)[0], engine.http.url, context, probe,
                                     route=engine.scoring)
        except ServerRefused as exc:
            raise BackendError(f"{engine.http.url} cannot teacher-force a query ({exc.message})") from None
        return context, probe, served

    # -- tokenizer: the local vocabulary, checked against the servers above -------------

    def tokenize(self, text: str) -> list[int]:
        return self.vocab.tokenize(text)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.vocab.detokenize(ids)

    @property
    def prefix_ids(self) -> list[int]:
        return self.vocab.prefix_ids

    @property
    def n_ctx_train(self) -> int:
        return self.vocab.n_ctx_train

    # -- scoring -------------------------------------------------------------------------

    def score(self, context: Sequence[int], queries: Sequence[Query]) -> list[Score]:
        [(_, scores)] = self.score_many([(context, queries)])
        return scores

    def score_many(self, jobs: Sequence[tuple[Sequence[int], Sequence[Query]]]) -> Iterator[tuple[int, list[Score]]]:
        """(job index, scores) as contexts finish, each context on one worker. A server that stops
        answering leaves: its workers hand their contexts back to the others' queue, and only when
        every server has left does the sweep stop. Any other failure stops it at once, raised here;
        so does the caller's no longer listening."""
        todo, done, stop = queue.Queue(), queue.Queue(), threading.Event()
        for item in enumerate(jobs):
            todo.put(item)
        workers = [worker for worker in self.workers if worker[0].http.url not in self._lost_urls()]
        reserve = workers[max(len(jobs), 1):]  # started when a lost server's contexts find every worker gone
        threads: list[threading.Thread] = []

        def start(worker) -> None:
            threads.append(threading.Thread(target=self._work, args=(worker, todo, done, stop), daemon=True))
            threads[-1].start()

        for worker in workers[:max(len(jobs), 1)]:
            start(worker)
        alive = len(threads)
        if not alive and jobs:
            raise self._every_server_gone()
        try:
            finished = 0
            while finished < len(jobs):
                result = _next(done)
                if isinstance(result, ServerGone):
                    alive -= 1
                    reserve = [worker for worker in reserve if worker[0].http.url not in self._lost_urls()]
                    if reserve:
                        start(reserve.pop(0))
                        alive += 1
                    if not alive:
                        raise self._every_server_gone() from None
                    continue
                if isinstance(result, BaseException):
                    raise result
                finished += 1
                yield result
            stop.set()
            for thread in threads:  # every context is done, so each worker is only polling the queue
                thread.join(timeout=WORKER_EXIT_S)
        finally:
            stop.set()

    def _work(self, worker, todo: queue.Queue, done: queue.Queue, stop: threading.Event) -> None:
        """Score contexts until told to stop (a context handed back by a lost server may come late)."""
        engine, slot = worker
        while not stop.is_set():
            try:
                index, job = todo.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                scores, evaluated = engine.score(slot, *job)
                scores = finite_scores(scores, engine.http.url, *job, route=engine.scoring)
            except ServerGone as exc:
                self._leave(engine.http.url, exc)  # before it is told, so that no reserve worker of its own starts
                todo.put((index, job))
                done.put(exc)
                return
            except BackendError as exc:
                done.put(exc)
                return
            except Exception as exc:  # a malformed answer: one line, not a worker dying silently
                done.put(BackendError(f"{engine.http.url} gave an answer kvphase cannot read ({exc!r})"))
                return
            with self._lock:
                self.tokens_evaluated += evaluated
            done.put((index, scores))

    def _leave(self, url: str, reason: BackendError) -> None:
        with self._lock:
            if url in self._lost_urls():
                return
            self.lost.append({"url": url, "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "reason": str(reason)})
            others = {engine.http.url for engine in self.engines} - self._lost_urls()
        if not others:  # with none left the sweep stops, and its one line says why
            return
        self._warn(f"{reason}; its contexts go to the other servers")

    def _lost_urls(self) -> set[str]:
        return {entry["url"] for entry in self.lost}

    def _every_server_gone(self) -> BackendError:
        summary = "; ".join(f"since {entry['at']}: {entry['reason']}" for entry in self.lost)
        return BackendError(f"every server has stopped answering ({summary}); finished contexts are kept: run the "
                            "same command again to resume")

    def engine_info(self) -> dict:
        """What the manifest records about the engines: their own build, model and slots."""
        return {"engine": self.servers[0].engine if self.servers else "server",
                "scoring": getattr(self.engines[0], "scoring", "forced"),
                "servers": [{"url": s.url, "stated_model": s.model, "build_info": s.build_info, "slots": s.slots,
                             "n_ctx": s.n_ctx, "model_check": self._model_check(s)} for s in self.servers],
                "workers": len(self.workers), "lost": self.lost}

    def _model_check(self, server: ServerInfo) -> dict:
        """What was compared of a server's model with the file's: the tokenizer always, the facts the
        server states (llama-server's; an OpenAI-compatible engine states none), and what differed."""
        if self.model is None:
            return {"tokenizer": "same", "facts": {}}
        return {"tokenizer": "same", "facts": compared_facts(server, self.model),
                "differs": served_model_mismatch(server, self.model), "scored_anyway": self.allow_other_model,
                **({"weights": self.identified[server.url]} if server.url in self.identified else {})}

    def close(self) -> None:
        """Nothing to free: each worker's keep-alive connection is its thread's, and goes with it."""


WORKER_EXIT_S = 5.0  # a worker polls its queue every 0.1 s, so one left working after the last context is a bug


def _next(done: queue.Queue):
    """The next result; waits in short steps so Ctrl-C reaches the main thread at once."""
    while True:
        try:
            return done.get(timeout=0.2)
        except queue.Empty:
            continue


def open_server_backend(model_path, *, n_ctx: int, engine: str = LlamaServer.kind, urls: Sequence[str] = (),
                        slots: int | None = None, request_timeout: float = Retry.request_timeout,
                        deadline: float | None = None, allow_model_mismatch: bool = False,
                        scoring: str | None = None) -> ServerBackend:
    """Servers at `urls` checked against the model file's vocabulary and the facts of its model
    (read locally, no weights); the deadline's clock starts here. `scoring`: the route
    (dialects.SCORING_ROUTES; None: the engine's default)."""
    from kvphase.engines.llamacpp import Vocab

    if engine not in ENGINES:
        raise PlanError(f"unknown server engine {engine!r}; expected one of {', '.join(ENGINES)}")
    if not urls:
        raise PlanError("--backend server needs --url http://HOST:PORT (once per server)")
    for option, seconds in (("--request-timeout", request_timeout), ("--deadline", deadline)):
        if seconds is not None:
            check_seconds(option, seconds)
    retry = Retry(request_timeout=request_timeout, deadline=deadline)
    engines = [ENGINES[engine](url, retry, scoring) for url in urls]
    seen: dict[str, str] = {}
    for url, one in zip(urls, engines):
        if one.http.url in seen:
            raise PlanError(f"--url {url} names the same server as --url {seen[one.http.url]}; give each server "
                            "once (--slots sets how many requests each takes at once)")
        seen[one.http.url] = url
    vocab = Vocab.load(model_path)
    return ServerBackend(engines, vocab, n_ctx_needed=n_ctx, slots=slots,
                         model=ModelFacts.of(model_path, vocab.n_vocab), allow_other_model=allow_model_mismatch)
