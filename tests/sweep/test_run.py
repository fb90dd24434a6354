"""Run folders: resume after an interruption, refuse a different plan, rebuild the report."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from kvphase.errors import PlanError, RunFolderError
from kvphase.gguf.modelinfo import read_model_info
from kvphase.runfolder import RunLock, write_atomic
from kvphase.sweep.report import build_report
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.contexts import build_contexts, plan_fingerprint
from kvphase.sweep.run import execute_sweep, load_plan, load_results
from kvphase.sweep.tasks import load_task
from tests.helpers.fakes import CharBackend
from tests.helpers.paths import REPO, TRAINED


@pytest.fixture
def info(default_model):
    return read_model_info(default_model)


def _plan(info, **changes):
    fields = dict(model=str(info.path), task="records", stride=4, modulus=8, context=1500, per_residue=8,
                  padding="prefix", seed=1, control=True, backend="fake")
    fields.update(changes)
    return SweepPlan(**fields)


def test_interrupted_run_keeps_finished_rows_and_resumes_without_duplicates(tmp_path, info):
    plan = _plan(info)
    with pytest.raises(KeyboardInterrupt):
        execute_sweep(plan, CharBackend(interrupt_after=2), tmp_path, info)
    partial = load_results(tmp_path)
    assert len(partial) > 0 and len(partial) < 64
    backend = CharBackend()
    full = execute_sweep(plan, backend, tmp_path, info)
    raw = pd.read_csv(tmp_path / "results.csv")
    assert len(raw) == len(full) == 64 == raw["target_id"].nunique()
    assert len(backend.scored) == 64 - len(partial)  # finished targets are not scored again
    uninterrupted = execute_sweep(plan, CharBackend(), tmp_path / "fresh", info)
    assert full.sort_values("target_id")["correct"].tolist() == uninterrupted.sort_values("target_id")["correct"].tolist()
    assert json.loads((tmp_path / "manifest.json").read_text())["sessions"] == 2


def test_a_half_written_row_is_dropped_and_rescored(tmp_path, info):
    plan = _plan(info)
    execute_sweep(plan, CharBackend(), tmp_path, info)
    path = tmp_path / "results.csv"
    text = path.read_text()
    path.write_text(text[: text.rfind("\n", 0, len(text) - 1) + 1] + "63,9,3,3,1")  # crash mid-row
    backend = CharBackend()
    results = execute_sweep(plan, backend, tmp_path, info)
    assert len(results) == 64 and len(backend.scored) == 1


@pytest.mark.parametrize("damage, fragment", [
    (b"garbage,,,,,,,,,,\n", "target_id is 'garbage', expected a whole number >= 0"),
    (b"\xff\xfe\x00 not text\n", "byte 4[0-9]+: not UTF-8 text"),
    (b"1" + b"0" * 400 + b",,,,,,,,,,\n", "target_id is '1000+', expected a whole number >= 0"),  # past a float
    (b"2.5,,,,,,,,,,\n", "target_id is '2.5', expected a whole number >= 0"),
])
def test_a_damaged_results_file_is_named_not_a_traceback(tmp_path, info, damage, fragment):
    execute_sweep(_plan(info, per_residue=1), CharBackend(), tmp_path, info)
    with (tmp_path / "results.csv").open("ab") as results:
        results.write(damage)
    with pytest.raises(RunFolderError, match=fragment):
        load_results(tmp_path)


@pytest.mark.parametrize("column, value, fragment", [
    ("target_id", "inf", "target_id is 'inf', expected a whole number >= 0"),  # resume died on int(inf)
    ("target_pos", "-3", "target_pos is '-3', expected a whole number >= 0"),
    ("logprob", "nan", "logprob is 'nan', expected a finite number"),
    ("correct", "2", "correct is '2', expected True or False"),  # counted as wrong, silently
    ("correct", "maybe", "correct is 'maybe', expected True or False"),
])
def test_a_results_cell_outside_its_domain_is_named(tmp_path, info, column, value, fragment):
    execute_sweep(_plan(info, per_residue=1), CharBackend(), tmp_path, info)
    path = tmp_path / "results.csv"
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    frame.loc[2, column] = value
    frame.to_csv(path, index=False)
    with pytest.raises(RunFolderError, match=f"line 4: {fragment}"):
        load_results(tmp_path)


def test_a_folder_with_a_different_plan_is_refused(tmp_path, info):
    execute_sweep(_plan(info), CharBackend(), tmp_path, info)
    with pytest.raises(RunFolderError, match="differs in: modulus, stride"):
        execute_sweep(_plan(info, stride=2, modulus=4), CharBackend(), tmp_path, info)


def test_report_is_rebuilt_from_config_and_results_alone(tmp_path, info):
    execute_sweep(_plan(info), CharBackend(), tmp_path, info)
    first = build_report(tmp_path)
    summary_text = (tmp_path / "summary.json").read_text()
    for name in ["summary.json", "report.md", "accuracy_by_residue.png", "manifest.json"]:
        (tmp_path / name).unlink()
    again = build_report(tmp_path)
    assert again == first
    assert (tmp_path / "summary.json").read_text() == summary_text
    report = (tmp_path / "report.md").read_text()
    assert report.splitlines()[2].startswith("**") and "control run" in report
    assert (tmp_path / "accuracy_by_residue.png").read_bytes()[:4] == b"\x89PNG"


def test_results_have_the_documented_columns(tmp_path, info):
    results = execute_sweep(_plan(info, padding="in-sequence"), CharBackend(), tmp_path, info)
    for column in ["residue", "phase", "target_pos", "correct", "logprob", "answer", "predicted"]:
        assert column in results.columns
    assert (results["target_pos"] % 8 == results["residue"]).all()
    assert (results["query_pos"] == 1500).all()


@pytest.mark.parametrize("column, change", [("target_pos", lambda v: v + 1), ("key", lambda v: v + "x"),
                                            ("answer", lambda v: v + "x"), ("context", lambda v: v + 1)])
def test_rows_from_a_different_context_layout_are_refused(tmp_path, info, column, change):
    plan = _plan(info)
    execute_sweep(plan, CharBackend(), tmp_path, info)
    path = tmp_path / "results.csv"
    frame = pd.read_csv(path, keep_default_na=False)
    frame.loc[3, column] = change(frame.loc[3, column])
    frame.to_csv(path, index=False)
    # a position off by one is a residue the position cannot have: refused by the rows' check against the plan
    with pytest.raises(RunFolderError, match="not the one this version of kvphase plans|plan cannot have made this row"):
        execute_sweep(plan, CharBackend(), tmp_path, info)


def test_rows_scored_on_contexts_built_differently_are_refused(tmp_path, info):
    """The manifest keeps a fingerprint of every context's tokens: rows scored on other filler
    (another kvphase or tokenizer version) have the same positions and keys, and must not mix."""
    plan = _plan(info)
    with pytest.raises(KeyboardInterrupt):
        execute_sweep(plan, CharBackend(interrupt_after=2), tmp_path, info)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    contexts = build_contexts(load_task(plan.task), CharBackend(), plan.context_settings)
    assert manifest["plan_sha256"] == plan_fingerprint(contexts)
    manifest["plan_sha256"] = "0" * 64
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RunFolderError, match="builds differently"):
        execute_sweep(plan, CharBackend(), tmp_path, info)
    (tmp_path / "manifest.json").unlink()  # a first session killed before its manifest: the rows decide
    assert len(execute_sweep(plan, CharBackend(), tmp_path, info)) == 64


def test_a_folder_scored_with_another_model_file_is_refused(tmp_path, info):
    """A retrained model saved under the same name (same size, other weights) must not add its
    rows to the old model's; the same file copied elsewhere resumes."""
    model = tmp_path / "models" / info.path.name
    model.parent.mkdir()
    shutil.copyfile(info.path, model)
    ours = read_model_info(model)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        execute_sweep(_plan(ours), CharBackend(interrupt_after=2), run, ours)
    moved = tmp_path / "elsewhere" / model.name
    moved.parent.mkdir()
    shutil.copyfile(model, moved)  # same bytes, another path and modification time
    with pytest.raises(KeyboardInterrupt):
        execute_sweep(_plan(read_model_info(moved)), CharBackend(interrupt_after=1), run, read_model_info(moved))
    with model.open("r+b") as f:  # same size, one weight byte changed
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(RunFolderError, match="scored with another model file"):
        execute_sweep(_plan(ours), CharBackend(), run, read_model_info(model))


