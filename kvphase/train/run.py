"""A training run folder: like a sweep's, it describes itself, keeps what is finished and resumes.

    OUT/config.json       the TrainConfig (`kind: train`)
    OUT/results.csv       one row per (evaluation step, residue): n, correct, mean log-probability
    OUT/training.csv      one row per evaluation: step, training loss and accuracy since the last one
    OUT/checkpoint.npz    weights, optimiser state and step, rewritten at every evaluation and on Ctrl-C
    OUT/model.gguf        the trained model (`kvphase sweep OUT/model.gguf` measures it)
    OUT/summary.json, report.md, training_curve.png, manifest.json

Running the same command again resumes from the checkpoint; a folder holding another
configuration is refused rather than mixed.
"""

from __future__ import annotations

import csv
import json
import math
import platform
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from kvphase import __version__
from kvphase.errors import Interrupted, PlanError, RunFolderError
from kvphase.runfolder import (CONFIG_FILE, MANIFEST_FILE, REPORT_FILE, SUMMARY_FILE, check_writable, make_folder,
                               numbers_in, read_json_object, read_table, write_csv, write_json, writing)
from kvphase.train.config import TrainConfig
from kvphase.train.loop import Evaluation, StepMetrics, Trainer
from kvphase.train.watchdog import STALL_LIMIT_S, TrainingStalled, Watchdog

RESULTS_FILE, TRAINING_FILE, CHECKPOINT_FILE = "results.csv", "training.csv", "checkpoint.npz"
MODEL_FILE, CURVE_FILE = "model.gguf", "training_curve.png"
FOLDER_FILES = (CONFIG_FILE, RESULTS_FILE, TRAINING_FILE, CHECKPOINT_FILE, MODEL_FILE,
                MANIFEST_FILE, SUMMARY_FILE, REPORT_FILE, CURVE_FILE)
MANIFEST_NUMBERS = ("wall_time_s", "steps_trained", "sessions")
RESULT_COLUMNS = ["step", "residue", "phase", "n", "correct", "logprob"]
TRAINING_COLUMNS = ["step", "loss", "accuracy", "steps_per_s"]


def default_train_dir(config: TrainConfig) -> Path:
    fixes = "" if config.stagger == "none" else f"-stagger-{config.stagger}"
    fixes += "" if config.offsets == "fixed" else f"-offsets-{config.offsets}"
    return Path("reports") / "trained" / f"{config.design}-S{config.stride}{fixes}-seed{config.seed}"


def check_train_dir(out: Path, config: TrainConfig) -> None:
    """Refuse a folder that cannot be written or that holds another run; before anything trains."""
    if out.exists() and not out.is_dir():
        raise PlanError(f"{out} exists and is not a folder")
    parent = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not parent.is_dir() or not _writable(parent):
        raise PlanError(f"cannot write the run folder {out}: {parent} is not a writable folder")
    if not out.is_dir():
        return
    check_writable(out, FOLDER_FILES)
    if (out / CONFIG_FILE).is_file():
        old = load_train_config(out)
        if old != config:
            changed = sorted(k for k, v in config.to_json().items() if old.to_json().get(k) != v)
            raise RunFolderError(f"{out} holds a different training run (differs in {', '.join(changed)}); choose another OUT")
    for name, columns in ((RESULTS_FILE, RESULT_COLUMNS), (TRAINING_FILE, TRAINING_COLUMNS)):
        if (out / name).is_file():
            load_csv(out / name, columns)
    load_train_manifest(out)


def _writable(folder: Path) -> bool:
    import os

    return os.access(folder, os.W_OK | os.X_OK)


def load_train_config(out: Path) -> TrainConfig:
    path = out / CONFIG_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunFolderError(f"{path} is not a readable training config ({exc})") from None
    if not isinstance(data, dict) or data.pop("kind", None) != "train":
        raise RunFolderError(f"{path} is not a training run's config (no \"kind\": \"train\")")
    return TrainConfig.from_json(data)


def is_train_dir(out: Path) -> bool:
    try:
        return json.loads((out / CONFIG_FILE).read_text()).get("kind") == "train"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False


def evaluation_rows(evaluation: Evaluation, config: TrainConfig) -> list[dict]:
    """Per-residue tallies of one evaluation (residue = key position mod 2S)."""
    modulus = 2 * config.stride
    residues = evaluation.key_positions % modulus  # (n,)
    rows = []
    for r in range(modulus):
        hit = residues == r
        rows.append({"step": evaluation.step, "residue": r, "phase": r % config.stride, "n": int(hit.sum()),
                     "correct": int(evaluation.correct[hit].sum()),
                     "logprob": round(float(evaluation.logprob[hit].mean()) if hit.any() else 0.0, 5)})
    return rows


