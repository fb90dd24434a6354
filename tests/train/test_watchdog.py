"""A training step that never returns ends the run in one line with its checkpoint kept
(kvphase/train/watchdog.py), and time the process spent stopped is not taken for a hang."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from kvphase.train.watchdog import Watchdog


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watched_for(limit_s: float, clock: FakeClock) -> Watchdog:
    """A watchdog whose thread is never started: the test looks as its thread would."""
    return Watchdog(limit_s, on_stall=lambda idle: None, clock=clock)


def test_idle_time_counts_from_the_last_beat_once_the_first_came():
    clock = FakeClock()
    watchdog = watched_for(100.0, clock)  # looks every 5 s
    for _ in range(100):  # the first step compiling, however long
        clock.now += 5.0
        assert watchdog.idle() == 0.0
    for _ in range(10):
        clock.now += 4.0
        watchdog.beat()
        assert watchdog.idle() == 0.0
    for looks in range(1, 31):
        clock.now += 5.0
        assert watchdog.idle() == 5.0 * looks


def test_time_the_process_spent_stopped_is_not_counted():
    """A process stopped for an hour (Ctrl-Z) wakes its watching thread once, an hour after its
    last look; in that look the step it was running has run for one poll, not an hour."""
    clock = FakeClock()
    watchdog = watched_for(100.0, clock)
    watchdog.beat()
    clock.now += 5.0
    assert watchdog.idle() == 5.0
    clock.now += 3600.0
    assert watchdog.idle() == pytest.approx(10.0)
    clock.now += 5.0
    assert watchdog.idle() == pytest.approx(15.0)


def test_the_thread_reports_a_stall_once_and_never_while_beats_come():
    stalls = []
    with Watchdog(0.4, on_stall=stalls.append) as watchdog:  # looks every 0.02 s
        time.sleep(0.8)  # before the first beat: not watched
        assert stalls == [], f"a stall reported before the first beat: {stalls}"
        for _ in range(40):
            time.sleep(0.01)
            watchdog.beat()
        assert stalls == [], f"a stall reported while beats came every 0.01 s: {stalls}"
        deadline = time.monotonic() + 10
        while not stalls and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(stalls) == 1 and stalls[0] > 0.4, stalls


# `kvphase train OUT` with the lightning indexer's top-k (a host callback inside the jitted step, where the
# hang it guards against was seen) blocking for good once the run saved its first checkpoint: XLA waits forever
HANGING_TRAIN = """
import pathlib, sys, threading
import kvphase.train.csa as csa
chosen, checkpoint = csa._llamacpp_top_k, pathlib.Path(sys.argv[3]) / "checkpoint.npz"
def hang(*args):
    if checkpoint.exists():
        threading.Event().wait()
    return chosen(*args)
csa._llamacpp_top_k = hang
from kvphase.cli import main
sys.argv = ["kvphase", *sys.argv[1:]]
main()
"""
TRAIN = ["train", "csa", "--top-k", "2", "--dense-steps", "0", "--d-model", "16", "--batch", "4", "--steps", "10",
         "--context", "32", "--eval-every", "5", "-q"]


@pytest.mark.slow
def test_a_step_that_never_returns_ends_the_run_in_one_line_and_the_same_command_resumes(tmp_path):
    out = tmp_path / "run"
    hung = subprocess.run([sys.executable, "-c", HANGING_TRAIN, *TRAIN[:2], str(out), *TRAIN[2:], "--stall-minutes", "0.1"],
                          capture_output=True, text=True, timeout=120)
    assert hung.returncode == 1, (hung.returncode, hung.stderr[-600:])
    lines = hung.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: training made no progress for "), hung.stderr[-600:]
    assert "after step 5 of 10" in lines[0] and "its checkpoint at step 5 is kept" in lines[0], lines[0]
    assert not (out / "model.gguf").exists()
    resumed = subprocess.run([sys.executable, "-m", "kvphase.cli", *TRAIN[:2], str(out), *TRAIN[2:]],
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-600:]
    assert (out / "model.gguf").is_file()
    assert [line.split(",")[0] for line in (out / "training.csv").read_text().splitlines()] == ["step", "5", "10"]


def test_the_stall_limit_is_an_option_that_refuses_a_negative_value():
    from typer.testing import CliRunner

    from kvphase.cli import app

    result = CliRunner().invoke(app, ["train", "csa", "--stall-minutes", "-1"])
    assert result.exit_code == 2 and "--stall-minutes" in result.output, result.output


def test_the_library_refuses_a_stall_limit_that_is_not_above_zero(tmp_path):
    from kvphase.errors import PlanError
    from kvphase.train.config import TrainConfig
    from kvphase.train.run import train

    for limit in (0.0, -60.0, float("nan")):
        with pytest.raises(PlanError, match="--stall-minutes must be above 0"):
            train(TrainConfig.for_design("gated", steps=1), tmp_path / "run", on_stall=print, stall_limit_s=limit)
    assert not (tmp_path / "run").exists()
