"""`kvphase sweep --dry-run`: the plan's counts, one context scored and timed, an estimate of the
whole sweep, and no run folder created or touched; the same input refused as a sweep refuses it."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from tests.helpers.cli_checks import one_line_error
from kvphase.cli import app
from kvphase.sweep.contexts import build_contexts
from kvphase.sweep.context_settings import ContextSettings
from kvphase.sweep.tasks import load_task

runner = CliRunner()
SWEEP = ["--context", "256", "--per-residue", "2", "--threads", "1", "-q"]


def _numbers(output: str) -> dict:
    """The counts, the estimate and the peak memory a dry run printed."""
    plan = re.search(r"(\d+) contexts, (\d+) targets, ([\d,]+) tokens to evaluate", output)
    estimate = re.search(r"Estimated wall time: ([\d.]+) (s|min|h) for (\d+) contexts \(an estimate from one context",
                         output)
    memory = re.search(r"Peak memory: ([\d,]+) MiB", output)
    assert plan and estimate and memory, output
    scale = {"s": 1, "min": 60, "h": 3600}[estimate[2]]
    return {"contexts": int(plan[1]), "targets": int(plan[2]), "tokens": int(plan[3].replace(",", "")),
            "seconds": float(estimate[1]) * scale, "estimated_contexts": int(estimate[3]),
            "memory": int(memory[1].replace(",", ""))}


def _independent_count(model, settings: ContextSettings) -> tuple[int, int, int]:
    """(contexts, targets, tokens) from build_contexts' contexts: each context once, then per target
    its query's prompt and every answer token but the last (teacher forcing)."""
    from kvphase.engines.llamacpp import Vocab

    contexts = build_contexts(load_task("records"), Vocab.load(model), settings)
    targets = [t for c in contexts for t in c.targets]
    tokens = sum(len(c.tokens) for c in contexts) + sum(len(t.query.prompt) + len(t.query.answer) - 1 for t in targets)
    return len(contexts), len(targets), tokens


def _listing(folder):
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir())


@pytest.mark.slow
def test_a_dry_run_counts_what_the_sweep_evaluates_and_writes_nothing(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default folder would be reports/...
    dry = runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert list(tmp_path.iterdir()) == []  # no folder, no lock
    numbers = _numbers(dry.output)
    assert (numbers["contexts"], numbers["targets"], numbers["tokens"]) == _independent_count(
        tiny_llama, ContextSettings(256, 4, 8, 2, "prefix", 0))
    assert numbers["estimated_contexts"] == numbers["contexts"]
    assert numbers["seconds"] > 0 and numbers["memory"] > 0
    # the sweep itself evaluates exactly that many tokens
    assert runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP]).exit_code == 0
    manifest = json.loads((tmp_path / "reports" / "tiny-llama-records-S4-L256" / "manifest.json").read_text())
    assert manifest["tokens_evaluated"] == numbers["tokens"]


@pytest.mark.slow
def test_a_dry_run_on_a_folder_with_results_says_how_many_remain(tiny_llama, tmp_path):
    out = tmp_path / "run"
    assert runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--out", str(out)]).exit_code == 0
    lines = (out / "results.csv").read_text().splitlines(keepends=True)
    (out / "results.csv").write_text("".join(lines[:6]))  # 5 of 16 targets kept
    before = _listing(out)
    dry = runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--out", str(out), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "The folder holds 5 of the targets: 11 remain" in dry.output
    assert _numbers(dry.output)["estimated_contexts"] == 11  # one target per context at this size
    assert _listing(out) == before  # nothing touched, not even the lock
    (out / "results.csv").write_text("".join(lines))
    done = runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--out", str(out), "--dry-run"])
    assert done.exit_code == 0 and "Nothing remains to score" in done.output, done.output


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    ["--backend", "reference", "--design", "meanpool", "-o", "local_window=8"],
    ["--backend", "reference"],
    ["--stride", "8", "--modulus", "16", "--padding", "in-sequence", "--task", "passkey", "--seed", "3"],
    ["--per-residue", "auto", "--detect", "90", "--context", "512"],  # the last --context counts
])
def test_a_dry_run_takes_every_option_a_sweep_takes(tiny_llama, tmp_path, extra):
    out = tmp_path / "run"
    dry = runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--out", str(out), "--dry-run", *extra])
    assert dry.exit_code == 0, dry.output
    assert _numbers(dry.output)["seconds"] > 0 and not out.exists()


@pytest.mark.slow
def test_a_dry_run_through_a_quantized_cache(default_model, tmp_path):
    from kvphase.gguf.tiny import write_tiny_model

    model = write_tiny_model("deepseek4", tmp_path / "tiny-ds4.gguf", tokenizer_from=default_model)
    dry = runner.invoke(app, ["sweep", str(model), *SWEEP, "--cache-type", "q4_0", "--dry-run", "--out",
                              str(tmp_path / "run")])
    assert dry.exit_code == 0, dry.output
    assert "through llama.cpp (cache_type=q4_0)" in dry.output and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_dry_run_through_llama_server(tiny_llama, tmp_path):
    from kvphase.engines.llama_server import find_llama_server, llama_server

    with llama_server(tiny_llama, binary=find_llama_server(), threads=1, slots=1, n_ctx_per_slot=1024) as server:
        dry = runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--backend", "server", "--url", server.url,
                                  "--dry-run", "--out", str(tmp_path / "run")])
    assert dry.exit_code == 0, dry.output
    assert _numbers(dry.output)["tokens"] == _independent_count(tiny_llama, ContextSettings(256, 4, 8, 2, "prefix", 0))[2]
    assert "the servers' own is not counted" in dry.output and not (tmp_path / "run").exists()


@pytest.mark.parametrize("extra, fragment", [
    (["--cache-type", "q8_0", "--backend", "reference"], "--cache-type applies to --backend llama.cpp only"),
    (["--stride", "0"], "--stride must be at least 2, got 0"),
    (["--stride", "abc"], "--stride must be a whole number (the stride S) or 'all', got 'abc'"),
    (["--stride", "all"], "is a llama model, which declares no KV-cache compression"),
    (["--design", "meanpool"], "apply to --backend reference only"),
    (["--per-residue", "auto"], "--per-residue auto needs --detect GAP"),
    (["--url", "http://127.0.0.1:1"], "apply to --backend server only"),
])
def test_a_dry_run_refuses_what_a_sweep_refuses(tiny_llama, tmp_path, extra, fragment):
    out = tmp_path / "run"
    for dry in ([], ["--dry-run"]):
        one_line_error(runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--out", str(out), *extra, *dry]),
                        fragment)
    assert not out.exists()


@pytest.mark.slow
def test_a_dry_run_refuses_a_folder_holding_another_plan(tiny_llama, tmp_path):
    out = tmp_path / "run"
    assert runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--out", str(out)]).exit_code == 0
    before = _listing(out)
    for dry in (["--dry-run"], []):
        one_line_error(runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--seed", "1", "--out", str(out), *dry]),
                        "holds a different run (differs in: seed)")
        if dry:
            assert _listing(out) == before  # (a sweep's refusal takes the lock a moment)
