"""`kvphase sweep --backend server` through the real llama-server, built from the
llama.cpp that llama-cpp-python vendors (`make llama-server`; `make test` builds it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.helpers.cli_checks import one_line_error
from tests.helpers.hostile_servers import gguf_facts
from kvphase.cli import app
from kvphase.engines.llama_server import find_llama_server, llama_server, rpc_options, rpc_server
from kvphase.sweep.run import RESULTS_FILE, load_results

pytestmark = pytest.mark.slow
# one thread: no spinning on a busy machine
SWEEP = ["--threads", "1", "-q"]
# SmolLM2: 24 targets in the 8 contexts a balanced run takes at least, at 384 tokens (each query is its own request)
REAL_SWEEP = ["--context", "384", "--contexts", "8"]
TINY_SWEEP = ["--context", "512", "--per-residue", "32"]  # 256 targets, 32 contexts: a kill after 16 rows lands mid-run


@pytest.fixture(scope="module")
def binary():
    return find_llama_server()


@pytest.fixture(scope="module")
def one_server(binary, default_model):
    with llama_server(default_model, binary=binary, threads=1, slots=1, n_ctx_per_slot=1024) as server:
        yield server


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, default_model):
    out = tmp_path_factory.mktemp("local") / "run"
    result = CliRunner().invoke(app, ["sweep", str(default_model), *SWEEP, *REAL_SWEEP, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return sorted_results(out)


def server_sweep(model, out, *urls, extra=()):
    args = ["sweep", str(model), *SWEEP, "--backend", "server", "--out", str(out), *extra]
    for url in urls:
        args += ["--url", url]
    return CliRunner().invoke(app, args)


def sorted_results(out):
    return load_results(out).sort_values("target_id").reset_index(drop=True)


@pytest.fixture(scope="module")
def one_server_run(tmp_path_factory, default_model, one_server):
    out = tmp_path_factory.mktemp("server") / "run"
    result = server_sweep(default_model, out, one_server.url, extra=REAL_SWEEP)
    assert result.exit_code == 0, result.output
    return sorted_results(out)


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    """How servers share and resume a run does not depend on the model."""
    return tiny_llama


@pytest.fixture(scope="module")
def tiny_server_run(tmp_path_factory, binary, tiny):
    out = tmp_path_factory.mktemp("tiny-server") / "run"
    with llama_server(tiny, binary=binary, threads=1, slots=1, n_ctx_per_slot=1024) as server:
        result = server_sweep(tiny, out, server.url, extra=TINY_SWEEP)
    assert result.exit_code == 0, result.output
    return sorted_results(out)


def flag_agreement(a: pd.DataFrame, b: pd.DataFrame) -> tuple[int, str]:
    """How many targets' correctness flags differ, and a line with the logprob differences."""
    assert list(a["target_id"]) == list(b["target_id"])
    diffs = np.abs(a["logprob"].to_numpy() - b["logprob"].to_numpy())  # (n_targets,)
    return int((a["correct"] != b["correct"]).sum()), f"logprob |diff| max {diffs.max():.3g}, mean {diffs.mean():.3g}"


def test_server_sweep_flags_agree_with_the_in_process_backend(local_run, one_server_run):
    differing, spread = flag_agreement(local_run, one_server_run)
    print(f"\n{differing} of {len(local_run)} flags differ; {spread}")
    assert differing <= 0.01 * len(local_run), f"{differing} of {len(local_run)} flags differ; {spread}"
    assert (local_run["predicted"] == one_server_run["predicted"]).mean() >= 0.99


