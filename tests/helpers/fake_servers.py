"""Small HTTP servers that speak llama-server's, vLLM's and SGLang's scoring APIs over a made-up
model, for fast tests of the server backend (the real llama-server is tested in
tests/backends/test_server_real.py, a real vLLM in tests/backends/test_vllm_real.py).

SGLang's shapes follow its source (sgl-project/sglang): `GenerateReqInput` in
python/sglang/srt/managers/io_struct.py (text or input_ids, sampling_params, return_logprob,
logprob_start_len, top_logprobs_num), `meta_info`'s input_token_logprobs / input_top_logprobs as
(logprob, token id, text) triples built by `detokenize_logprob_tokens` and
`detokenize_top_logprobs_tokens` in python/sglang/srt/managers/tokenizer_manager.py (the first
prompt position's logprob is None: nothing predicts it), prompt_tokens and cached_tokens (its radix
cache), and `/get_model_info` ({"model_path", "is_generation", ...}) and `/get_server_info` (the
server args, context_length among them, and "version") in python/sglang/srt/entrypoints/http_server.py;
docs/references/sampling_params.md documents the request.

The made-up model: one token per UTF-8 byte (plus BOS = 256), and logits that are a
fixed function of the previous token and the position (it predicts the next byte value), so expected scores can be
computed independently with `score_from_logits`.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Sequence

import numpy as np

BOS, N_VOCAB = 256, 257


class ByteVocab:
    """The made-up model's tokenizer, on the client side."""

    n_vocab = N_VOCAB
    n_ctx_train = 8192

    def __init__(self, shift: int = 0):
        self.shift = shift  # a different tokenizer: every byte maps to another id

    @property
    def prefix_ids(self) -> list[int]:
        return [BOS]

    def tokenize(self, text: str) -> list[int]:
        return [(b + self.shift) % 256 for b in text.encode("utf-8")]

    def detokenize(self, ids: Sequence[int]) -> str:
        return bytes((i - self.shift) % 256 for i in ids if i != BOS).decode("utf-8", errors="replace")


def fake_logits(previous: int, position: int) -> np.ndarray:
    """(N_VOCAB,) logits after `previous` at `position`: the next byte value is the
    argmax ("=" predicts ">"), on top of position-dependent noise."""
    j = np.arange(N_VOCAB)  # (N_VOCAB,)
    return np.cos(0.37 * j * (previous + 1) + 0.11 * position) + 5.0 * (j == (previous + 1) % 256)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


