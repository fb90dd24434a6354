"""The server backend against small fake servers that follow llama-server's and vLLM's
documented formats (fast); the real llama-server is in tests/backends/test_server_real.py."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvphase.backends.base import Query, score_from_logits
from kvphase.backends.dialects import ENGINES, ModelFacts
from kvphase.backends.fleet import ServerBackend
from kvphase.backends.transport import ANSWER_CAPS, MIN_PATIENCE_S, STALL_FACTOR, Pace, Retry
from kvphase.cli import app
from kvphase.engines.llama_server import free_port
from kvphase.errors import BackendError, PlanError

from tests.helpers.fake_servers import BOS, ByteVocab, FakeServer, fake_logits
from tests.helpers.paths import TRAINED

pytestmark = pytest.mark.time_limit(60)  # a failover that never ends fails here in a minute, not never
QUICK = Retry(attempts=3, first_wait_s=0.01, request_timeout=5)
CONTEXT = tuple([BOS] + ByteVocab().tokenize("Records: alpha=17, beta=42, gamma=99. " * 4))
QUERIES = [Query(tuple(ByteVocab().tokenize(f" {k}=")), tuple(ByteVocab().tokenize(v)))
           for k, v in [("alpha", ">?"), ("beta", "42"), ("gamma", ">"), ("delta", ">x")]]  # the model says ">?@..." after "="


def expected_scores(context, queries):
    """Independent of the backend: the fake model's logits through score_from_logits."""
    out = []
    for query in queries:
        sequence = list(context) + list(query.prompt) + list(query.answer)
        first = len(context) + len(query.prompt)
        rows = np.stack([fake_logits(sequence[p - 1], p - 1) for p in range(first, first + len(query.answer))])
        out.append(score_from_logits(rows, query.answer))  # rows: (n_answer, n_vocab)
    return out


def backend_for(*servers, vocab=None, slots=None, n_ctx_needed=512, model=None, allow_other_model=False):
    engines = [ENGINES[s.engine](s.url, QUICK) for s in servers]
    return ServerBackend(engines, vocab or ByteVocab(), n_ctx_needed=n_ctx_needed, slots=slots, model=model,
                         allow_other_model=allow_other_model)


def assert_scores_match(got, want):
    assert [s.correct for s in got] == [s.correct for s in want]
    assert [s.predicted for s in got] == [s.predicted for s in want]
    diffs = np.abs(np.array([s.logprob for s in got]) - np.array([s.logprob for s in want]))
    assert diffs.max() < 1e-9, f"logprob differences: max {diffs.max():.2e}, mean {diffs.mean():.2e}"


@pytest.mark.parametrize("engine", ["llama-server", "openai", "sglang"])
def test_scores_equal_the_models_own_teacher_forced_scores(engine):
    with FakeServer(engine) as server:
        got = backend_for(server).score(CONTEXT, QUERIES)
    want = expected_scores(CONTEXT, QUERIES)
    assert {s.correct for s in want} == {True, False}  # the fake model gets some right and some wrong
    assert_scores_match(got, want)


def test_llama_server_evaluates_the_context_once_and_only_query_tokens_after_it():
    with FakeServer() as server:
        backend_for(server).score(CONTEXT, QUERIES)
    priming, *per_query = server.evaluated_per_request[2:]  # after the two requests that check the server
    assert priming == len(CONTEXT)
    assert all(n <= len(q.prompt) for n, q in zip(per_query, QUERIES)), per_query


@pytest.mark.slow
def test_contexts_spread_over_servers_and_slots_give_the_same_scores_as_one_slot():
    jobs = [(CONTEXT[:60 + 7 * i], QUERIES) for i in range(9)]
    with FakeServer(slots=1) as one:
        single = dict(backend_for(one).score_many(jobs))
    with FakeServer(slots=2, delay_s=0.01) as a, FakeServer(slots=2, delay_s=0.01) as b:
        spread = dict(backend_for(a, b).score_many(jobs))
    assert sorted(spread) == list(range(len(jobs)))
    for i in range(len(jobs)):
        assert_scores_match(spread[i], single[i])
    assert a.completions > 0 and b.completions > 0  # both servers took work
    assert len(a.slot_prompts) == 2 and len(b.slot_prompts) == 2  # on both of their slots


def test_slots_limits_the_workers_per_server():
    with FakeServer(slots=4) as server:
        assert len(backend_for(server, slots=2).workers) == 2
        assert len(backend_for(server).workers) == 4
        with pytest.raises(BackendError, match="has 4 slots, --slots asks for 5; restart it with -np 5"):
            backend_for(server, slots=5)


