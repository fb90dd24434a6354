"""Damaged training folders: every kind of damage is refused in one line before anything
trains (or, for what a kill mid-write leaves, repaired), never a traceback and never rows
of two runs mixed."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from kvphase.cli import app

pytest.importorskip("jax", reason="the training extra is installed by make test; CI runs these")

ARGS = ["--layers", "1", "--heads", "2", "--d-model", "16", "--context", "40", "--batch", "4", "--steps", "4",
        "--eval-every", "2", "-q"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-step run (evaluations at 2 and 4), trained once for every case."""
    folder = tmp_path_factory.mktemp("train") / "run"
    result = CliRunner().invoke(app, ["train", "dense", str(folder), *ARGS])
    assert result.exit_code == 0, result.output
    return folder


def _edit_checkpoint(change):
    def edit(folder):
        path = folder / "checkpoint.npz"
        with np.load(path) as saved:
            arrays = dict(saved)
        change(arrays)
        with open(path, "wb") as f:  # np.savez on a path would add .npz to a name it does not end in
            np.savez(f, **arrays)
    return edit


def _replace_with_folder(name):
    def edit(folder):
        (folder / name).unlink()
        (folder / name).mkdir()
    return edit


def _write(name, data: bytes):
    return lambda folder: (folder / name).write_bytes(data)


def _substitute(name, old, new):
    return lambda folder: (folder / name).write_text((folder / name).read_text().replace(old, new, 1))


