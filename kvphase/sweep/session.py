"""A sweep from its options to its run folders: planning (the model's defaults, calibration,
phase shifts, every declared stride), the run folders' names, a dry run's estimate, and the runs
themselves with their reports (each backend opened and closed by `backend_setup`).

Both front ends call this: `kvphase sweep` (which parses the options and prints) and the Python
API (`kvphase.sweep`). Nothing here prints; what a user should read goes to a `say` callback as
a `Notice`, and errors are the library's (`kvphase.errors`). Messages name the command line's
options (`--context`); in Python each is the keyword of the same name (`context=`).
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable, ContextManager, NamedTuple, Optional, Union

from kvphase.backends import BACKENDS
from kvphase.defaults import default_model_path, gpu_layer_count
from kvphase.engines.llamacpp import CACHE_TYPES, Vocab
from kvphase.errors import PlanError, RunFolderError
from kvphase.options_check import check_record
from kvphase.gguf.limits import check_llama_limits
from kvphase.gguf.modelinfo import ModelInfo, read_model_info
from kvphase.runfolder import CONFIG_FILE, RunLock
from kvphase.sweep.backend_setup import (SERVER_ENGINES, backend_context, closed_after, open_backend,
                                         refuse_trained_compressor, server_connection, with_backend,
                                         with_gpu_layers, with_reference_design)
from kvphase.sweep.calibrate import (DEFAULT_BAND, Band, Calibration, calibrated_run_dir, calibration_knobs,
                                     held_calibration, plan_for_folder)
from kvphase.sweep.notices import Notice, Say, log_notice
from kvphase.sweep.offsets import offset_plan_from_options
from kvphase.sweep.selection import check_selection_plan, indexer_unit
from kvphase.sweep.probe_settings import AUTO_DENSITY, MIN_CONTEXTS
from kvphase.sweep.reach_check import acting_context, backend_reach, plan_inactive, reach_notice
from kvphase.sweep.plan import (SweepDefaults, SweepPlan, default_context, make_plan, query_room,
                                stride_and_modulus)
from kvphase.sweep.run import SweepProgress, check_run_dir, default_run_dir, execute_sweep, load_plan
from kvphase.sweep.strides import ALL, LARGE_STRIDE, declared_strides, modulus_for, parse_stride, planned_dip
from kvphase.sweep.tasks import load_task

PADDINGS = ("prefix", "in-sequence")


@dataclass(frozen=True)
class SweepOptions:
    """A sweep's options, one field per `kvphase sweep` option (None: not given, the model's
    default). Checked here, where they are made: PlanError names the option and what it got."""

    stride: Union[int, str, None] = None  # S, or "all": one run per stride the file declares
    modulus: Optional[int] = None  # residues are positions mod M; default 2 x stride
    context: Optional[int] = None  # tokens before every query
    per_residue: Union[int, str, None] = None  # targets per residue, or "auto" (with detect)
    contexts: Optional[int] = None  # size the run by its contexts instead
    targets_per_context: Union[int, str] = AUTO_DENSITY  # "auto", at most N, or "task"
    detect: Optional[float] = None  # with per_residue="auto": the dip (points) to detect
    padding: Optional[str] = None  # "prefix" or "in-sequence"
    task: Optional[str] = None  # a task of prompts/
    seed: int = 0
    out: Optional[Path] = None  # the run folder (with stride="all": the folder the runs go in)
    threads: Optional[int] = None  # llama.cpp's CPU threads; default the CPUs this process may use
    backend: Optional[str] = None  # a name of `kvphase.backends.BACKENDS`
    design: Optional[str] = None  # the reference backend's design
    design_options: Union[dict, tuple[str, ...]] = ()  # the reference design's options: a dict, or KEY=VALUE strings
    url: Union[str, tuple[str, ...]] = ()  # backend="server": the servers (one: its URL)
    slots: Optional[int] = None
    engine: str = "llama-server"
    request_timeout: Optional[float] = None
    deadline: Optional[float] = None
    allow_model_mismatch: bool = False  # score servers whose model's facts differ from the file's
    cache_type: Optional[str] = None  # llama.cpp's K and V cache type
    gpu_layers: Union[int, str] = 0  # a count, -1 or "all"
    calibrate: bool = False
    target_accuracy: Optional[str] = None  # with calibrate: "LOW-HIGH" percent
    offsets: Optional[int] = None
    combine: Optional[str] = None
    shift: Optional[int] = None
    random_offset: bool = False
    selection: bool = False  # record whether the indexer selected each target's pool (sweep.selection)
    query_phases: Optional[bool] = None  # each context's query at its own phase; None: on where it costs no target

    def __post_init__(self) -> None:
        check_record(self)  # types and ranges, as every command's and API function's options are checked
        normal = {"url": (self.url,) if isinstance(self.url, str) else tuple(self.url),
                  "design_options": dict(self.design_options) if isinstance(self.design_options, dict)
                  else tuple(self.design_options),
                  "targets_per_context": str(self.targets_per_context).strip().lower(),
                  "per_residue": None if self.per_residue is None else str(self.per_residue),
                  "stride": None if self.stride is None else str(self.stride),
                  "out": None if self.out is None else Path(self.out)}
        for name, value in normal.items():
            object.__setattr__(self, name, value)
        for name, allowed in (("padding", PADDINGS), ("backend", tuple(BACKENDS)), ("engine", SERVER_ENGINES),
                              ("cache_type", tuple(CACHE_TYPES))):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise PlanError(f"--{name.replace('_', '-')} must be one of {', '.join(allowed)}, got {value!r}")
        object.__setattr__(self, "gpu_layers", gpu_layer_count(self.gpu_layers))  # a count, -1 or 'all': every layer
        check_own_folder(self.out)

    @classmethod
    def from_keywords(cls, keywords: dict) -> "SweepOptions":
        """The options from keyword arguments; PlanError naming any keyword that is no option."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(keywords) - known)
        if unknown:
            raise PlanError(f"sweep has no option {', '.join(map(repr, unknown))}; its options: "
                            f"{', '.join(sorted(known))}")
        return cls(**keywords)


