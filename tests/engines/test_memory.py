"""Too little memory (issue 42): the estimate before loading, the warning, and a failed load or
context named as memory, under a real address-space limit (RLIMIT_AS) in a child process."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from kvphase.engines.memory import MIB, RUNTIME, Available, memory_need, shortfall

# SmolLM2-135M's published configuration (HuggingFaceTB/SmolLM2-135M-Instruct config.json), not the file
LAYERS, HEADS, KV_HEADS, HIDDEN, VOCAB = 30, 9, 3, 576, 49152


def test_the_estimate_follows_the_models_published_shape(default_model):
    need = memory_need(default_model, 1088)
    head_dim = HIDDEN // HEADS  # 64
    assert need.kv_cache == LAYERS * KV_HEADS * 2 * head_dim * 1088 * 2  # K and V, f16: 25,067,520 bytes
    assert need.compute == 4 * 512 * (1088 * HEADS + VOCAB) + RUNTIME
    assert need.weights == default_model.stat().st_size
    assert memory_need(default_model, 1088, cache_type="q8_0").kv_cache == pytest.approx(need.kv_cache * 34 / 64, abs=1)
    assert memory_need(default_model, 8192).kv_cache == need.kv_cache * 8192 // 1088


def test_a_shortfall_is_named_only_when_the_need_exceeds_what_is_available():
    available = Available(100 * MIB, "a test limit")
    assert shortfall(100 * MIB, available) is None and shortfall(1, None) is None
    assert shortfall(101 * MIB, available) == "about 101 MiB needed, 100 MiB available (a test limit)"


# the command's imports, and a pandas column of strings: where pyarrow is installed (lm-eval brings it),
# pandas keeps strings in pyarrow arrays, whose memory pool reserves about 1 GiB of address space on first use
BASELINE = """
import resource, kvphase.cli, llama_cpp, pandas
from kvphase.engines.memory import _status_kib
pandas.Series(["a", "bb"]).str.len()
print(_status_kib("VmSize") * 1024)
"""


def _sweep_under_a_limit(model, extra_bytes: int, tmp_path) -> subprocess.CompletedProcess:
    """`kvphase sweep --dry-run` in a child whose address space may grow `extra_bytes` past what
    the command's imports take (measured in a child of its own)."""
    baseline = int(subprocess.run([sys.executable, "-c", BASELINE], capture_output=True, text=True,
                                  check=True).stdout)
    limit = baseline + extra_bytes

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, "-m", "kvphase.cli", "sweep", str(model), "--context", "1024",
                           "--contexts", "8", "--threads", "1", "-q", "--dry-run", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, preexec_fn=limited, timeout=300)


@pytest.mark.skipif(sys.platform != "linux", reason="the limits are read from /proc (Linux)")
@pytest.mark.parametrize("room, stage", [(40 * MIB, "the weights"), (94 * MIB + 110 * MIB, "the context")])
def test_a_model_that_does_not_fit_is_named_as_memory_not_as_a_corrupt_file(default_model, tmp_path, room, stage):
    """SmolLM2 at 1,088 tokens: 94 MiB of weights, 187 MiB of context; 40 MiB of room cannot map
    the weights, 204 MiB maps them but cannot hold the context."""
    result = _sweep_under_a_limit(default_model, room, tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("Warning:") and "needs about 281 MiB" in lines[0] and "ulimit -v" in lines[0], lines
    assert len(lines) == 2 and lines[1].startswith("Error:"), lines
    assert f"not enough memory, the likely cause: {stage}" in lines[1] and "corrupt" not in lines[1], lines[1]
    assert not (tmp_path / "run").exists()


def test_the_dry_run_states_the_memory_it_expects(tiny_llama, tmp_path):
    from typer.testing import CliRunner

    from kvphase.cli import app

    result = CliRunner().invoke(app, ["sweep", str(tiny_llama), "--context", "512", "--contexts", "8", "--threads",
                                      "1", "-q", "--dry-run", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert f"Expected in llama.cpp: {memory_need(tiny_llama, 512 + 64).describe()}; " in result.output
    assert "MiB available (" in result.output


@pytest.mark.parametrize("exc, expected", [
    (MemoryError(), True),
    (ImportError("libXau.so.6: failed to map segment from shared object"), True),
    (OSError(12, "Cannot allocate memory"), True),
    (ImportError("No module named 'jax'", name="jax"), False),
    (OSError(28, "No space left on device"), False),
])
def test_what_counts_as_memory_running_out(exc, expected):
    from kvphase.errors import out_of_memory

    assert out_of_memory(exc) is expected


@pytest.mark.parametrize("raised, said", [
    (ImportError("_backend_agg.so: failed to map segment from shared object"), "Error: out of memory;"),
    (MemoryError(), "Error: out of memory;"),
    (OSError(5, "Input/output error", "/x/y.csv"), "Error: /x/y.csv: Input/output error"),
])
def test_the_command_line_names_memory_and_system_errors_in_one_line(monkeypatch, tmp_path, raised, said):
    """What a library below kvphase raises when it finds no room (matplotlib's import under
    ulimit -v, numpy's allocation) or a device fails, from any command."""
    from typer.testing import CliRunner

    from kvphase.cli import app
    from tests.helpers.cli_checks import one_line_error

    def fails(*args, **kwargs):
        raise raised

    monkeypatch.setattr("kvphase.theory.study.run_study", fails)
    result = CliRunner().invoke(app, ["theory", "--steps", "10", "-q", "--out", str(tmp_path / "run")])
    one_line_error(result, said)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS as Linux applies it")
def test_training_under_an_address_space_xla_aborts_in_is_refused_in_one_line(tmp_path):
    """Measured: under 1.2 GiB XLA aborts (std::bad_alloc, SIGABRT), under 1.6 GiB an import fails."""
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1200 * MIB, 1200 * MIB))

    result = subprocess.run([sys.executable, "-m", "kvphase.cli", "train", "dense", str(tmp_path / "run"), "--steps",
                             "2", "-q"], capture_output=True, text=True, preexec_fn=limited, timeout=300)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == ("Error: training needs at least 2,048 MiB of address space (JAX and XLA reserve "
                                     "it at start and abort below it); ulimit -v allows 1,200 MiB"), result.stderr
