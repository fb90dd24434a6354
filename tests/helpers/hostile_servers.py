"""An HTTP server on 127.0.0.1 that answers every request in one hostile way (issue 65), for
tests/backends/test_hostile_servers.py and the fuzz campaign's `hostile` category.

Each mode is bounded in what it sends and how long it keeps at it (ENDLESS_LIMIT, GIVE_UP_S), so
a client that does not bound its reads is caught by a test's memory or time bound, never left to
eat the machine. The facts `wrong-model` states of its model are read with gguf-py, not kvphase,
so that a test pins kvphase's comparison against an independent reader.
"""

from __future__ import annotations

import json
import re
import socketserver
import threading
import time
from pathlib import Path

from tests.helpers.fake_servers import LocalServer

ENDLESS_LIMIT = 256 << 20  # bytes an endless answer sends at most: 4x the largest cap kvphase reads
GIVE_UP_S = 300.0  # a trickle stops after this long: past twice the longest deadline kvphase sets (120 s, header's)
TRICKLE_S = 0.2  # seconds between two bytes of a trickle
HUGE_SIZE = 10**12  # bytes `huge-size` states of its file
SLOW_RANGE_S = 0.25  # seconds `slow-ranges` waits before each answer
BLOCK = 1 << 20

MODES = {
    "endless": "answers 200 (206 with a range to a range request) with no length and a body that goes on",
    "trickle": "answers 200 (206 to a range request) with a length, then its body one byte every 0.2 s",
    "half-headers": "sends its status line and one header line, then nothing more (until it gives up)",
    "redirect-loop": "answers 302 to the very address it was asked, every time",
    "huge-size": "serves a model file by ranges, stating a size of 10^12 bytes",
    "empty-steps": "a llama-server stating `model`'s facts that answers every completion with no token steps",
    "slow-ranges": "serves a model file by ranges, each answer after 0.25 s: many requests, each well inside a deadline",
    "wrong-model": "a llama-server with the tokenizer of `model` that states the facts of another model, `stated`",
    "nan-scores": "a llama-server stating `model`'s facts that forces answers with a log-probability of -1 per "
                  "token for its first `finite` completions, and of null (llama-server's NaN) after them",
}