def check_own_folder(folder: Optional[Path]) -> None:
    """A run folder must be a folder of the run's own: "" and "." (the current folder) would mix
    the run's files with whatever is there."""
    if folder is not None and Path(folder) == Path("."):
        raise PlanError(f"the run folder {str(folder)!r} is the current folder; name a folder for the run "
                        "(e.g. --out run1)")


class CalibrationAim(NamedTuple):
    """What --calibrate aims at: the band, the knobs it may turn, and the padding each setting
    starts from when the padding is kvphase's to fit (None: the user's)."""

    band: Band
    knobs: tuple[str, ...]
    fit: Optional[str]


@dataclass(frozen=True)
class PlannedSweep:
    """A sweep's runs, planned and named, before anything is scored or written."""

    info: ModelInfo
    runs: list[tuple[SweepPlan, Path]]  # (plan, run folder), one per stride swept
    connect: dict  # where a server sweep runs (`server_connection`); empty for the other backends
    aim: Optional[CalibrationAim]  # --calibrate's, or None
    every_stride: bool  # --stride all
    options: SweepOptions

    @property
    def strides(self) -> list[int]:
        return [plan.stride for plan, _ in self.runs]


@dataclass(frozen=True)
class DryRun:
    """What --dry-run found for one run: its estimate (`sweep.estimate`), whether one context
    was timed (not for a header-only file), and llama.cpp's expected memory (None otherwise)."""

    run_dir: Path
    plan: SweepPlan
    model: Path
    estimate: object  # sweep.estimate.SweepEstimate
    timed: bool
    memory: Optional[str]


