"""A full disk at every write of every command that writes (issue 42): one line naming the
folder and the lack of space, exit 1, nothing finished lost, and the same command run again
with room finishes with the results of a run that never met the fault.

The disk is `tests.faults.FillingDisk` (portable: Python's file writes draw on a byte budget);
`test_a_real_small_file_system_*` runs the sweep on a real 20 KiB tmpfs where the machine lets an
unprivileged user namespace mount one. Probes and training: tests/runfolder/test_full_disk_probes.py.
`--stride all` and `--calibrate` write with the sweep's and `compare`'s code, faulted here; the
fuzz campaign's `disk` category runs them whole on a small tmpfs (each costs 10-20 s a run).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.gguf.tiny import write_tiny_model
from tests.helpers.cli_checks import one_line_error
from tests.helpers.faults import ENOSPC_TEXT, FillingDisk, fill_the_disk_at_every_site, table_rows

# one round of 256-token contexts: the files and write sites of a 512-token run (9 budgets either way), 25% less CPU
SWEEP = ["--context", "256", "--contexts", "8", "--threads", "1", "--quiet"]
RESULTS = lambda out: table_rows(out / "results.csv")  # noqa: E731
runner = CliRunner()


def test_a_sweep_meets_a_full_disk_at_every_write_and_resumes_to_the_same_rows(tiny_llama, tmp_path):
    disk = fill_the_disk_at_every_site(tmp_path, lambda out: ["sweep", tiny_llama, *SWEEP, "--out", out], RESULTS)
    written = {Path(w.file).name for w in disk.writes}
    assert written == {".lock", "config.json", "results.csv", "manifest.json", "summary.json", "report.md",
                       "accuracy_by_residue.png"}  # every file a sweep writes met the fault


def test_a_sweep_through_the_reference_meets_a_full_disk_in_its_rows(tiny_llama, tmp_path):
    fill_the_disk_at_every_site(tmp_path, lambda out: ["sweep", tiny_llama, *SWEEP, "--backend", "reference",
                                                       "--out", out], RESULTS, only={"results.csv"})


def test_an_offset_ensemble_meets_a_full_disk_in_its_shifts_table(tiny_llama, tmp_path):
    kept = lambda out: (table_rows(out / "results.csv"), table_rows(out / "offsets.csv"))  # noqa: E731
    fill_the_disk_at_every_site(tmp_path, lambda out: ["sweep", tiny_llama, *SWEEP, "--offsets", "2", "--out", out],
                                kept, only={"offsets.csv"})  # mid-way through its rows: results.csv lacks that context


@pytest.fixture(scope="module")
def finished_runs(tiny_llama, tmp_path_factory):
    """Two finished sweeps (seeds 0 and 1) for report and compare to write beside."""
    runs = []
    for seed in (0, 1):
        out = tmp_path_factory.mktemp("runs") / f"seed{seed}"
        result = runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--seed", str(seed), "--out", str(out)])
        assert result.exit_code == 0, result.output
        runs.append(out)
    return runs


def test_report_meets_a_full_disk_and_leaves_the_rows_alone(finished_runs, tmp_path):
    def copy_then_report(out: Path) -> list[str]:
        if not out.exists():
            shutil.copytree(finished_runs[0], out)
        return ["report", out]

    summary = lambda out: json.loads((out / "summary.json").read_text())  # noqa: E731
    fill_the_disk_at_every_site(tmp_path, copy_then_report, lambda out: (RESULTS(out), summary(out)))


def test_compare_meets_a_full_disk_at_each_of_its_files(finished_runs, tmp_path):
    disk = fill_the_disk_at_every_site(tmp_path, lambda out: ["compare", *finished_runs, "--out", out],
                                       lambda out: table_rows(out / "comparison.csv", drop=("run_dir",)))
    assert {w.file for w in disk.writes} == {"comparison.csv", "comparison.png", "comparison.md"}


def test_make_tiny_meets_a_full_disk_and_leaves_no_half_model(tmp_path):
    disk = fill_the_disk_at_every_site(tmp_path, lambda out: ["make-tiny", "deepseek4", out / "m.gguf"],
                                       lambda out: (out / "m.gguf").read_bytes(), root=lambda out: out)
    assert len(disk.budgets()) >= 2
    with FillingDisk(tmp_path / "half", 1000):
        one_line_error(runner.invoke(app, ["make-tiny", "llama", str(tmp_path / "half" / "m.gguf")]), ENOSPC_TEXT)
    assert not list((tmp_path / "half").iterdir())  # the temporary file went with the failure


# -- a real file system that fills up ---------------------------------------------------------

def _user_namespaces_mount() -> bool:
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


REAL_FS = """
set -u
mount -t tmpfs -o size={size} tmpfs {mnt}
{kvphase} sweep {model} {args} --out {mnt}/run > {log}/full.out 2> {log}/full.err; echo $? > {log}/full.rc
mount -o remount,size=64m tmpfs {mnt}
{kvphase} sweep {model} {args} --out {mnt}/run > {log}/again.out 2> {log}/again.err; echo $? > {log}/again.rc
cp {mnt}/run/results.csv {log}/results.csv
"""


@pytest.mark.skipif(shutil.which("unshare") is None or not _user_namespaces_mount(),
                    reason="this machine lets no user namespace mount a tmpfs (the portable tests above still run)")
def test_a_real_small_file_system_ends_the_sweep_in_one_line_and_the_resume_completes(tiny_llama, tmp_path):
    """A 20 KiB tmpfs holds the config and some rows; the kernel's own ENOSPC ends the sweep."""
    args = " ".join(SWEEP)
    clean = tmp_path / "clean"
    assert runner.invoke(app, ["sweep", str(tiny_llama), *SWEEP, "--out", str(clean)]).exit_code == 0
    (tmp_path / "mnt").mkdir()
    script = REAL_FS.format(size="20k", mnt=tmp_path / "mnt", model=tiny_llama, args=args, log=tmp_path,
                            kvphase=f"{sys.executable} -m kvphase.cli")
    subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "bash", "-c", script], check=True, timeout=600)
    full_err = (tmp_path / "full.err").read_text()
    assert (tmp_path / "full.rc").read_text().strip() == "1", full_err
    assert len(full_err.strip().splitlines()) == 1 and ENOSPC_TEXT in full_err and "/run/" in full_err, full_err
    assert (tmp_path / "again.rc").read_text().strip() == "0", (tmp_path / "again.err").read_text()
    assert table_rows(tmp_path / "results.csv") == table_rows(clean / "results.csv")
