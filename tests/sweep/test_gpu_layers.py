"""--gpu-layers N (issue 40, part 5): llama.cpp's layers offloaded to a GPU, on the sweep and the
probes. This machine's llama.cpp is a CPU build, where the option must change nothing and say so."""

from __future__ import annotations

import llama_cpp
import pytest
from typer.testing import CliRunner

from kvphase.backends import llamacpp_backend
from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.sweep.run import load_results

SWEEP = ["--context", "256", "--per-residue", "2", "--threads", "1", "-q"]
CPU_BUILD = not llama_cpp.llama_supports_gpu_offload()


def test_a_sweep_records_its_gpu_layers_and_a_cpu_build_says_it_offloads_nothing(tiny_llama, tmp_path):
    runner = CliRunner()
    plain = runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--out", str(tmp_path / "plain")])
    offloaded = runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--gpu-layers", "2", "--out", str(tmp_path / "gpu")])
    assert plain.exit_code == 0 and offloaded.exit_code == 0, offloaded.output
    warned = "--gpu-layers 2 does nothing, every layer runs on the CPU" in offloaded.output
    assert warned == CPU_BUILD, offloaded.output
    assert '"gpu_layers": 2' in (tmp_path / "gpu" / "config.json").read_text()
    assert "gpu_layers" not in (tmp_path / "plain" / "config.json").read_text()
    if CPU_BUILD:  # nothing offloaded: the same numbers
        assert load_results(tmp_path / "gpu").equals(load_results(tmp_path / "plain"))
    resumed = runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--out", str(tmp_path / "gpu")])
    assert resumed.exit_code == 1 and "differs in: backend_options" in resumed.output


@pytest.mark.parametrize("args, message", [
    (["sweep", "{model}", "--backend", "reference", "--gpu-layers", "1"], "--gpu-layers applies to the llama.cpp backend only, not reference"),
    (["sweep", "{model}", "--gpu-layers", "-2"], "--gpu-layers must be a count of layers from 0 to"),
    (["knockout", "{model}", "--backend", "reference", "--gpu-layers", "1"], "--gpu-layers applies to the llama.cpp backend only"),
])
def test_gpu_layers_where_they_cannot_apply_is_one_error(args, message, tiny_llama, tmp_path):
    result = CliRunner().invoke(app, [a.format(model=tiny_llama) for a in args] + ["--out", str(tmp_path / "r")])
    assert result.exit_code in (1, 2) and message in result.output, result.output


def test_the_backend_refuses_a_count_that_is_not_one(tiny_llama):
    with pytest.raises(PlanError, match="gpu_layers must be a count of layers"):
        llamacpp_backend(tiny_llama, n_ctx=256, options={"gpu_layers": -3})
