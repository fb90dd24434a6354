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
import platform
import time
from pathlib import Path
from typing import Callable

import numpy as np

from kvphase import __version__
from kvphase.errors import PlanError, RunFolderError
from kvphase.sweep.run import make_folder, write_atomic
from kvphase.train.config import TrainConfig
from kvphase.train.loop import Evaluation, StepMetrics, Trainer

CONFIG_FILE, RESULTS_FILE, TRAINING_FILE = "config.json", "results.csv", "training.csv"
CHECKPOINT_FILE, MODEL_FILE, MANIFEST_FILE = "checkpoint.npz", "model.gguf", "manifest.json"
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
    saved = out / CONFIG_FILE
    if saved.is_file():
        old = load_train_config(out)
        if old != config:
            changed = sorted(k for k, v in config.to_json().items() if old.to_json().get(k) != v)
            raise RunFolderError(f"{out} holds a different training run (differs in {', '.join(changed)}); choose another OUT")


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


def _keep_rows_up_to(path: Path, step: int) -> None:
    """After resuming from a checkpoint at `step`, rows from later (lost) steps go."""
    if not path.is_file():
        return
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    header = path.read_text().splitlines()[0].split(",") if path.stat().st_size else []
    kept = [r for r in rows if r.get("step", "").isdigit() and int(r["step"]) <= step]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(kept)


def _append(path: Path, columns: list[str], rows: list[dict]) -> None:
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def train(config: TrainConfig, out: Path, on_start: Callable[[int, int], None] = lambda total, done: None,
          on_step: Callable[[StepMetrics], None] = lambda m: None) -> Trainer:
    """Train (or resume) into `out`; returns the trainer. Ctrl-C saves a checkpoint and re-raises."""
    check_train_dir(out, config)
    trainer = Trainer.new(config)  # the task and the extra are checked before the folder is written
    make_folder(out)
    write_atomic(out / CONFIG_FILE, json.dumps({"kind": "train", **config.to_json()}, indent=2) + "\n")
    checkpoint = out / CHECKPOINT_FILE
    if checkpoint.is_file():
        trainer.load(checkpoint)
    for name in (RESULTS_FILE, TRAINING_FILE):
        _keep_rows_up_to(out / name, trainer.step)
    on_start(config.steps, trainer.step)
    t0, losses = time.perf_counter(), []

    def step_done(metrics: StepMetrics) -> None:
        losses.append((metrics.loss, metrics.accuracy, metrics.steps_per_s))
        on_step(metrics)

    def evaluated(evaluation: Evaluation) -> None:
        trainer.save(checkpoint)
        _append(out / RESULTS_FILE, RESULT_COLUMNS, evaluation_rows(evaluation, config))
        mean = np.mean(losses, axis=0) if losses else (np.nan, np.nan, np.nan)
        _append(out / TRAINING_FILE, TRAINING_COLUMNS, [{"step": evaluation.step, "loss": round(float(mean[0]), 5),
                                                          "accuracy": round(float(mean[1]), 5),
                                                          "steps_per_s": round(float(mean[2]), 2)}])
        losses.clear()

    started = trainer.step
    try:
        trainer.run(config.steps, step_done, evaluated)
    except KeyboardInterrupt:
        trainer.save(checkpoint)
        raise
    from kvphase.train.export import export_gguf

    export_gguf(out / MODEL_FILE, trainer.params, config, trainer.data.vocab, trainer.step)
    _update_manifest(out, time.perf_counter() - t0, trainer.step - started)
    return trainer


def _update_manifest(out: Path, wall_s: float, steps: int) -> None:
    import jax
    import optax

    path = out / MANIFEST_FILE
    try:
        old = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        old = {}
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
    write_atomic(path, json.dumps(manifest, indent=2) + "\n")