def load_csv(path: Path, columns: list[str]) -> pd.DataFrame:
    """One of a training folder's tables, finite numbers everywhere and whole, non-negative
    steps; RunFolderError naming the file, the line and the problem."""
    frame = read_table(path, columns)
    for column in columns:
        frame[column] = numbers_in(path, frame, column, whole=column == "step")
    return frame


def load_train_manifest(out: Path) -> dict:
    """manifest.json ({} before the first session ends); RunFolderError when a number it sums is damaged."""
    path = out / MANIFEST_FILE
    if not path.exists():
        return {}
    manifest = read_json_object(path)
    for name in MANIFEST_NUMBERS:
        value = manifest.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise RunFolderError(f"{path}: {name} is {str(value)[:40]!r}, expected a number; delete the file "
                                 "(it records times and versions) and the next session writes a new one")
    return manifest


def _keep_rows_up_to(path: Path, columns: list[str], step: int) -> None:
    """After resuming from a checkpoint at `step`, rows from later (lost) steps go."""
    if not path.is_file():
        return
    frame = load_csv(path, columns)
    kept = frame[frame["step"] <= step][columns]
    raw = path.read_bytes()
    whole = raw.endswith(b"\n") and raw.count(b"\n") == len(frame) + 1  # no half row a kill or a full disk left
    if len(kept) < len(frame) or not whole:  # else as it is: a finished run run again keeps its files byte for byte
        write_csv(path, kept)


def _append(path: Path, columns: list[str], rows: list[dict]) -> None:
    new = not path.exists() or path.stat().st_size == 0
    with writing(path), path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def train(config: TrainConfig, out: Path, on_start: Callable[[int, int], None] = lambda total, done: None,
          on_step: Callable[[StepMetrics], None] = lambda m: None,
          on_stall: Callable[[TrainingStalled], None] | None = None, stall_limit_s: float = STALL_LIMIT_S) -> Trainer:
    """Train (or resume) into `out`; returns the trainer. SIGINT or SIGTERM saves a checkpoint
    and raises Interrupted. With `on_stall`, a run with no step or evaluation finished for
    `stall_limit_s` hands it a TrainingStalled from another thread (the main one is stuck: only
    ending the process helps; the last checkpoint is kept)."""
    if on_stall is not None and not stall_limit_s > 0:
        raise PlanError(f"--stall-minutes must be above 0 (0: no limit), not {stall_limit_s / 60:g}")
    check_train_dir(out, config)
    checkpoint = out / CHECKPOINT_FILE
    with stop_requests() as requested:
        trainer = _resume(config, out)
        on_start(config.steps, trainer.step)
        t0, started = time.perf_counter(), trainer.step
        with _watched(trainer, on_stall, stall_limit_s) as beat:
            try:
                trainer.run(config.steps, *_recorders(trainer, out, on_step, beat), should_stop=lambda: bool(requested))
            except KeyboardInterrupt:  # a second signal, which stops at once
                trainer.save(checkpoint)
                raise
    if requested and trainer.step < config.steps:
        trainer.save(checkpoint)
        raise Interrupted(f"training stopped at step {trainer.step} of {config.steps} with its checkpoint saved; "
                          "run the same command again to resume.", requested[0])
    from kvphase.train.export import export_gguf

    export_gguf(out / MODEL_FILE, trainer.params, config, trainer.data.vocab, trainer.step)
    _update_manifest(out, time.perf_counter() - t0, trainer.step - started)
    return trainer


@contextmanager
def _watched(trainer: Trainer, on_stall: Callable[[TrainingStalled], None] | None, limit_s: float):
    """Yields the beat the recorders call after each step and evaluation; a Watchdog behind it
    when there is someone to tell."""
    if on_stall is None:
        yield lambda: None
        return

    def stalled(idle_s: float) -> None:
        saved = ("no checkpoint was saved yet" if trainer.saved_step is None
                 else f"its checkpoint at step {trainer.saved_step} is kept")
        on_stall(TrainingStalled(
            f"training made no progress for {idle_s:.0f} s after step {trainer.step} of {trainer.config.steps} (a step "
            f"or evaluation that never returned: XLA can hang so, jax issues 24255 and 25861); {saved}: run the same "
            "command again to resume."))

    with Watchdog(limit_s, stalled) as watchdog:
        yield watchdog.beat