def test_a_header_only_file_sweeps_through_a_server_as_the_model_itself(tmp_path, binary, tiny, tiny_server_run):
    """A model you do not hold: its header (kvphase header, no weights) plans the same prompts, row for row."""
    from kvphase.gguf.header_only import write_header_only

    header = write_header_only(tiny, tmp_path / "header.gguf").path
    with llama_server(tiny, binary=binary, threads=1, slots=1, n_ctx_per_slot=1024) as server:
        result = server_sweep(header, tmp_path / "run", server.url, extra=TINY_SWEEP)
    assert result.exit_code == 0, result.output
    rows = sorted_results(tmp_path / "run")
    assert rows.drop(columns="logprob").equals(tiny_server_run.drop(columns="logprob"))
    _, spread = flag_agreement(tiny_server_run, rows)
    # one slot, each context evaluated alone from position 0: the server returns the same numbers
    assert np.array_equal(rows["logprob"], tiny_server_run["logprob"]), spread
    check = json.loads((tmp_path / "run" / "manifest.json").read_text())["engine"]["servers"][0]["model_check"]
    facts = gguf_facts(tiny)  # gguf-py's reading of the model the server holds, beside the header's own
    assert check == {"tokenizer": "same", "facts": {key: {"server": value, "file": value} for key, value in facts.items()},
                     "differs": "", "scored_anyway": False, "weights": "metadata only"}  # no weights here to compare
    assert "only the metadata of its model was compared with header.gguf (header.gguf is a header-only file)" in \
        result.output


def test_a_server_holding_another_model_with_the_same_tokenizer_is_refused_unless_allowed(tmp_path, binary, tiny,
                                                                                           tiny_deepseek4):
    """The issue's case: the sweep names the tiny llama, the server holds a tiny deepseek4 with the same
    tokenizer. Refused in one line, nothing written; --allow-model-mismatch scores it, and says so."""
    with llama_server(tiny_deepseek4, binary=binary, threads=1, slots=1, n_ctx_per_slot=512) as server:
        refused = server_sweep(tiny, tmp_path / "run", server.url, extra=["--context", "256", "--per-residue", "1"])
        allowed = server_sweep(tiny, tmp_path / "allowed", server.url,
                               extra=["--context", "256", "--per-residue", "1", "--allow-model-mismatch"])
    served, ours = gguf_facts(tiny_deepseek4), gguf_facts(tiny)
    differs = ", ".join(f"{key} {served[key]:,} where the file has {ours[key]:,}" for key in served
                        if served[key] != ours[key])
    one_line_error(refused, f"{server.url} serves another model ({tiny_deepseek4}), not {tiny.name}: {differs}; "
                   "`kvphase sweep --allow-model-mismatch` scores it anyway")
    assert not (tmp_path / "run").exists()
    assert allowed.exit_code == 0, allowed.output
    assert f"Warning: {server.url} serves another model" in allowed.output
    check = json.loads((tmp_path / "allowed" / "manifest.json").read_text())["engine"]["servers"][0]["model_check"]
    assert check["differs"] == differs and check["scored_anyway"] is True


