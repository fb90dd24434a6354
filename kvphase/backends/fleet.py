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

import queue
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from kvphase.backends.base import Query, Score
from kvphase.backends.dialects import (ENGINES, LlamaServer, ModelFacts, ServerInfo, compared_facts,
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
        if self.slots is not None and self.slots < 1:
            raise PlanError(f"--slots must be at least 1, got {self.slots}")
        self._lock = threading.Lock()
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
        self._check_forcing(engine)
        if self.slots is not None and engine.kind == LlamaServer.kind and self.slots > info.slots:
            raise BackendError(f"{info.url} has {info.slots} slots, --slots asks for {self.slots}; "
                               f"restart it with -np {self.slots}")
        return info

    def _check_model(self, info: ServerInfo) -> None:
        """The model the server states against the file's (MODEL_FACTS): refused, or with
        allow_other_model a warning."""
        line = served_model_line(info, self.model) if self.model is not None else ""
        if line and not self.allow_other_model:
            raise BackendError(f"{line}; `kvphase sweep --allow-model-mismatch` scores it anyway")
        if line:
            self._warn(f"{line}; scored anyway (--allow-model-mismatch)")

    def _warn(self, line: str) -> None:
        if self._tell is None:
            self._untold.append(line)
        else:
            self._tell(line)

    def _check_forcing(self, engine) -> None:
        """Score one short query: a server that cannot teacher-force fails here, not mid-sweep."""
        ids = self.vocab.prefix_ids + self.vocab.tokenize(TOKENIZER_PROBES[0])  # at least 5 tokens in any vocabulary
        try:
            engine.score(0, ids[:-3], [Query(tuple(ids[-3:-2]), tuple(ids[-2:]))])
        except ServerRefused as exc:
            raise BackendError(f"{engine.http.url} cannot teacher-force a query ({exc.message})") from None

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
                "servers": [{"url": s.url, "model": s.model, "build_info": s.build_info, "slots": s.slots,
                             "n_ctx": s.n_ctx, "model_check": self._model_check(s)} for s in self.servers],
                "workers": len(self.workers), "lost": self.lost}

    def _model_check(self, server: ServerInfo) -> dict:
        """What was compared of a server's model with the file's: the tokenizer always, the facts the
        server states (llama-server's; an OpenAI-compatible engine states none), and what differed."""
        if self.model is None:
            return {"tokenizer": "same", "facts": {}}
        return {"tokenizer": "same", "facts": compared_facts(server, self.model),
                "differs": served_model_mismatch(server, self.model), "scored_anyway": self.allow_other_model}

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
