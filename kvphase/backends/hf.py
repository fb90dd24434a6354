"""Scoring through transformers' own modeling code (the `hf` extra: torch and transformers).

The model is an HF checkpoint folder, loaded with `AutoModelForCausalLM.from_pretrained`, or a GGUF
file, which transformers dequantizes into a float32 model of its own architecture
(`from_pretrained(folder, gguf_file=...)`); the tokenizer is the one the plan was laid out with: the
checkpoint's tokenizer.json, or llama.cpp's vocabulary of the GGUF file (`engines.llamacpp.Vocab`).
The device is torch's choice (a CUDA GPU where torch has one, else the CPU), stated in the manifest.

Each context is evaluated once into the model's cache. A query then runs after it and the cache is
rolled back: cropped back to the context where every layer's cache is transformers' plain
`DynamicLayer` (llama: rolling back costs nothing), else each query runs on a deep copy of the
context's cache (a compressor's cache, with its pooled state: one cache copy per query). This module
is imported only by the backend's factory, so nothing else of kvphase loads torch.
"""

from __future__ import annotations

import copy
import inspect
from typing import Iterator, Sequence

import numpy as np

from kvphase.backends.base import Query, Score, cut_at, log_softmax_rows, score_from_logits
from kvphase.engines.llamacpp import Vocab
from kvphase.errors import BackendError, ModelFileError, PlanError
from kvphase.gguf.modelinfo import ModelInfo

HF_EXTRA = "pip install 'kvphase[hf]' (torch and transformers)"
CROP, COPY = "crop", "copy"  # how the context's cache is rolled back after each query (`query_scoring`)


def load_transformers_model(info: ModelInfo):
    """(model, device) in float32 and eval mode: a checkpoint folder as it is, a GGUF file dequantized;
    ModelFileError naming what transformers refused (an architecture it lacks, a damaged file)."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        raise BackendError(f"--backend transformers needs the hf extra: {HF_EXTRA}") from None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if info.header is None:
        check_weights_fit(info)
    where = (dict(pretrained_model_name_or_path=str(info.path)) if info.header is None else
             dict(pretrained_model_name_or_path=str(info.path.parent), gguf_file=info.path.name))
    try:
        model = causal_lm_class(info).from_pretrained(**where, dtype=torch.float32)
    except (ValueError, KeyError, OSError, RuntimeError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelFileError(f"transformers cannot load {info.path}: {first[:160]}") from None
    return model.to(device).eval(), device


def causal_lm_class(info: ModelInfo):
    """transformers' Auto class for the checkpoint's language model: AutoModelForCausalLM, or the image-text
    class where that is the only head transformers registers (glm5_next: Glm5NextForConditionalGeneration)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if info.architecture == "glm5-next" else AutoModelForCausalLM


