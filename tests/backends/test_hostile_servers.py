"""Hostile servers (issue 65) against every command that reads one: `sweep --backend server`,
`header` and `inspect` by URL, and `conform --backend server`. Each case ends in one line naming
the server and the limit, writes nothing, within twice its deadline (plus the command's own start)
and within MEMORY_BOUND of Python memory (tracemalloc's peak, which an endless answer read whole
would pass at once: the server sends up to 256 MiB).

The servers (`hostile_servers.HostileServer`) listen on 127.0.0.1 only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tracemalloc

import pytest
from typer.testing import CliRunner

from tests.helpers.cli_checks import one_line_error
from tests.helpers.hostile_servers import HUGE_SIZE, HostileServer, gguf_facts
from kvphase.cli import app
from kvphase.conform.references import DEFAULT_REFERENCES
from kvphase.gguf import remote
from tests.helpers.paths import REPO

runner = CliRunner()
REFERENCES = {reference.name: reference for reference in DEFAULT_REFERENCES}
MODEL, OTHER = REFERENCES["csa-disjoint"].model, REFERENCES["csa-top4"].model  # one tokenizer, other facts
REQUEST_TIMEOUT_S = 1.0  # --request-timeout of the server commands; header and inspect get it as REQUEST_DEADLINE
SERVER_DEADLINE_S = 2 * REQUEST_TIMEOUT_S + 0.25  # a server that never answered: 2 tries and the wait between
START_S = 15.0  # a command's own start before its first request (planning, the vocabulary) on a loaded 2-core machine:
# measured up to 8 s for conform beside make test's two workers and other jobs
MEMORY_BOUND = 100 << 20  # bytes of Python memory a command may take (tracemalloc's peak)


def commands(url: str, tmp_path) -> dict[str, tuple[list[str], float]]:
    """Each command a hostile server meets, and its deadline in seconds."""
    return {
        "sweep": (["sweep", str(MODEL), "--backend", "server", "--url", url, "--request-timeout",
                   str(REQUEST_TIMEOUT_S), "--out", str(tmp_path / "run"), "-q"], SERVER_DEADLINE_S),
        "header": (["header", f"{url}/m.gguf", str(tmp_path / "run" / "header.gguf")], REQUEST_TIMEOUT_S),
        "inspect": (["inspect", f"{url}/m.gguf"], REQUEST_TIMEOUT_S),
        "conform": (["conform", "--backend", "server", "--url", url, "--model", "csa-disjoint", "--request-timeout",
                     str(REQUEST_TIMEOUT_S), "--out", str(tmp_path / "run")], SERVER_DEADLINE_S),
    }


def facts_line() -> str:
    """What the refusal of a server holding OTHER says differs, from gguf-py's reading of both files."""
    served, ours = gguf_facts(OTHER), gguf_facts(MODEL)
    return ", ".join(f"{key} {served[key]:,} where the file has {ours[key]:,}" for key in served
                     if served[key] != ours[key])


SERVER_LINES = {  # mode -> what sweep's and conform's one line says (the server's URL is checked besides)
    "endless": "/props answered more than 4 MiB, the most kvphase reads from /props",
    "trickle": f"does not answer (no answer within --request-timeout {REQUEST_TIMEOUT_S:g} s) after 2 tries",
    "half-headers": f"does not answer (no answer within --request-timeout {REQUEST_TIMEOUT_S:g} s) after 2 tries",
    "redirect-loop": "/props answered HTTP 302, a redirect to /props: give --url the server's own address",
    "wrong-model": "serves another model (/models/csa-top4.gguf), not csa-disjoint.gguf: {facts}; "
                   "`kvphase sweep --allow-model-mismatch` scores it anyway",
}
URL_LINES = {  # mode -> what header's and inspect's one line says
    "endless": "the server sent 1048576 and more bytes where 1048576 were asked for",
    "trickle": f"no whole answer within {REQUEST_TIMEOUT_S:g} s (the limit of one request)",
    "half-headers": f"no whole answer within {REQUEST_TIMEOUT_S:g} s (the limit of one request)",
    "redirect-loop": "model URL redirects in a loop or too often",
    "huge-size": f"the server states a size of {HUGE_SIZE:,} bytes, but its tensor table ends at byte",
}
EXPECTED = {**{(mode, command): line for mode, line in SERVER_LINES.items() for command in ("sweep", "conform")},
            **{(mode, command): line for mode, line in URL_LINES.items() for command in ("header", "inspect")}}


@pytest.mark.time_limit(60)
@pytest.mark.parametrize("mode, command", EXPECTED)
def test_a_hostile_server_is_one_line_within_its_deadline_and_memory(mode, command, tmp_path, monkeypatch):
    monkeypatch.setattr(remote, "REQUEST_DEADLINE", REQUEST_TIMEOUT_S)
    with HostileServer(mode, model=MODEL, stated=OTHER) as server:
        argv, deadline = commands(server.url, tmp_path)[command]
        tracemalloc.start()
        started = time.monotonic()
        try:
            result = runner.invoke(app, argv)
        finally:
            seconds = time.monotonic() - started
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    one_line_error(result, server.url, EXPECTED[mode, command].format(facts=facts_line()))
    assert not (tmp_path / "run").exists()  # no folder, no header-only file: nothing filed under the wrong model
    assert seconds < 2 * deadline + START_S, f"{seconds:.1f} s, the bound {2 * deadline + START_S:g} s"
    assert peak < MEMORY_BOUND, f"{peak / 2**20:.0f} MiB of Python memory at the peak, the bound {MEMORY_BOUND >> 20}"


@pytest.mark.time_limit(60)
def test_header_interrupted_says_nothing_was_written_not_that_results_are_kept(tmp_path):
    """A signal while `header` waits on a trickle: the line is header's own, not a sweep's
    "finished results are kept; run the same command again to resume"."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with HostileServer("trickle") as server:
        process = subprocess.Popen([sys.executable, "-m", "kvphase.cli", "header", f"{server.url}/m.gguf",
                                    str(tmp_path / "h.gguf")], stderr=subprocess.PIPE, text=True, env=env)
        while not server.sent and process.poll() is None:  # the command is reading its answer
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 128 + signal.SIGINT, err
    assert err.strip() == ("Interrupted: nothing was written (the header-only file is written whole or not at "
                           "all)."), err
    assert not list(tmp_path.iterdir())
