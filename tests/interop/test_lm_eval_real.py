"""A plan through the real lm-evaluation-harness and back: `kvphase export lm-eval`, then `lm_eval --model
local-completions --log_samples` against the real llama-server the tests build (and, in
tests/backends/test_vllm_real.py, the real vLLM), then `kvphase import lm-eval`: the imported run reads
the same verdict as the in-process sweep of the same plan. Part of `make test-engines` (minutes:
lm-eval evaluates each doc's whole context, a request of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.engines.llama_server import find_llama_server, llama_server
from kvphase.sweep.run import load_results

pytestmark = [pytest.mark.slow, pytest.mark.time_limit(900)]
PLAN = ["--context", "384", "--contexts", "8", "-q", "--threads", "1"]  # SmolLM2: 24 targets


def served_model(url: str) -> str:
    """The name an OpenAI-compatible server serves (vLLM refuses requests naming another)."""
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as answer:
        return json.loads(answer.read())["data"][0]["id"]


def through_lm_eval(run_folder: Path, url: str, tmp_path: Path):
    """(the import's CLI result, the imported rows by target) of `run_folder`'s plan through lm-eval at `url`."""
    task = tmp_path / "task"
    exported = CliRunner().invoke(app, ["export", "lm-eval", str(run_folder), str(task), "--flag-mismatches"])
    assert exported.exit_code == 0, exported.output
    name = json.loads((task / "export.json").read_text())["task"]
    arguments = (f"model={served_model(url)},base_url={url}/v1/completions,tokenizer_backend=None,"
                 "tokenized_requests=False,num_concurrent=1")
    ran = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", arguments,
                          "--include_path", str(task), "--tasks", name, "--log_samples", "--output_path",
                          str(tmp_path / "lm-eval")], capture_output=True, text=True, timeout=800,
                         env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    assert ran.returncode == 0, ran.stderr[-3000:]
    [samples] = (tmp_path / "lm-eval").rglob(f"samples_{name}_*.jsonl")
    result = CliRunner().invoke(app, ["import", "lm-eval", str(samples), str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    return result, load_results(tmp_path / "run").set_index("target_id").sort_index()


def test_lm_eval_through_llama_server_reads_the_in_process_sweeps_verdict(default_model, tmp_path):
    local = tmp_path / "local"
    swept = CliRunner().invoke(app, ["sweep", str(default_model), *PLAN, "--out", str(local)])
    assert swept.exit_code == 0, swept.output
    with llama_server(default_model, binary=find_llama_server(), threads=1, slots=1, n_ctx_per_slot=1024) as server:
        result, imported = through_lm_eval(local, server.url, tmp_path)
    rows = load_results(local).set_index("target_id").sort_index()
    assert result.output.splitlines()[0].split(":")[0] == swept.output.splitlines()[0].split(":")[0]
    # the text lm-eval sends tokenizes otherwise than the plan ("\n" + " word" merge), so a flag may differ
    assert (imported["correct"] == rows["correct"]).mean() >= 0.9, (imported["correct"] != rows["correct"]).sum()
    assert imported.index.equals(rows.index) and imported["logprob"].isna().all()
