"""Smaller cases of issue 77, each one clean line: a missing indexer key named missing by `inspect`,
garbage scoring answers not blamed on the server's version, `--engine openai` against a llama-server
named as the engine mismatch it is, conflicting or unknown sweep options, a flag given both ways."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.gguf.tiny import write_tiny_model
from tests.helpers.cli_checks import one_line_error

runner = CliRunner()
TOP_K = b"deepseek4.attention.indexer.top_k"


def test_inspect_names_a_missing_indexer_key_missing_not_zero(tmp_path):
    model = write_tiny_model("deepseek4", tmp_path / "ds4.gguf", seed=0)
    data = model.read_bytes()
    assert data.count(TOP_K) == 1
    renamed = tmp_path / "no-top-k.gguf"
    renamed.write_bytes(data.replace(TOP_K, TOP_K[:-1] + b"X"))  # the same length: the file stays well-formed
    result = runner.invoke(app, ["inspect", str(renamed)])
    one_line_error(result, "deepseek4.attention.indexer.top_k is missing, expected a positive whole number")


def test_an_empty_scoring_answer_is_not_blamed_on_the_servers_version():
    from kvphase.backends.dialects import ENGINES
    from kvphase.backends.fleet import ServerBackend
    from kvphase.errors import BackendError
    from tests.helpers.fake_servers import ByteVocab, FakeServer

    with FakeServer(hostile="empty") as server:
        with pytest.raises(BackendError) as error:
            ServerBackend([ENGINES["llama-server"](server.url)], ByteVocab(), n_ctx_needed=64)
    assert str(error.value) == (f"{server.url}/completion answered 0 token steps where a grammar forced 2: not a "
                                "llama-server scoring answer")
    with FakeServer(grammar=False) as old:  # an old build ignores the grammar: that one is its version's
        with pytest.raises(BackendError, match="does not support token-id grammars"):
            ServerBackend([ENGINES["llama-server"](old.url)], ByteVocab(), n_ctx_needed=64)


def test_engine_openai_against_a_llama_server_is_named_the_engine_mismatch():
    from kvphase.backends.dialects import ENGINES
    from kvphase.backends.fleet import ServerBackend
    from kvphase.errors import BackendError
    from tests.helpers.fake_servers import ByteVocab, FakeServer

    with FakeServer("llama-server") as server:
        with pytest.raises(BackendError) as error:
            ServerBackend([ENGINES["openai"](server.url)], ByteVocab(), n_ctx_needed=64)
    assert str(error.value) == (f"{server.url} is a llama-server (it answers /props), not an OpenAI-compatible engine "
                                "with prompt logprobs: give --engine llama-server")
    with FakeServer("openai") as vllm:  # vLLM answers no /props: checked as before
        assert ServerBackend([ENGINES["openai"](vllm.url)], ByteVocab(), n_ctx_needed=64).servers[0].engine == "openai"


def test_a_keyword_that_contradicts_the_options_record_is_refused_and_an_unknown_one_named(tmp_path):
    import kvphase
    from kvphase.errors import PlanError

    with pytest.raises(PlanError, match=r"^context is given twice, 256 in options and 512 as a keyword; give it once$"):
        kvphase.sweep(tmp_path / "m.gguf", options=kvphase.SweepOptions(context=256), context=512)
    with pytest.raises(PlanError, match=r"^sweep has no option 'bogus'; its options: allow_model_mismatch, "):
        kvphase.SweepOptions(bogus=1)
    record = kvphase.SweepOptions(context=256)
    assert record.overridden({"context": 256, "seed": 3}) == kvphase.SweepOptions(context=256, seed=3)


def test_a_flag_given_both_ways_is_a_usage_error(tmp_path):
    result = runner.invoke(app, ["sweep", str(tmp_path / "m.gguf"), "--query-phases", "--no-query-phases"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("│", " ").split())  # the usage box wraps the line
    assert "--query-phases and --no-query-phases are both given; give one of them" in said, result.output
    assert not (tmp_path / "reports").exists()
