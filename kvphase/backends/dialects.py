"""Server dialects: how llama-server and an OpenAI-compatible engine answer and score, and the model check.

Each kind is an `Engine` (`ENGINES`): llama-server's native API, or an OpenAI-compatible
engine that returns prompt logprobs (vLLM's `/v1/completions`). What a server states of the
model it serves (`ServerInfo`, `MODEL_FACTS`) is compared with the model file's (`ModelFacts`).

llama-server gives no prompt logprobs and refuses echo, so teacher forcing is a grammar
of literal token ids (`root ::= <[a1]> <[a2]>`) with `n_probs: 1` and
`post_sampling_probs: false`: each generated entry then holds the raw-logit
log-probability of the forced token and the top-1 (argmax) token. A context is first
evaluated alone on a slot (`cache_prompt: false`, so it is evaluated from position 0
whatever the slot held before); each query then resends the context, which the slot's
prompt cache recognises, so only the query's own tokens are evaluated
(tools/server/server-context.cpp: `get_common_prefix`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

from kvphase.backends.base import Query, Score
from kvphase.backends.transport import Http, Retry
from kvphase.errors import BackendError


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
    weights: Path | None = None  # the file holding its weights here, which a server's are identified against
    no_weights: str = ""  # why there is none (a header-only file, a file cut short, a URL): only metadata is compared

    @classmethod
    def of(cls, model, n_vocab: int) -> "ModelFacts":
        """The facts of a model (every shard of a split one) or a header-only copy of it: a `ModelInfo`
        already opened, or a path (read as a file cut inside its tensor data is)."""
        from kvphase.gguf.header import read_gguf_header
        from kvphase.gguf.header_only import other_shards
        from kvphase.gguf.modelinfo import ModelInfo

        first = model.header if isinstance(model, ModelInfo) else read_gguf_header(model, partial=True)
        tensors = [t for shard in [first, *map(read_gguf_header, other_shards(first))] for t in shard.tensors]
        arch = first.fields.get("general.architecture")
        numbers = {"n_vocab": n_vocab, "n_ctx_train": first.fields.get(f"{arch}.context_length"),
                   "n_embd": first.fields.get(f"{arch}.embedding_length"),
                   "n_params": sum(t.n_elements for t in tensors), "size": sum(t.n_bytes for t in tensors)}
        return cls(first.path.name, {k: v for k, v in numbers.items() if isinstance(v, int)},
                   weights=None if _without_weights(first) else Path(first.path), no_weights=_without_weights(first))


def _without_weights(header) -> str:
    """Why a model's header comes without its weights here ("" when the file holds them)."""
    if not isinstance(header.path, Path):
        return "the model is a URL"
    if header.header_only:
        return f"{header.path.name} is a header-only file"
    return f"{header.path.name} is cut inside its tensor data" if header.needed_size is not None else ""


def other_bytes(served: Path, file: Path) -> bool:
    """Whether the file a server holds (readable here) is another file than `file`, byte for byte."""
    from kvphase.runfolder import file_sha256

    if served.resolve() == file.resolve():
        return False
    return served.stat().st_size != file.stat().st_size or file_sha256(served) != file_sha256(file)


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
    differ = [f"{key} {server.facts[key]:,} where the file has {model.numbers[key]:,}" for key in MODEL_FACTS
              if key in server.facts and key in model.numbers and server.facts[key] != model.numbers[key]]
    if model.file is not None:
        served = Path(server.model)
        if served.is_file():
            if other_bytes(served, model.file):
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
        if not isinstance(steps, list) or len(steps) != len(answer):
            raise BackendError(f"{self.http.url}/completion answered {len(steps) if isinstance(steps, list) else 'no'} "
                               f"token steps where a grammar forced {len(answer)}: not a llama-server scoring answer")
        forced = tuple(int(step["id"]) for step in steps)
        predicted = tuple(int(step["top_logprobs"][0]["id"]) for step in steps)
        if forced != tuple(answer) and forced == predicted:  # greedy tokens of its own: the grammar was ignored
            raise BackendError(f"{self.http.url} generated {list(forced)} where a token-id grammar forced "
                               f"{list(answer)}: it does not support token-id grammars (`<[id]>`); use a newer llama-server")
        if forced != tuple(answer):
            raise BackendError(f"{self.http.url}/completion answered tokens {list(forced)} where a grammar forced "
                               f"{list(answer)}, and not its own top tokens {list(predicted)}: not a scoring answer")
        return Score(correct=predicted == forced, logprob=sum(logprob_of(step["logprob"]) for step in steps),
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
        if _is_llama_server(self.http):
            raise BackendError(f"{self.http.url} is a llama-server (it answers /props), not an OpenAI-compatible "
                               "engine with prompt logprobs: give --engine llama-server")
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
            logprob += logprob_of(entry[int(token)]["logprob"])
            predicted.append(min(entry, key=lambda t: (entry[t]["rank"], t != token)))
        return Score(correct=tuple(predicted) == tuple(answer), logprob=logprob, predicted=tuple(predicted))


ENGINES = {LlamaServer.kind: LlamaServer, OpenAICompatible.kind: OpenAICompatible}


def _is_llama_server(http: Http) -> bool:
    """Whether the server answers llama-server's own /props (vLLM and SGLang do not)."""
    try:
        props = http.get("/props")
    except BackendError:
        return False
    return isinstance(props, dict) and isinstance(props.get("default_generation_settings"), dict)


def logprob_of(value) -> float:
    """A log-probability as an engine wrote it: JSON has no NaN, and llama-server (nlohmann::json) writes one as
    null, which is NaN here; the fleet refuses it (`backends.base.finite_scores`)."""
    return math.nan if value is None else float(value)


def _evaluated(response: dict) -> int:
    timings = response.get("timings") or {}
    return int(timings.get("prompt_n", 0)) + int(timings.get("predicted_n", 0))