@pytest.mark.parametrize("slots", [0, 257, 2**63])
def test_slots_outside_what_llama_cpp_holds_are_refused_before_any_request(slots):
    # 256: LLAMA_MAX_SEQ in the vendored src/llama-cparams.h; each slot is a worker thread here
    with FakeServer(slots=4) as server:
        with pytest.raises(PlanError, match=f"--slots must be 1 to 256 .*got {slots}$"):
            backend_for(server, slots=slots)
        assert server.completions == 0


def test_unreachable_server_is_one_line():
    with FakeServer() as server:
        url = server.url
    with pytest.raises(BackendError, match=f"{url} does not answer \\(connection refused\\) after 2 tries"):
        backend_for(server)


@pytest.mark.parametrize("url", ["ftp://somewhere", "http//bad url", "http://[::1", "http://localhost:99999",
                                 "http://host:abc"])
def test_a_malformed_url_is_refused(url):
    """Each was a traceback (ValueError) or a retried request before it was refused."""
    with pytest.raises(PlanError, match="--url expects http://HOST:PORT"):
        ENGINES["llama-server"](url, QUICK)


@pytest.mark.parametrize("engine", ["llama-server", "openai", "sglang"])
def test_a_server_with_another_tokenizer_is_refused_before_scoring(engine):
    with FakeServer(engine, vocab_shift=1) as server:
        with pytest.raises(BackendError, match="serves another model .*tokenizes 'The quick brown fox jump' as"):
            backend_for(server)
    assert server.completions == 0


def test_a_vocabulary_of_another_size_is_refused():
    class Bigger(ByteVocab):
        n_vocab = 32000

    with FakeServer() as server, pytest.raises(BackendError, match="vocabulary has 257 tokens, the model file's 32000"):
        backend_for(server, vocab=Bigger())


def test_a_context_too_small_is_refused():
    with FakeServer(n_ctx=256) as server, pytest.raises(BackendError, match="holds 256 tokens per slot, the sweep needs 512"):
        backend_for(server, n_ctx_needed=512)


def test_a_server_without_token_id_grammars_is_refused():
    with FakeServer(grammar=False) as server, pytest.raises(BackendError, match="does not support token-id grammars"):
        backend_for(server)


def test_a_server_that_dies_mid_run_stops_the_run_with_one_line():
    jobs = [(CONTEXT, QUERIES)] * 6
    finished = []
    with FakeServer(slots=1, down_after=12) as server:
        with pytest.raises(BackendError, match="does not answer .* after 3 tries"):
            for index, scores in backend_for(server).score_many(jobs):
                finished.append(index)
    assert finished == [0, 1]  # 2 requests check the server, 5 score a context: two finished, the third did not


def test_a_server_that_dies_mid_run_hands_its_contexts_to_the_others():
    jobs = [(CONTEXT, QUERIES)] * 8
    with FakeServer(slots=1, down_after=12) as dying, FakeServer(slots=1) as staying:
        backend = backend_for(dying, staying)
        told = []
        backend.on_lost = told.append
        results = dict(backend.score_many(jobs))
    assert sorted(results) == list(range(8))  # every context scored once, the dying server's by the other
    for scores in results.values():
        assert_scores_match(scores, expected_scores(CONTEXT, QUERIES))
    assert [entry["url"] for entry in backend.lost] == [dying.url] == [entry["url"] for entry in
                                                                       backend.engine_info()["lost"]]
    assert told == [f"{dying.url} does not answer (Remote end closed connection without response) after 3 tries; "
                    "its contexts go to the other servers"]
    assert staying.completions == completions_for(8 - 2)  # the dying server finished 2 contexts (12 completions)


PER_CONTEXT = 1 + len(QUERIES)  # a context's completions: evaluated alone, then one per query
CHECKS = 2  # completions of the checks before scoring (one short query forced)


def completions_for(contexts: int) -> int:
    """A server's completions when it scored `contexts` contexts, each exactly once, after its checks."""
    return CHECKS + PER_CONTEXT * contexts


