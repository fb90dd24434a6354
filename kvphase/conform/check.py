"""Each reference model through an engine, compared with its committed folder; the run folder.

Everything that can be refused is checked before anything is scored: the references' folders
(plan, results, the model's sha256), the plan building the very contexts the folder scored (its
manifest's fingerprint), and the engine answering for the model it is asked about. The run folder
is written once every model has run, so a run that stops leaves nothing half-written; a model the
engine could not run is "cannot run" with the engine's reason, never PASS.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import pandas as pd

from kvphase.backends.base import ServerFleet
from kvphase.conform.compare import DEFAULT_LOGPROB_TOLERANCE, DEFAULT_MARGIN, ModelCheck, compare_rows, paired_rows
from kvphase.conform.engine_ties import TieAccount
from kvphase.conform.paths import (MIN_ANSWER_MODULUS, SERVER_PATHS, PathCheck, cannot_run, large_blocks,
                                   model_paths, server_paths)
from kvphase.conform.references import ROOT, Reference
from kvphase.errors import BackendError, ModelFileError, PlanError, RunFolderError
from kvphase.gguf.modelinfo import ModelInfo, read_model_info
from kvphase.options_check import check_record
from kvphase.runfolder import SUMMARY_FILE, make_folder, read_json_object, write_atomic, write_csv, write_json
from kvphase.sweep.backend_setup import (BackendSettings, open_backend, server_connection, with_backend,
                                         with_reference_design)
from kvphase.sweep.notices import Say, log_notice
from kvphase.sweep.plan import SweepPlan

CONFORM_FILE = "conform.json"
REPORT_FILE = "report.md"
DEFAULT_CONTEXTS = 256  # contexts per model: a multiple of every reference's modulus (4 and 8)
REFERENCE_ARCHITECTURES = ("gpt2", "deepseek4", "glm5-next")  # what kvphase's numpy reference implements


@dataclass(frozen=True)
class EngineChoice:
    """The engine the options name and how much of each plan it runs."""

    backend: str = "llama.cpp"  # "llama.cpp", "reference", "server" or "transformers"
    urls: tuple[str, ...] = ()
    server_engine: str = "llama-server"
    threads: Optional[int] = None
    request_timeout: Optional[float] = None
    contexts: int = DEFAULT_CONTEXTS  # at most this many of a plan's contexts (whole rounds of residues); 0: all
    margin: float = DEFAULT_MARGIN
    logprob_tolerance: float = DEFAULT_LOGPROB_TOLERANCE

    def __post_init__(self) -> None:
        check_record(self)  # as sweep checks the options both take (--threads, --request-timeout)
        self.backend_settings  # the engine's name, as sweep checks it

    @property
    def backend_settings(self) -> BackendSettings:
        """How the backend runs, as a sweep's options say it (conform.json keeps this record's own names)."""
        return BackendSettings(url=self.urls, engine=self.server_engine, request_timeout=self.request_timeout,
                               threads=self.threads)


@dataclass(frozen=True)
class Prepared:
    """A reference ready to run: its file, the plan the engine runs, the contexts, the folder's rows."""

    reference: Reference
    info: ModelInfo
    plan: SweepPlan
    contexts: list  # Context, the first whole rounds of the folder's plan
    committed: pd.DataFrame  # the folder's results.csv
    committed_cis: dict  # residue -> the folder's 95% interval (percent)


@dataclass(frozen=True)
class Outcome:
    """One line of the table: PASS, FAIL or cannot run, and what was measured."""

    name: str
    status: str  # "PASS", "FAIL", "UNDECIDED" (every moved target after an indexer tie) or "cannot run"
    reason: str
    seconds: float
    check: Optional[ModelCheck] = None
    rows: Optional[pd.DataFrame] = None  # the engine's rows (results.csv columns)
    paths: tuple[PathCheck, ...] = ()  # each engine path against one prompt (kvphase.conform.paths)
    ties: Optional[TieAccount] = None  # through transformers: the moved targets an indexer tie explains

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "reason": self.reason, "seconds": round(self.seconds, 2),
                "check": self.check.to_json() if self.check else None, "paths": [p.to_json() for p in self.paths],
                "ties": self.ties.to_json() if self.ties else None}


