"""Scoring through running inference servers: llama-server (one or many), or an
OpenAI-compatible engine that returns prompt logprobs (vLLM's `/v1/completions`).

llama-server gives no prompt logprobs and refuses echo, so teacher forcing is a grammar
of literal token ids (`root ::= <[a1]> <[a2]>`) with `n_probs: 1` and
`post_sampling_probs: false`: each generated entry then holds the raw-logit
log-probability of the forced token and the top-1 (argmax) token. A context is first
evaluated alone on a slot (`cache_prompt: false`, so it is evaluated from position 0
whatever the slot held before); each query then resends the context, which the slot's
prompt cache recognises, so only the query's own tokens are evaluated
(tools/server/server-context.cpp: `get_common_prefix`).

Contexts are spread over (server, slot) workers; a context and all its queries stay
on one worker, so its prefix is reused. Each worker keeps one HTTP connection alive.
Transient failures (refused, reset, 503 while loading) are retried with backoff. A
request that takes longer than the run's pace allows (`Pace`) asks the server's
`/health` whether it is alive: a server that answers nothing (stopped, hung, behind a
dead link) leaves at once, a busy one is waited for up to `--request-timeout`. A server
that leaves hands its contexts to the others; when none is left the sweep stops with one
line, keeping every finished context in the run folder for a resume.
"""

from __future__ import annotations

import http.client
import json
import math
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence
from urllib.parse import urlsplit

from kvphase.backends.base import Query, Score
from kvphase.backends.server_paths import path_warnings
from kvphase.errors import BackendError, PlanError
from kvphase.options_check import check_seconds

# Strings both sides must tokenize alike: words, digits, code, accents, CJK, emoji and
# whitespace runs, where tokenizers of different models part ways.
TOKENIZER_PROBES = (
    "The quick brown fox jumps over the lazy dog.",
    " key-0042: value 1234567 | x_y = f(z) * 3.14;\n\tdef main():",
    "Ünïcödé naïve café, 東京タワー, 🙂👍 and  two  spaces\n\n",
)


@dataclass(frozen=True)
class Retry:
    """How long to keep trying a server that does not answer.

    `timeout_s` bounds each request, from sending it to the last byte of its answer;
    `deadline_s` bounds every request of the run together, from when this record is made
    (None: no bound). Either one, when hit, is named in the error."""

    attempts: int = 6  # tries per request before giving up
    first_wait_s: float = 0.25  # wait after the first failure, doubled after each next one
    timeout_s: float = 300.0  # per request: a long context on a slow machine takes a while
    deadline_s: float | None = None
    started: float = field(default_factory=time.monotonic, compare=False)

    def __post_init__(self) -> None:
        finite = math.isfinite(self.timeout_s) and (self.deadline_s is None or math.isfinite(self.deadline_s))
        if self.attempts < 1 or self.first_wait_s < 0 or self.timeout_s <= 0 or not finite or (
                self.deadline_s is not None and self.deadline_s <= 0):
            raise ValueError(f"Retry expects attempts >= 1, first_wait_s >= 0, finite timeout_s > 0 and "
                             f"deadline_s > 0, got {self}")

    def seconds_left(self) -> float:
        """Until the deadline (infinite without one)."""
        return math.inf if self.deadline_s is None else self.deadline_s - (time.monotonic() - self.started)


class DeadlinePassed(BackendError):
    """The run's --deadline passed; what finished is kept."""

    def __init__(self, what: str):
        super().__init__(f"{what}; finished contexts are kept: run the command again (a later --deadline) to resume")


class ServerGone(BackendError):
    """A server that stopped answering (every retry failed): its contexts can go to the others."""


class ServerRefused(BackendError):
    """The server answered with an error status (not worth retrying)."""

    def __init__(self, url: str, status: int, message: str):
        super().__init__(f"{url} refused the request (HTTP {status}): {message}")
        self.status, self.message = status, message