def plan_sweep_runs(model: Optional[Path], options: SweepOptions, dry_run: bool = False,
                    say: Say = log_notice) -> PlannedSweep:
    """Every run the options ask for, planned and named; PlanError, ModelFileError or GGUFError
    before any weights load. `say` hears the strides --stride all skips and each stride's power."""
    info = read_model_info(model if model is not None else default_model_path())
    check_llama_limits(info.path)  # both backends read the file with llama.cpp: refuse what it would abort on
    if options.selection:
        indexer_unit(info)  # a file without an indexer is refused before its plans are built
    chosen = parse_stride(options.stride)  # None (the file's own), S, or ALL
    every_stride = chosen == ALL
    asked = PlanOptions.from_sweep_options(options)
    plans, skipped = plans_that_fit(info, declared_strides(info) if every_stride else [chosen], asked, every_stride)
    connect = server_connection(asked.backend or SweepDefaults.for_model(info).backend, list(options.url),
                                options.slots, options.engine, options.request_timeout, options.deadline,
                                options.allow_model_mismatch)
    plans = [with_gpu_layers(with_backend(plan, connect, options.engine, asked.cache_type), options.gpu_layers, say)
             for plan in plans]
    plans = [with_offsets(info, plan, options.offsets, options.combine, options.shift, options.random_offset)
             for plan in plans]
    plans = [with_selection(info, plan) for plan in plans] if options.selection else plans
    aim = calibration_aim(info, plans[0], asked, options.calibrate, options.target_accuracy, dry_run)
    runs = [(plan, run_dir_for(info, plan, options.out, every_stride, aim)) for plan in plans]
    if options.query_phases is None:
        runs = [(held_query_phases(plan, run_dir), run_dir) for plan, run_dir in runs]
    for stride, reason in skipped:
        say(Notice(f"--stride all: stride {stride} is not swept: {reason}", "attention"))
    if every_stride:
        for line in stride_plan_lines(plans, asked.per_residue is not None):
            say(Notice(line))
    return PlannedSweep(info, runs, connect, aim, every_stride, options)


@dataclass(frozen=True)
class PlanOptions:
    """The options that shape a run's plan (None: not given)."""

    modulus: Optional[int]
    context: Optional[int]
    per_residue: Optional[str]
    detect: Optional[float]
    padding: Optional[str]
    task: Optional[str]
    seed: int
    backend: Optional[str]
    design: Optional[str]
    options: tuple[str, ...]  # --option KEY=VALUE pairs
    cache_type: Optional[str]
    density: str = AUTO_DENSITY  # --targets-per-context
    contexts: Optional[int] = None
    query_phases: Optional[bool] = None  # --query-phases / --no-query-phases

    @classmethod
    def from_sweep_options(cls, options: SweepOptions) -> "PlanOptions":
        pairs = options.design_options  # KEY=VALUE strings, parsed (and checked) where the plan is made
        if isinstance(pairs, dict):
            pairs = tuple(f"{key}={json.dumps(value)}" for key, value in pairs.items())
        return cls(options.modulus, options.context, options.per_residue, options.detect, options.padding,
                   options.task, options.seed, options.backend, options.design, pairs, options.cache_type,
                   options.targets_per_context, options.contexts, options.query_phases)


def plans_that_fit(info: ModelInfo, strides: list[Optional[int]], asked: PlanOptions,
                   every_stride: bool) -> tuple[list[SweepPlan], list[tuple[int, str]]]:
    """Each stride's plan; under `--stride all` a stride the contexts leave no room for (a 128-token
    stride in a short trained context) is skipped with its reason, and only when none fits is that an
    error (the first stride's)."""
    plans, skipped = [], []
    for stride in strides:
        try:
            plans.append(plan_sweep(info, stride, asked, every_stride))
        except PlanError as exc:
            if not every_stride:
                raise
            skipped.append((stride, str(exc)))
    if not plans:
        raise PlanError(f"--stride all: no stride fits: {'; '.join(f'stride {s}: {r}' for s, r in skipped)}")
    return plans, skipped


