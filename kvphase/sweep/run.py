"""A sweep as files: plan -> contexts -> backend -> results.csv (appended as it goes) ->
summary.json, report.md, figure, manifest.json.

A run folder describes itself (`config.json`) and resumes: rows already in
`results.csv` are never scored again, and a folder that holds a different plan is
refused rather than mixed. One sweep at a time holds a folder (`RunLock`); config,
manifest and summary are replaced whole (`write_atomic`), and every file is checked
before a model loads, so a damaged one is named in one line instead of a traceback
(the lock, the writes and the checked reads are `kvphase.runfolder`'s).
"""

from __future__ import annotations

import csv
import functools
import math
import platform
import time
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pandas as pd

from kvphase import __version__
from kvphase.backends.base import Backend, NonFiniteScore, ServerFleet, score_contexts, usable_logprob
from kvphase.errors import PlanError, RunFolderError
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.runfolder import (CONFIG_FILE, MANIFEST_FILE, RunLock, check_writable, drop_partial_last_line, file_sha256,
                               flags_in, make_folder, numbers_in, read_json_object, read_table, write_csv, write_json,
                               writing)
from kvphase.runfolder.rows import check_planned_rows, refuse_repeated_rows
from kvphase.sweep.contexts import build_contexts, plan_fingerprint
from kvphase.sweep.layout import Context, Target
from kvphase.sweep.machine import machine_info
from kvphase.sweep.offsets import OFFSET_COLUMNS, OFFSETS_FILE, ShiftedScore, ShiftedScorer, score_shifted
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.selection import SelectionReader, file_indexer, score_selected, target_selection
from kvphase.sweep.tasks import load_task

RESULT_COLUMNS = ["target_id", "context", "residue", "phase", "target_pos", "query_pos", "correct", "logprob",
                  "key", "answer", "predicted"]
MISSING_LOGPROB = ""  # results.csv's logprob where the scoring route gave none (--scoring generate, a wrong answer)
NUMERIC_COLUMNS = ["target_id", "context", "residue", "phase", "target_pos", "query_pos", "logprob"]
RESULTS_FILE = "results.csv"
ANSWER_COLUMN = "answer_pos"  # where the answer's first token sits: len(context) + the query's tokens, filler included


def default_run_dir(info: ModelInfo, plan: SweepPlan) -> Path:
    """reports/<model>-<task>-S<stride>-L<context>, plus the reference design and its options,
    the server engine, or llama.cpp's cache type where it is not the default f16, and the phase
    shifts and selection records where the run has them."""
    name = f"{info.short_name}-{plan.task}-S{plan.stride}-L{plan.context}"
    if plan.backend == "llama.cpp" and plan.backend_options.get("cache_type", "f16") != "f16":
        name += f"-cache-{plan.backend_options['cache_type']}"
    if plan.backend == "reference":
        options = plan.backend_options
        name += "-ref-" + "-".join([str(options.get("design", "dense"))] + [
            f"{k}{v}" for k, v in sorted(options.items()) if k in ("stagger", "randomize", "local_window") and v])
    if plan.backend == "server":
        name += "-" + str(plan.backend_options.get("engine", "server"))
        if "scoring" in plan.backend_options:
            name += "-" + str(plan.backend_options["scoring"])
    return Path("reports") / (name + plan.offset_plan.folder_suffix() + ("-selection" if plan.selection else ""))