def prepare(reference: Reference, choice: EngineChoice) -> Prepared:
    """The reference's plan retargeted to its file and the chosen engine, and the contexts it
    builds, checked against the folder (RunFolderError, ModelFileError) before any engine starts."""
    from kvphase.engines.llamacpp import Vocab
    from kvphase.sweep.contexts import build_contexts, plan_fingerprint
    from kvphase.sweep.run import load_manifest, load_plan, load_results, model_sha256
    from kvphase.sweep.tasks import load_task

    reference.config  # the folder holds its plan (a one-line error naming the reference otherwise)
    if not reference.model.is_file():
        raise ModelFileError(f"reference {reference.name}: no model file at {reference.model}")
    if model_sha256(reference.model) != reference.sha256:
        raise RunFolderError(f"reference {reference.name}: {reference.model} is not the file its folder scored "
                             f"(sha256 differs from {reference.folder / 'manifest.json'}'s); restore it")
    info = read_model_info(reference.model)
    plan = replace(load_plan(reference.folder), model=str(reference.model))
    contexts = build_contexts(load_task(plan.task), Vocab.load(info), plan.context_settings)
    recorded = load_manifest(reference.folder).get("plan_sha256")
    if recorded and recorded != plan_fingerprint(contexts):
        raise RunFolderError(f"reference {reference.name}: this kvphase builds other contexts from "
                             f"{reference.folder}'s plan than the folder scored; the comparison would be void")
    committed = load_results(reference.folder)
    return Prepared(reference, info, plan, _first_rounds(contexts, plan.modulus, choice.contexts), committed,
                    _committed_intervals(reference.folder))


def _first_rounds(contexts: list, modulus: int, wanted: int) -> list:
    """The first `wanted` contexts rounded down to whole rounds of `modulus` (each residue in each
    lane as often), all of them when `wanted` is 0 or at least their number."""
    if not wanted or wanted >= len(contexts):
        return contexts
    return contexts[:max(modulus, wanted - wanted % modulus)]


def _committed_intervals(folder: Path) -> dict:
    """residue -> (low, high), the folder's own 95% intervals from its summary.json."""
    path = folder / SUMMARY_FILE
    if not path.is_file():
        return {}
    rows = read_json_object(path).get("per_residue", [])
    return {int(r["residue"]): (float(r["ci_low"]), float(r["ci_high"])) for r in rows
            if isinstance(r, dict) and {"residue", "ci_low", "ci_high"} <= set(r)}


def engine_plan(prepared: Prepared, choice: EngineChoice) -> tuple[SweepPlan, dict]:
    """The plan as the chosen engine runs it, and where it runs (`connect`): sweep's own helpers."""
    plan = replace(prepared.plan, backend="llama.cpp", backend_options={})
    connect = server_connection(choice.backend, choice.backend_settings)
    if choice.backend == "reference":
        return with_reference_design(plan, "trained", {}, prepared.info.n_layer), connect
    if choice.backend == "transformers":  # its HF copy (`engine_model`), or the GGUF as transformers' GGUF reader loads it
        return replace(plan, backend="transformers"), connect
    return with_backend(plan, connect, choice.backend_settings), connect


HF_COPIES = ROOT / ".cache" / "hf-export"  # the references in HF layout, one folder per file hash


def engine_model(prepared: Prepared, choice: EngineChoice) -> ModelInfo:
    """The model the engine loads: for transformers, the reference in HF layout where export-hf writes its
    architecture (exported once into HF_COPIES), else the GGUF itself (transformers' GGUF reader)."""
    if choice.backend != "transformers":
        return prepared.info
    from kvphase.backends.hf_layout import LAYOUTS

    if prepared.info.architecture not in LAYOUTS:
        return prepared.info
    from kvphase.backends.hf_export import cached_checkpoint

    return read_model_info(cached_checkpoint(prepared.reference.model, prepared.reference.sha256, HF_COPIES))