def plan_sweep(info: ModelInfo, stride: Optional[int], asked: PlanOptions, every_stride: bool = False) -> SweepPlan:
    """One run's plan from the options as given and the model's defaults; PlanError when
    impossible. `every_stride`: one of `--stride all`'s runs, whose modulus is the stride itself
    from LARGE_STRIDE on (`strides.modulus_for`)."""
    defaults = SweepDefaults.for_model(info)
    modulus = modulus_for(stride, asked.modulus) if every_stride else asked.modulus
    count, contexts = sample_size(asked.per_residue, asked.detect, stride_and_modulus(info, stride, modulus)[1],
                                  defaults, asked.contexts)
    context, why = default_context(info, defaults.context) if asked.context is None else (asked.context, "")
    plan = make_plan(info, stride, modulus, context, count, asked.padding or defaults.padding,
                     defaults.task if asked.task is None else asked.task, asked.seed, fit=asked.padding is None,
                     density=asked.density, contexts=contexts, query_phases=asked.query_phases)
    if why:
        plan = replace(plan, adjusted="; ".join(filter(None, [plan.adjusted, why])))
    if (asked.backend or defaults.backend) == "reference":
        return with_reference_design(plan, asked.design or defaults.design, parse_options(list(asked.options)),
                                     info.n_layers)
    if asked.design is not None or asked.options:
        raise PlanError("--design and --option apply to --backend reference only")
    refuse_trained_compressor(info)
    return plan


def with_offsets(info: ModelInfo, plan: SweepPlan, offsets: Optional[int], combine: Optional[str],
                 shift: Optional[int], random_offset: bool) -> SweepPlan:
    """The plan with the phase shifts --offsets, --shift or --random-offset ask for (`sweep.offsets`):
    made by moving the reference backend's compressor windows (positions stay as a trained model
    learned them), else by filler tokens after BOS, which must fit in the model's context."""
    shift_by = "window" if plan.backend == "reference" else "prefix"
    chosen = offset_plan_from_options(offsets, combine, shift, random_offset, plan.stride, shift_by)
    if not chosen.active:
        return plan
    if len(chosen.shifts) > 1 and plan.backend == "server":
        raise PlanError("--offsets needs each answer's log-probability rows, which servers do not return; use "
                        "--backend llama.cpp, or --shift D once per shift")
    longest = chosen.max_shift(plan.stride)
    room = query_room(info)
    if shift_by == "prefix" and info.context_length and (
            longest >= room if info.trained is not None else plan.context + longest + room > info.context_length):
        raise PlanError(f"shifts up to {longest} tokens do not fit: {info.path.name} has a {info.context_length}-token "
                        f"context, the contexts take {plan.context} and the query needs "
                        f"{1 if info.trained is not None else room} more; use a shorter --context or fewer --offsets")
    return replace(plan, offsets=chosen.to_json())


def with_selection(info: ModelInfo, plan: SweepPlan) -> SweepPlan:
    """The plan with selection records (`sweep.selection`); PlanError for a model without an indexer,
    a server backend, a reference design other than the file's own, or phase shifts."""
    check_selection_plan(info, plan.backend, plan.offsets, plan.backend_options.get("design", ""))
    return replace(plan, selection=True)


def held_query_phases(plan: SweepPlan, run_dir: Path) -> SweepPlan:
    """The plan with the query-phase setting of the folder it resumes, where the option was not given:
    a folder a compressed model's sweep wrote before query phases existed resumes as one query phase."""
    if not (run_dir / CONFIG_FILE).is_file():
        return plan
    try:
        held = load_plan(run_dir).query_phases
    except RunFolderError:  # a damaged config.json is named where the folder is checked
        return plan
    return replace(plan, query_phases=held)