# --------------------------------------------------------------------------- locks, atomic writes, damaged files

HOLD_LOCK = """
import sys, time
from kvphase.runfolder import RunLock
with RunLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)
"""


def _lock_holder(folder):
    """A process that holds the folder's lock until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_folder_another_process_holds_is_refused_and_a_killed_holder_is_stale(tmp_path, info):
    holder = _lock_holder(tmp_path)
    try:
        with pytest.raises(RunFolderError, match=rf"in use by another sweep \(pid {holder.pid} on "):
            execute_sweep(_plan(info), CharBackend(), tmp_path, info)
        assert not (tmp_path / "config.json").exists() and not (tmp_path / "results.csv").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with RunLock(tmp_path) as lock:  # the kernel dropped the killed holder's lock; its note stays
        assert lock.stale.startswith(f"pid {holder.pid} on ")
        execute_sweep(_plan(info), CharBackend(), tmp_path, info)
    with RunLock(tmp_path) as lock:
        assert lock.stale is None  # a clean release leaves no holder behind
    assert len(load_results(tmp_path)) == 64


def test_a_plan_that_cannot_be_built_leaves_no_config_behind(tmp_path, info):
    run_dir = tmp_path / "run"
    with pytest.raises(PlanError, match="no room for targets"):
        execute_sweep(_plan(info, context=120, stride=2, modulus=4, per_residue=1), CharBackend(), run_dir, info)
    assert not run_dir.exists()  # created for the lock, and removed with it
    execute_sweep(_plan(info), CharBackend(), run_dir, info)  # the corrected plan is not "a different run"
    assert load_plan(run_dir) == _plan(info)


def test_config_manifest_and_summary_are_replaced_whole(tmp_path, info, monkeypatch):
    execute_sweep(_plan(info, per_residue=1), CharBackend(), tmp_path, info)
    before = (tmp_path / "manifest.json").read_text()

    def crash(*args):
        raise KeyboardInterrupt  # killed between writing the new file and renaming it

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "manifest.json", "{half")
    assert (tmp_path / "manifest.json").read_text() == before


def _damage(folder, name, content):
    path = folder / name
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)


@pytest.mark.parametrize("name, content, fragment", [
    ("config.json", b"\xff\xfe binary", r"config.json byte 0: not UTF-8 text"),
    ("config.json", b'{"model": "m.gguf", "task"', r"config.json line 1 column 27: Expecting ':' delimiter"),
    ("config.json", b"[1, 2]", r"config.json: expected a JSON object, found list"),
    ("config.json", None, r"config.json is a directory"),
    ("config.json", b"[" * 100_000, r"config.json: JSON nested too deeply|config.json line 1"),
    ("manifest.json", b"\x00\x01", r"manifest.json line 1 column 1"),
    ("manifest.json", b'{"sessions": "many"}', r"manifest.json: sessions is 'many', expected a number"),
    ("manifest.json", b'{"model": 5}', r"manifest.json: model is '5', expected an object"),
    ("manifest.json", None, r"manifest.json is a directory"),
    ("results.csv", None, r"results.csv is not a file"),
])
def test_a_damaged_file_is_named_before_anything_runs(tmp_path, info, name, content, fragment):
    execute_sweep(_plan(info, per_residue=1), CharBackend(), tmp_path, info)
    _damage(tmp_path, name, content)
    backend = CharBackend()
    with pytest.raises(RunFolderError, match=fragment):
        execute_sweep(_plan(info, per_residue=1), backend, tmp_path, info)
    assert backend.calls == 0


@pytest.mark.parametrize("change, fragment", [
    ({"modulus": 0}, "--modulus must be a multiple of the stride 4, got 0"),
    ({"stride": "4"}, "stride is '4', expected int"),
    ({"stride": True}, "stride is 'True', expected int"),
    ({"per_residue": 10**12}, "--per-residue 1000000000000 asks for"),
    ({"surprise": 1}, "unexpected keyword argument 'surprise'"),
    ({"backend_options": []}, "backend_options is '[]', expected dict"),
])
def test_invalid_settings_in_a_config_are_refused_with_the_field(tmp_path, info, change, fragment):
    execute_sweep(_plan(info, per_residue=1), CharBackend(), tmp_path, info)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(RunFolderError, match=re.escape(fragment)):
        load_plan(tmp_path)


def test_report_names_an_output_that_is_in_the_way(tmp_path, info):
    execute_sweep(_plan(info, per_residue=1), CharBackend(), tmp_path, info)
    _damage(tmp_path, "report.md", None)
    with pytest.raises(RunFolderError, match="report.md is not a file"):
        build_report(tmp_path)


# --------------------------------------------------------------------------- real sweeps, killed and raced

# the tiny llama: what a kill does to a run folder does not depend on the model, and its 128 targets
# (about 30 contexts, milliseconds each) leave room to kill the sweep after any number of rows
SWEEP_ARGS = ["--context", "512", "--per-residue", "16", "--quiet", "--threads", "1"]
N_TARGETS = 128


def _sweep(model, out, *extra):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "kvphase.cli", "sweep", str(model), *SWEEP_ARGS, "--out", str(out),
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def _wait_for_lock(proc, out) -> None:
    while proc.poll() is None and not ((out / ".lock").is_file() and (out / ".lock").stat().st_size):
        time.sleep(0.005)


def _rows(folder) -> int:
    path = folder / "results.csv"
    return max(0, path.read_bytes().count(b"\n") - 1) if path.is_file() else 0


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_llama):
    out = tmp_path_factory.mktemp("whole") / "run"
    proc = _sweep(tiny_llama, out)
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kill_after_rows", [0, 1, 4])
def test_a_sweep_killed_at_any_point_resumes_to_the_uninterrupted_results(tmp_path, tiny_llama, uninterrupted,
                                                                          kill_after_rows):
    """SIGKILL while the model loads (0 rows) or after some contexts; the lock it leaves is
    stale, and the resumed results.csv is byte-identical to a run never interrupted."""
    out = tmp_path / "run"
    proc = _sweep(tiny_llama, out)
    _wait_for_lock(proc, out)
    while proc.poll() is None and _rows(out) < kill_after_rows:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert _rows(out) < N_TARGETS, "the sweep finished before it could be killed"
    assert (out / ".lock").read_text().startswith("pid ")
    resumed = _sweep(tiny_llama, out)
    _, stderr = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, stderr
    assert "ended without releasing it; resuming" in " ".join(stderr.split())  # rich wraps the line
    assert (out / "results.csv").read_bytes() == (uninterrupted / "results.csv").read_bytes()
    assert (out / "summary.json").read_bytes() == (uninterrupted / "summary.json").read_bytes()


@pytest.mark.slow
def test_two_sweeps_on_one_folder_one_runs_the_other_is_refused(tmp_path, tiny_llama, uninterrupted):
    out = tmp_path / "run"
    first = _sweep(tiny_llama, out)
    _wait_for_lock(first, out)
    first.send_signal(signal.SIGSTOP)  # it holds the folder, however fast the tiny model runs, until the second gives up
    second = _sweep(tiny_llama, out)
    _, refusal = second.communicate(timeout=900)
    first.send_signal(signal.SIGCONT)
    _, stderr = first.communicate(timeout=900)
    assert first.returncode == 0, stderr
    assert second.returncode == 1 and refusal.count("\n") == 1, refusal
    assert f"is in use by another sweep (pid {first.pid} on " in refusal
    assert (out / "results.csv").read_bytes() == (uninterrupted / "results.csv").read_bytes()
    assert build_report(out).n_targets == N_TARGETS


def test_two_trained_models_get_default_run_folders_of_their_own(tmp_path):
    """Every `kvphase train` folder holds a model.gguf: the default folder takes the training
    folder's name, so sweeping two of them never mixes their rows (issue 41)."""
    from kvphase.sweep.run import default_run_dir

    gated = TRAINED / "gated.gguf"
    names = []
    for run in ("gated-S4-seed0", "gated-S4-seed1"):
        (tmp_path / run).mkdir()
        shutil.copyfile(gated, tmp_path / run / "model.gguf")
        info = read_model_info(tmp_path / run / "model.gguf")
        plan = SweepPlan(str(info.path), "records", 4, 8, 64, 16, "prefix", 0, False)
        names.append(default_run_dir(info, plan).name)
    assert names == ["gated-S4-seed0-records-S4-L64", "gated-S4-seed1-records-S4-L64"]
    assert read_model_info(gated).short_name == "gated"  # any other file keeps its own name