def test_every_context_of_a_lost_server_is_scored_exactly_once_by_the_others():
    """Each context's index comes back once, and the servers did exactly the completions of the
    contexts (a context handed back twice was scored twice: 37 completions for 32 contexts)."""
    jobs = [(CONTEXT, QUERIES)] * 9
    # the others take 0.05 s a completion, so the dying one surely takes a second context and dies in it
    with FakeServer(slots=1, down_after=completions_for(1)) as dying, FakeServer(slots=1, delay_s=0.05) as a, \
            FakeServer(slots=1, delay_s=0.05) as b:
        backend = backend_for(dying, a, b)
        indices = [index for index, _ in backend.score_many(jobs)]
    assert sorted(indices) == list(range(9))
    assert [entry["url"] for entry in backend.lost] == [dying.url]
    assert a.completions + b.completions == 2 * CHECKS + PER_CONTEXT * (9 - 1), (a.completions, b.completions)


def test_later_calls_skip_a_lost_server():
    """After a server left, a one-context score (the calibration pilot, the dry run's estimate)
    goes to a server that is still there, even when the lost one comes first."""
    jobs = [(CONTEXT, QUERIES)] * 4
    # the staying server takes 0.05 s a completion: the dying one takes a second context and dies in it
    with FakeServer(slots=1, down_after=completions_for(1)) as dying, FakeServer(slots=1, delay_s=0.05) as staying:
        backend = backend_for(dying, staying)
        dict(backend.score_many(jobs))
        assert [entry["url"] for entry in backend.lost] == [dying.url]
        asked_of_dying = dying.completions
        assert_scores_match(backend.score(CONTEXT, QUERIES), expected_scores(CONTEXT, QUERIES))
    assert dying.completions == asked_of_dying
    assert [entry["url"] for entry in backend.lost] == [dying.url]


def test_one_context_on_a_server_that_dies_goes_to_a_worker_not_yet_started():
    """One job starts one worker; when its server dies, another server's worker takes the context
    (the calibration pilot's and the dry run's single contexts)."""
    with FakeServer(slots=1, down_after=CHECKS) as dying, FakeServer(slots=1) as staying:
        backend = backend_for(dying, staying)
        assert_scores_match(backend.score(CONTEXT, QUERIES), expected_scores(CONTEXT, QUERIES))
    assert [entry["url"] for entry in backend.lost] == [dying.url]
    assert staying.completions == completions_for(1)


def test_pace_waits_a_multiple_of_the_slowest_request_between_bounds():
    pace = Pace()
    assert pace.patience(300) == MIN_PATIENCE_S  # nothing measured yet: the floor
    pace.record(0.01)
    assert pace.patience(300) == MIN_PATIENCE_S
    pace.record(10.0)
    pace.record(4.0)  # the slowest counts, not the last
    assert pace.patience(300) == STALL_FACTOR * 10.0 == 20.0
    assert pace.patience(12.5) == 12.5  # never past the request's own limit


@pytest.fixture
def short_patience(monkeypatch):
    """Patience of 0.3 s (instead of MIN_PATIENCE_S) while the fakes answer in milliseconds."""
    monkeypatch.setattr("kvphase.backends.transport.MIN_PATIENCE_S", 0.3)
    return 0.3


def _stall_line(url: str, patience: float) -> str:
    return (f"{url} stopped answering: no answer to /completion within {patience:g} s, and none to /health "
            f"within {patience:g} s more")


def test_a_stalled_server_stops_a_single_server_run_within_two_patiences(short_patience):
    """SIGSTOP: the socket accepts, nothing answers, /health neither. One line in about twice the
    patience, not the tries of --request-timeout (6 x 300 s at the defaults)."""
    with FakeServer(slots=1, down_after=12, hostile="stalled") as server:
        finished, message, seconds = _run_until_error(server, Retry(attempts=6, first_wait_s=0.01, request_timeout=20))
    assert finished == [0, 1]
    assert re.fullmatch(r"every server has stopped answering \(since [\d\-T:+]+: " + re.escape(
        _stall_line(server.url, short_patience)) + r"\); finished contexts are kept: run the same command again "
        "to resume", message), message
    assert seconds < 2 * short_patience + 2, seconds