TRANSIENT_STATUS = (502, 503, 504)  # a proxy hiccup, or llama-server still loading the model
# The most bytes one answer may hold, by endpoint: a scoring answer grows with its prompt (vLLM's prompt logprobs,
# about 200 bytes a position: 64 MiB hold 300,000 of them), every other answer is a few kB (llama-server's /props,
# its chat template included). An endless or huge answer stops at the cap, not at the machine's memory.
ANSWER_CAPS = {"/completion": 64 << 20, "/v1/completions": 64 << 20}
OTHER_ANSWER_CAP = 4 << 20
FIRST_CONTACT_S = 30.0  # a server that has never answered: /props and /tokenize answer at once on a live one
STALL_FACTOR = 2.0  # a request may take this many times the slowest answered so far before /health is asked
MIN_PATIENCE_S = 5.0  # ... and at least this long: a tiny model's requests take milliseconds, a loaded CPU stutters


class Pace:
    """The slowest request the run's servers have answered so far, and from it how long a request
    may stay unanswered before its server is asked whether it is alive (`patience`). Shared by a
    fleet: a server that stalls on its first context is judged by the others' pace."""

    def __init__(self) -> None:
        self._slowest = 0.0
        self._lock = threading.Lock()

    def record(self, seconds: float) -> None:
        with self._lock:
            self._slowest = max(self._slowest, seconds)

    def patience(self, limit: float) -> float:
        """STALL_FACTOR x the slowest request so far, at least MIN_PATIENCE_S, at most `limit`."""
        with self._lock:
            return min(limit, max(MIN_PATIENCE_S, STALL_FACTOR * self._slowest))


class Stalled(Exception):
    """A request unanswered past its patience, and the server's /health unanswered as long."""