def gguf_facts(path: Path) -> dict:
    """What llama-server's /v1/models meta says of a model file, read with gguf-py (every tensor's
    elements and bytes, the architecture's embedding and context lengths, the vocabulary's size)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def value(key: str):
        field = reader.fields[key]
        return field.parts[field.data[0]].tolist()[0] if len(field.data) == 1 else len(field.data)

    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    return {"n_vocab": value("tokenizer.ggml.tokens"), "n_ctx_train": value(f"{arch}.context_length"),
            "n_embd": value(f"{arch}.embedding_length"), "n_params": sum(int(t.n_elements) for t in reader.tensors),
            "size": sum(int(t.n_bytes) for t in reader.tensors)}


class HostileServer(LocalServer):
    """One mode of MODES on a free port of 127.0.0.1; use as a context manager. `sent` counts the
    body bytes written."""

    def __init__(self, mode: str, model: Path | None = None, stated: Path | None = None, finite: int = 0):
        if mode not in MODES:
            raise ValueError(f"no hostile mode {mode!r}; expected one of {', '.join(MODES)}")
        self.mode, self.model, self.sent = mode, model and Path(model), 0
        self.finite = finite  # nan-scores: completions answered with finite numbers (a test may raise it)
        self.completions = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        if mode in ("wrong-model", "nan-scores", "empty-steps"):
            from kvphase.engines.llamacpp import Vocab

            stated = stated if mode == "wrong-model" else model
            self._vocab = Vocab.load(model)
            self._facts = {**gguf_facts(stated), "n_ctx": 4096}
            self._name = stated.name
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                self.request.settimeout(GIVE_UP_S)
                try:
                    while not server._stop.is_set() and server._answer(self.request):
                        pass
                except (OSError, ValueError):
                    pass

        self._listen(socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler))

    def __exit__(self, *exc) -> None:
        self._stop.set()  # releases the answers under way
        super().__exit__(*exc)

    # -- one request -------------------------------------------------------------------

    def _answer(self, sock) -> bool:
        """Read one request and answer it; whether the connection stays open for another."""
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(65536)
            if not chunk:
                return False
            head += chunk
        head, _, body = head.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(body) < length:
            body += sock.recv(65536)
        ranged = re.fullmatch(r"bytes=(\d+)-(\d+)", headers.get("range", ""))
        if self.mode == "endless":
            self._endless(sock, ranged)
        elif self.mode == "trickle":
            self._trickle(sock, ranged)
        elif self.mode == "half-headers":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
            self._stop.wait(GIVE_UP_S)
        elif self.mode == "redirect-loop":
            sock.sendall(f"HTTP/1.1 302 Found\r\nLocation: {path}\r\nContent-Length: 0\r\n\r\n".encode())
            return True
        elif self.mode in ("huge-size", "slow-ranges"):
            if self.mode == "slow-ranges":
                self._stop.wait(SLOW_RANGE_S)
            self._huge(sock, ranged, HUGE_SIZE if self.mode == "huge-size" else self.model.stat().st_size)
            return True
        else:
            self._llama_server(sock, method, path, json.loads(body or b"{}"))
            return True
        return False

    def _send_body(self, sock, data: bytes) -> None:
        sock.sendall(data)
        with self._lock:
            self.sent += len(data)

    def _endless(self, sock, ranged) -> None:
        status = f"206 Partial Content\r\nContent-Range: bytes 0-{BLOCK - 1}/{2 * BLOCK}" if ranged else "200 OK"
        sock.sendall(f"HTTP/1.1 {status}\r\nConnection: close\r\n\r\n".encode())
        chunk = b" " * (1 << 16)
        for _ in range(ENDLESS_LIMIT // len(chunk)):
            if self._stop.is_set():
                return
            self._send_body(sock, chunk)

    def _trickle(self, sock, ranged) -> None:
        data = b'{"data": [{"id": "m"}]}' + b" " * BLOCK
        status = f"206 Partial Content\r\nContent-Range: bytes 0-{BLOCK - 1}/{2 * BLOCK}" if ranged else "200 OK"
        sock.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {BLOCK if ranged else len(data)}\r\n\r\n".encode())
        ends = time.monotonic() + GIVE_UP_S
        for i in range(len(data)):
            if self._stop.wait(TRICKLE_S) or time.monotonic() > ends:
                return
            self._send_body(sock, data[i:i + 1])

    def _huge(self, sock, ranged, size: int) -> None:
        start, end = (int(ranged.group(1)), int(ranged.group(2)) + 1) if ranged else (0, BLOCK)
        with self.model.open("rb") as f:
            f.seek(start)
            data = f.read(end - start)
        data += bytes(end - start - len(data))  # past the file's end: zeros, as far as the stated size goes
        sock.sendall(f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{end - 1}/{size}\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode())
        self._send_body(sock, data)

    def _llama_server(self, sock, method: str, path: str, body: dict) -> None:
        """llama-server's checks (/props, /v1/models, /tokenize, /health) for another model than the
        tokenizer's; scoring is refused, so nothing is ever scored on it."""
        answers = {
            ("GET", "/props"): {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1,  # nan-scores holds
                                "model_path": f"/models/{self._name}" if self.mode == "wrong-model" else str(self.model),
                                "build_info": "hostile"},  # `model` itself (the same bytes), wrong-model another
            ("GET", "/v1/models"): {"data": [{"id": self._name, "meta": self._facts}]},
            ("GET", "/health"): {"status": "ok"},
        }
        if (method, path) == ("POST", "/tokenize"):
            answer = {"tokens": self._vocab.prefix_ids + self._vocab.tokenize(body.get("content", ""))}
        elif (method, path) == ("POST", "/completion") and self.mode == "nan-scores":
            answer = self._forced(body)
        elif (method, path) == ("POST", "/completion") and self.mode == "empty-steps":
            answer = {"content": "", "completion_probabilities": [], "timings": {"prompt_n": 1, "predicted_n": 0}}
        else:
            answer = answers.get((method, path))
        status = "200 OK" if answer is not None else "500 Internal Server Error"
        data = json.dumps(answer if answer is not None else {"error": {"message": "no scoring here"}}).encode()
        sock.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                     .encode() + data)

    def _forced(self, body: dict) -> dict:
        """llama-server's answer to a token-id grammar: each forced token as its own top-1, -1 nats each, or
        null once `finite` completions have been answered."""
        with self._lock:
            self.completions += 1
            logprob = -1.0 if self.completions <= self.finite else None
        forced = [int(t) for t in re.findall(r"<\[(\d+)\]>", body.get("grammar", ""))]
        return {"content": "", "timings": {"prompt_n": len(body.get("prompt", [])), "predicted_n": len(forced)},
                "completion_probabilities": [{"id": t, "logprob": logprob, "top_logprobs": [{"id": t, "logprob": logprob}]}
                                             for t in forced]}
