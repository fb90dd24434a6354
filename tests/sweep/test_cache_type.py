"""`kvphase sweep --cache-type f16|q8_0|q4_0`: llama.cpp's K and V cache type, recorded in the
plan (so a folder is never resumed with another one), in the default folder's name, and
really handed to llama.cpp (a quantized cache is smaller and scores differently)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.helpers.cli_checks import one_line_error
from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.sweep.run import load_results

runner = CliRunner()
SWEEP = ["--context", "256", "--per-residue", "1", "--threads", "1", "-q"]


@pytest.fixture(scope="module")
def runs(tiny_deepseek4, tmp_path_factory):
    """The same plan with every cache type, each in its default folder; f16 once by default and once
    given."""
    work = tmp_path_factory.mktemp("cache-runs")
    folders = {}
    for name, extra in [("default", []), ("f16", ["--cache-type", "f16"]), ("q8_0", ["--cache-type", "q8_0"]),
                        ("q4_0", ["--cache-type", "q4_0"])]:
        out = work / name
        result = runner.invoke(app, ["sweep", str(tiny_deepseek4), *SWEEP, "--out", str(out), *extra])
        assert result.exit_code == 0, result.output
        folders[name] = out
    return folders


@pytest.mark.slow
def test_the_cache_type_is_in_the_plan_only_when_it_is_not_f16(runs):
    configs = {name: (out / "config.json").read_bytes() for name, out in runs.items()}
    assert configs["f16"] == configs["default"]  # every existing f16 folder keeps its config.json byte for byte
    assert json.loads(configs["default"])["backend_options"] == {}
    for name in ("q8_0", "q4_0"):
        config = json.loads(configs[name])
        assert config["backend"] == "llama.cpp" and config["backend_options"] == {"cache_type": name}
        assert json.loads((runs[name] / "manifest.json").read_text())["engine"]["cache_type"] == name
        assert f"cache_type={name}" in (runs[name] / "report.md").read_text()


@pytest.mark.slow
def test_a_quantized_cache_scores_differently_from_f16(runs):
    """Guards against a cache type that never reaches llama.cpp: the rows would be f16's."""
    logprobs = {name: load_results(out).sort_values("target_id")["logprob"].to_numpy() for name, out in runs.items()}
    assert np.array_equal(logprobs["f16"], logprobs["default"])
    for name in ("q8_0", "q4_0"):
        assert len(logprobs[name]) == len(logprobs["f16"]) == 8
        assert np.abs(logprobs[name] - logprobs["f16"]).max() > 1e-4, name
    assert np.abs(logprobs["q8_0"] - logprobs["q4_0"]).max() > 1e-4


@pytest.mark.slow
def test_the_default_folder_names_a_quantized_cache(tiny_deepseek4, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["sweep", str(tiny_deepseek4), *SWEEP, "--cache-type", "q8_0"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "reports" / "tiny-ds4-records-S4-L256-cache-q8_0"
    assert json.loads((folder / "config.json").read_text())["backend_options"] == {"cache_type": "q8_0"}
    assert runner.invoke(app, ["sweep", str(tiny_deepseek4), *SWEEP, "--cache-type", "f16"]).exit_code == 0
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["tiny-ds4-records-S4-L256",
                                                                       "tiny-ds4-records-S4-L256-cache-q8_0"]


@pytest.mark.slow
@pytest.mark.parametrize("first, second", [("q8_0", ["--cache-type", "q4_0"]), ("q8_0", []), ("f16", ["--cache-type", "q8_0"])])
def test_a_folder_is_not_resumed_with_another_cache_type(tiny_deepseek4, tmp_path, first, second):
    out = tmp_path / "run"
    assert runner.invoke(app, ["sweep", str(tiny_deepseek4), *SWEEP, "--out", str(out), "--cache-type", first]).exit_code == 0
    rows = (out / "results.csv").read_bytes()
    one_line_error(runner.invoke(app, ["sweep", str(tiny_deepseek4), *SWEEP, "--out", str(out), *second]),
                    "holds a different run (differs in: backend_options)")
    assert (out / "results.csv").read_bytes() == rows


@pytest.mark.parametrize("backend", [["--backend", "reference"], ["--backend", "server", "--url", "http://127.0.0.1:1"]])
@pytest.mark.parametrize("cache", ["q8_0", "f16"])
def test_the_cache_type_needs_the_llama_cpp_backend(tiny_llama, tmp_path, backend, cache):
    out = tmp_path / "run"
    one_line_error(runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--out", str(out), "--cache-type", cache,
                                        *backend]), "--cache-type applies to --backend llama.cpp only")
    assert not out.exists()


def test_an_unknown_cache_type_is_a_usage_error(tiny_llama, tmp_path):
    result = runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--out", str(tmp_path / "r"), "--cache-type", "q5_1"])
    assert result.exit_code == 2 and "q5_1" in result.output and "f16" in result.output


@pytest.mark.slow
def test_heads_a_quantized_block_does_not_divide_are_one_line(tiny_llama, tmp_path):
    """The tiny llama's heads are 8 wide; q8_0 stores blocks of 32, and llama.cpp refuses the context."""
    out = tmp_path / "run"
    one_line_error(runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--out", str(out), "--cache-type", "q8_0"]),
                    "with a q8_0 KV cache")
    assert not out.exists()


@pytest.mark.slow
def test_llama_cpp_holds_the_cache_in_the_type_asked_for(tiny_deepseek4):
    """The context's state (its KV cache) shrinks with the cache type: the type reached llama.cpp."""
    import llama_cpp

    from kvphase.backends import llamacpp_backend
    from kvphase.backends.base import Query

    sizes = {}
    for name in ("f16", "q8_0", "q4_0"):
        backend = llamacpp_backend(tiny_deepseek4, n_ctx=320, n_threads=1, options={"cache_type": name})
        backend.score(list(range(100, 300)), [Query((5, 6), (7, 8))])
        sizes[name] = llama_cpp.llama_state_get_size(backend._ctx)
        backend.close()
    assert sizes["f16"] > sizes["q8_0"] > sizes["q4_0"], sizes


@pytest.mark.parametrize("options, fragment", [({"design": "dense"}, "takes no options but cache_type and gpu_layers, got design"),
                                               ({"cache_type": "q5_1"}, "cache_type must be one of f16, q8_0, q4_0"),
                                               ({"cache_type": 8}, "cache_type must be one of")])
def test_the_llama_cpp_factory_takes_exactly_its_options(tiny_llama, options, fragment):
    """A config.json edited by hand reaches the factory: it refuses what it does not know."""
    from kvphase.backends import llamacpp_backend

    with pytest.raises(PlanError, match=fragment):
        llamacpp_backend(tiny_llama, n_ctx=320, n_threads=1, options=options)