def check_run_dir(run_dir: Path, plan: SweepPlan, info: ModelInfo) -> None:
    """RunFolderError unless `run_dir` is new, or a folder that holds this same plan, scored
    with this same model file, with readable results and manifest."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"{run_dir} is a file, not a run folder; choose another --out")
    if (run_dir / CONFIG_FILE).exists() or (run_dir / CONFIG_FILE).is_symlink():
        existing = load_plan(run_dir).comparable()
        if existing != plan.comparable():
            differing = sorted(k for k, v in plan.comparable().items() if existing.get(k) != v)
            raise RunFolderError(f"{run_dir} holds a different run (differs in: {', '.join(differing)}); "
                                 f"choose another --out or delete the folder")
    check_planned_rows(run_dir / RESULTS_FILE, load_results(run_dir), plan)
    _check_same_model(run_dir, load_manifest(run_dir).get("model", {}), info)
    load_offsets(run_dir)
    check_writable(run_dir, [CONFIG_FILE, RESULTS_FILE, MANIFEST_FILE, OFFSETS_FILE])


def _check_same_model(run_dir: Path, recorded: dict, info: ModelInfo) -> None:
    """RunFolderError when the folder's rows were scored with another file than `info`'s: a
    retrained model of the same name and size would otherwise mix its rows with the old ones."""
    if not recorded.get("sha256") or _unchanged_sha256(recorded, info):
        return
    if recorded.get("size") != info.file_size or model_sha256(info.path) != recorded["sha256"]:
        raise RunFolderError(f"{run_dir} holds rows scored with another model file (sha256 "
                             f"{recorded['sha256'][:16]}..., {recorded.get('size')} bytes) than {info.path}; "
                             "choose another --out or delete the folder")


def _unchanged_sha256(recorded: dict, info: ModelInfo) -> str | None:
    """The sha256 the manifest recorded when the model file still has the size and modification
    time it had then (no need to read it whole), else None."""
    same = (recorded.get("size"), recorded.get("mtime_ns")) == (info.file_size, info.path.stat().st_mtime_ns)
    return recorded.get("sha256") if same else None


def prepare_run_dir(run_dir: Path, plan: SweepPlan) -> None:
    """Create the folder and write its config (after `check_run_dir` has accepted the folder)."""
    make_folder(run_dir)
    config = asdict(plan)
    # a plain sweep's config.json has no key for an option it does not use, so folders written
    # without these keys and the plans that reproduce them stay byte-identical
    if not plan.offsets:
        del config["offsets"]
    if not plan.selection:
        del config["selection"]
    if not plan.query_phases:
        del config["query_phases"]
    if not plan.answer_phases:
        del config["answer_phases"]
    write_json(run_dir / CONFIG_FILE, config)


def load_plan(run_dir: Path) -> SweepPlan:
    """The plan `config.json` holds; RunFolderError naming the field when it is damaged or invalid."""
    path = run_dir / CONFIG_FILE
    if not path.exists():
        raise RunFolderError(f"{run_dir} is not a run folder: {CONFIG_FILE} is missing")
    raw = read_json_object(path)
    try:
        plan = SweepPlan(**raw)
    except TypeError as exc:  # a missing or unknown field
        raise RunFolderError(f"{path}: {str(exc).replace('__init__() ', '').replace('SweepPlan.', '')}") from None
    except PlanError as exc:
        raise RunFolderError(f"{path}: {exc}") from None
    return plan


def load_manifest(run_dir: Path) -> dict:
    """manifest.json as a dict ({} when there is none yet), with the fields a resumed sweep adds
    to checked; RunFolderError naming the field when it is damaged."""
    path = run_dir / MANIFEST_FILE
    if not path.exists():
        return {}
    manifest = read_json_object(path)
    model = manifest.get("model", {})
    if not isinstance(model, dict) or not isinstance(model.get("sha256", ""), str):
        raise RunFolderError(f"{path}: model is {str(model)[:60]!r}, expected an object with a text sha256; "
                             "delete the file and the next sweep writes a new one")
    numbers = {"wall_time_s": manifest.get("wall_time_s", 0), "tokens_evaluated": manifest.get("tokens_evaluated", 0),
               "sessions": manifest.get("sessions", 0), "model.size": model.get("size", 0)}
    for name, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RunFolderError(f"{path}: {name} is {str(value)[:60]!r}, expected a number; "
                                 "delete the file and the next sweep writes a new one")
    return manifest


def load_results(run_dir: Path) -> pd.DataFrame:
    """The scored rows so far (an empty frame with the right columns when none)."""
    path = run_dir / RESULTS_FILE
    if not path.exists() and not path.is_symlink():
        return pd.DataFrame(columns=RESULT_COLUMNS)
    frame = read_table(path, RESULT_COLUMNS)
    missing = frame["logprob"] == MISSING_LOGPROB  # (rows,) a scoring route that gives none there
    for column in NUMERIC_COLUMNS:
        if column == "logprob":
            known = numbers_in(path, frame.assign(logprob=frame["logprob"].where(~missing, "0")), column)
            frame[column] = known.astype(float).where(~missing, float("nan"))
        else:
            frame[column] = numbers_in(path, frame, column, whole=True)
    frame["correct"] = flags_in(path, frame, "correct")
    if ANSWER_COLUMN in frame.columns:  # the answer's first position: planned-answer-phase folders only
        frame[ANSWER_COLUMN] = numbers_in(path, frame, ANSWER_COLUMN, whole=True)
    return refuse_repeated_rows(path, frame, ["target_id"])


def load_offsets(run_dir: Path) -> pd.DataFrame:
    """offsets.csv: each target's score under each shift (`sweep.offsets`); an empty frame when none."""
    path = run_dir / OFFSETS_FILE
    if not path.exists() and not path.is_symlink():
        return pd.DataFrame(columns=OFFSET_COLUMNS)
    frame = read_table(path, OFFSET_COLUMNS)
    for column in ("target_id", "shift", "logprob"):
        frame[column] = numbers_in(path, frame, column, whole=column != "logprob")
    frame["confidence"] = pd.to_numeric(frame["confidence"], errors="coerce")  # nan: one shift, none computed
    frame["correct"] = flags_in(path, frame, "correct")
    return refuse_repeated_rows(path, frame, ["target_id", "shift"])


