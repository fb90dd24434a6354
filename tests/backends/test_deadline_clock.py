"""--deadline between two tries (issue 76): once it has passed, no retry is sent.

The transport's clock is a fake one the test controls: a server that answers 503 ("still loading",
a transient status kvphase retries) moves it on by the seconds each answer "took", and the client's
backoff waits move it on by what they wait, so the deadline passes exactly where the test puts it,
in no real time."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import pytest

from kvphase.backends.transport import DeadlinePassed, Http, Retry
from kvphase.errors import BackendError
from tests.helpers.fake_servers import LocalServer, QuietHTTPServer


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now, self.waits = now, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


class LoadingServer(LocalServer):
    """Answers every request 503 after `takes` seconds of the fake clock; keeps when each arrived."""

    def __init__(self, clock: FakeClock, takes: float):
        self.arrived: list[float] = []
        lock, outer = threading.Lock(), self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                with lock:
                    outer.arrived.append(clock.now)
                    clock.now += takes
                body = json.dumps({"error": {"message": "Loading model"}}).encode()
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._listen(QuietHTTPServer(("127.0.0.1", 0), Handler))


@pytest.mark.parametrize("takes, first_wait, where", [
    (20.0, 1.0, "during the first try"),  # the answer comes at 20 s of a 10 s deadline
    (4.0, 8.0, "during the wait before the second"),  # answered at 4 s; the 8 s wait would end at 12 s
])
def test_no_retry_is_sent_once_the_deadline_has_passed(monkeypatch, takes, first_wait, where):
    clock = FakeClock()
    monkeypatch.setattr("kvphase.backends.transport.time", SimpleNamespace(monotonic=clock.monotonic,
                                                                           sleep=clock.sleep))
    retry = Retry(attempts=6, first_wait_s=first_wait, request_timeout=60, deadline=10.0, started=clock.now)
    with LoadingServer(clock, takes) as server:
        with pytest.raises(BackendError) as error:
            Http(server.url, retry).get("/props")
    assert server.arrived == [1000.0], f"the deadline passed {where}; tries arrived at {server.arrived}"
    assert isinstance(error.value, DeadlinePassed), error.value
    assert str(error.value) == (f"the --deadline of 10 s passed while waiting for {server.url} (HTTP 503: Loading "
                                "model); finished contexts are kept: run the command again (a later --deadline) to "
                                "resume")
    assert clock.now <= 1000.0 + max(takes, 10.0), f"waited to {clock.now - 1000:g} s: {clock.waits}"
