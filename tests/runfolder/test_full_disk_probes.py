"""A full disk at the writes of training, every probe and the theory model (issue 42): one line
naming the folder, exit 1, and the same command run again with room finishes with the rows
of a run that never met the fault (`tests.faults`). Sweeps, report, compare, make-tiny:
tests/runfolder/test_full_disk.py. A probe's sub-sweeps are sweeps: here only the probe's own files."""

from __future__ import annotations


from tests.helpers.faults import fill_the_disk_at_every_site, table_rows
from tests.helpers.paths import TRAINED

DATA = TRAINED
GATED = DATA / "gated.gguf"
TRAIN = ["--layers", "1", "--heads", "2", "--d-model", "16", "--context", "40", "--batch", "4", "--steps", "4",
         "--eval-every", "2", "-q"]


def test_training_meets_a_full_disk_at_every_write_and_resumes_to_the_same_rows(tmp_path):
    kept = lambda out: (table_rows(out / "results.csv"), table_rows(out / "training.csv", drop=("steps_per_s",)))  # noqa: E731
    disk = fill_the_disk_at_every_site(tmp_path, lambda out: ["train", "dense", out, *TRAIN], kept)
    assert {w.file for w in disk.writes} >= {"checkpoint.npz", "model.gguf", "results.csv", "training.csv",
                                             "training_curve.png", "report.md"}


def test_flip_meets_a_full_disk_at_every_write(tmp_path):
    fill_the_disk_at_every_site(tmp_path, lambda out: ["flip", GATED, "--threads", "1", "--out", out],
                                lambda out: table_rows(out / "results.csv"))


def test_gates_meets_a_full_disk_at_every_write(tmp_path):
    fill_the_disk_at_every_site(tmp_path, lambda out: ["gates", GATED, "--out", out],
                                lambda out: (table_rows(out / "results.csv"), table_rows(out / "phases.csv")))


def test_gate_activations_meets_a_full_disk_at_every_write(tmp_path):
    fill_the_disk_at_every_site(tmp_path, lambda out: ["gate-activations", GATED, "--contexts", "2", "--out", out],
                                lambda out: table_rows(out / "windows.csv"))


def test_cycle_meets_a_full_disk_at_its_own_files(tmp_path):
    fill_the_disk_at_every_site(tmp_path, lambda out: ["cycle", GATED, "--k", "1", "--per-residue", "8", "--threads",
                                                       "1", "--out", out],
                                lambda out: table_rows(out / "phases.csv"), only={"phases.csv", "cycling.png"})


def test_knockout_meets_a_full_disk_at_its_own_files(tmp_path):
    fill_the_disk_at_every_site(tmp_path, lambda out: ["knockout", GATED, "--per-residue", "8", "--layer", "0",
                                                       "--threads", "1", "--out", out],
                                lambda out: table_rows(out / "effects.csv"), only={"head_means.json", "effects.csv"})


def test_theory_meets_a_full_disk_at_every_write(tmp_path):
    """Its tables and one of its figures (the others are drawn by the same `figure`)."""
    fill_the_disk_at_every_site(tmp_path, lambda out: ["theory", "--steps", "100", "--components", "2", "--out", out,
                                                       "-q"], lambda out: table_rows(out / "trajectories.csv"),
                                only={"config.json", "trajectories.csv", "stability.csv", "accuracy.png", "report.md"})