class QuietHTTPServer(ThreadingHTTPServer):
    """Says nothing when a client hangs up mid-answer (timeouts do, on purpose): a handler
    thread's traceback would land in whatever output a later test captures."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LocalServer:
    """A socketserver on 127.0.0.1 (`_listen`), served from a thread of its own inside a `with` block."""

    def _listen(self, server) -> None:
        self._server = server
        server.daemon_threads = True
        self.url = f"http://127.0.0.1:{server.server_address[1]}"

    def __enter__(self):
        # a short poll: shutdown() waits up to one poll interval, 0.5 s by default, in every test
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


class FakeServer:
    """A threaded HTTP server on 127.0.0.1 with a free port; use as a context manager.

    engine: "llama-server", "openai" or "sglang". grammar: False makes llama-server ignore
    token-id grammars (an old build). lacks: what this openai engine does not give ("prompt_logprobs",
    "token_ids": it answers `return_tokens_as_token_ids` with token texts). vocab_shift: tokenize differently from ByteVocab().
    down_after: stop answering completions after this many (a server that dies).
    delay_s: time each completion takes, so that concurrent workers overlap.
    hostile: after `down_after` completions (or from the first), each next completion is
    answered in one of HOSTILE's ways instead; "stalled" stops answering anything, /health
    included, as a process stopped with SIGSTOP does (`stall()` does it at once).
    """

    HOSTILE = {"silent": "accepts the request and never answers",
               "trickle": "answers one byte every 50 ms",
               "slow-headers": "sends its status and header lines one byte every 50 ms",
               "garbage": "answers 200 with bytes that are not JSON",
               "empty": "answers 200 with a completion of no token steps",
               "cut": "sends half the answer it announced, then closes",
               "stalled": "answers no request at all from then on, /health included (SIGSTOP)"}

    def __init__(self, engine: str = "llama-server", slots: int = 2, n_ctx: int = 4096, grammar: bool = True,
                 vocab_shift: int = 0, down_after: int | None = None, delay_s: float = 0.0, hostile: str | None = None,
                 meta: dict | None = None, lacks: Sequence[str] = (), model_dir: str = "fake-bytes"):
        self.engine, self.slots, self.n_ctx, self.grammar = engine, slots, n_ctx, grammar
        self.lacks, self.model_dir = set(lacks), model_dir  # model_dir: the folder vLLM or SGLang names
        self.prefix_cache: list[list[int]] = []  # the prompts an openai or sglang engine has cached
        self.meta = meta or {}  # llama-server: what /v1/models states of the model besides its vocabulary
        self.vocab = ByteVocab(vocab_shift)
        self.down_after, self.delay_s, self.hostile = down_after, delay_s, hostile
        self._stopped = threading.Event()
        self._stalled = threading.Event()  # every request waits for the end, as under SIGSTOP
        self.health_checks = 0
        self.completions = 0
        self.slot_prompts: dict[int, list[int]] = {}  # what each slot last evaluated
        self.evaluated_per_request: list[int] = []
        self._lock = threading.Lock()
        self._httpd = QuietHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> "FakeServer":
        # a short poll: shutdown() waits up to one poll interval, 0.5 s by default, in every test
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stall(self) -> None:
        """From now on answer nothing, as a process stopped with SIGSTOP."""
        self._stalled.set()

    def stop(self) -> None:
        self._stopped.set()  # releases the handlers a silent server holds
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- the APIs ----------------------------------------------------------------------

    def get(self, path: str) -> dict:
        if path == "/health":
            with self._lock:
                self.health_checks += 1
            return {"status": "ok"}
        if path == "/v1/models":
            model = {"id": self.model_dir, "root": self.model_dir, "max_model_len": self.n_ctx}
            if self.engine == "llama-server":
                model["meta"] = {"n_vocab": N_VOCAB, "n_ctx": self.n_ctx, "n_ctx_train": 8192, **self.meta}
            return {"data": [model]}
        if path == "/props" and self.engine == "llama-server":
            return {"default_generation_settings": {"n_ctx": self.n_ctx}, "total_slots": self.slots,
                    "model_path": "/models/fake-bytes.gguf", "build_info": "b0-fake"}
        if path == "/version" and self.engine == "openai":
            return {"version": "0.0-fake"}
        if path == "/get_model_info" and self.engine == "sglang":
            return {"model_path": self.model_dir, "tokenizer_path": self.model_dir, "is_generation": True}
        if path == "/get_server_info" and self.engine == "sglang":
            return {"model_path": self.model_dir, "context_length": self.n_ctx, "version": "0.0-fake",
                    "disable_radix_cache": False}
        raise KeyError(path)

    def post(self, path: str, body: dict) -> dict:
        if path == "/tokenize" and self.engine != "sglang":
            text = body["content"] if self.engine == "llama-server" else body["prompt"]
            return {"tokens": [BOS] + self.vocab.tokenize(text)}
        if path == "/generate" and self.engine == "sglang" and "text" in body:  # tokenizing: no completion
            return self._sglang_generate([BOS] + self.vocab.tokenize(body["text"]), body)
        with self._lock:
            self.completions += 1
            if self.down_after is not None and self.completions > self.down_after or self.hostile and not self.down_after:
                if self.hostile == "stalled":
                    self._stalled.set()
                raise ConnectionAbortedError(self.hostile)
        time.sleep(self.delay_s)
        if path == "/completion" and self.engine == "llama-server":
            return self._completion(body)
        if path == "/v1/completions" and self.engine == "openai":
            if "prompt_logprobs" in body:
                return self._openai_completion(body)
            return self._openai_generation(body)
        if path == "/generate" and self.engine == "sglang":
            return self._sglang_generate(list(body["input_ids"]), body)
        raise KeyError(path)

    def _cached(self, prompt: list[int]) -> int:
        """The longest prefix of `prompt` a cached prompt shares (vLLM counts whole blocks; a token
        granularity keeps the count simple), and `prompt` cached from now on."""
        with self._lock:
            common = max((next((i for i, (a, b) in enumerate(zip(seen, prompt)) if a != b), min(len(seen), len(prompt)))
                          for seen in self.prefix_cache), default=0)
            self.prefix_cache.append(list(prompt))
        return common

    def _openai_generation(self, body: dict) -> dict:
        """Greedy generation of max_tokens tokens (vLLM's completions without prompt logprobs): the
        sampled tokens' logprobs and the top ones, tokens as "token_id:N" with return_tokens_as_token_ids."""
        prompt = list(body["prompt"])
        cached = self._cached(prompt)
        self.evaluated_per_request.append(len(prompt) - cached)
        tokens, names, logprobs, tops = list(prompt), [], [], []
        for _ in range(int(body["max_tokens"])):
            row = log_softmax(fake_logits(tokens[-1], len(tokens) - 1))
            top = int(np.argmax(row))
            ids = body.get("return_tokens_as_token_ids") and "token_ids" not in self.lacks
            names.append(f"token_id:{top}" if ids else chr(top % 256))
            logprobs.append(float(row[top]))
            tops.append({names[-1]: float(row[top])})
            tokens.append(top)
        choice = {"text": "", "logprobs": {"tokens": names, "token_logprobs": logprobs, "top_logprobs": tops,
                                           "text_offset": list(range(len(names)))} if body.get("logprobs") else None}
        return {"choices": [choice], "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(names),
                                               "prompt_tokens_details": {"cached_tokens": cached}}}

    def _sglang_generate(self, prompt: list[int], body: dict) -> dict:
        """SGLang's /generate answer for one prompt: input logprobs from logprob_start_len on, with
        the top `top_logprobs_num` at each position (None at position 0)."""
        cached = min(self._cached(prompt), int(body.get("logprob_start_len") or 0))  # logprobs are not cached
        start = max(int(body.get("logprob_start_len", -1)), 0)
        steps, tops = [], []
        for position in range(start, len(prompt)):
            if position == 0:
                steps.append([None, prompt[0], None])
                tops.append(None)
                continue
            row = log_softmax(fake_logits(prompt[position - 1], position - 1))
            steps.append([float(row[prompt[position]]), prompt[position], None])
            order = np.argsort(-row, kind="stable")[: int(body.get("top_logprobs_num") or 0)]
            tops.append([[float(row[t]), int(t), None] for t in order])
        meta = {"id": "0", "prompt_tokens": len(prompt), "completion_tokens": 0, "cached_tokens": cached,
                "finish_reason": {"type": "length", "length": 0}}
        if body.get("return_logprob"):
            meta.update(input_token_logprobs=steps, input_top_logprobs=tops, output_token_logprobs=[],
                        output_top_logprobs=[])
        self.evaluated_per_request.append(len(prompt) - cached)
        return {"text": "", "meta_info": meta}

    def _completion(self, body: dict) -> dict:
        prompt, slot = list(body["prompt"]), body.get("id_slot", 0)
        cached = self.slot_prompts.get(slot, []) if body.get("cache_prompt", True) else []
        common = next((i for i, (a, b) in enumerate(zip(cached, prompt)) if a != b), min(len(cached), len(prompt)))
        self.evaluated_per_request.append(len(prompt) - common)
        forced = [int(t) for t in re.findall(r"<\[(\d+)\]>", body.get("grammar", ""))]
        tokens, steps = list(prompt), []
        for i in range(body.get("n_predict", 0)):
            logprobs = log_softmax(fake_logits(tokens[-1], len(tokens) - 1))
            top = int(np.argmax(logprobs))
            chosen = forced[i] if self.grammar and i < len(forced) else top
            steps.append({"id": chosen, "logprob": float(logprobs[chosen]),
                          "top_logprobs": [{"id": top, "logprob": float(logprobs[top])}]})
            tokens.append(chosen)
        self.slot_prompts[slot] = tokens
        return {"content": "", "completion_probabilities": steps,
                "timings": {"prompt_n": len(prompt) - common, "predicted_n": len(steps)}}

    def _openai_completion(self, body: dict) -> dict:
        prompt = list(body["prompt"])
        if "prompt_logprobs" in self.lacks:  # an OpenAI-compatible engine that ignores the field
            return {"choices": [{"text": ""}], "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1}}
        entries: list = [None]
        for position in range(1, len(prompt)):
            logprobs = log_softmax(fake_logits(prompt[position - 1], position - 1))
            order = np.argsort(-logprobs, kind="stable")  # (N_VOCAB,)
            rank = {int(t): r + 1 for r, t in enumerate(order[:1])}
            token = prompt[position]
            rank.setdefault(token, int(np.sum(logprobs > logprobs[token])) + 1)
            entries.append({str(t): {"logprob": float(logprobs[t]), "rank": r, "decoded_token": "?"}
                            for t, r in rank.items()})
        return {"choices": [{"text": "", "prompt_logprobs": entries}]}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as both engines do

            def do_GET(self):
                if not self._stalled():
                    self._answer(lambda: server.get(self.path))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not self._stalled():
                    self._answer(lambda: server.post(self.path, body))

            def _stalled(self) -> bool:
                """Under `stall()`, hold the request unanswered until the server stops."""
                if not server._stalled.is_set():
                    return False
                server._stopped.wait()
                self.close_connection = True
                return True

            def _answer(self, make):
                try:
                    status, out = 200, make()
                except KeyError:
                    status, out = 404, {"error": {"code": 404, "message": "File Not Found"}}
                except ConnectionAbortedError as exc:
                    if exc.args and exc.args[0]:
                        self._misbehave(exc.args[0])
                    self.close_connection = True
                    self.connection.close()
                    return
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _misbehave(self, how: str) -> None:
                if how in ("silent", "stalled"):
                    server._stopped.wait()
                    return
                data = b"<html>502 upstream error</html>" if how == "garbage" else json.dumps(
                    {"content": "", "completion_probabilities": []}).encode()
                if how == "slow-headers":
                    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                    for i, byte in enumerate(head.encode()):
                        if server._stopped.wait(0.05):
                            return
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if how == "cut":
                    self.wfile.write(data[: len(data) // 2])
                elif how == "trickle":
                    for i in range(len(data)):
                        if server._stopped.wait(0.05):
                            return
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                else:
                    self.wfile.write(data)
                    self.wfile.flush()

            def log_message(self, *args):
                pass

        return Handler
