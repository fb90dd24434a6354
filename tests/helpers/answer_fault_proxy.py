"""An HTTP proxy in front of a real llama-server that plants an engine fault of where generation
starts (issue 70): it spoils a scored answer in one class of request and passes every other byte
through untouched, so a test can check that kvphase finds the fault and that the same run through
the plain server does not.

The class of fault is the one users found in engines (vLLM #55927: a DeepSeek-V4 answer wrong only
when the prompt was 3 mod 4 tokens long; llama.cpp #26471 / #26509; jundot/omlx #1888, partial cache
hits that end mid-block). Two modes (`MODES`):

- "answer-residue": a forced answer (a `/completion` answered with `completion_probabilities`)
  whose first token's position, the prompt's length in tokens (context + query), is `residue`
  mod `modulus`;
- "cache-hit-mid-block": a forced answer after a prefix-cache hit that ends mid-block: the server
  reused a prefix of the prompt (its `timings.prompt_n` is less than the prompt's length) whose
  length is not a multiple of `modulus`.

Spoiling an answer lowers every step's forced-token log-probability by `nats` and makes each step's
top token another id, so the answer moves on both what kvphase reads: its log-probability and
whether the model's argmax is the forced token. The server is not touched: what it computed is
exactly what it computes without the proxy, and everything else it answers (/props, /tokenize,
/health, a context evaluated with `n_predict: 0`) reaches the client byte for byte.

    with llama_server(model) as server, AnswerFaultProxy(server.url, residue=3) as proxy:
        ... point kvphase at proxy.url ...
        proxy.spoiled  # the prompt lengths of the answers it spoiled, in order
"""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from tests.helpers.fake_servers import LocalServer, QuietHTTPServer

MODES = {
    "answer-residue": "spoils a forced answer whose first token's position (the prompt's length) is `residue` mod "
                      "`modulus`",
    "cache-hit-mid-block": "spoils a forced answer after a prefix-cache hit whose reused prefix is not a multiple of "
                           "`modulus` tokens",
}
SPOIL_NATS = 3.0  # per answer token: far beyond conform's 0.01-nat tolerance, as a real fault of this class moves
UPSTREAM_TIMEOUT_S = 300.0  # as kvphase's own request timeout: a long prompt on a busy machine takes a while
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class AnswerFaultProxy(LocalServer):
    """A proxy on a free port of 127.0.0.1 in front of `upstream` (a llama-server's URL); use as a
    context manager. `spoiled` lists the prompt length of every answer it spoiled, `passed` the
    prompt length of every forced answer it let through."""

    def __init__(self, upstream: str, mode: str = "answer-residue", residue: int = 3, modulus: int = 4,
                 nats: float = SPOIL_NATS):
        if mode not in MODES:
            raise ValueError(f"no answer-fault mode {mode!r}; expected one of {', '.join(MODES)}")
        if not 0 <= residue < modulus:
            raise ValueError(f"residue {residue} is not a residue mod {modulus}")
        self.upstream = urlsplit(upstream)
        self.mode, self.residue, self.modulus, self.nats = mode, residue, modulus, nats
        self.spoiled: list[int] = []
        self.passed: list[int] = []
        self._lock = threading.Lock()
        self._listen(QuietHTTPServer(("127.0.0.1", 0), self._handler()))

    # ------------------------------------------------------------------ the fault

    def spoils(self, prompt_length: int, evaluated: int | None) -> bool:
        """Whether a forced answer after a prompt of `prompt_length` tokens, of which the server
        evaluated `evaluated` (None: it did not say), is spoiled in this mode."""
        if self.mode == "answer-residue":
            return prompt_length % self.modulus == self.residue
        reused = prompt_length - evaluated if evaluated is not None else 0
        return reused > 0 and reused % self.modulus != 0

    def answer(self, request: dict, response: dict) -> dict:
        """The response the client sees for one `/completion` request."""
        steps = response.get("completion_probabilities")
        if not isinstance(steps, list) or not steps:
            return response  # no scored answer in it (a context evaluated on its own, an error)
        length = self._prompt_length(request.get("prompt"))
        if length is None:
            return response
        timings = response.get("timings") or {}
        evaluated = int(timings["prompt_n"]) if "prompt_n" in timings else None
        spoil = self.spoils(length, evaluated)
        with self._lock:
            (self.spoiled if spoil else self.passed).append(length)
        return {**response, "completion_probabilities": [self._spoiled(s) for s in steps]} if spoil else response

    def _spoiled(self, step: dict) -> dict:
        forced = int(step["id"])
        other = forced - 1 if forced > 0 else forced + 1
        top = {**(step.get("top_logprobs") or [{}])[0], "id": other, "logprob": float(step["logprob"])}
        return {**step, "logprob": float(step["logprob"]) - self.nats, "top_logprobs": [top]}

    def _prompt_length(self, prompt) -> int | None:
        """The prompt's length in tokens: a list of ids as kvphase sends, or a string the server tokenizes."""
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        if isinstance(prompt, str):
            status, body, _ = self._forward("POST", "/tokenize", json.dumps(
                {"content": prompt, "add_special": True}).encode(), {"Content-Type": "application/json"})
            return len(json.loads(body)["tokens"]) if status == 200 else None
        return None

    # ------------------------------------------------------------------ the plumbing

    def _forward(self, method: str, path: str, body: bytes | None, headers: dict) -> tuple[int, bytes, list]:
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port,
                                                timeout=UPSTREAM_TIMEOUT_S)
        try:
            connection.request(method, path, body=body, headers=headers)
            reply = connection.getresponse()
            return reply.status, reply.read(), [(k, v) for k, v in reply.getheaders()
                                                if k.lower() not in HOP_HEADERS]
        finally:
            connection.close()

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as llama-server does

            def do_GET(self):
                self._relay(None)

            def do_POST(self):
                self._relay(self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def _relay(self, body: bytes | None):
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS | {"host"}}
                try:
                    status, data, reply_headers = proxy._forward(self.command, self.path, body, headers)
                except OSError:
                    self.send_error(502, "upstream llama-server did not answer")
                    return
                if self.path.split("?")[0] == "/completion" and status == 200 and body:
                    data = self._maybe_spoiled(body, data)
                self.send_response(status)
                for key, value in reply_headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            @staticmethod
            def _maybe_spoiled(body: bytes, data: bytes) -> bytes:
                try:
                    request, response = json.loads(body), json.loads(data)
                except ValueError:
                    return data  # not JSON (a streamed answer): passed through
                if not isinstance(request, dict) or not isinstance(response, dict):
                    return data
                answered = proxy.answer(request, response)
                return data if answered is response else json.dumps(answered).encode()

            def log_message(self, *args):
                pass

        return Handler
