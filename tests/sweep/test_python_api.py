"""The Python API (`kvphase.sweep`, `load_run`, `compare`, `inspect`): the same run folder as the
command line, docs/python.md's example as written, and bad input as the library's own errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvphase
from kvphase.cli import app
from kvphase.errors import KvphaseError, ModelFileError, PlanError, RunFolderError
from tests.helpers.paths import REPO

PAGE = REPO / "docs" / "python.md"
runner = CliRunner()
SMALL = {"context": 256, "per_residue": 2, "threads": 1}  # a sweep of seconds on the tiny llama
SMALL_ARGS = ["--context", "256", "--per-residue", "2", "--threads", "1"]


def _in_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def swept(tiny_llama, tmp_path_factory):
    """One small sweep of the tiny llama through the API, with what its callbacks heard."""
    heard, progress = [], []
    run = kvphase.sweep(tiny_llama, out=tmp_path_factory.mktemp("api") / "run", on_notice=heard.append,
                        progress=lambda done, total: progress.append((done, total)), **SMALL)
    return run, heard, progress


@pytest.mark.slow
def test_the_api_and_the_command_line_write_the_same_run_folder(swept, tiny_llama, tmp_path):
    run, _, _ = swept
    result = runner.invoke(app, ["sweep", str(tiny_llama), *SMALL_ARGS, "--out", str(tmp_path / "cli"), "-q"])
    assert result.exit_code == 0, result.output
    for name in ("results.csv", "config.json", "summary.json"):  # report.md holds the wall time
        assert (run.path / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    assert result.output.splitlines()[0] == run.summary.headline()


@pytest.mark.slow
def test_a_run_reads_back_as_its_folder_says(swept):
    run, heard, progress = swept
    loaded = kvphase.load_run(run.path)
    written = json.loads((run.path / "summary.json").read_text())
    again = json.loads(json.dumps(loaded.summary.to_json()))  # computed again from results.csv
    assert again == written == json.loads(json.dumps(run.summary.to_json()))
    assert json.loads(json.dumps(kvphase.report(run.path).summary.to_json())) == written
    frame = loaded.results
    assert len(frame) == written["n_targets"] == progress[-1][1]
    accuracy = frame.groupby("residue")["correct"].mean() * 100  # (modulus,)
    residues = {row["residue"]: row["accuracy"] for row in written["per_residue"]}
    assert max(abs(accuracy[r] - a) for r, a in residues.items()) < 0.01, (accuracy, residues)
    assert loaded.report_path == run.path / "report.md" and loaded.report_path.is_file()
    axes = loaded.figure().axes
    assert len(axes) == 1 and "residue" in axes[0].get_xlabel() and len(axes[0].lines) >= 1


@pytest.mark.slow
def test_progress_and_notices_reach_their_callbacks(swept):
    run, heard, progress = swept
    done = [d for d, _ in progress]
    assert progress[0] == (0, progress[-1][1]) and done == sorted(done) and done[-1] == progress[-1][1] > 0
    control = [n for n in heard if "declares no KV-cache compression" in n.text]
    assert len(control) == 1 and control[0].kind == "attention", heard


@pytest.mark.slow
def test_the_python_page_runs_as_written(tmp_path):
    """docs/python.md: its console block (the tiny model), then its python block, in one folder."""
    text = PAGE.read_text()
    commands = re.findall(r"^\$ kvphase (.+)$", text, re.M)
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)
    assert len(commands) == 1 and len(blocks) == 1
    made = _in_python(f"import sys; from kvphase.cli import main; sys.argv = ['kvphase', *{commands[0].split()!r}]; "
                      "main()", tmp_path)
    assert made.returncode == 0, made.stderr
    done = _in_python(blocks[0], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: --per-residue must be a whole number" in done.stdout, done.stdout
    assert (tmp_path / "tiny-accuracy.png").stat().st_size > 0
    assert (tmp_path / "runs" / "compared" / "comparison.csv").is_file()


@pytest.mark.slow
def test_import_kvphase_is_cheap_and_its_sweep_is_the_package_made_callable():
    code = ("import sys, kvphase; cheap = not {'pandas', 'typer', 'llama_cpp'} & set(sys.modules); "
            "import kvphase.sweep.run; package = sys.modules['kvphase.sweep']; "
            "print(cheap, kvphase.sweep is package, callable(package), kvphase.load_run.__module__, "
            "kvphase.PlanError.__module__)")
    done = _in_python(code, REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True", "kvphase.sweep.api", "kvphase.errors"]


@pytest.mark.slow
def test_an_options_record_runs_as_its_keywords_do(swept, tiny_llama, tmp_path):
    """`sweep(model, SweepOptions(...), **overrides)` writes the folder the same keywords write (the
    keywords set what the record leaves unset; tests/cli/test_clean_lines.py: one it sets otherwise)."""
    run, _, _ = swept
    options = kvphase.SweepOptions(**SMALL)
    again = kvphase.sweep(tiny_llama, options, seed=0, out=tmp_path / "record")
    for name in ("results.csv", "config.json", "summary.json"):
        assert (run.path / name).read_bytes() == (again.path / name).read_bytes(), name


def test_the_api_lists_every_option_in_its_signature():
    from dataclasses import fields
    from inspect import signature

    options = [f.name for f in fields(kvphase.SweepOptions)]
    for function in (kvphase.sweep, kvphase.sweep_strides, kvphase.dry_run):
        listed = signature(function).parameters
        assert [name for name in listed if name in options] == options, function
        assert listed["context"].default is None and listed["engine"].default == "llama-server"
    _refused(PlanError, lambda: kvphase.sweep(None, {"context": 256}), "SweepOptions", "dict")


def test_design_options_are_one_dict_from_either_spelling_to_the_plan(tiny_llama):
    """`design_options` as a dict or as the command line's KEY=VALUE strings (values read as JSON, keys
    with dashes as Python names) is one dict, and the plan holds exactly it over the design's defaults."""
    from kvphase.sweep.planning import plan_sweep_runs

    spelled = [("local-window=8", "stagger=\"head\"", "top_k=[2, 3]"), {"local-window": 8, "stagger": "head",
                                                                        "top_k": [2, 3]}]
    held = [kvphase.SweepOptions(design_options=options).design_options for options in spelled]
    assert held == [{"local_window": 8, "stagger": "head", "top_k": [2, 3]}] * 2
    options = kvphase.SweepOptions(backend="reference", design="meanpool", context=320, per_residue=8,
                                   design_options=("local_window=8", "window=8"))
    plan = plan_sweep_runs(tiny_llama, options, say=lambda notice: None).runs[0][0]
    assert plan.backend_options == {"design": "meanpool", "window": 8, "stride": plan.stride, "local_window": 8}