def run_dir_for(info: ModelInfo, plan: SweepPlan, out: Optional[Path], every_stride: bool,
                aim: Optional[CalibrationAim] = None) -> Path:
    """--out, or the default folder; under `--stride all`, each stride's default folder, inside --out
    when it is given. A calibrated run's default folder is named by where calibration starts."""
    default = default_run_dir(info, plan)
    if aim is not None:
        default = calibrated_run_dir(default, plan, aim.band)
    if every_stride:
        return out / default.name if out is not None else default
    return out or default


def plan_notices(info: ModelInfo, plan: SweepPlan, detect: Optional[float]) -> list[Notice]:
    """What the user should know about a plan before it runs: the sample size --detect chose, a control run."""
    said = []
    if detect is not None:
        said.append(Notice(f"--per-residue auto: {plan.per_residue} targets per residue detect a one-residue dip of "
                           f"{detect:g} points with 80% power at any accuracy."))
    if plan.control:
        said.append(Notice(f"{info.architecture} declares no KV-cache compression: control run with stride "
                           f"{plan.stride}.", "attention"))
    reach = backend_reach(info.compression, plan.backend, plan.backend_options.get("design"))
    for line in reach_notice(reach, plan.context, plan_inactive(info.compression, plan)):
        said.append(Notice(line, "attention" if line.startswith("Compressor inactive") else "note"))
    return said


def stride_plan_lines(plans: list[SweepPlan], per_residue_given: bool) -> list[str]:
    """`--stride all`, before anything runs: each stride's targets and the dip they can detect."""
    lines = []
    for plan in plans:
        dip = planned_dip(plan.per_residue, plan.modulus)
        power = (f"detect a one-residue dip of {dip:.1f} points" if dip < 100 else
                 "cannot detect even a 100-point one-residue dip")
        lines.append(f"--stride all: stride {plan.stride}, modulus {plan.modulus}: {plan.per_residue * plan.modulus} "
                     f"targets ({plan.per_residue} per residue) {power} with 80% power.")
    if not per_residue_given and any(plan.stride >= LARGE_STRIDE for plan in plans):
        lines.append("Size the runs by the dip they must detect with --per-residue auto --detect GAP, or set "
                     "--per-residue N.")
    return lines


def check_runs(info: ModelInfo, runs: list[tuple[SweepPlan, Path]]) -> None:
    """Each run's folder, and that its contexts can be laid out (a sweep finds that out only once
    its model has loaded; one round of contexts shows it): PlanError or RunFolderError for the first
    that cannot run."""
    from kvphase.sweep.contexts import build_probes

    vocab = Vocab.load(info.path)
    for plan, run_dir in runs:
        check_run_dir(run_dir, plan, info)
        build_probes(load_task(plan.task), vocab, plan.probe_settings, rounds=1)


ProgressBar = Callable[[], ContextManager[SweepProgress]]  # entered around each run's scoring


def run_planned(planned: PlannedSweep, progress: Optional[ProgressBar] = None, say: Say = log_notice,
                on_run: Callable[[Path, object], None] = lambda run_dir, summary: None) -> list[Path]:
    """Score every planned run into its folder (resuming what each holds) and build its report;
    `on_run(run_dir, summary)` as each finishes. Returns the run folders."""
    info = planned.info
    if len(planned.runs) > 1:  # every run's folder and contexts are checked before the first run spends its time
        check_runs(info, planned.runs)
    for plan, run_dir in planned.runs:
        on_run(run_dir, run_sweep(info, plan, run_dir, planned, progress, say))
    return [run_dir for _, run_dir in planned.runs]


