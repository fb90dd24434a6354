"""Start a local llama-server on 127.0.0.1 and stop it again (tests, bench, studies).

The binary comes from `scripts/build_llama_server.sh`, built from the llama.cpp that
llama-cpp-python vendors; `find_llama_server` runs that script, which returns at once
when the build is cached. The flags match the in-process backend where numbers depend
on them: n_batch = n_ubatch = 512 and no flash attention.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from kvphase.defaults import default_threads
from kvphase.engines.llamacpp import extra_buffers_safe
from kvphase.errors import BackendError

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_llama_server.sh"


def find_llama_server() -> Path:
    """The cached llama-server binary, built first when there is none (15-40 minutes)."""
    if os.environ.get("KVPHASE_LLAMA_SERVER"):
        return Path(os.environ["KVPHASE_LLAMA_SERVER"])
    if not BUILD_SCRIPT.is_file():
        raise BackendError(f"{BUILD_SCRIPT} is missing: set KVPHASE_LLAMA_SERVER to a llama-server binary")
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BackendError(f"building llama-server failed ({tail}); see {BUILD_SCRIPT}")
    return Path(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(binary: Path, model: Path, port: int, *, slots: int = 1, n_ctx_per_slot: int = 2048,
                   threads: int = 2, extra: tuple[str, ...] = ()) -> list[str]:
    """The command line: `slots` slots of `n_ctx_per_slot` tokens each."""
    return [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-c", str(slots * n_ctx_per_slot), "-np", str(slots), "-t", str(threads), "-tb", str(threads),
            "-b", "512", "-ub", "512", "-fa", "off", "--cache-ram", "0", "--no-webui",
            *(() if extra_buffers_safe() else ("--no-repack",)), *extra]


@contextlib.contextmanager
def llama_server(model: Path, *, slots: int = 1, n_ctx_per_slot: int = 2048, threads: int | None = None,
                 extra: tuple[str, ...] = (), binary: Path | None = None, ready_s: float = 120.0
                 ) -> Iterator["RunningServer"]:
    """A llama-server serving `model` on a free port; always stopped on exit."""
    binary = binary or find_llama_server()
    port = free_port()
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(server_command(binary, model, port, slots=slots, n_ctx_per_slot=n_ctx_per_slot,
                                              threads=threads or default_threads(), extra=extra),
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    running = RunningServer(f"http://127.0.0.1:{port}", process, log)
    try:
        running.wait_ready(ready_s)
        yield running
    finally:
        running.stop()
        log.close()


class RunningServer:
    """A started llama-server: its URL, and a way to kill it on purpose."""

    def __init__(self, url: str, process: subprocess.Popen, log):
        self.url, self.process, self._log = url, process, log

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BackendError(f"llama-server exited with {self.process.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise BackendError(f"llama-server at {self.url} was not ready after {timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 3) -> str:
        self._log.seek(0)
        return " | ".join(self._log.read().decode(errors="replace").strip().splitlines()[-lines:])

    def kill(self) -> None:
        """Stop it hard, as a crash or a pulled cable would."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