def _resume(config: TrainConfig, out: Path) -> Trainer:
    """A trainer at the folder's checkpoint (step 0 without one), its tables cut back to that step."""
    trainer = Trainer.new(config)  # the task and the extra are checked before the folder is written
    resuming = (out / CHECKPOINT_FILE).is_file()
    if config.init and not resuming:
        trainer.start_from(_init_checkpoint(config), load_train_config(Path(config.init)))
    make_folder(out)
    write_json(out / CONFIG_FILE, {"kind": "train", **config.to_json()})
    if resuming:
        trainer.load(out / CHECKPOINT_FILE)
    for name, columns in ((RESULTS_FILE, RESULT_COLUMNS), (TRAINING_FILE, TRAINING_COLUMNS)):
        _keep_rows_up_to(out / name, columns, trainer.step)
    return trainer


def _init_checkpoint(config: TrainConfig) -> Path:
    """The checkpoint `--init` names, from a run folder of the same design; PlanError otherwise."""
    source = Path(config.init)
    if not (source / CHECKPOINT_FILE).is_file():
        raise PlanError(f"--init {source}: no {CHECKPOINT_FILE} there; give a run folder kvphase train wrote (its "
                        "checkpoint is kept after the run)")
    design = load_train_config(source).design
    if design != config.design:
        raise PlanError(f"--init {source} trained {design}; this run trains {config.design}")
    return source / CHECKPOINT_FILE


def _recorders(trainer: Trainer, out: Path, on_step: Callable[[StepMetrics], None], beat: Callable[[], None]):
    """(after each step, after each evaluation): the step's metrics gathered, then each
    evaluation's rows appended and the checkpoint saved; each tells `beat` of the progress."""
    losses = []

    def step_done(metrics: StepMetrics) -> None:
        beat()
        losses.append((metrics.loss, metrics.accuracy, metrics.steps_per_s))
        on_step(metrics)

    def evaluated(evaluation: Evaluation) -> None:
        # rows first, then the checkpoint: a kill between them leaves rows past the checkpoint,
        # which the resume drops and writes again, never a checkpoint whose rows are missing
        _append(out / RESULTS_FILE, RESULT_COLUMNS, evaluation_rows(evaluation, trainer.config))
        if losses:
            mean = np.mean(losses, axis=0)
            _append(out / TRAINING_FILE, TRAINING_COLUMNS, [{"step": evaluation.step, "loss": round(float(mean[0]), 5),
                                                              "accuracy": round(float(mean[1]), 5),
                                                              "steps_per_s": round(float(mean[2]), 2)}])
        trainer.save(out / CHECKPOINT_FILE)
        losses.clear()
        beat()

    return step_done, evaluated


@contextmanager
def stop_requests():
    """SIGINT and SIGTERM ask the training loop to stop between two steps; yields the signals
    received. A KeyboardInterrupt raised in the middle of a step, while XLA still runs it,
    could crash the interpreter on its way out (SIGSEGV after the checkpoint was saved);
    between steps nothing is in flight. A second signal stops at once."""
    received: list[int] = []

    def request(signum, frame) -> None:
        if received:
            raise KeyboardInterrupt
        received.append(signum)

    if threading.current_thread() is not threading.main_thread():  # only the main thread may take signals
        yield received
        return
    previous = {signum: signal.signal(signum, request) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _update_manifest(out: Path, wall_s: float, steps: int) -> None:
    import jax
    import optax

    path = out / MANIFEST_FILE
    old = load_train_manifest(out)
    if old and not steps:  # a finished run run again: no session to record
        return
    manifest = {
        "model": {"file": MODEL_FILE, "size": (out / MODEL_FILE).stat().st_size},
        "versions": {"kvphase": __version__, "jax": jax.__version__, "optax": optax.__version__,
                     "numpy": np.__version__, "python": platform.python_version()},
        "host": {"machine": platform.machine(), "system": platform.system(), "node": platform.node(),
                 "processor": platform.processor()},
        "wall_time_s": round(old.get("wall_time_s", 0.0) + wall_s, 2),
        "steps_trained": old.get("steps_trained", 0) + steps,
        "sessions": old.get("sessions", 0) + 1,
    }
    write_json(path, manifest)
