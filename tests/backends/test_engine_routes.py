"""The scoring routes of the server engines against fakes of their documented formats: the
prefix-cached "generate" route of an OpenAI-compatible engine (vLLM), SGLang's native `/generate`,
and the one-line refusals of an engine that lacks the route asked for or serves another model.
The real vLLM is in tests/backends/test_vllm_real.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvphase.backends.base import Query
from kvphase.backends.dialects import ENGINES, ModelFacts
from kvphase.backends.fleet import ServerBackend
from kvphase.cli import app
from kvphase.errors import BackendError, PlanError
from kvphase.statistics.stratified import p_text
from kvphase.sweep.analysis import summarize
from kvphase.sweep.run import RESULT_COLUMNS, load_results

from tests.backends.test_server import CONTEXT, QUERIES, QUICK, assert_scores_match, expected_scores
from tests.helpers.fake_servers import ByteVocab, FakeServer, fake_logits


def backend_for(server, scoring=None, model=None):
    return ServerBackend([ENGINES[server.engine](server.url, QUICK, scoring)], ByteVocab(), n_ctx_needed=512,
                         model=model)


def greedy(context, query, steps):
    """The fake model's greedy continuation of context + question, computed from its logits alone."""
    tokens = list(context) + list(query.prompt)
    for _ in range(steps):
        tokens.append(int(np.argmax(fake_logits(tokens[-1], len(tokens) - 1))))
    return tuple(tokens[-steps:])


def test_the_generate_route_gives_the_forced_routes_flags_and_its_logprob_where_it_generated_the_answer():
    with FakeServer("openai") as server:
        got = backend_for(server, "generate").score(CONTEXT, QUERIES)
    forced = expected_scores(CONTEXT, QUERIES)
    assert {s.correct for s in forced} == {True, False}
    assert [s.correct for s in got] == [s.correct for s in forced]
    assert [s.predicted for s in got] == [greedy(CONTEXT, q, len(q.answer)) for q in QUERIES]
    for mine, exact in zip(got, forced):
        if exact.correct:
            assert abs(mine.logprob - exact.logprob) < 1e-9
        else:
            assert math.isnan(mine.logprob)


def test_the_generate_route_sends_the_context_once_and_the_prefix_cache_serves_it_to_every_query():
    with FakeServer("openai") as server:
        backend = backend_for(server, "generate")
        before, tokens = len(server.evaluated_per_request), backend.tokens_evaluated
        backend.score(CONTEXT, QUERIES)
    priming, *per_query = server.evaluated_per_request[before:]
    # the manifest's count: what the server evaluated of each prompt, and what it generated (1 token to prime)
    assert backend.tokens_evaluated - tokens == priming + sum(per_query) + 1 + sum(len(q.answer) for q in QUERIES)
    assert priming == len(CONTEXT) - 1  # all but BOS, which the check's prompt left in the cache
    # at most each query's own tokens (fewer where an earlier query's opening is cached too): the context came from
    # the cache every time
    assert all(0 < n <= len(q.prompt) for n, q in zip(per_query, QUERIES)), per_query
    assert backend.engine_info()["scoring"] == "generate"


def test_sglang_scores_by_teacher_forcing_and_its_radix_cache_serves_the_context():
    with FakeServer("sglang") as server:
        backend = backend_for(server)
        before = len(server.evaluated_per_request)
        got = backend.score(CONTEXT, QUERIES)
    assert_scores_match(got, expected_scores(CONTEXT, QUERIES))
    first, *rest = server.evaluated_per_request[before:]
    assert first == len(CONTEXT) - 1 + len(QUERIES[0].prompt) + len(QUERIES[0].answer)  # BOS cached by the checks
    assert all(0 < n <= len(q.prompt) + len(q.answer) for n, q in zip(rest, QUERIES[1:])), rest
    assert backend.servers[0].engine == "sglang" and backend.servers[0].build_info == "version 0.0-fake"


@pytest.mark.parametrize("engine, scoring, works", [("llama-server", "generate", "forced"),
                                                    ("sglang", "generate", "forced")])
def test_an_engine_without_the_route_is_one_line_naming_the_route_that_works(engine, scoring, works):
    with pytest.raises(PlanError) as error:
        ENGINES[engine]("http://127.0.0.1:1", QUICK, scoring)
    assert str(error.value) == f"--engine {engine} has no {scoring!r} scoring route; use --scoring {works} with it"


@pytest.mark.parametrize("lacks, scoring, message", [
    ("prompt_logprobs", None, "returned no prompt logprobs, which --engine openai --scoring forced needs .*"
                              "--scoring generate needs only top logprobs"),
    ("token_ids", "generate", "named a generated token '.*', not 'token_id:N': it ignores "
                              "`return_tokens_as_token_ids`, which --scoring generate needs; use --scoring forced"),
])
def test_an_openai_engine_that_lacks_what_a_route_needs_is_refused_before_scoring(lacks, scoring, message):
    with FakeServer("openai", lacks=[lacks]) as server:
        with pytest.raises(BackendError, match=message):
            backend_for(server, scoring)


def test_a_vllm_serving_another_model_folder_is_refused_as_llama_servers_is(tmp_path):
    """vLLM's /v1/models names the folder it serves; its config.json states the facts compared."""
    folder = tmp_path / "other-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 257, "max_position_embeddings": 8192,
                                                    "hidden_size": 960}))
    facts = ModelFacts("fake-bytes.gguf", {"n_vocab": 257, "n_ctx_train": 8192, "n_embd": 576})
    with FakeServer("openai", model_dir=str(folder)) as server:
        with pytest.raises(BackendError) as error:
            backend_for(server, model=facts)
    assert str(error.value) == (f"{server.url} serves another model ({folder}), not fake-bytes.gguf: n_embd 960 "
                                "where the file has 576; `kvphase sweep --allow-model-mismatch` scores it anyway")


def test_cli_a_route_the_engine_lacks_is_one_line(default_model, tmp_path):
    result = CliRunner().invoke(app, ["sweep", str(default_model), "--backend", "server", "--url", "http://127.0.0.1:1",
                                      "--scoring", "generate", "--out", str(tmp_path / "run"), "-q"])
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: --engine llama-server has no 'generate' scoring route; use --scoring "
                                     "forced with it")


def test_missing_logprobs_round_trip_and_make_the_logprob_test_unavailable(tmp_path):
    """A generate-route run: results.csv holds no logprob for the wrong answers; the summary's
    log-probability test then says it is unavailable instead of testing the right answers alone."""
    rows = [{"target_id": i, "context": i // 8, "residue": i % 4, "phase": i % 4, "target_pos": 10 + i,
             "query_pos": 100, "correct": i % 3 != 0, "logprob": -0.5 if i % 3 else "", "key": "k", "answer": "a",
             "predicted": "a"} for i in range(32)]
    (tmp_path / "results.csv").write_text(pd.DataFrame(rows, columns=RESULT_COLUMNS).to_csv(index=False))
    results = load_results(tmp_path)
    assert int(results["logprob"].isna().sum()) == 11  # targets 0, 3, ..., 30
    summary = summarize(results, stride=4, modulus=4)
    assert p_text(summary.logprob_test) == "unavailable"
    assert "11 of 32 targets have no answer log-probability" in summary.logprob_test.note
    (tmp_path / "results.csv").write_text(pd.DataFrame(rows, columns=RESULT_COLUMNS).to_csv(index=False)
                                          .replace(",,k,", ",nan,k,", 1))
    with pytest.raises(Exception, match="logprob is 'nan', expected a finite number"):
        load_results(tmp_path)