class ResultWriter:
    """Appends rows to a CSV table (results.csv by default) and flushes after each context, so
    nothing finished is lost."""

    def __init__(self, path: Path, columns: list[str] = RESULT_COLUMNS):
        self.path = path
        if path.exists():  # a header a full disk cut short goes too, and is written again
            drop_partial_last_line(path)
        new = not path.exists() or path.stat().st_size == 0
        with writing(path):
            self._file = path.open("a", newline="")
            self._writer = csv.DictWriter(self._file, fieldnames=columns)
            if new:
                self._writer.writeheader()

    def write(self, rows: Iterable[dict]) -> None:
        with writing(self.path):
            self._writer.writerows(rows)
            self._file.flush()

    def close(self) -> None:
        """Closes the file; rows a full disk kept in the buffer are dropped, not retried: the
        failed write was reported, and the next session scores those targets again."""
        try:
            self._file.close()
        except OSError:
            pass


@dataclass
class SweepProgress:
    """Callbacks a front end can hook; the library itself prints nothing."""

    start: Callable[[int, int], None] = lambda total, done: None
    advance: Callable[[int], None] = lambda n: None


def execute_sweep(plan: SweepPlan, backend: Backend, run_dir: Path, info: ModelInfo,
                  progress: SweepProgress | None = None) -> pd.DataFrame:
    """Score every planned target not already in the folder; return all results."""
    progress = progress or SweepProgress()
    with RunLock(run_dir):
        return _execute_locked(plan, backend, run_dir, info, progress)


def _execute_locked(plan: SweepPlan, backend: Backend, run_dir: Path, info: ModelInfo,
                    progress: SweepProgress) -> pd.DataFrame:
    started = time.time()
    check_run_dir(run_dir, plan, info)
    contexts = build_contexts(load_task(plan.task), backend, plan.context_settings)
    fingerprint = plan_fingerprint(contexts)
    done = _check_finished_rows_match(load_results(run_dir), contexts, run_dir, fingerprint)
    prepare_run_dir(run_dir, plan)  # the config is written once the plan has proved buildable
    total = sum(len(c.targets) for c in contexts)
    progress.start(total, len(done))  # every finished row is a planned target, checked above
    selection_columns = [_selection_name(plan, c) for c in file_indexer(info).columns] if plan.selection else []
    planned_columns = [ANSWER_COLUMN] if plan.answer_phases else []
    writer = ResultWriter(run_dir / RESULTS_FILE, RESULT_COLUMNS + planned_columns + selection_columns)
    tokens_before = backend.tokens_evaluated
    pending = [(c, [t for t in c.targets if t.target_id not in done]) for c in contexts]
    pending = [(c, todo) for c, todo in pending if todo]

    def end_session() -> None:
        writer.close()
        _update_manifest(run_dir, info, plan, time.time() - started,
                         backend.tokens_evaluated - tokens_before, backend.engine_info(), backend.n_threads,
                         fingerprint)

    try:
        for index, scores, chosen in naming_targets(_scored_contexts(plan, backend, pending, run_dir, info), pending):
            context, todo = pending[index]  # as contexts finish; each row checked before any of its context's is written
            writer.write([_planned_row(plan, result_row(t, s, len(context.tokens), backend), c)
                          for t, s, c in zip(todo, scores, chosen)])
            progress.advance(len(todo))
    except BaseException:
        with suppress(RunFolderError):  # a full disk fails the manifest too: the first failure is the one to report
            end_session()
        raise
    end_session()
    return load_results(run_dir)


