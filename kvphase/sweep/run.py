"""A sweep as files: plan -> probes -> backend -> results.csv (appended as it goes) ->
summary.json, report.md, figure, manifest.json.

A run folder describes itself (`config.json`) and resumes: rows already in
`results.csv` are never scored again, and a folder that holds a different plan is
refused rather than mixed.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from kvphase import __version__
from kvphase.backends.base import Backend
from kvphase.errors import RunFolderError
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.sweep.placement import ProbeContext, Target, build_probes
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.tasks import load_task

RESULT_COLUMNS = ["target_id", "context", "residue", "phase", "target_pos", "query_pos", "correct", "logprob",
                  "key", "answer", "predicted"]
NUMERIC_COLUMNS = ["target_id", "context", "residue", "phase", "target_pos", "query_pos", "logprob"]
CONFIG_FILE, RESULTS_FILE, SUMMARY_FILE, MANIFEST_FILE = "config.json", "results.csv", "summary.json", "manifest.json"


def default_run_dir(info: ModelInfo, plan: SweepPlan) -> Path:
    """reports/<model>-<task>-S<stride>-L<context>, plus the reference design and its options."""
    name = f"{info.short_name}-{plan.task}-S{plan.stride}-L{plan.context}"
    if plan.backend == "reference":
        options = plan.backend_options
        name += "-ref-" + "-".join([str(options.get("design", "dense"))] + [
            f"{k}{v}" for k, v in sorted(options.items()) if k in ("stagger", "randomize", "local_window") and v])
    return Path("reports") / name


def check_run_dir(run_dir: Path, plan: SweepPlan) -> None:
    """RunFolderError unless `run_dir` is new, or a folder that holds this same plan."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"{run_dir} is a file, not a run folder; choose another --out")
    if (run_dir / CONFIG_FILE).exists():
        existing = load_plan(run_dir).comparable()
        if existing != plan.comparable():
            differing = sorted(k for k, v in plan.comparable().items() if existing.get(k) != v)
            raise RunFolderError(f"{run_dir} holds a different run (differs in: {', '.join(differing)}); "
                                 f"choose another --out or delete the folder")


def prepare_run_dir(run_dir: Path, plan: SweepPlan) -> None:
    """Create the folder and its config, or check that an existing one holds the same plan."""
    check_run_dir(run_dir, plan)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(json.dumps(asdict(plan), indent=2) + "\n")