def lacking(info: ModelInfo, choice: EngineChoice) -> str:
    """Why the engine cannot run this architecture at all ("" when it may)."""
    if choice.backend == "reference" and info.architecture not in REFERENCE_ARCHITECTURES:
        return f"kvphase's numpy reference has no {info.architecture} model (it runs {', '.join(REFERENCE_ARCHITECTURES)})"
    return ""


def run_reference(prepared: Prepared, choice: EngineChoice, advance: Callable[[int], None] = lambda n: None,
                  on_notice: Say = log_notice) -> Outcome:
    """Score the prepared contexts through the engine and compare; "cannot run" when the engine
    lacks the architecture or refuses to load the file. `on_notice` hears the backend's warnings
    (memory, a server lost)."""
    from kvphase.backends.base import NonFiniteScore, score_contexts
    from kvphase.sweep.run import RESULT_COLUMNS, naming_targets, result_row

    started = time.monotonic()
    name = prepared.reference.name
    why = lacking(prepared.info, choice)
    if why:
        return Outcome(name, "cannot run", why, 0.0)
    plan, connect = engine_plan(prepared, choice)
    try:
        info = engine_model(prepared, choice)
    except (PlanError, ModelFileError) as exc:
        return Outcome(name, "cannot run", f"no HF copy of {prepared.reference.model.name}: {exc}",
                       time.monotonic() - started)
    with ExitStack() as stack:
        try:
            backend = stack.enter_context(open_backend(plan, info, choice.threads, connect, on_notice))
        except (BackendError, ModelFileError) as exc:
            if choice.backend == "server":  # a server that does not answer, or serves another model: the check stops
                raise
            return Outcome(name, "cannot run", f"{plan.backend} cannot load {prepared.info.architecture}: {exc}",
                           time.monotonic() - started)
        check_served_model(backend, prepared.reference)
        jobs = [(c.tokens, [t.query for t in c.targets]) for c in prepared.contexts]
        rows = []
        try:
            for index, scores in naming_targets(score_contexts(backend, jobs),
                                                [(c, c.targets) for c in prepared.contexts]):
                context = prepared.contexts[index]
                rows += [result_row(t, s, len(context.tokens), backend) for t, s in zip(context.targets, scores)]
                advance(len(context.targets))
        except NonFiniteScore as exc:  # an engine that answers NaN fails the check; it is not a server gone away
            return Outcome(name, "FAIL", str(exc), time.monotonic() - started)
        paths = engine_paths(backend, prepared, choice)
        engine = pd.DataFrame(rows, columns=RESULT_COLUMNS).sort_values("target_id", ignore_index=True)
        check = compare_rows(name, prepared.reference.check, prepared.committed, engine, prepared.committed_cis,
                             choice.margin, choice.logprob_tolerance, seed=prepared.plan.seed)
        ties = tie_account(backend, prepared, choice, check, engine)
    status, reason = check.verdict, check.reason
    if ties is not None and status == "FAIL" and ties.every_one:  # each engine right by its own tie-break
        status = "UNDECIDED"
    if status == "FAIL":
        reason += answer_start_note(check, prepared, engine)
    if ties is not None:
        what = ("flags that differ" if check.check == "profile" else
                "targets whose log-probability moved beyond the tolerance")
        reason += ("; " if reason else "") + ties.phrase(what)
    return Outcome(name, status, reason, time.monotonic() - started, check, engine, tuple(paths), ties)


def tie_account(backend, prepared: Prepared, choice: EngineChoice, check: ModelCheck, engine: pd.DataFrame):
    """Through transformers, how many of the targets that moved from the llama.cpp folder an indexer tie
    explains (`conform.engine_ties`); None through another engine or when nothing moved."""
    from kvphase.conform.engine_ties import engine_ties, moved_targets

    if choice.backend != "transformers":
        return None
    moved = moved_targets(paired_rows(prepared.committed, engine), check.check, choice.logprob_tolerance)
    if not moved:
        return None
    return engine_ties(prepared.info, backend, prepared.contexts, moved, choice.threads)