def _scored_contexts(plan: SweepPlan, backend: Backend, pending: list[tuple[Context, list[Target]]],
                     run_dir: Path, info: ModelInfo) -> Iterator[tuple[int, list, list[dict]]]:
    """(index into `pending`, its targets' scores, their selection columns) as contexts finish;
    under an offset plan each target's score under each shift goes to offsets.csv first (so a row
    in results.csv always has its shifts' rows), and the score is the combined one. `query_pos`
    stays the unshifted plan's. Selection columns ({} without --selection): `sweep.selection`."""
    offsets = plan.offset_plan
    jobs = [(c.tokens, [t.query for t in todo]) for c, todo in pending]
    if plan.selection:
        indexer = file_indexer(info)
        for index, scores, chosen in score_selected(SelectionReader(backend), jobs):
            context, todo = pending[index]
            yield index, scores, [target_selection(context.tokens, t, layers, indexer)
                                  for t, layers in zip(todo, chosen)]
        return
    if not offsets.active:
        for index, scores in score_contexts(backend, jobs):
            yield index, scores, [{}] * len(scores)
        return
    filler = backend.tokenize(load_task(plan.task).filler_text)
    scorer = ShiftedScorer(backend, offsets, filler, plan.seed, plan.stride)
    jobs = [(c.index, c.tokens, [t.query for t in todo]) for c, todo in pending]
    _drop_shifts_of(run_dir / OFFSETS_FILE, {t.target_id for _, todo in pending for t in todo})
    shift_writer = ResultWriter(run_dir / OFFSETS_FILE, OFFSET_COLUMNS)
    try:
        for index, combined, each in score_shifted(scorer, jobs):
            shift_writer.write([_offset_row(t, shifted, backend) for t, per_target in zip(pending[index][1], each)
                                for shifted in per_target])
            yield index, combined, [{}] * len(combined)
    finally:
        shift_writer.close()


def _drop_shifts_of(path: Path, targets: set[int]) -> None:
    """Shift rows of targets about to be scored again go first: a session that stopped between
    a context's offsets.csv rows and its results.csv rows (a kill, a full disk) left them."""
    if not path.is_file():
        return
    rows = read_table(path, OFFSET_COLUMNS)  # whole lines only: ResultWriter cuts a half one next
    stale = numbers_in(path, rows, "target_id", whole=True).isin(targets)
    if stale.any():
        write_csv(path, rows[~stale.to_numpy()][OFFSET_COLUMNS])


def _offset_row(target: Target, shifted: ShiftedScore, backend: Backend) -> dict:
    if not math.isfinite(shifted.score.logprob):
        raise NonFiniteScore(engine_name(backend), shifted.score.logprob, (), target.query,
                             f"{describe_target(target)} shifted by {shifted.shift}")
    return {"target_id": target.target_id, "shift": shifted.shift, "correct": shifted.score.correct,
            "logprob": round(shifted.score.logprob, 6), "confidence": round(shifted.confidence, 6),
            "predicted": backend.detokenize(shifted.score.predicted).strip()}


def _check_finished_rows_match(results: pd.DataFrame, contexts: list[Context], run_dir: Path,
                               fingerprint: str) -> set[int]:
    """The finished target ids, after checking they were scored on these very contexts (a
    different kvphase or tokenizer version could build other contexts from the same plan): the
    manifest's fingerprint of every context's tokens, and each row's context, position, key and
    answer (the manifest is written when a session ends, so a killed first session has none)."""
    recorded = load_manifest(run_dir).get("plan_sha256")
    if recorded and recorded != fingerprint:
        raise RunFolderError(f"{run_dir}: its rows were scored on contexts this version of kvphase builds "
                             f"differently (plan sha256 {str(recorded)[:16]}..., now {fingerprint[:16]}...); "
                             "finish it with the version that started it or use a new --out")
    planned = {t.target_id: (t.context_index, t.position, t.key, t.answer) for c in contexts for t in c.targets}
    for row in results.itertuples(index=False):
        if planned.get(int(row.target_id)) != (int(row.context), int(row.target_pos), str(row.key), str(row.answer)):
            raise RunFolderError(f"{run_dir}: target {row.target_id} in {RESULTS_FILE} is not the one this version "
                                 f"of kvphase plans; finish it with the version that started it or use a new --out")
    return set(results["target_id"].astype(int))


def naming_targets(scored: Iterator, contexts: list[tuple[Context, list[Target]]]) -> Iterator:
    """What `scored` yields; a NonFiniteScore an engine raised names the target among `contexts`
    ((context, its targets scored)) whose query it was."""
    try:
        yield from scored
    except NonFiniteScore as exc:
        target = next((t for c, todo in contexts if tuple(c.tokens) == exc.context for t in todo
                       if t.query == exc.query), None)
        raise (exc.at(describe_target(target)) if target else exc) from None


