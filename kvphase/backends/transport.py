"""HTTP to one inference server: JSON requests with capped answers, deadlines and retries.

Each thread keeps one keep-alive connection; an answer is read up to its endpoint's cap
(`ANSWER_CAPS`), a request ends by --request-timeout and every request by --deadline (`Retry`).
Transient failures (refused, reset, 503 while loading) are retried with backoff. A
request that takes longer than the run's pace allows (`Pace`) asks the server's
`/health` whether it is alive: a server that answers nothing (stopped, hung, behind a
dead link) is gone at once (`ServerGone`), a busy one is waited for up to `--request-timeout`.
A watch thread shuts the socket at the deadline, since a socket timeout is per read and never
fires on a server that trickles its answer.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit

from kvphase.errors import BackendError, PlanError


@dataclass(frozen=True)
class Retry:
    """How long to keep trying a server that does not answer.

    `request_timeout` bounds each request, from sending it to the last byte of its answer;
    `deadline` bounds every request of the run together, from when this record is made
    (None: no bound). Either one, when hit, is named in the error."""

    attempts: int = 6  # tries per request before giving up
    first_wait_s: float = 0.25  # wait after the first failure, doubled after each next one
    request_timeout: float = 300.0  # per request: a long context on a slow machine takes a while
    deadline: float | None = None
    started: float = field(default_factory=time.monotonic, compare=False)

    def __post_init__(self) -> None:
        finite = math.isfinite(self.request_timeout) and (self.deadline is None or math.isfinite(self.deadline))
        if self.attempts < 1 or self.first_wait_s < 0 or self.request_timeout <= 0 or not finite or (
                self.deadline is not None and self.deadline <= 0):
            raise ValueError(f"Retry expects attempts >= 1, first_wait_s >= 0, finite request_timeout > 0 and "
                             f"deadline > 0, got {self}")

    def seconds_left(self) -> float:
        """Until the deadline (infinite without one)."""
        return math.inf if self.deadline is None else self.deadline - (time.monotonic() - self.started)


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
# about 200 bytes a position: 64 MiB hold 300,000 of them; SGLang's input logprobs), every other answer is a few kB
# (llama-server's /props, its chat template included). An endless or huge answer stops at the cap, not at the machine's memory.
ANSWER_CAPS = {"/completion": 64 << 20, "/v1/completions": 64 << 20, "/generate": 64 << 20}
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
                raise DeadlinePassed(f"the --deadline of {self._retry.deadline:g} s passed while waiting for "
                                     f"{self.url}" + (f" ({problem})" if problem else ""))
            limit = self._retry.request_timeout if self._answered else min(self._retry.request_timeout, FIRST_CONTACT_S)
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
                    raise DeadlinePassed(f"the --deadline of {self._retry.deadline:g} s passed while waiting for "
                                         f"{self.url}{path} to answer") from None
                problem = _describe(exc) if not isinstance(exc, TimeoutError) else (
                    f"no answer within --request-timeout {limit:g} s" if limit == self._retry.request_timeout
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