def test_a_stalled_server_hands_its_contexts_to_the_others_within_two_patiences(short_patience):
    import time

    jobs = [(CONTEXT, QUERIES)] * 8
    with FakeServer(slots=1, down_after=12, hostile="stalled") as stalled, FakeServer(slots=1) as staying:
        backend = ServerBackend([ENGINES["llama-server"](s.url, Retry(first_wait_s=0.01, request_timeout=20))
                                 for s in (stalled, staying)], ByteVocab(), n_ctx_needed=512)
        told = []
        backend.on_lost = told.append
        started = time.monotonic()
        results = dict(backend.score_many(jobs))
        seconds = time.monotonic() - started
    assert sorted(results) == list(range(8))
    for scores in results.values():
        assert_scores_match(scores, expected_scores(CONTEXT, QUERIES))
    assert told == [_stall_line(stalled.url, short_patience) + "; its contexts go to the other servers"]
    assert staying.completions == completions_for(8 - 2)
    assert seconds < 2 * short_patience + 3, seconds


def test_a_busy_server_that_answers_health_is_waited_for(short_patience):
    """Requests that take 3 patiences each: /health answers, so the server is slow, not gone; once
    one such request is answered the pace is its time, and the next ones wait without asking."""
    with FakeServer(slots=1) as server:
        backend = backend_for(server)  # its checks answer in milliseconds: the pace is the floor
        server.delay_s = 3 * short_patience
        got = backend.score(CONTEXT, QUERIES[:2])  # three requests: the context, then one per query
    assert_scores_match(got, expected_scores(CONTEXT, QUERIES[:2]))
    assert 1 <= server.health_checks <= 3, server.health_checks  # asked during the first request only


def test_cli_a_wrong_url_is_one_line(default_model, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["sweep", str(default_model), "--backend", "server", "--url", url,
                                      "--out", str(tmp_path / "run"), "-q"])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {url} does not answer (connection refused) after 2 tries"


@pytest.mark.parametrize("args, message", [
    (["--url", "http://127.0.0.1:1"], "--url, --slots, --engine, --scoring, --request-timeout, --deadline and --allow-model-mismatch apply to "
                                  "--backend server only"),
    (["--backend", "server"], "--backend server needs --url http://HOST:PORT (once per server)"),
])
def test_cli_server_options_are_checked(default_model, tmp_path, args, message):
    result = CliRunner().invoke(app, ["sweep", str(default_model), *args, "--out", str(tmp_path / "run"), "-q"])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {message}"