def describe_target(target: Target) -> str:
    return f"target {target.target_id} (context {target.context_index}, position {target.position}, key {target.key!r})"


def engine_name(backend: Backend) -> str:
    """How a refusal names the engine that scored: its servers' URLs, or its own name."""
    if isinstance(backend, ServerFleet):
        return ", ".join(server.url for server in backend.servers)
    return str(backend.engine_info().get("engine", type(backend).__name__))


def _selection_name(plan: SweepPlan, column: str) -> str:
    """A selection column's name: its `answer_pos` (the target record's value in the context) is
    `value_pos` where the row's `answer_pos` is the answer's own first position (answer phases)."""
    return "value_pos" if plan.answer_phases and column == ANSWER_COLUMN else column


def _planned_row(plan: SweepPlan, row: dict, selected: dict) -> dict:
    """A results.csv row as the plan's columns hold it: `answer_pos` only where the answer's phase was
    planned (folders written before keep their columns), and the selection columns."""
    if not plan.answer_phases:
        row = {k: v for k, v in row.items() if k != ANSWER_COLUMN}
    return row | {_selection_name(plan, k): v for k, v in selected.items()}


def result_row(target: Target, score, query_pos: int, backend: Backend) -> dict:
    """One `results.csv` row (RESULT_COLUMNS and `answer_pos`, the answer's first position: the context's
    length and the query's tokens, its filler included) of a scored target: the sweep's and conform's one
    writer of it; NonFiniteScore naming the engine and the target for a score that is not a finite number."""
    if not math.isfinite(score.logprob) and not usable_logprob(score, backend.engine_info().get("scoring", "forced")):
        raise NonFiniteScore(engine_name(backend), score.logprob, (), target.query, describe_target(target))
    return {
        "target_id": target.target_id,
        "context": target.context_index,
        "residue": target.residue,
        "phase": target.phase,
        "target_pos": target.position,
        "query_pos": query_pos,
        ANSWER_COLUMN: query_pos + len(target.query.prompt),
        "correct": score.correct,
        "logprob": round(score.logprob, 6) if math.isfinite(score.logprob) else MISSING_LOGPROB,
        "key": target.key,
        "answer": target.answer,
        "predicted": backend.detokenize(score.predicted).strip(),
    }


def model_sha256(path: Path) -> str:
    """sha256 of a model file, read once per size and modification time (a resumed sweep checks it
    before scoring and records it after). An HF checkpoint folder's: of its files' names and sha256s
    (config.json, the weights, the tokenizer's), in name order."""
    if path.is_dir():
        import hashlib

        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors"))
        return hashlib.sha256("".join(f"{p.name}:{model_sha256(p)}\n" for p in files).encode()).hexdigest()
    stat = path.stat()
    return _sha256_of(path.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _sha256_of(path: Path, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def _update_manifest(run_dir: Path, info: ModelInfo, plan: SweepPlan, wall_s: float, tokens: int,
                     engine: dict, threads: int | None = None, fingerprint: str | None = None) -> None:
    """manifest.json: model identity, the engine that scored (its own build info), the machine
    (of the latest session), and what this folder cost, summed over resumed sessions."""
    import numpy

    path = run_dir / MANIFEST_FILE
    old = load_manifest(run_dir)
    manifest = {
        "model": {"file": info.path.name, "size": info.file_size, "mtime_ns": info.path.stat().st_mtime_ns,
                  "sha256": _unchanged_sha256(old.get("model", {}), info) or model_sha256(info.path),
                  "name": info.name, "architecture": info.architecture, "quantization": info.quantization},
        "compression": asdict(info.compression),
        "backend": plan.backend,
        "backend_options": plan.backend_options,
        "engine": engine,
        "versions": {"kvphase": __version__, "numpy": numpy.__version__,
                     "pandas": pd.__version__, "python": platform.python_version()},
        "plan_sha256": fingerprint,  # the same on every machine (contexts.plan_fingerprint)
        "machine": machine_info(threads),
        "wall_time_s": round(old.get("wall_time_s", 0.0) + wall_s, 2),
        "tokens_evaluated": old.get("tokens_evaluated", 0) + tokens,
        "sessions": old.get("sessions", 0) + 1,
    }
    write_json(path, manifest)


__all__ = ["SweepPlan", "execute_sweep", "load_plan", "load_results", "load_manifest", "default_run_dir",
           "Context", "RESULT_COLUMNS", "result_row"]