def resident_mib(process) -> float:
    """A process's resident memory (VmRSS, /proc)."""
    status = Path(f"/proc/{process.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def test_a_model_split_over_two_rpc_servers_scores_as_in_process(tmp_path, binary, default_model, local_run):
    """llama.cpp's RPC split (llama-server --rpc, every layer on two rpc-servers): the same targets
    as the in-process backend, log-probabilities within the cross-build tolerance of docs/server.md."""
    with rpc_server() as a, rpc_server() as b, llama_server(default_model, binary=binary, threads=1, slots=1,
                                                           n_ctx_per_slot=1024, extra=rpc_options([a.url, b.url])) as server:
        result = server_sweep(default_model, tmp_path / "run", server.url, extra=REAL_SWEEP)
        held = [resident_mib(rpc.process) for rpc in (a, b)]
    assert result.exit_code == 0, result.output
    assert min(held) > 20, f"each rpc-server should hold part of the 94 MiB of weights: {held} MiB"
    rows = sorted_results(tmp_path / "run")
    differing, spread = flag_agreement(local_run, rows)
    print(f"\nRPC split: {differing} of {len(rows)} flags differ; {spread}; rpc-servers hold {held} MiB")
    assert differing <= 0.01 * len(rows), spread
    assert np.abs(rows["logprob"] - local_run["logprob"]).max() < 0.4, spread


def test_two_servers_give_the_results_of_one(tmp_path, binary, tiny, tiny_server_run):
    with llama_server(tiny, binary=binary, threads=1, n_ctx_per_slot=1024) as a, \
         llama_server(tiny, binary=binary, threads=1, n_ctx_per_slot=1024) as b:
        result = server_sweep(tiny, tmp_path / "two", a.url, b.url, extra=TINY_SWEEP)
    assert result.exit_code == 0, result.output
    two = sorted_results(tmp_path / "two")
    differing, spread = flag_agreement(tiny_server_run, two)
    assert differing == 0, spread
    # one slot per server: each context is evaluated alone from position 0, so the numbers are the same
    assert np.array_equal(tiny_server_run["logprob"], two["logprob"]), spread


def _warnings(stderr: str) -> list[str]:
    """stderr's lines but the note every run without answer phases ends with (it says their axis was not planned)."""
    return [line for line in stderr.strip().splitlines() if not line.startswith("Note: this run's answer phase")]


def sweep_killing_one(tiny, out, servers, victim, how: str = "kill") -> tuple[int, str]:
    """A sweep through `servers` in its own process, `victim` killed (or paused: `how` names the
    RunningServer method) once 16 rows are written: (exit code, stderr)."""
    urls = [part for server in servers for part in ("--url", server.url)]
    sweep = subprocess.Popen([sys.executable, "-m", "kvphase.cli", "sweep", str(tiny), *SWEEP, *TINY_SWEEP,
                              "--backend", "server", "--out", str(out), *urls],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    while _rows(out) < 16 and sweep.poll() is None:
        time.sleep(0.05)
    getattr(victim, how)()
    _, stderr = sweep.communicate(timeout=120)
    return sweep.returncode, stderr


def test_a_server_paused_mid_run_stops_the_sweep_within_two_patiences_and_a_resume_completes(
        tmp_path, binary, tiny, tiny_server_run):
    """SIGSTOP: alive, silent, /health silent too. One line within two patiences (MIN_PATIENCE_S
    each: the tiny model answers in milliseconds), not 6 tries of --request-timeout's 300 s."""
    from kvphase.backends.transport import MIN_PATIENCE_S

    out = tmp_path / "run"
    with llama_server(tiny, binary=binary, threads=1, n_ctx_per_slot=1024) as server:
        started = time.monotonic()
        returncode, stderr = sweep_killing_one(tiny, out, [server], server, how="pause")
        seconds = time.monotonic() - started
        assert returncode == 1, stderr
        assert stderr.strip().count("\n") == 0, stderr
        assert stderr.startswith("Error: every server has stopped answering (since "), stderr
        assert f"{server.url} stopped answering: no answer to /completion within {MIN_PATIENCE_S:g} s" in stderr, stderr
        assert seconds < 2 * MIN_PATIENCE_S + 20, seconds  # the rows before the pause take a few seconds
        assert 16 <= len(load_results(out)) < len(tiny_server_run)
        server.resume()
        result = server_sweep(tiny, out, server.url, extra=TINY_SWEEP)
    assert result.exit_code == 0, result.output
    assert_rows_of_a_clean_run(out, tiny_server_run)


def test_a_server_paused_mid_run_hands_its_contexts_to_the_other(tmp_path, binary, tiny, tiny_server_run):
    from kvphase.backends.transport import MIN_PATIENCE_S

    out = tmp_path / "run"
    with llama_server(tiny, binary=binary, threads=1, n_ctx_per_slot=1024) as a, \
            llama_server(tiny, binary=binary, threads=1, n_ctx_per_slot=1024) as b:
        returncode, stderr = sweep_killing_one(tiny, out, [a, b], b, how="pause")
    assert returncode == 0, stderr
    assert _warnings(stderr) == [
        f"Warning: {b.url} stopped answering: no answer to /completion within {MIN_PATIENCE_S:g} s, and none to "
        f"/health within {MIN_PATIENCE_S:g} s more; its contexts go to the other servers"], stderr
    assert_rows_of_a_clean_run(out, tiny_server_run)
    lost = json.loads((out / "manifest.json").read_text())["engine"]["lost"]
    assert [entry["url"] for entry in lost] == [b.url], lost


def assert_rows_of_a_clean_run(out, clean) -> None:
    lines = (out / RESULTS_FILE).read_text().strip().splitlines()[1:]
    assert len(lines) == len(clean)  # nothing scored twice, nothing missing
    rows = sorted_results(out)
    assert list(rows["target_id"]) == list(clean["target_id"])
    assert (rows["correct"] == clean["correct"]).all()
    assert np.allclose(rows["logprob"], clean["logprob"], atol=1e-4)


def test_a_server_killed_mid_run_stops_the_sweep_with_one_line_and_a_resume_completes(
        tmp_path, binary, tiny, tiny_server_run):
    out = tmp_path / "run"
    with llama_server(tiny, binary=binary, threads=1, n_ctx_per_slot=1024) as server:
        returncode, stderr = sweep_killing_one(tiny, out, [server], server)
    assert returncode == 1, stderr
    assert stderr.strip().count("\n") == 0, stderr
    assert stderr.startswith("Error: every server has stopped answering (since "), stderr
    assert f"{server.url} does not answer" in stderr, stderr
    finished = load_results(out)
    assert 16 <= len(finished) < len(tiny_server_run)

    with llama_server(tiny, binary=binary, threads=1, n_ctx_per_slot=1024) as again:
        result = server_sweep(tiny, out, again.url, extra=TINY_SWEEP)
    assert result.exit_code == 0, result.output
    assert_rows_of_a_clean_run(out, tiny_server_run)


def test_a_server_killed_mid_run_hands_its_contexts_to_the_others(tmp_path, binary, tiny, tiny_server_run):
    """A fleet of three: one killed mid-run, the other two finish the sweep; the rows are a clean
    run's, nothing lost or scored twice, and the manifest says which server left and when."""
    out = tmp_path / "run"
    servers = [llama_server(tiny, binary=binary, threads=1, n_ctx_per_slot=1024) for _ in range(3)]
    with servers[0] as a, servers[1] as b, servers[2] as c:
        returncode, stderr = sweep_killing_one(tiny, out, [a, b, c], b)
    assert returncode == 0, stderr
    assert _warnings(stderr) == [f"Warning: {b.url} does not answer (connection refused) after 6 tries; "
                                           "its contexts go to the other servers"], stderr
    assert_rows_of_a_clean_run(out, tiny_server_run)
    lost = json.loads((out / "manifest.json").read_text())["engine"]["lost"]
    assert [entry["url"] for entry in lost] == [b.url] and lost[0]["at"].startswith("20"), lost


def _rows(out) -> int:
    path = out / RESULTS_FILE
    return max(path.read_text().count("\n") - 1, 0) if path.exists() else 0


def test_a_full_disk_mid_run_through_a_server_is_one_line_and_the_resume_completes(tmp_path, binary, tiny):
    """The server backend's rows meet a full disk (tests/helpers/faults.py) like the in-process one's."""
    from tests.helpers.faults import fill_the_disk_at_every_site, table_rows

    with llama_server(tiny, binary=binary, threads=1, slots=1, n_ctx_per_slot=1024) as server:
        argv = lambda out: ["sweep", tiny, *SWEEP, "--context", "512", "--per-residue", "8",  # noqa: E731
                            "--backend", "server", "--url", server.url, "--out", out]
        kept = lambda out: table_rows(out / RESULTS_FILE, drop=("logprob",))  # noqa: E731
        fill_the_disk_at_every_site(tmp_path, argv, kept, only={"results.csv"})