def run_sweep(info: ModelInfo, plan: SweepPlan, run_dir: Path, planned: PlannedSweep,
              progress: Optional[ProgressBar], say: Say):
    """Score the plan into its folder (resuming what it holds) and build the report; returns its
    summary. With --calibrate, at the setting a pilot chooses first (or the one the folder's pilot chose)."""
    from kvphase.sweep.report import build_report  # scipy: imported when used, not at start-up

    threads, connect, aim = planned.options.threads, planned.connect, planned.aim
    with RunLock(run_dir) as lock:  # one sweep per folder; the folder and its files are checked before any model loads
        check_run_dir(run_dir, aim and held_calibration(run_dir, plan, aim.band, aim.knobs) or plan, info)
        if lock.stale:  # a sweep died here
            say(Notice(f"{run_dir}: the sweep that held it ({lock.stale}) ended without releasing it; resuming.",
                       "warning"))
        for notice in plan_notices(info, plan, planned.options.detect):
            say(notice)
        if aim is not None:
            plan = calibrated(info, plan, run_dir, aim, threads, connect, say)
        with open_backend(plan, info, threads, connect, say) as backend, \
                (progress or (lambda: nullcontext(SweepProgress())))() as bar:
            execute_sweep(plan, backend, run_dir, info, bar)
        return build_report(run_dir)


def calibration_aim(info: ModelInfo, plan: SweepPlan, asked: PlanOptions, calibrate: bool,
                    target_accuracy: Optional[str], dry_run: bool) -> Optional[CalibrationAim]:
    """--calibrate's band and knobs (None without it); PlanError for options it cannot take."""
    if not calibrate:
        if target_accuracy is not None:
            raise PlanError("--target-accuracy applies to --calibrate only")
        return None
    if plan.offsets:
        raise PlanError("--calibrate chooses a difficulty by plain scoring; run it without --offsets, --shift or "
                        "--random-offset, then sweep the setting it chose (--context, --task) with them")
    if dry_run:
        raise PlanError("--dry-run cannot foresee the setting --calibrate's pilot will choose; dry-run that setting "
                        "(--context, --task) instead")
    band = Band.parse(target_accuracy or DEFAULT_BAND)
    knobs = calibration_knobs(plan.task, context_given=asked.context is not None, task_given=asked.task is not None)
    return CalibrationAim(band, knobs, fit=None if asked.padding else SweepDefaults.for_model(info).padding)


def calibrated(info: ModelInfo, plan: SweepPlan, run_dir: Path, aim: CalibrationAim, threads: Optional[int],
               connect: dict, say: Say) -> SweepPlan:
    """The plan at the setting the folder's pilot chose, or a new pilot's choice (its steps said)."""
    longest = info.context_length - query_room(info) if info.context_length else plan.context

    def pilot_backend(context: int):
        return open_backend(replace(plan, context=context), info, threads, connect, say)

    def say_step(step) -> None:
        say(Notice(f"calibration pilot: {step.task} at {step.context} tokens: {step.accuracy:.1f}% "
                   f"({step.correct}/{step.targets}), {step.tokens:,} tokens"))

    chosen, held = plan_for_folder(plan, run_dir, aim.band, aim.knobs, max(longest, plan.context), pilot_backend,
                                   aim.fit, say_step, shortest_acting_context(info, plan))
    calibration = Calibration.from_json(chosen.calibration)
    say(Notice(f"--calibrate {'(as this folder chose it before) ' if held else ''}chose task {chosen.task} at "
               f"{chosen.context} tokens for {aim.band} (the pilot stopped {calibration.stopped} and cost "
               f"{100 * calibration.pilot_tokens / calibration.choice.sweep_tokens:.1f}% of the sweep)."))
    return chosen


def shortest_acting_context(info: ModelInfo, plan: SweepPlan) -> int:
    """The shortest --context at which the file's indexer acts on every query (0 where it has none, or
    where the plan's backend does not run it): --calibrate searches no shorter one."""
    return acting_context(backend_reach(info.compression, plan.backend, plan.backend_options.get("design")))


