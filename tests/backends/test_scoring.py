"""Shared-context scoring equals scoring each context + query as its own prompt (real model)."""

from __future__ import annotations

import numpy as np
import pytest

from kvphase.backends.base import Query, score_from_logits
from kvphase.defaults import default_threads
from kvphase.sweep.contexts import build_contexts
from kvphase.sweep.context_settings import ContextSettings
from kvphase.sweep.tasks import load_task


def _separate_prompt_scores(model_path, context, queries):
    """Each prompt on its own through llama-cpp-python's high-level API, all logits kept."""
    from kvphase.engines.llamacpp import high_level_llama

    llm = high_level_llama(model_path, n_ctx=2048, n_threads=default_threads(), logits_all=True, verbose=False)
    scores = []
    for query in queries:
        tokens = list(context) + list(query.prompt) + list(query.answer[:-1])
        llm.reset()
        llm.eval(tokens)
        first = len(context) + len(query.prompt) - 1
        logits = np.array(llm.scores[first:first + len(query.answer)])  # (n_answer, n_vocab)
        scores.append(score_from_logits(logits, query.answer))
    return scores


@pytest.fixture(scope="module")
def long_tiny(default_model, tmp_path_factory):
    """A two-layer llama with SmolLM2's tokenizer and a 2048-token context: the equality does not
    depend on the model, and SmolLM2 would take minutes for the eight 1,100-token prompts."""
    from kvphase.backends.llamacpp import LlamaCppBackend
    from kvphase.gguf.tiny import write_tiny_model

    path = write_tiny_model("llama", tmp_path_factory.mktemp("long-tiny") / "tiny.gguf",
                            tokenizer_from=default_model, context_length=2048)
    backend = LlamaCppBackend(path, n_ctx=2048, n_threads=default_threads())
    yield path, backend
    backend.close()


@pytest.mark.slow
@pytest.mark.parametrize("model, task, length", [("real", "records", 384), ("tiny", "passkey", 512),
                                                 ("tiny", "records", 1100)])
# 1100 tokens: three 512-token batches, whose positions must run on from one batch to the next; SmolLM2 at
# 384 tokens: its 3 queries, each evaluated again as a whole prompt (at 512 its 5 took twice as long)
def test_shared_context_equals_separate_prompts(default_model, llama_backend, long_tiny, model, task, length):
    path, backend = (default_model, llama_backend) if model == "real" else long_tiny
    settings = ContextSettings(length, 4, 8, 8, "in-sequence", seed=3)
    context = build_contexts(load_task(task), backend, settings)[0]
    queries = [t.query for t in context.targets][:8]
    shared = backend.score(context.tokens, queries)
    separate = _separate_prompt_scores(path, context.tokens, queries)
    assert [s.correct for s in shared] == [s.correct for s in separate]
    diffs = np.abs(np.array([s.logprob for s in shared]) - np.array([s.logprob for s in separate]))
    assert diffs.max() <= 1e-3, f"logprob differences: max {diffs.max():.2e}, mean {diffs.mean():.2e}"


def test_rescoring_reuses_the_cached_context_and_gives_the_same_scores(llama_backend):
    context = tuple(llama_backend.tokenize(" The grass is green. The sky is blue." * 20))
    queries = [Query(tuple(llama_backend.tokenize(" The sky is")), tuple(llama_backend.tokenize(" blue.")))] * 3
    first = llama_backend.score(context, queries)
    evaluated = llama_backend.tokens_evaluated
    again = llama_backend.score(context, queries)
    assert llama_backend.tokens_evaluated - evaluated < len(context)  # the context was kept
    assert first == again
    assert first[0].correct  # a repeated sentence is easy to continue


def test_teacher_forced_score_from_logits_by_hand():
    logits = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]))
    score = score_from_logits(logits, [0, 2])
    assert score.correct and score.predicted == (0, 2)
    assert score.logprob == pytest.approx(np.log(0.7) + np.log(0.6))
    assert not score_from_logits(logits, [1, 2]).correct
