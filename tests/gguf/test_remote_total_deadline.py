"""A model URL whose header takes many requests, each well inside its own deadline (issue 77): all of
a file's requests are bounded together (`remote.TOTAL_DEADLINE`), so a slow server is one line in
bounded time however many blocks its header spans."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.gguf import remote
from tests.helpers.cli_checks import one_line_error
from tests.helpers.hostile_servers import SLOW_RANGE_S, HostileServer

pytestmark = pytest.mark.time_limit(60)
runner = CliRunner()
SMALL_BLOCK = 4 << 10  # the tiny llama's header then takes 4 range requests, a block and three runs of them


def test_a_header_of_many_slow_requests_is_bounded_in_all(tiny_llama, monkeypatch):
    monkeypatch.setattr(remote, "BLOCK", SMALL_BLOCK)
    monkeypatch.setattr(remote, "REQUEST_DEADLINE", 2 * SLOW_RANGE_S)  # each request answers inside it
    with HostileServer("slow-ranges", model=tiny_llama) as server:
        url = f"{server.url}/m.gguf"
        started = time.monotonic()
        whole = runner.invoke(app, ["inspect", url])
        unbounded_s = time.monotonic() - started
        assert whole.exit_code == 0, whole.output  # given the time, every request answers
        assert unbounded_s > 3 * SLOW_RANGE_S, unbounded_s  # longer than any one request may take
        monkeypatch.setattr(remote, "TOTAL_DEADLINE", 2 * SLOW_RANGE_S)
        bounded = runner.invoke(app, ["inspect", url])
    one_line_error(bounded, url, f"no whole header within {2 * SLOW_RANGE_S:g} s (the limit of all of a file's "
                   "requests)")