@pytest.fixture
def silent_socket():
    """A port whose connections the kernel accepts and nobody ever answers."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def _run_until_error(server, retry, n_jobs=6):
    """Contexts finished before the backend raised, the error and the seconds it took."""
    import time

    engines = [ENGINES[server.engine](server.url, retry)]
    finished, started = [], time.monotonic()
    with pytest.raises(BackendError) as error:
        for index, _ in ServerBackend(engines, ByteVocab(), n_ctx_needed=512).score_many([(CONTEXT, QUERIES)] * n_jobs):
            finished.append(index)
    return finished, str(error.value), time.monotonic() - started


@pytest.mark.parametrize("hostile", ["silent", "trickle", "slow-headers"])
def test_a_server_that_stops_answering_hits_the_request_timeout(hostile):
    with FakeServer(slots=1, down_after=12, hostile=hostile) as server:
        finished, message, seconds = _run_until_error(server, Retry(attempts=2, first_wait_s=0.01, request_timeout=0.4))
    assert finished == [0, 1]
    assert re.fullmatch(r"every server has stopped answering \(since [\d\-T:+]+: " + re.escape(
        f"{server.url} does not answer (no answer within --request-timeout 0.4 s) after 2 tries); finished contexts "
        "are kept: run the same command again to resume"), message), message
    assert seconds < 5  # 2 tries of 0.4 s, not the 300 s default


def test_a_silent_server_hits_the_deadline_before_its_request_timeout():
    with FakeServer(slots=1, down_after=12, hostile="silent") as server:
        finished, message, seconds = _run_until_error(server, Retry(attempts=6, first_wait_s=0.01, request_timeout=60,
                                                                    deadline=1.5))
    assert finished == [0, 1]
    assert message.startswith(f"the --deadline of 1.5 s passed while waiting for {server.url}/completion to answer; "
                              "finished contexts are kept")
    assert seconds < 5


@pytest.mark.parametrize("hostile, problem", [("garbage", "answered with something that is not JSON: b'<html>502"),
                                              ("cut", "does not answer (")])
def test_a_server_that_answers_garbage_or_cuts_its_answer_is_one_line(hostile, problem):
    with FakeServer(slots=1, down_after=12, hostile=hostile) as server:
        finished, message, _ = _run_until_error(server, QUICK)
    assert finished == [0, 1] and problem in message and "\n" not in message


def test_a_deadline_that_passes_between_requests_is_named():
    with FakeServer(slots=1, delay_s=0.2) as server:  # 5 requests a context: 1 s each
        finished, message, _ = _run_until_error(server, Retry(attempts=3, first_wait_s=0.01, request_timeout=60,
                                                              deadline=3.0), n_jobs=20)
    assert 0 < len(finished) < 20 and "the --deadline of 3 s passed" in message


@pytest.mark.parametrize("args, message", [
    (["--request-timeout", "0.3"], "{url} does not answer (no answer within --request-timeout 0.3 s) after 2 tries"),
    (["--deadline", "5"], "the --deadline of 5 s passed while waiting for {url}/props to answer; "
                            "finished contexts are kept: run the command again (a later --deadline) to resume"),
    (["--request-timeout", "0"], "--request-timeout expects a number of seconds above 0, got 0"),
    (["--deadline", "inf"], "--deadline expects a number of seconds above 0, got inf"),
])
def test_cli_a_server_that_never_answers_is_one_line_within_the_bound(default_model, tmp_path, silent_socket,
                                                                      args, message):
    result = CliRunner().invoke(app, ["sweep", str(default_model), "--backend", "server", "--url", silent_socket,
                                      *args, "--out", str(tmp_path / "run"), "-q"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: " + message.format(url=silent_socket)


def test_a_server_that_never_answered_waits_only_the_first_contact_bound(silent_socket, monkeypatch):
    """Default options: a port that accepts and never answers is reported in 2 x FIRST_CONTACT_S,
    not 2 x the 300 s a long context may take once the server has answered."""
    import time

    monkeypatch.setattr("kvphase.backends.transport.FIRST_CONTACT_S", 0.3)
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"does not answer \(no first answer within 0.3 s\) after 2 tries"):
        ENGINES["llama-server"](silent_socket, Retry()).info()
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("engine", ["llama-server", "openai", "sglang"])
def test_a_server_whose_tokenize_answers_the_wrong_shape_is_one_line(engine, monkeypatch):
    """It answered its info well, then /tokenize with JSON that holds no tokens (was a KeyError traceback)."""
    with FakeServer(engine) as server:
        monkeypatch.setattr(server, "post", lambda path, body: {"data": [{"id": "m"}]})
        with pytest.raises(BackendError, match=f"{server.url} does not look like a {engine} server \\(unexpected answer"):
            backend_for(server)


def test_weight_repacking_is_off_on_a_cpu_with_amx(tmp_path, monkeypatch):
    """llama.cpp 0.3.36's AMX kernels die with SIGSEGV on repacked Q4_0/Q4_1/Q8_0 weights (measured on
    a Xeon with amx_int8: SmolLM2's Q4_1 file, quantized deepseek4 files): on such a CPU models load
    with use_extra_bufts off and llama-server gets --no-repack; elsewhere both keep repacking."""
    import llama_cpp

    from kvphase.engines import llama_server
    from kvphase.engines import llamacpp as engine

    amx, plain = tmp_path / "amx", tmp_path / "plain"
    amx.write_text("flags\t\t: fpu sse avx2 avx512f amx_bf16 avx512_fp16 amx_tile amx_int8\n")
    plain.write_text("flags\t\t: fpu sse avx2 fma avx512f\n")
    assert not engine.extra_buffers_safe(amx)
    assert engine.extra_buffers_safe(plain) and engine.extra_buffers_safe(tmp_path / "missing")
    model = TRAINED / "dense.gguf"
    for safe in (False, True):
        monkeypatch.setattr(engine, "extra_buffers_safe", lambda: safe)
        monkeypatch.setattr(llama_server, "extra_buffers_safe", lambda: safe)
        assert ("--no-repack" in llama_server.server_command(Path("server"), Path("model.gguf"), 8080)) is not safe
        llm = engine.high_level_llama(model, vocab_only=True, verbose=False)  # llama_cpp.Llama, as tests and benches use it
        assert llm.model_params.use_extra_bufts is safe
        llm.close()
    assert llama_cpp.llama_model_default_params().use_extra_bufts  # the library's own defaults are left as they were
    loaded = []
    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", lambda path, params: loaded.append(params.use_extra_bufts))
    for safe in (False, True):
        monkeypatch.setattr(engine, "extra_buffers_safe", lambda: safe)
        engine.load_model(model, vocab_only=True)
    assert loaded == [False, True]


def test_a_server_down_at_the_start_leaves_as_one_lost_mid_run():
    """One rule: a server that does not answer at the checks leaves with the same warning (told once
    someone listens) and the others score everything; with every server down, one line."""
    with FakeServer() as gone, FakeServer() as also_gone:
        pass
    with FakeServer(slots=1) as up:
        backend = backend_for(gone, up)
        told = []
        backend.on_lost = told.append
        results = dict(backend.score_many([(CONTEXT, QUERIES)] * 3))
    assert sorted(results) == [0, 1, 2]
    assert told == [f"{gone.url} does not answer (connection refused) after 2 tries; its contexts go to the other "
                    "servers"]
    assert [entry["url"] for entry in backend.engine_info()["lost"]] == [gone.url]
    assert [server["url"] for server in backend.engine_info()["servers"]] == [up.url]
    with pytest.raises(BackendError, match=r"^every server has stopped answering \(since .*connection refused.*; "
                                           r"since .*connection refused"):
        backend_for(gone, also_gone)


def test_cli_the_same_server_twice_is_one_line(default_model, tmp_path):
    result = CliRunner().invoke(app, ["sweep", str(default_model), "--backend", "server", "--url", "http://127.0.0.1:1",
                                      "--url", "127.0.0.1:1/", "--out", str(tmp_path / "run"), "-q"])
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: --url 127.0.0.1:1/ names the same server as --url http://127.0.0.1:1; "
                                     "give each server once (--slots sets how many requests each takes at once)")


# --------------------------------------------------------------------------- the model behind each server

FILE_FACTS = ModelFacts("fake-bytes.gguf", {"n_vocab": 257, "n_ctx_train": 8192, "n_params": 1000, "size": 4000})


def test_a_fleet_server_stating_another_model_is_refused_naming_it_and_what_differs():
    """Each server of a fleet is checked: the second states other parameter and byte counts."""
    with FakeServer(meta={"n_params": 1000, "size": 4000}) as same, \
            FakeServer(meta={"n_params": 999, "size": 3996}) as other:
        with pytest.raises(BackendError) as error:
            backend_for(same, other, model=FILE_FACTS)
    assert str(error.value) == (f"{other.url} serves another model (/models/fake-bytes.gguf), not fake-bytes.gguf: "
                                "n_params 999 where the file has 1,000, size 3,996 where the file has 4,000; "
                                "`kvphase sweep --allow-model-mismatch` scores it anyway")


def test_allowed_another_model_is_scored_with_a_warning_and_the_manifest_says_what_was_compared():
    with FakeServer(meta={"n_params": 1000}) as same, FakeServer(meta={"n_params": 999}) as other:
        backend = backend_for(same, other, model=FILE_FACTS, allow_other_model=True)
        warned = []
        backend.on_lost = warned.append
        got = backend.score(CONTEXT, QUERIES)
    assert_scores_match(got, expected_scores(CONTEXT, QUERIES))
    assert warned == [f"{other.url} serves another model (/models/fake-bytes.gguf), not fake-bytes.gguf: n_params "
                      "999 where the file has 1,000; scored anyway (--allow-model-mismatch)"]
    checks = [server["model_check"] for server in backend.engine_info()["servers"]]
    compared = {"n_vocab": {"server": 257, "file": 257}, "n_ctx_train": {"server": 8192, "file": 8192}}
    assert checks == [
        {"tokenizer": "same", "facts": {**compared, "n_params": {"server": 1000, "file": 1000}}, "differs": "",
         "scored_anyway": True},
        {"tokenizer": "same", "facts": {**compared, "n_params": {"server": 999, "file": 1000}},
         "differs": "n_params 999 where the file has 1,000", "scored_anyway": True}]


def test_a_fact_that_is_not_a_number_is_one_line():
    with FakeServer(meta={"n_params": "many"}) as server:
        with pytest.raises(BackendError, match=r"does not look like a llama-server server \(unexpected answer: "
                                               r"ValueError\(\"/v1/models meta.n_params is 'many'"):
            backend_for(server, model=FILE_FACTS)


def test_a_scoring_answer_past_its_cap_is_one_line_naming_the_cap(monkeypatch):
    monkeypatch.setitem(ANSWER_CAPS, "/completion", 100)  # a forced answer takes about 200 bytes
    with FakeServer(slots=1) as server:
        with pytest.raises(BackendError) as error:
            backend_for(server)
    assert str(error.value) == (f"{server.url}/completion answered more than 100 bytes, the most kvphase reads from "
                                "/completion; not a scoring answer")