def parse_url(url: str):
    """urlsplit of a server's URL (http:// when no scheme), or one line naming what is wrong with it."""
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        parts.port  # noqa: B018 -- raises on a port outside 0-65535 or not a number
    except ValueError as exc:
        raise PlanError(f"--url expects http://HOST:PORT, got {url!r} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise PlanError(f"--url expects http://HOST:PORT, got {url!r}")
    return parts


class Http:
    """JSON requests to one server over one keep-alive connection (one per thread).

    Until the server has answered once, a failure is retried only once and a request waits
    at most FIRST_CONTACT_S: a wrong URL or a port that never answers is reported in a
    minute. After that a request unanswered for its patience (`Pace`) asks /health, on a
    connection of its own, whether the server is alive: one that answers within as long is
    waited for (again and again, up to --request-timeout); one that does not has stalled
    (stopped, hung, cut off) and is gone at once, not after every retry of every timeout."""

    def __init__(self, url: str, retry: Retry):
        parts = parse_url(url)
        self.url = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self._parts = parts
        self._retry = retry
        self._local = threading.local()
        self._answered = False
        self.pace = Pace()  # a fleet's servers share one (ServerBackend)

    def get(self, path: str) -> dict:
        return self._request("GET", path, None)

    def post(self, path: str, body: dict) -> dict:
        return self._request("POST", path, body)

    def _request(self, method: str, path: str, body: dict | None) -> dict:
        wait, problem = self._retry.first_wait_s, ""
        attempts = self._retry.attempts if self._answered else min(self._retry.attempts, 2)
        for attempt in range(attempts):
            if attempt:
                time.sleep(max(0.0, min(wait, self._retry.seconds_left())))
                wait *= 2
            left = self._retry.seconds_left()
            if left <= 0:
                raise DeadlinePassed(f"the --deadline of {self._retry.deadline_s:g} s passed while waiting for "
                                     f"{self.url}" + (f" ({problem})" if problem else ""))
            limit = self._retry.timeout_s if self._answered else min(self._retry.timeout_s, FIRST_CONTACT_S)
            timeout = min(limit, left)
            patience = self.pace.patience(timeout) if self._answered else timeout
            started = time.monotonic()
            try:
                status, data, location = self._send(method, path, body, timeout, patience)
            except Stalled:
                self._drop_connection()
                raise ServerGone(f"{self.url} stopped answering: no answer to {path} within {patience:g} s, and none "
                                 f"to /health within {patience:g} s more") from None
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, cut mid-answer
                self._drop_connection()
                if isinstance(exc, TimeoutError) and timeout < limit:
                    raise DeadlinePassed(f"the --deadline of {self._retry.deadline_s:g} s passed while waiting for "
                                         f"{self.url}{path} to answer") from None
                problem = _describe(exc) if not isinstance(exc, TimeoutError) else (
                    f"no answer within --request-timeout {limit:g} s" if limit == self._retry.timeout_s
                    else f"no first answer within {limit:g} s")
                continue
            self._answered = True
            if status in TRANSIENT_STATUS:
                problem = f"HTTP {status}: {_error_message(data)}"
                continue
            if status >= 400:
                raise ServerRefused(self.url, status, _error_message(data))
            if status >= 300:  # llama-server and vLLM answer where they are asked; a redirect is a proxy's or a typo's
                raise BackendError(f"{self.url}{path} answered HTTP {status}, a redirect to {location or 'nowhere'}: "
                                   "give --url the server's own address")
            self.pace.record(time.monotonic() - started)
            try:
                return json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise BackendError(f"{self.url}{path} answered with something that is not JSON: {data[:80]!r}") from None
        raise ServerGone(f"{self.url} does not answer ({problem}) after {attempts} tries")

    def _send(self, method: str, path: str, body: dict | None, timeout: float,
              patience: float) -> tuple[int, bytes, str | None]:
        """One request and its whole answer (status, body, Location) within `timeout` seconds
        (TimeoutError otherwise), however slowly the server trickles its header lines or its body;
        Stalled when it stays unanswered for `patience` and so does /health. A watch shuts the socket
        in both cases. An answer past its endpoint's cap (ANSWER_CAPS) is a BackendError."""
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._connection(timeout)
            self._local.connection = connection
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        payload = None if body is None else json.dumps(body).encode()
        watch = _Watch(connection, timeout, patience, self.alive)
        watch.start()
        try:
            connection.request(method, self._parts.path.rstrip("/") + path, body=payload,
                               headers={"Content-Type": "application/json"} if payload else {})
            response = connection.getresponse()
            data = self._read_capped(response, path)  # IncompleteRead when the answer stops short of its length
            if watch.expired or watch.stalled:  # shut mid-header, the answer can look whole: no length, no body
                raise TimeoutError
            return response.status, data, response.getheader("Location")
        except (OSError, http.client.HTTPException):
            if watch.stalled:
                raise Stalled from None
            if watch.expired:
                raise TimeoutError from None
            raise
        finally:
            watch.finish()

    def _read_capped(self, response: http.client.HTTPResponse, path: str) -> bytes:
        """The answer's body, read a MiB at a time up to its endpoint's cap; past the cap (or when its
        Content-Length says it will go past) the connection is dropped with one line naming the cap."""
        cap = ANSWER_CAPS.get(path, OTHER_ANSWER_CAP)
        parts, size = [], 0
        while response.length is None or response.length > 0:
            if response.length is not None and size + response.length > cap or size > cap:
                self._drop_connection()
                most = f"{cap >> 20} MiB" if cap >= 1 << 20 else f"{cap} bytes"
                raise BackendError(f"{self.url}{path} answered more than {most}, the most kvphase reads from {path}; "
                                   f"not a {'scoring' if path in ANSWER_CAPS else 'server'} answer")
            chunk = response.read(min(1 << 20, cap + 1 - size))
            if not chunk:  # a read of some bytes returns none when the answer stops short of its length
                if response.length:
                    raise http.client.IncompleteRead(b"".join(parts), response.length)
                break
            parts.append(chunk)
            size += len(chunk)
        return b"".join(parts)

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
        return kind(self._parts.hostname, self._parts.port, timeout=timeout)

    def alive(self, within: float) -> bool:
        """Whether the server answers GET /health with any HTTP status within `within` seconds,
        on a connection of its own (llama-server and vLLM answer it while they compute)."""
        connection = self._connection(within)
        watch = _Watch(connection, within, within, lambda _: True)
        watch.start()
        try:
            connection.request("GET", self._parts.path.rstrip("/") + "/health")
            connection.getresponse()
            return True
        except (OSError, http.client.HTTPException):
            return False
        finally:
            watch.finish()
            connection.close()

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None


class _Watch(threading.Thread):
    """Watches one request: at `timeout` seconds it shuts the socket (`expired`); every
    `patience` seconds before that it asks `alive(patience)`, and shuts the socket when the
    answer is no (`stalled`). A read blocked on the socket then returns at once."""

    def __init__(self, connection: http.client.HTTPConnection, timeout: float, patience: float,
                 alive: Callable[[float], bool]):
        super().__init__(daemon=True)
        self._connection, self._timeout, self._patience, self._alive = connection, timeout, patience, alive
        self._done = threading.Event()
        self.expired = self.stalled = False

    def run(self) -> None:
        end = time.monotonic() + self._timeout
        check = time.monotonic() + self._patience
        while not self._done.wait(max(0.0, min(end, check) - time.monotonic())):
            if time.monotonic() >= end:
                self.expired = True
                break
            if not self._alive(min(self._patience, max(end - time.monotonic(), 0.01))):
                if self._done.is_set():  # answered while /health was asked
                    return
                self.stalled = True
                break
            check = time.monotonic() + self._patience
        else:
            return
        _shut(self._connection)

    def finish(self) -> None:
        self._done.set()


def _shut(connection: http.client.HTTPConnection) -> None:
    """A read blocked on the connection's socket returns at once."""
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    return str(exc) or type(exc).__name__


def _error_message(data: bytes) -> str:
    """llama-server and vLLM both answer errors as {"error": {"message": ...}} (vLLM also {"message": ...})."""
    try:
        parsed = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return data[:200].decode("utf-8", errors="replace").strip() or "no message"
    error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    message = error.get("message", error) if isinstance(error, dict) else error
    return str(message).splitlines()[0] if str(message) else "no message"


@dataclass(frozen=True)
class ServerInfo:
    """What a server says about itself and the model it serves."""

    url: str
    engine: str  # "llama-server" or "openai"
    model: str  # the served model's name or path
    n_vocab: int | None  # None when the engine does not say
    n_ctx: int  # tokens one slot (or one request) can hold
    slots: int  # requests it evaluates side by side
    build_info: str
    facts: dict = field(default_factory=dict)  # MODEL_FACTS the engine states of its model (llama-server's meta)


# What llama-server states of its model in /v1/models "meta" (tools/server/server-context.cpp,
# get_res_model_info), each of which the model file answers too: llama.cpp counts the parameters
# and bytes of every tensor of every shard (llama-model-loader.cpp), as the tensor table lists them.
MODEL_FACTS = ("n_vocab", "n_ctx_train", "n_embd", "n_params", "size")


@dataclass(frozen=True)
class ModelFacts:
    """The model a sweep names, in the terms of MODEL_FACTS, to compare with what a server states.
    `file`: the server must hold this very file (conform's references, which share every fact but
    their weights): the same bytes when its path is readable here, else the same file name."""

    name: str  # how a refusal names it
    numbers: dict  # MODEL_FACTS -> the file's value
    file: Path | None = None

    @classmethod
    def of(cls, model_path, n_vocab: int) -> "ModelFacts":
        """The facts of a model file (every shard of a split one) or a header-only copy of it."""
        from kvphase.gguf.header import read_gguf_header
        from kvphase.gguf.header_only import other_shards

        first = read_gguf_header(model_path, partial=True)
        tensors = [t for shard in [first, *map(read_gguf_header, other_shards(first))] for t in shard.tensors]
        arch = first.fields.get("general.architecture")
        numbers = {"n_vocab": n_vocab, "n_ctx_train": first.fields.get(f"{arch}.context_length"),
                   "n_embd": first.fields.get(f"{arch}.embedding_length"),
                   "n_params": sum(t.n_elements for t in tensors), "size": sum(t.n_bytes for t in tensors)}
        return cls(Path(model_path).name, {k: v for k, v in numbers.items() if isinstance(v, int)})


def stated_facts(meta: object) -> dict:
    """MODEL_FACTS a server's /v1/models "meta" states (those it leaves out are not compared);
    ValueError for one that is not a whole number."""
    if not isinstance(meta, dict):
        return {}
    stated = {key: meta[key] for key in MODEL_FACTS if meta.get(key) is not None}
    wrong = [key for key, value in stated.items() if not isinstance(value, int) or isinstance(value, bool)]
    if wrong:
        raise ValueError(f"/v1/models meta.{wrong[0]} is {str(stated[wrong[0]])[:40]!r}, not a whole number")
    return stated


def served_model_mismatch(server: ServerInfo, model: ModelFacts) -> str:
    """What differs between the model a server states it serves and `model` ("" when nothing does):
    every fact both state, and with `model.file` the file itself."""
    from kvphase.runfolder import file_sha256

    differ = [f"{key} {server.facts[key]:,} where the file has {model.numbers[key]:,}" for key in MODEL_FACTS
              if key in server.facts and key in model.numbers and server.facts[key] != model.numbers[key]]
    if model.file is not None:
        served = Path(server.model)
        if served.is_file() and served.resolve() != model.file.resolve():
            if served.stat().st_size != model.file.stat().st_size or file_sha256(served) != file_sha256(model.file):
                differ.append(f"its file {served} holds other bytes than {model.file}")
        elif not served.is_file() and served.name != model.file.name:
            differ.append(f"its file is named {served.name}, not {model.file.name}")
    return ", ".join(differ)


def compared_facts(server: ServerInfo, model: ModelFacts) -> dict:
    """What the manifest records of a server's model check: each fact compared, the server's and the file's."""
    return {key: {"server": server.facts[key], "file": model.numbers[key]} for key in MODEL_FACTS
            if key in server.facts and key in model.numbers}


def served_model_line(server: ServerInfo, model: ModelFacts) -> str:
    """The line saying a server serves another model than `model`, and what differs ("" when nothing does)."""
    differ = served_model_mismatch(server, model)
    return f"{server.url} serves another model ({server.model}), not {model.name}: {differ}" if differ else ""


def refuse_served_model(server: ServerInfo, model: ModelFacts) -> None:
    """BackendError in one line when the server serves another model than `model`."""
    line = served_model_line(server, model)
    if line:
        raise BackendError(line)


class Engine(Protocol):
    """One server of some kind; thread-safe, each thread has its own connection."""

    http: Http

    def info(self) -> ServerInfo: ...

    def tokenize(self, text: str) -> list[int]:
        """Token ids with the model's own prefix (BOS) and no special-token parsing."""
        ...

    def score(self, slot: int, context: Sequence[int], queries: Sequence[Query]) -> tuple[list[Score], int]:
        """Teacher-forced scores of `queries` after `context`, and the tokens the server evaluated."""
        ...


class LlamaServer:
    """llama-server's native API (tools/server/README.md in llama.cpp)."""

    kind = "llama-server"

    def __init__(self, url: str, retry: Retry = Retry()):
        self.http = Http(url, retry)

    def info(self) -> ServerInfo:
        props = self.http.get("/props")
        model = self.http.get("/v1/models")["data"][0]
        facts = stated_facts(model.get("meta"))
        return ServerInfo(url=self.http.url, engine=self.kind, model=str(props.get("model_path") or model.get("id")),
                          n_vocab=facts.get("n_vocab"), n_ctx=int(props["default_generation_settings"]["n_ctx"]),
                          slots=int(props.get("total_slots", 1)), build_info=str(props.get("build_info", "unknown")),
                          facts=facts)

    def tokenize(self, text: str) -> list[int]:
        return self.http.post("/tokenize", {"content": text, "add_special": True, "parse_special": False})["tokens"]

    def score(self, slot: int, context: Sequence[int], queries: Sequence[Query]) -> tuple[list[Score], int]:
        primed = self.http.post("/completion", {"prompt": list(context), "n_predict": 0, "id_slot": slot,
                                                "cache_prompt": False})
        evaluated = _evaluated(primed)
        scores = []
        for query in queries:
            answer = self._forced(slot, list(context) + list(query.prompt), query.answer)
            evaluated += _evaluated(answer)
            scores.append(self._score(answer["completion_probabilities"], query.answer))
        return scores, evaluated

    def _forced(self, slot: int, prompt: list[int], answer: Sequence[int]) -> dict:
        """Generate exactly `answer` after `prompt`, with the raw log-probabilities of each step."""
        return self.http.post("/completion", {
            "prompt": prompt, "id_slot": slot, "cache_prompt": True, "n_predict": len(answer),
            "grammar": "root ::= " + " ".join(f"<[{int(t)}]>" for t in answer),
            "n_probs": 1, "post_sampling_probs": False, "temperature": 0.0, "stream": False,
        })

    def _score(self, steps: list[dict], answer: Sequence[int]) -> Score:
        forced = tuple(int(step["id"]) for step in steps)
        if forced != tuple(answer):
            raise BackendError(f"{self.http.url} generated {list(forced)} where a token-id grammar forced "
                               f"{list(answer)}: it does not support token-id grammars (`<[id]>`); use a newer llama-server")
        predicted = tuple(int(step["top_logprobs"][0]["id"]) for step in steps)
        return Score(correct=predicted == forced, logprob=float(sum(step["logprob"] for step in steps)),
                     predicted=predicted)


class OpenAICompatible:
    """An OpenAI-style engine with prompt logprobs, in vLLM's format: `/v1/completions`
    with token ids as the prompt and `prompt_logprobs: 1` returns, for every prompt
    position, {token id: {logprob, rank}} for the actual token and the top-1 token.

    One request per query holds context, query and answer; vLLM skips its prefix cache
    for requests that ask for prompt logprobs, so each evaluates the whole context.
    """

    kind = "openai"

    def __init__(self, url: str, retry: Retry = Retry()):
        self.http = Http(url, retry)
        self._model: str | None = None

    def info(self) -> ServerInfo:
        model = self.http.get("/v1/models")["data"][0]
        self._model = str(model["id"])
        try:
            version = str(self.http.get("/version").get("version", "unknown"))
        except BackendError:
            version = "unknown"
        return ServerInfo(url=self.http.url, engine=self.kind, model=self._model, n_vocab=None,
                          n_ctx=int(model.get("max_model_len") or 0), slots=1, build_info=f"version {version}")

    def tokenize(self, text: str) -> list[int]:
        return self.http.post("/tokenize", {"model": self._model, "prompt": text, "add_special_tokens": True})["tokens"]

    def score(self, slot: int, context: Sequence[int], queries: Sequence[Query]) -> tuple[list[Score], int]:
        scores, evaluated = [], 0
        for query in queries:
            prompt = list(context) + list(query.prompt) + list(query.answer)
            out = self.http.post("/v1/completions", {"model": self._model, "prompt": prompt, "max_tokens": 1,
                                                     "temperature": 0.0, "prompt_logprobs": 1})
            first = len(context) + len(query.prompt)
            scores.append(self._score(out["choices"][0].get("prompt_logprobs"), first, query.answer))
            evaluated += len(prompt)
        return scores, evaluated

    def _score(self, steps: list | None, first: int, answer: Sequence[int]) -> Score:
        if not steps or len(steps) < first + len(answer):
            raise BackendError(f"{self.http.url} returned no prompt logprobs; it needs vLLM-style `prompt_logprobs`")
        logprob, predicted = 0.0, []
        for position, token in enumerate(answer, start=first):
            entry = {int(k): v for k, v in steps[position].items()}
            logprob += float(entry[int(token)]["logprob"])
            predicted.append(min(entry, key=lambda t: (entry[t]["rank"], t != token)))
        return Score(correct=tuple(predicted) == tuple(answer), logprob=logprob, predicted=tuple(predicted))


ENGINES = {LlamaServer.kind: LlamaServer, OpenAICompatible.kind: OpenAICompatible}


def _evaluated(response: dict) -> int:
    timings = response.get("timings") or {}
    return int(timings.get("prompt_n", 0)) + int(timings.get("predicted_n", 0))


class Vocab(Protocol):
    """The local tokenizer of the model the plan names (llama.cpp, vocabulary only)."""

    n_vocab: int

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, ids: Sequence[int]) -> str: ...

    @property
    def prefix_ids(self) -> list[int]: ...

    @property
    def n_ctx_train(self) -> int: ...


