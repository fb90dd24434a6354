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

Two routes score a query (`SCORING_ROUTES`, `--scoring`): "forced", teacher forcing, which
gives each answer token's log-probability given the answer tokens before it, and "generate",
greedy generation of the answer's length after the context, so that an engine's prefix cache
serves the context (vLLM skips its prefix cache for any request asking for prompt logprobs);
its flags are the forced route's (greedy decoding follows the answer exactly as long as every
argmax is the answer's token), its log-probability is known only when the generation is the
answer (missing otherwise: NaN, and the sweep's log-probability test is then unavailable).
Each engine offers the routes it can run (`routes`, the first its default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

from kvphase.backends.base import Query, Score
from kvphase.backends.transport import Http, Retry
from kvphase.errors import BackendError, PlanError
from kvphase.gguf.keys import Keys


@dataclass(frozen=True)
class ServerInfo:
    """What a server says about itself and the model it serves."""

    url: str
    engine: str  # "llama-server", "openai" or "sglang"
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
        arch = first.fields.get(Keys.General.ARCHITECTURE)
        numbers = {"n_vocab": n_vocab, "n_ctx_train": first.fields.get(Keys.LLM.CONTEXT_LENGTH.format(arch=arch)),
                   "n_embd": first.fields.get(Keys.LLM.EMBEDDING_LENGTH.format(arch=arch)),
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


SCORING_ROUTES = ("forced", "generate")  # teacher forcing; greedy generation behind a prefix cache


def route_for(engine: type, scoring: str | None) -> str:
    """The route an engine scores by: `scoring`, or the engine's default (None); PlanError in one
    line naming the engine, the route and the one that works when the engine lacks it."""
    if scoring is None:
        return engine.routes[0]
    if scoring not in SCORING_ROUTES:
        raise PlanError(f"--scoring must be one of {', '.join(SCORING_ROUTES)}, got {scoring!r}")
    if scoring not in engine.routes:
        raise PlanError(f"--engine {engine.kind} has no {scoring!r} scoring route; use --scoring "
                        f"{' or '.join(engine.routes)} with it")
    return scoring


class LlamaServer:
    """llama-server's native API (tools/server/README.md in llama.cpp). Its forced route is
    served by its slot's prompt cache already, so it has no other."""

    kind = "llama-server"
    routes = ("forced",)

    def __init__(self, url: str, retry: Retry = Retry(), scoring: str | None = None):
        self.http = Http(url, retry)
        self.scoring = route_for(type(self), scoring)

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
    """An OpenAI-style engine in vLLM's format (`/v1/completions` with token ids as the prompt).

    "forced" (the default, exact): `prompt_logprobs: 1` returns, for every prompt position,
    {token id: {logprob, rank}} for the actual token and the top-1 token. One request per query
    holds context, query and answer; vLLM skips its prefix cache for requests that ask for prompt
    logprobs, so each evaluates the whole context.

    "generate": the context is sent once alone (so the engine caches it), then each query is
    context plus question, generating the answer's length greedily with `logprobs: 1` and its
    tokens as ids (vLLM's `return_tokens_as_token_ids`); the prefix cache serves the context,
    and `usage.prompt_tokens_details.cached_tokens` (vLLM with --enable-prompt-tokens-details)
    says how much of it, else the whole prompt is counted as evaluated.
    """

    kind = "openai"
    routes = ("forced", "generate")

    def __init__(self, url: str, retry: Retry = Retry(), scoring: str | None = None):
        self.http = Http(url, retry)
        self.scoring = route_for(type(self), scoring)
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
        facts = hf_config_facts(str(model.get("root") or self._model))
        return ServerInfo(url=self.http.url, engine=self.kind, model=self._model, n_vocab=facts.get("n_vocab"),
                          n_ctx=int(model.get("max_model_len") or 0), slots=1, build_info=f"version {version}",
                          facts=facts)

    def tokenize(self, text: str) -> list[int]:
        return self.http.post("/tokenize", {"model": self._model, "prompt": text, "add_special_tokens": True})["tokens"]

    def score(self, slot: int, context: Sequence[int], queries: Sequence[Query]) -> tuple[list[Score], int]:
        if self.scoring == "generate":
            return self._score_generated(context, queries)
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
            raise BackendError(f"{self.http.url} returned no prompt logprobs, which --engine openai --scoring forced "
                               "needs (vLLM-style `prompt_logprobs`); --scoring generate needs only top logprobs")
        logprob, predicted = 0.0, []
        for position, token in enumerate(answer, start=first):
            entry = {int(k): v for k, v in steps[position].items()}
            logprob += logprob_of(entry[int(token)]["logprob"])
            predicted.append(min(entry, key=lambda t: (entry[t]["rank"], t != token)))
        return Score(correct=tuple(predicted) == tuple(answer), logprob=logprob, predicted=tuple(predicted))

    def _score_generated(self, context: Sequence[int], queries: Sequence[Query]) -> tuple[list[Score], int]:
        primed = self._complete(list(context), 1, logprobs=False)
        evaluated = _uncached(primed)
        scores = []
        for query in queries:
            out = self._complete(list(context) + list(query.prompt), len(query.answer), logprobs=True)
            evaluated += _uncached(out)
            scores.append(self._generated(out["choices"][0], query.answer))
        return scores, evaluated

    def _complete(self, prompt: list[int], tokens: int, logprobs: bool) -> dict:
        """Greedy generation of exactly `tokens` tokens (an end-of-sequence token does not stop it)."""
        body = {"model": self._model, "prompt": prompt, "max_tokens": tokens, "min_tokens": tokens,
                "ignore_eos": True, "temperature": 0.0}
        if logprobs:
            body.update(logprobs=1, return_tokens_as_token_ids=True)
        return self.http.post("/v1/completions", body)

    def _generated(self, choice: dict, answer: Sequence[int]) -> Score:
        """The generated tokens against the answer: correct when they are it; the answer's
        log-probability when they are (the generated tokens' own), else missing (NaN)."""
        steps = choice.get("logprobs") or {}
        tokens, logprobs = steps.get("tokens"), steps.get("token_logprobs")
        if not tokens or not logprobs or len(tokens) != len(answer) or None in logprobs:
            raise BackendError(f"{self.http.url} returned no logprobs of {len(answer)} generated tokens, which "
                               "--engine openai --scoring generate needs (`logprobs` with vLLM's "
                               "`return_tokens_as_token_ids`); --scoring forced needs prompt logprobs instead")
        generated = tuple(_token_id(token, self.http.url) for token in tokens)
        correct = generated == tuple(answer)
        return Score(correct=correct, logprob=float(sum(logprobs)) if correct else math.nan, predicted=generated)


def _token_id(token: str, url: str) -> int:
    """vLLM's `return_tokens_as_token_ids` spelling of a token, "token_id:123"."""
    name, _, number = str(token).partition(":")
    if name != "token_id" or not number.isdigit():
        raise BackendError(f"{url} named a generated token {str(token)[:40]!r}, not 'token_id:N': it ignores "
                           "`return_tokens_as_token_ids`, which --scoring generate needs; use --scoring forced")
    return int(number)


def _uncached(response: dict) -> int:
    """Tokens an OpenAI-style answer says it evaluated: its prompt less what its prefix cache held, and
    what it generated."""
    usage = response.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return int(usage.get("prompt_tokens", 0)) - int(cached) + int(usage.get("completion_tokens", 0))


class SGLang:
    """SGLang's native API (python/sglang/srt/entrypoints/http_server.py, GenerateReqInput in
    python/sglang/srt/managers/io_struct.py): `/generate` with `input_ids`, `return_logprob`,
    `logprob_start_len` at the answer and `top_logprobs_num: 1` teacher-forces the answer, and its
    radix cache serves the context each query resends (its OpenAI endpoint ignores echo, so it
    gives no prompt logprobs). `meta_info.input_token_logprobs` holds (logprob, token id, text) for
    each prompt position from `logprob_start_len` on, `input_top_logprobs` the top ones there;
    `prompt_tokens` and `cached_tokens` say what it evaluated. `/get_model_info` and
    `/get_server_info` name the model and its context length."""

    kind = "sglang"
    routes = ("forced",)

    def __init__(self, url: str, retry: Retry = Retry(), scoring: str | None = None):
        self.http = Http(url, retry)
        self.scoring = route_for(type(self), scoring)

    def info(self) -> ServerInfo:
        model = self.http.get("/get_model_info")
        server = self.http.get("/get_server_info")
        path = str(model["model_path"])
        facts = hf_config_facts(path)
        return ServerInfo(url=self.http.url, engine=self.kind, model=path, n_vocab=facts.get("n_vocab"),
                          n_ctx=int(server.get("context_length") or 0), slots=1,
                          build_info=f"version {server.get('version', 'unknown')}", facts=facts)

    def tokenize(self, text: str) -> list[int]:
        """The ids SGLang's tokenizer gives `text`, read back from the prompt's logprobs."""
        out = self._generate({"text": text}, 0)
        return [int(entry[1]) for entry in out["meta_info"]["input_token_logprobs"]]

    def score(self, slot: int, context: Sequence[int], queries: Sequence[Query]) -> tuple[list[Score], int]:
        scores, evaluated = [], 0
        for query in queries:
            prompt = list(context) + list(query.prompt)
            out = self._generate({"input_ids": prompt + list(query.answer)}, len(prompt))
            meta = out["meta_info"]
            evaluated += int(meta.get("prompt_tokens", 0)) - int(meta.get("cached_tokens") or 0)
            scores.append(self._score(meta, query.answer))
        return scores, evaluated

    def _generate(self, prompt: dict, start: int) -> dict:
        out = self.http.post("/generate", {**prompt, "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
                                           "return_logprob": True, "logprob_start_len": start,
                                           "top_logprobs_num": 1})
        return out[0] if isinstance(out, list) else out

    def _score(self, meta: dict, answer: Sequence[int]) -> Score:
        steps, tops = meta.get("input_token_logprobs") or [], meta.get("input_top_logprobs") or []
        steps, tops = steps[len(steps) - len(answer):], tops[len(tops) - len(answer):]
        if len(steps) < len(answer) or len(tops) < len(answer) or any(not top for top in tops) or \
                [int(step[1]) for step in steps] != list(answer):
            raise BackendError(f"{self.http.url} returned no input logprobs of the answer, which --engine sglang "
                               "needs (`return_logprob` with `logprob_start_len` and `top_logprobs_num`)")
        predicted = tuple(int(top[0][1]) for top in tops)
        return Score(correct=predicted == tuple(answer), logprob=float(sum(float(step[0]) for step in steps)),
                     predicted=predicted)


def hf_config_facts(model_dir: str) -> dict:
    """MODEL_FACTS an HF-format model folder's config.json states, when the folder a server names is
    readable here (vLLM's and SGLang's models are such folders); {} otherwise."""
    import json

    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    named = {"n_vocab": "vocab_size", "n_ctx_train": "max_position_embeddings", "n_embd": "hidden_size"}
    return {fact: config[key] for fact, key in named.items()
            if isinstance(config.get(key), int) and not isinstance(config.get(key), bool)}


ENGINES = {engine.kind: engine for engine in (LlamaServer, OpenAICompatible, SGLang)}


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