def answer_start_note(check: ModelCheck, prepared: Prepared, engine: pd.DataFrame) -> str:
    """For a model that FAILs, where its moved targets' answers start (mod the paths' modulus): a
    fault of where generation starts moves every target of a plan whose answers all start at one
    residue, whatever the target's phase, so the target residue the verdict names says nothing of it
    ("" for a PASS)."""
    if check.verdict != "FAIL":
        return ""
    plan = prepared.plan
    modulus = max(MIN_ANSWER_MODULUS, plan.stride, plan.modulus)
    starts = {t.target_id: (len(c.tokens) + len(t.query.prompt)) % modulus for c in prepared.contexts for t in c.targets}
    rows = paired_rows(prepared.committed, engine)
    moved = rows["correct"] != rows["correct_ref"] if check.check == "profile" else \
        (rows["logprob"] - rows["logprob_ref"]).abs() > check.logprob_tolerance
    planned, at = sorted(set(starts.values())), sorted({starts[i] for i in rows.loc[moved, "target_id"]})
    if len(planned) == 1:
        return f"; its plan's answers all start at residue {planned[0]} mod {modulus} (the engine paths move them)"
    return (f"; the moved targets' answers start at residue{'s' if len(at) > 1 else ''} "
            f"{', '.join(map(str, at))} mod {modulus} (the plan's at {', '.join(map(str, planned))})")


def engine_paths(backend, prepared: Prepared, choice: EngineChoice) -> list[PathCheck]:
    """The model's engine paths (`conform.paths`), each against the same text as one prompt, with
    answers starting at every residue mod the plan's modulus (at least 4) and around its large blocks."""
    info, plan = prepared.info, prepared.plan
    modulus, blocks = max(plan.stride, plan.modulus), large_blocks(info)
    if choice.backend != "server":
        return model_paths(backend, plan.stride, info.vocab_size, info.context_length, modulus, blocks)
    engine, server = backend.engines[0], backend.servers[0]
    if engine.kind != "llama-server":
        return cannot_run(f"a {engine.kind} server has no slots or prompt cache kvphase can address", SERVER_PATHS)
    words = sorted({int(t) for context in prepared.contexts for t in context.tokens} - set(backend.prefix_ids))
    return server_paths(engine, plan.stride, words, min(server.n_ctx, info.context_length), server.slots, modulus,
                        blocks)


def served_references(references: tuple[Reference, ...], choice: EngineChoice) -> tuple[Reference, ...]:
    """--backend server without --model: the reference the servers hold (every server the same
    one); BackendError for a server that does not answer, holds no reference, or differs."""
    from kvphase.backends.dialects import ENGINES, ModelFacts, served_model_mismatch
    from kvphase.backends.transport import Retry

    retry = Retry() if choice.request_timeout is None else Retry(request_timeout=choice.request_timeout)
    held = set()
    for url in choice.urls:
        try:
            served = ENGINES[choice.server_engine](url, retry).info()
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise BackendError(f"{url} does not look like a {choice.server_engine} server (unexpected answer: "
                               f"{exc!r})") from None
        held.add(next((r for r in references if not served_model_mismatch(served, ModelFacts(r.name, {}, r.model))),
                      None) or served.model)
    if len(held) != 1 or not isinstance(next(iter(held)), Reference):
        names = ", ".join(sorted(h.name if isinstance(h, Reference) else str(h) for h in held))
        raise BackendError(f"the servers hold {names}: conform checks one reference model per run through servers "
                           "that all hold it (--model names it; the references are listed in docs/conform.md)")
    return (next(iter(held)),)