def load_plan(run_dir: Path) -> SweepPlan:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise RunFolderError(f"{run_dir} is not a run folder: {CONFIG_FILE} is missing")
    try:
        return SweepPlan(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as exc:
        raise RunFolderError(f"{path} is not a valid run config ({exc})") from None


def load_results(run_dir: Path) -> pd.DataFrame:
    """The scored rows so far (an empty frame with the right columns when none)."""
    path = run_dir / RESULTS_FILE
    if not path.is_file() or path.stat().st_size == 0:
        return pd.DataFrame(columns=RESULT_COLUMNS)
    try:
        text = _complete_lines(path.read_bytes()).decode("utf-8")
        frame = pd.read_csv(io.StringIO(text), keep_default_na=False, dtype={"key": str, "answer": str, "predicted": str})
    except (UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise RunFolderError(f"{path} is not a readable results file ({str(exc).splitlines()[0]})") from None
    missing = set(RESULT_COLUMNS) - set(frame.columns)
    if missing:
        raise RunFolderError(f"{path} lacks columns: {', '.join(sorted(missing))}")
    for column in NUMERIC_COLUMNS:
        values = pd.to_numeric(frame[column], errors="coerce")  # (n_rows,)
        if values.isna().any():
            row = int(values.isna().to_numpy().argmax())
            raise RunFolderError(f"{path} line {row + 2}: {column} is {frame[column].iloc[row]!r}, expected a number")
        frame[column] = values
    frame["correct"] = frame["correct"].astype(str).str.lower().isin(["true", "1"])
    return frame.drop_duplicates("target_id", keep="first")


class ResultWriter:
    """Appends rows to results.csv and flushes after each context, so nothing finished is lost."""

    def __init__(self, path: Path):
        new = not path.exists() or path.stat().st_size == 0
        if not new:
            _drop_partial_last_line(path)
        self._file = path.open("a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=RESULT_COLUMNS)
        if new:
            self._writer.writeheader()

    def write(self, rows: Iterable[dict]) -> None:
        self._writer.writerows(rows)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _complete_lines(data: bytes) -> bytes:
    """A crash mid-write can leave half a row; only whole lines count."""
    return data[: data.rfind(b"\n") + 1]


def _drop_partial_last_line(path: Path) -> None:
    data = path.read_bytes()
    if _complete_lines(data) != data:
        path.write_bytes(_complete_lines(data))


@dataclass
class SweepProgress:
    """Callbacks a front end can hook; the library itself prints nothing."""

    start: Callable[[int, int], None] = lambda total, done: None
    advance: Callable[[int], None] = lambda n: None


def execute_sweep(plan: SweepPlan, backend: Backend, run_dir: Path, info: ModelInfo,
                  progress: SweepProgress | None = None) -> pd.DataFrame:
    """Score every planned target not already in the folder; return all results."""
    progress = progress or SweepProgress()
    prepare_run_dir(run_dir, plan)
    started = time.time()
    contexts = build_probes(load_task(plan.task), backend, plan.probe_settings)
    done = _check_finished_rows_match(load_results(run_dir), contexts, run_dir)
    total = sum(len(c.targets) for c in contexts)
    progress.start(total, len(done))  # every finished row is a planned target, checked above
    writer = ResultWriter(run_dir / RESULTS_FILE)
    tokens_before = getattr(backend, "tokens_evaluated", 0)
    try:
        for context in contexts:
            todo = [t for t in context.targets if t.target_id not in done]
            if not todo:
                continue
            scores = backend.score(context.tokens, [t.query for t in todo])
            writer.write(_result_row(t, s, len(context.tokens), backend) for t, s in zip(todo, scores))
            progress.advance(len(todo))
    finally:
        writer.close()
        _update_manifest(run_dir, info, plan, time.time() - started,
                         getattr(backend, "tokens_evaluated", 0) - tokens_before)
    return load_results(run_dir)


def _check_finished_rows_match(results: pd.DataFrame, contexts: list[ProbeContext], run_dir: Path) -> set[int]:
    """The finished target ids, after checking each still names the same position and key
    (a different kvphase version could build different probes from the same plan)."""
    planned = {t.target_id: (t.position, t.key) for c in contexts for t in c.targets}
    for row in results.itertuples(index=False):
        if planned.get(int(row.target_id)) != (int(row.target_pos), str(row.key)):
            raise RunFolderError(f"{run_dir}: target {row.target_id} in {RESULTS_FILE} is not the one this version "
                                 f"of kvphase plans; finish it with the version that started it or use a new --out")
    return set(results["target_id"].astype(int))


def _result_row(target: Target, score, query_pos: int, backend: Backend) -> dict:
    return {
        "target_id": target.target_id,
        "context": target.context_index,
        "residue": target.residue,
        "phase": target.phase,
        "target_pos": target.position,
        "query_pos": query_pos,
        "correct": score.correct,
        "logprob": round(score.logprob, 6),
        "key": target.key,
        "answer": target.answer,
        "predicted": backend.detokenize(score.predicted).strip(),
    }


def file_sha256(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _update_manifest(run_dir: Path, info: ModelInfo, plan: SweepPlan, wall_s: float, tokens: int) -> None:
    """manifest.json: model identity and what this folder cost, summed over resumed sessions."""
    import llama_cpp
    import numpy

    path = run_dir / MANIFEST_FILE
    old = json.loads(path.read_text()) if path.exists() else {}
    sha = old.get("model", {}).get("sha256") if old.get("model", {}).get("size") == info.file_size else None
    manifest = {
        "model": {"file": info.path.name, "size": info.file_size, "sha256": sha or file_sha256(info.path),
                  "name": info.name, "architecture": info.architecture, "quantization": info.quantization},
        "compression": asdict(info.compression),
        "backend": plan.backend,
        "backend_options": plan.backend_options,
        "versions": {"kvphase": __version__, "llama-cpp-python": llama_cpp.__version__, "numpy": numpy.__version__,
                     "pandas": pd.__version__, "python": platform.python_version()},
        "host": {"machine": platform.machine(), "system": platform.system(), "node": platform.node(),
                 "processor": platform.processor()},
        "wall_time_s": round(old.get("wall_time_s", 0.0) + wall_s, 2),
        "tokens_evaluated": old.get("tokens_evaluated", 0) + tokens,
        "sessions": old.get("sessions", 0) + 1,
    }
    path.write_text(json.dumps(manifest, indent=2) + "\n")


__all__ = ["SweepPlan", "execute_sweep", "load_plan", "load_results", "default_run_dir", "ProbeContext"]