def test_backend_settings_are_the_sweeps_own_options():
    """A sweep's backend options, gathered in their record as the sweep's keywords give them."""
    options = kvphase.SweepOptions(url="http://127.0.0.1:1", slots=2, engine="openai", scoring="generate",
                                   request_timeout=5.0, deadline=60.0, allow_model_mismatch=True, cache_type="q8_0",
                                   gpu_layers="all", threads=1)
    assert vars(options.backend_settings) == {"url": ("http://127.0.0.1:1",), "slots": 2, "engine": "openai",
                                              "scoring": "generate", "request_timeout": 5.0, "deadline": 60.0, "allow_model_mismatch": True,
                                              "cache_type": "q8_0", "gpu_layers": -1, "threads": 1}
    _refused(PlanError, lambda: kvphase.SweepOptions(engine="vllm"), "--engine", "'vllm'")


def _refused(error: type, call, *fragments: str) -> None:
    """`call()` raises the library's `error` (not SystemExit, not another type) in one line naming the problem."""
    with pytest.raises(KvphaseError) as raised:
        call()
    assert type(raised.value) is error, repr(raised.value)
    message = str(raised.value)
    assert "\n" not in message and all(f in message for f in fragments), message


def test_a_missing_model_file_is_a_model_file_error(tmp_path):
    missing = tmp_path / "missing.gguf"
    _refused(ModelFileError, lambda: kvphase.sweep(missing), "missing.gguf")
    _refused(ModelFileError, lambda: kvphase.dry_run(missing), "missing.gguf")
    _refused(ModelFileError, lambda: kvphase.inspect(missing), "missing.gguf")


@pytest.mark.parametrize("options, fragments", [
    ({"per_residue": "many"}, ["--per-residue", "'many'"]),
    ({"context": 10**9}, ["context"]),
    ({"padding": "sideways"}, ["--padding", "'sideways'"]),
    ({"cache_type": "f8"}, ["--cache-type", "'f8'"]),
    ({"threads": 0}, ["--threads"]),
    ({"contexts": 9}, ["--contexts", "9"]),
    ({"url": "http://localhost:1"}, ["--url", "--backend server"]),
    ({"out": "."}, ["current folder"]),
    ({"stride": "all"}, ["sweep_strides"]),
    ({"no_such_option": 1}, ["no_such_option"]),
], ids=lambda value: str(value)[:30])
def test_an_impossible_option_is_a_plan_error(tiny_llama, options, fragments, tmp_path):
    _refused(PlanError, lambda: kvphase.sweep(tiny_llama, **{"out": tmp_path / "run", **options}), *fragments)
    assert not (tmp_path / "run").exists()


def test_an_impossible_dry_run_is_a_plan_error(tiny_llama):
    _refused(PlanError, lambda: kvphase.dry_run(tiny_llama, calibrate=True), "--dry-run", "--calibrate")


@pytest.mark.slow
def test_a_damaged_run_folder_is_a_run_folder_error(swept, tmp_path):
    import shutil

    _refused(RunFolderError, lambda: kvphase.load_run(tmp_path / "nowhere"), "nowhere")
    damaged = tmp_path / "damaged"
    shutil.copytree(swept[0].path, damaged)
    (damaged / "config.json").write_text('{"stride": ')
    _refused(RunFolderError, lambda: kvphase.load_run(damaged), "config.json")
    _refused(RunFolderError, lambda: kvphase.compare([swept[0], damaged], out=tmp_path / "both"), "config.json")
    shutil.copy(swept[0].path / "config.json", damaged / "config.json")
    with open(damaged / "results.csv", "a") as rows:
        rows.write("x,0,0,0,0,0,True,-1.0,k,a,a\n")
    _refused(RunFolderError, lambda: kvphase.load_run(damaged), "results.csv")
    (damaged / "results.csv").write_text((swept[0].path / "results.csv").read_text().splitlines()[0] + "\n")
    _refused(RunFolderError, lambda: kvphase.load_run(damaged), "no scored targets")