def dry_run_planned(planned: PlannedSweep, say: Say = log_notice) -> list[DryRun]:
    """--dry-run of every planned run: the plan's counts, one context scored and timed, the
    estimated wall time and the peak memory; the folders are read (a resume's checks), never
    created or written."""
    if planned.runs[0][0].offsets:
        raise PlanError("--dry-run times plain scoring; a dry run without --offsets, --shift or --random-offset "
                        "estimates one shift (K shifts cost about K times its tokens)")
    return [dry_run_sweep(planned, plan, run_dir, say) for plan, run_dir in planned.runs]


def dry_run_sweep(planned: PlannedSweep, plan: SweepPlan, run_dir: Path, say: Say) -> DryRun:
    """One run's dry run (`dry_run_planned`)."""
    from kvphase.sweep.estimate import estimate_sweep

    info = planned.info
    check_run_dir(run_dir, plan, info)  # before the model loads, as a sweep checks it
    for notice in plan_notices(info, plan, planned.options.detect):
        say(notice)
    timed = info.weights_size is None or plan.backend == "server"
    # a header-only file: the prompts from its vocabulary, nothing to run here
    opened = open_backend(plan, info, planned.options.threads, planned.connect, say) if timed else \
        closed_after(Vocab.load(info.path))
    with opened as backend:
        estimate = estimate_sweep(plan, backend, run_dir, info, timed, announce=lambda line: say(Notice(line)))
    memory = expected_memory(info, plan) if plan.backend == "llama.cpp" and estimate.pending_contexts else None
    return DryRun(run_dir, plan, info.path, estimate, timed, memory)


def expected_memory(info: ModelInfo, plan: SweepPlan) -> str:
    """The estimate of `engines.memory` for the plan's backend context, and what is available."""
    from kvphase.engines.memory import available_memory, memory_need

    need = memory_need(info.path, backend_context(info, plan), cache_type=plan.backend_options.get("cache_type", "f16"))
    available = available_memory()
    return need.describe() + (f"; {available.describe()}" if available else "")


def sample_size(per_residue: Optional[str], detect: Optional[float], modulus: int, defaults: SweepDefaults,
                contexts: Optional[int] = None) -> tuple[Optional[int], int]:
    """(per residue, contexts) where the option that sizes the run is given (None and 0 for the other):
    --per-residue N; --per-residue auto, the smallest multiple of M with which a balanced design
    detects a one-residue dip of --detect points with 80% power at any accuracy; --contexts N.
    With none of them, a trained model's own per-residue, else (None, 0): the plan sizes itself
    (`plan.make_plan`)."""
    if contexts is not None:
        if per_residue is not None or detect is not None:
            raise PlanError("--contexts sizes the run instead of --per-residue and --detect; give one of them")
        if contexts < MIN_CONTEXTS or contexts % modulus:
            raise PlanError(f"--contexts must be a multiple of the modulus {modulus} (a round of contexts holds "
                            f"every residue once in every lane) and at least {MIN_CONTEXTS}, got {contexts}")
        return None, contexts
    if per_residue is None and detect is None:
        return defaults.per_residue, 0
    if per_residue is not None and per_residue.strip().lower() == "auto":
        from kvphase.sweep.plan import per_residue_for_detect

        if detect is None or not 0 < detect < 100:
            raise PlanError(f"--per-residue auto needs --detect GAP, a dip in points above 0 and below 100 (both "
                            f"excluded), got {'none' if detect is None else format(detect, 'g')}")
        if modulus < 2:
            raise PlanError(f"--modulus must be at least 2, got {modulus}")
        return per_residue_for_detect(detect, modulus), 0
    if detect is not None:
        raise PlanError("--detect applies to --per-residue auto only")
    try:
        return int(per_residue or ""), 0
    except ValueError:
        raise PlanError(f"--per-residue must be a whole number or 'auto', got {per_residue!r}") from None


def parse_options(pairs: list[str]) -> dict:
    """KEY=VALUE strings to a dict; values are read as JSON when they parse (4, true, [0, 2])."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PlanError(f"--option expects KEY=VALUE, got {pair!r}")
        try:
            options[key.strip().replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip().replace("-", "_")] = value
    return options