def check_weights_fit(info: ModelInfo) -> None:
    """ModelFileError when a checkpoint's safetensors hold far fewer parameters than its config.json's
    model has (counted on torch's meta device, which allocates nothing): transformers would fill the
    rest with random values and sweep them, or build a model many times larger than the folder (a
    config that leaves sizes at transformers' defaults, a released model's)."""
    import torch
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(info.path))
        with torch.device("meta"):
            needed = sum(p.numel() for p in causal_lm_class(info).from_config(config).parameters())
    except (ValueError, KeyError, OSError, RuntimeError, TypeError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelFileError(f"transformers cannot build the model {info.path}/config.json describes: {first[:160]}") from None
    if info.n_params < needed * MIN_WEIGHTS_SHARE:
        raise ModelFileError(f"{info.path}: its .safetensors hold {info.n_params:,} parameters, and the model its "
                             f"config.json describes has {needed:,}: the weights are not this model's")


MIN_WEIGHTS_SHARE = 0.25  # a checkpoint packed 4 bits to a byte still counts a quarter of its parameters' elements


class TransformersBackend:
    """A model in transformers, scored teacher-forced as every backend is (`backends.base.Backend`)."""

    def __init__(self, info: ModelInfo, n_threads: int | None = None):
        import torch

        if n_threads:
            torch.set_num_threads(n_threads)
        self._torch = torch
        self.info = info
        self.model, self.device = load_transformers_model(info)
        # transformers 5.2x names the cache argument `cache` (`past_key_values` is deprecated); earlier 5.x: the latter
        self._cache_argument = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self._vocab = Vocab.load(info)
        self._context: tuple[int, ...] = ()
        self._cache = None
        self.tokens_evaluated = 0
        self.n_threads = torch.get_num_threads()

    # -- tokenizer -------------------------------------------------------------------

    @property
    def n_ctx_train(self) -> int:
        return self._vocab.n_ctx_train

    @property
    def prefix_ids(self) -> list[int]:
        return self._vocab.prefix_ids

    def tokenize(self, text: str) -> list[int]:
        return self._vocab.tokenize(text)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._vocab.detokenize(ids)

    # -- scoring ---------------------------------------------------------------------

    def score(self, context: Sequence[int], queries: Sequence[Query]) -> list[Score]:
        return [score_from_logits(logits, query.answer)
                for logits, query in zip(self._answer_logits(context, queries), queries)]

    def answer_logprobs(self, context: Sequence[int], queries: Sequence[Query],
                        cuts: Sequence[int] = ()) -> list[np.ndarray]:
        return [log_softmax_rows(logits) for logits in self._answer_logits(context, queries, cuts)]

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Every row's next-token logits for one prompt from position 0: (n_tokens, n_vocab)."""
        self._context, self._cache = (), None
        logits, _ = self._forward(tuple(int(t) for t in tokens), None)
        return logits

    def _answer_logits(self, context: Sequence[int], queries: Sequence[Query],
                       cuts: Sequence[int] = ()) -> Iterator[np.ndarray]:
        """Each query's logit rows that predict its answer tokens, (n_answer, n_vocab), one at a time."""
        if any(not q.prompt or not q.answer for q in queries):
            raise PlanError("every query needs a non-empty prompt and answer")
        context = tuple(int(t) for t in context)
        if context != self._context or self._cache is None:
            self._cache = None
            if context:  # no context, no cache: each query starts its own (deepseek_v4 cannot run 0 tokens)
                _, self._cache = self._forward(context, None, rows=())
            self._context = context
        for query in queries:
            tokens = tuple(query.prompt) + tuple(query.answer[:-1])
            first_scored = len(query.prompt) - 1
            cache = self._cache if self.query_scoring == CROP else copy.deepcopy(self._cache)
            try:
                parts = []
                for part in cut_at(len(tokens), cuts):
                    rows = [i - part.start for i in part if i >= first_scored]
                    logits, cache = self._forward(tokens[part.start:part.stop], cache, rows)
                    parts.append(logits)
                yield np.concatenate(parts)  # (n_answer, n_vocab)
            finally:
                if self.query_scoring == CROP:
                    self._roll_back(len(context))

    def _roll_back(self, n_tokens: int) -> None:
        """Cut every layer's keys and values back to the first `n_tokens` (a DynamicLayer holds
        (batch, heads, tokens, head_dim) tensors and nothing else; `Cache.crop`'s argument changed
        meaning within transformers 5, so the slice is made here)."""
        for layer in self._cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys[..., :n_tokens, :], layer.values[..., :n_tokens, :]

    @property
    def query_scoring(self) -> str:
        """CROP where every layer's cache is a plain DynamicLayer (cropping it is exact), else COPY."""
        layers = getattr(self._cache, "layers", None)
        plain = (layers is not None and all(type(layer).__name__ == "DynamicLayer" for layer in layers))
        return CROP if plain else COPY

    def _forward(self, tokens: tuple[int, ...], cache, rows=None):
        """(logit rows asked for as float32 numpy, (len(rows), n_vocab); the cache after the tokens).
        `rows` None: every row; () none."""
        torch = self._torch
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        try:
            with torch.inference_mode():
                out = self.model(input_ids=ids, use_cache=True, **{self._cache_argument: cache})
        except (MemoryError, torch.OutOfMemoryError) as exc:
            raise BackendError(f"transformers ran out of memory on {len(tokens)} tokens") from exc
        self.tokens_evaluated += len(tokens)
        logits = out.logits[0]  # (n_tokens, n_vocab)
        if rows is not None:
            logits = logits[list(rows)]
        cache = getattr(out, "cache", None)
        return logits.float().cpu().numpy(), cache if cache is not None else out.past_key_values

    @property
    def records_indexer(self) -> bool:
        """Whether `validate.transformers_indexer.indexer_selections` reads this model's indexer (glm5-next's
        k-pool): `conform.ties` then decides a moved answer's tie as it does through llama.cpp's graph tap."""
        return self.info.architecture == "glm5-next"

    def engine_info(self) -> dict:
        """The manifest's account of it: versions, the device torch chose, how queries reuse the context."""
        import transformers

        return {"engine": type(self).__name__, "transformers": transformers.__version__,
                "torch": self._torch.__version__, "device": self.device, "dtype": "float32",
                "model_class": type(self.model).__name__,
                "attention": getattr(self.model.config, "_attn_implementation", None),
                "weights": "HF checkpoint" if self.info.header is None else "GGUF dequantized by transformers",
                "query_scoring": ("context cache cropped back after each query" if self.query_scoring == CROP
                                  else "context cache deep-copied for each query")}

    def close(self) -> None:
        self.model = None
        self._cache = None
        vocab = getattr(self, "_vocab", None)
        if vocab is not None and hasattr(vocab, "close"):
            vocab.close()
        self._vocab = None
