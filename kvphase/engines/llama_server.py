"""Start a local llama-server (and llama.cpp's rpc-server) on 127.0.0.1 and stop it again (tests,
bench, studies).

The binary comes from `scripts/build_llama_server.sh`, built from the llama.cpp that
llama-cpp-python vendors; `find_llama_server` runs that script, which returns at once
when the build is cached. The flags match the in-process backend where numbers depend
on them: n_batch = n_ubatch = 512 and no flash attention, except for an architecture whose sparse
attention llama.cpp runs only under it (minimax-m3: `SPARSE_NEEDS_FLASH_ONE_STREAM`); `-np` given
explicitly leaves the cache one stream per slot, which that attention needs too.
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
from kvphase.engines.llamacpp import SPARSE_NEEDS_FLASH_ONE_STREAM, extra_buffers_safe
from kvphase.errors import BackendError, ModelFileError
from kvphase.gguf.header import read_gguf_header
from kvphase.gguf.keys import Keys

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
            "-b", "512", "-ub", "512", "-fa", _flash_attention(model), "--cache-ram", "0", "--no-webui",
            *(() if extra_buffers_safe() else ("--no-repack",)), *extra]


def _flash_attention(model: Path) -> str:
    """"on" where the model's sparse attention needs it (else llama.cpp runs it dense), else "off"."""
    try:
        architecture = read_gguf_header(model).fields.get(Keys.General.ARCHITECTURE)
    except ModelFileError:  # no file to read (a test's command line): the server reports it itself
        return "off"
    return "on" if architecture in SPARSE_NEEDS_FLASH_ONE_STREAM else "off"


def rpc_options(endpoints: list[str]) -> tuple[str, ...]:
    """llama-server's options that put every layer on the rpc-servers at `endpoints` (host:port),
    split by their memory. The `-ot` with a pattern no tensor has comes first because it makes
    ggml load its backend modules (libggml-rpc.so beside the binary): llama.cpp only looks for them
    when no backend is registered yet, and llama-cpp-python's libraries register the CPU's."""
    return ("-ot", "kvphase-no-such-tensor=CPU", "--rpc", ",".join(endpoints), "-ngl", "99")


@contextlib.contextmanager
def llama_server(model: Path, *, slots: int = 1, n_ctx_per_slot: int = 2048, threads: int | None = None,
                 extra: tuple[str, ...] = (), binary: Path | None = None, ready_s: float = 120.0,
                 port: int | None = None) -> Iterator["RunningServer"]:
    """A llama-server serving `model` on `port` (default a free one); always stopped on exit."""
    binary = binary or find_llama_server()
    port = port or free_port()
    command = server_command(binary, model, port, slots=slots, n_ctx_per_slot=n_ctx_per_slot,
                             threads=threads or default_threads(), extra=extra)
    with _running(command, f"http://127.0.0.1:{port}", ready_s) as running:
        yield running


@contextlib.contextmanager
def rpc_server(*, threads: int = 1, binary: Path | None = None, ready_s: float = 30.0) -> Iterator["RunningServer"]:
    """llama.cpp's rpc-server (built beside llama-server) on a free port: it holds and computes the
    layers a `llama-server --rpc` gives it. Its `url` is the host:port `--rpc` takes."""
    binary = binary or find_llama_server().with_name("rpc-server")
    if not binary.is_file():
        raise BackendError(f"no rpc-server beside {binary.parent / 'llama-server'}: scripts/build_llama_server.sh "
                           "builds it against llama-cpp-python's libraries (FULL=1 builds have none)")
    port = free_port()
    with _running([str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)], f"127.0.0.1:{port}",
                  ready_s) as running:
        yield running


@contextlib.contextmanager
def _running(command: list[str], url: str, ready_s: float) -> Iterator["RunningServer"]:
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    running = RunningServer(url, process, log)
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
        """Until llama-server's /health answers, or an rpc-server (a host:port URL) accepts a connection."""
        deadline, name = time.monotonic() + timeout_s, Path(self.process.args[0]).name
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BackendError(f"{name} exited with {self.process.returncode}: {self.log_tail()}")
            if self._answers():
                return
            time.sleep(0.2)
        raise BackendError(f"{name} at {self.url} was not ready after {timeout_s:.0f} s: {self.log_tail()}")

    def _answers(self) -> bool:
        try:
            if not self.url.startswith("http"):
                host, port = self.url.rsplit(":", 1)
                socket.create_connection((host, int(port)), timeout=2).close()
                return True
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 3) -> str:
        self._log.seek(0)
        return " | ".join(self._log.read().decode(errors="replace").strip().splitlines()[-lines:])

    def kill(self) -> None:
        """Stop it hard, as a crash or a pulled cable would."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def pause(self) -> None:
        """Stop it answering anything while it stays alive (SIGSTOP), as a hung host would."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server go on (SIGCONT)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            os.killpg(self.process.pid, signal.SIGCONT)  # a paused server takes its SIGTERM only once it runs
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