@dataclass
class ServerBackend:
    """Scores on one or many servers; tokenizes locally with the model's own vocabulary,
    after checking that every server tokenizes the same way."""

    engines: list  # Engine, one per URL
    vocab: Vocab
    n_ctx_needed: int  # context plus the room a query needs
    slots: int | None = None  # workers per server; default: every slot it has
    model: ModelFacts | None = None  # what each server's model must match (None: the vocabulary only)
    allow_other_model: bool = False  # a server whose model differs is scored, with a warning, not refused
    servers: list[ServerInfo] = field(init=False)
    tokens_evaluated: int = field(init=False, default=0)
    lost: list[dict] = field(init=False, default_factory=list)  # servers that left: url, when, why

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


WORKER_EXIT_S = 5.0  # a worker polls its queue every 0.1 s, so one left working after the last context is a bug


def _next(done: queue.Queue):
    """The next result; waits in short steps so Ctrl-C reaches the main thread at once."""
    while True:
        try:
            return done.get(timeout=0.2)
        except queue.Empty:
            continue


def open_server_backend(model_path, *, n_ctx: int, engine: str = LlamaServer.kind, urls: Sequence[str] = (),
                        slots: int | None = None, request_timeout_s: float = Retry.timeout_s,
                        deadline_s: float | None = None, allow_model_mismatch: bool = False) -> ServerBackend:
    """Servers at `urls` checked against the model file's vocabulary and the facts of its model
    (read locally, no weights); the deadline's clock starts here."""
    from kvphase.engines.llamacpp import Vocab

    if engine not in ENGINES:
        raise PlanError(f"unknown server engine {engine!r}; expected one of {', '.join(ENGINES)}")
    if not urls:
        raise PlanError("--backend server needs --url http://HOST:PORT (once per server)")
    for option, seconds in (("--request-timeout", request_timeout_s), ("--deadline", deadline_s)):
        if seconds is not None:
            check_seconds(option, seconds)
    retry = Retry(timeout_s=request_timeout_s, deadline_s=deadline_s)
    engines = [ENGINES[engine](url, retry) for url in urls]
    seen: dict[str, str] = {}
    for url, one in zip(urls, engines):
        if one.http.url in seen:
            raise PlanError(f"--url {url} names the same server as --url {seen[one.http.url]}; give each server "
                            "once (--slots sets how many requests each takes at once)")
        seen[one.http.url] = url
    vocab = Vocab.load(model_path)
    return ServerBackend(engines, vocab, n_ctx_needed=n_ctx, slots=slots,
                         model=ModelFacts.of(model_path, vocab.n_vocab), allow_other_model=allow_model_mismatch)