def check_served_model(backend, reference: Reference) -> None:
    """BackendError when a server serves another file than the reference: the sweep's check of a
    served model (`backends.dialects.refuse_served_model`) with the file itself, since the reference
    models share their tokenizer and may share every fact a server states."""
    from kvphase.backends.dialects import ModelFacts, refuse_served_model

    model = ModelFacts(f"reference {reference.name} ({reference.model.name})", {}, file=reference.model)
    for server in backend.servers if isinstance(backend, ServerFleet) else ():
        refuse_served_model(server, model)


@dataclass(frozen=True)
class ConformRun:
    """Every reference's outcome, and the run folder they were written to."""

    engine: str
    outcomes: list[Outcome]
    folder: Path
    wall_time_s: float = 0.0  # the check's whole time: the references prepared, every model run

    @property
    def failed(self) -> bool:
        return any(o.status == "FAIL" or any(p.status == "FAIL" for p in o.paths) for o in self.outcomes)


def chosen_references(choice: EngineChoice, models: Sequence[str] = (),
                      references: Optional[Path] = None) -> tuple[Reference, ...]:
    """The references a run checks: those `models` names (by name, or as a file identical to one's) among
    kvphase's own or the `references` file's, every one without `models`, or through servers without
    `models`, the one they hold (`served_references`)."""
    from kvphase.conform.references import DEFAULT_REFERENCES, load_references, select

    known = load_references(references) if references else DEFAULT_REFERENCES
    server_connection(choice.backend, choice.backend_settings)  # servers need --url, before any is asked
    if choice.backend == "server" and not models:
        return served_references(known, choice)
    return select(known, list(models))


def conform_dir(backend: str) -> Path:
    """The default run folder of a conform run through `backend`."""
    return Path("reports") / f"conform-{backend}"


def conform(references: tuple[Reference, ...], choice: EngineChoice, out: Optional[Path] = None,
            say: Callable[[str], None] = lambda line: None,
            advance: Callable[[int], None] = lambda n: None, on_notice: Say = log_notice) -> ConformRun:
    """Prepare every reference (all refusals first), run each, then write the folder (`out`, default
    `conform_dir`); `say` hears the table's lines, `on_notice` the backends' warnings."""
    out = conform_dir(choice.backend) if out is None else out
    started = time.monotonic()
    prepared = [prepare(reference, choice) for reference in references]
    outcomes = []
    for item in prepared:
        outcome = run_reference(item, choice, advance, on_notice)
        say(table_line(outcome))
        for path in outcome.paths:
            say(f"  {outcome.name} {path.line(with_tie=False)}")
            if path.ties:
                say(f"    {path.tie_note}")
        outcomes.append(outcome)
    run = ConformRun(describe_engine(choice), outcomes, out, time.monotonic() - started)
    write_folder(run, choice)
    return run


def describe_engine(choice: EngineChoice) -> str:
    if choice.backend == "server":
        return f"{choice.server_engine} at {', '.join(choice.urls)}"
    return choice.backend


def table_line(outcome: Outcome) -> str:
    """The console's line for one model."""
    said = f"{outcome.name}: {outcome.status}"
    if outcome.check is not None:
        c = outcome.check
        said += (f" ({c.targets} targets, {c.flags_differing} flags differ, largest log-probability difference "
                 f"{c.max_logprob_difference:.3g})")
    return said + (f": {outcome.reason}" if outcome.reason else "")


def write_folder(run: ConformRun, choice: EngineChoice) -> None:
    """conform.json, report.md and each model's engine rows (<name>/results.csv)."""
    make_folder(run.folder)
    for outcome in run.outcomes:
        if outcome.rows is not None:
            make_folder(run.folder / outcome.name)
            write_csv(run.folder / outcome.name / "results.csv", outcome.rows)
    write_json(run.folder / CONFORM_FILE, {"engine": run.engine, "choice": asdict(choice),
                                           "wall_time_s": round(run.wall_time_s, 2),
                                           "failed": run.failed, "models": [o.to_json() for o in run.outcomes]})
    from kvphase.conform.page import conform_page

    write_atomic(run.folder / REPORT_FILE, conform_page(run, choice).markdown())