DAMAGE = {
    "checkpoint truncated": (lambda f: (f / "checkpoint.npz").write_bytes((f / "checkpoint.npz").read_bytes()[:500]),
                             "checkpoint {folder}/checkpoint.npz is damaged (File is not a zip file)"),
    "checkpoint empty": (_write("checkpoint.npz", b""), "checkpoint {folder}/checkpoint.npz is damaged (No data left"),
    "checkpoint random bytes": (_write("checkpoint.npz", np.random.default_rng(0).bytes(4000)), "is damaged ("),
    "checkpoint a folder": (_replace_with_folder("checkpoint.npz"), "{folder}/checkpoint.npz is not a file"),
    "checkpoint of another shape": (_edit_checkpoint(lambda a: a.update(leaf0=np.zeros((3, 3), np.float32))),
                                    "is damaged (array 0: float32[3, 3], expected float32["),
    "checkpoint of text": (_edit_checkpoint(lambda a: a.update(leaf0=a["leaf0"].astype(str))), "is damaged (array 0: <U"),
    "checkpoint of NaN": (_edit_checkpoint(lambda a: a.update(leaf0=a["leaf0"] * np.nan)),
                          "is damaged (array 0: non-finite values)"),
    "checkpoint step negative": (_edit_checkpoint(lambda a: a.update(step=np.int64(-5))),
                                 "is damaged (step -5, expected a whole number from 0 to 4)"),
    "checkpoint step past the run": (_edit_checkpoint(lambda a: a.update(step=np.int64(10**9))),
                                     "is damaged (step 1000000000, expected a whole number from 0 to 4)"),
    "checkpoint without its step": (_edit_checkpoint(lambda a: a.pop("step")), "arrays, this configuration saves"),
    "checkpoint with objects": (_edit_checkpoint(lambda a: a.update(leaf0=np.array([{}], dtype=object))),
                                "Object arrays cannot be loaded"),
    "results random bytes": (_write("results.csv", b"\xbb\xff" + bytes(100) + b"\n"),
                             "{folder}/results.csv byte 0: not UTF-8 text"),
    "results a folder": (_replace_with_folder("results.csv"), "{folder}/results.csv is not a file"),
    "results step not a number": (_substitute("results.csv", "\n2,", "\nabc,"),
                                  "{folder}/results.csv line 2: step is 'abc', expected a whole number >= 0"),
    "results step a fraction": (_substitute("results.csv", "\n2,", "\n2.5,"), "line 2: step is '2.5'"),
    "results count infinite": (_write("results.csv", b"step,residue,phase,n,correct,logprob\n2,0,0,inf,1,-1.0\n"),
                               "{folder}/results.csv line 2: n is 'inf', expected a finite number"),
    "results without columns": (_write("results.csv", b"step,residue\n2,0\n"),
                                "{folder}/results.csv lacks columns: correct, logprob, n, phase"),
    "training random bytes": (_write("training.csv", b"\xf8" * 50 + b"\n"), "{folder}/training.csv byte 0: not UTF-8"),
    "training a folder": (_replace_with_folder("training.csv"), "{folder}/training.csv is not a file"),
    "config of wrong types": (_substitute("config.json", '"stride": 4', '"stride": "four"'),
                              "config.json: stride is 'four', expected a whole number"),
    "config a folder": (_replace_with_folder("config.json"), "{folder}/config.json is not a file"),
    "manifest a list": (_write("manifest.json", b"[1, 2]"), "{folder}/manifest.json: expected a JSON object, found list"),
    "manifest random bytes": (_write("manifest.json", b"\xe1\x01\x02"), "{folder}/manifest.json byte 0: not UTF-8"),
    "manifest time not a number": (_substitute("manifest.json", '"wall_time_s": ', '"wall_time_s": "x", "old": '),
                                   "{folder}/manifest.json: wall_time_s is 'x', expected a number"),
    "model a folder": (_replace_with_folder("model.gguf"), "{folder}/model.gguf is not a file"),
    "summary a folder": (_replace_with_folder("summary.json"), "{folder}/summary.json is not a file"),
    "report a folder": (_replace_with_folder("report.md"), "{folder}/report.md is not a file"),
    "curve a folder": (_replace_with_folder("training_curve.png"), "{folder}/training_curve.png is not a file"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_training_folder_is_refused_in_one_line_before_training(finished, tmp_path, damage):
    folder = tmp_path / "run"
    shutil.copytree(finished, folder)
    edit, message = DAMAGE[damage]
    edit(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    result = CliRunner().invoke(app, ["train", "dense", str(folder), *ARGS])
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("Error: "), result.output
    assert message.format(folder=folder) in result.output
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before, "a refused folder was written"


@pytest.mark.parametrize("damage", ["results step not a number", "results count infinite", "results without columns",
                                    "summary a folder", "report a folder", "curve a folder"])
def test_report_on_a_damaged_training_folder_is_one_line(finished, tmp_path, damage):
    folder = tmp_path / "run"
    shutil.copytree(finished, folder)
    edit, message = DAMAGE[damage]
    edit(folder)
    result = CliRunner().invoke(app, ["report", str(folder)])
    assert result.exit_code == 1 and message.format(folder=folder) in result.output, result.output


def test_half_a_row_and_rows_past_the_checkpoint_are_what_a_kill_leaves_and_are_repaired(finished, tmp_path):
    """A kill after an evaluation's rows but before its checkpoint, and one in the middle of
    writing a row: the resume drops both and writes the rows of an uninterrupted run."""
    from kvphase.train.config import TrainConfig
    from kvphase.train.run import train

    folder = tmp_path / "run"
    config = TrainConfig.for_design("dense", layers=1, heads=2, d_model=16, context=40, batch=4, steps=4, eval_every=2)

    def stop_at_3(metrics):
        if metrics.step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, folder, on_step=stop_at_3)  # checkpoint at step 3, rows of step 2
    with (folder / "results.csv").open("a") as f:
        f.write("4,0,0,16,3,-1.5\n4,1,1,1")  # an evaluation the checkpoint never followed, and a row cut mid-write
    result = CliRunner().invoke(app, ["train", "dense", str(folder), *ARGS])
    assert result.exit_code == 0, result.output
    assert (folder / "results.csv").read_text() == (finished / "results.csv").read_text()
    steps = [[line.split(",")[0] for line in (run / "training.csv").read_text().splitlines()] for run in (folder, finished)]
    assert steps[0] == steps[1]
