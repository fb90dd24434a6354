"""From a probe command's options to its run folder: the defaults a probe's sweeps use where an
option is not given, the backend they run on, the sweep plan that provides their contexts, and
the backend opened (with the memory warning) and closed around the probe. `kvphase gates`,
`gate-activations`, `flip`, `cycle` and `knockout` each call one function here."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from kvphase.errors import PlanError
from kvphase.gguf.limits import check_llama_limits
from kvphase.gguf.modelinfo import ModelInfo, read_model_info
from kvphase.options_check import check_record
from kvphase.sweep.backend_setup import (BackendSettings, open_backend, refuse_trained_compressor, with_gpu_layers,
                                         with_reference_design)
from kvphase.sweep.notices import Say, log_notice
from kvphase.sweep.context_settings import AUTO_DENSITY
from kvphase.sweep.context_settings import MAX_TARGETS
from kvphase.sweep.plan import (CONTROL_STRIDE, SweepDefaults, SweepPlan, make_plan, query_room,
                               stride_and_modulus)

PROBE_CONTEXT = 512  # tokens before every query, where the model was not trained by kvphase
PROBE_PER_RESIDUE = 8  # targets per residue in each of a probe's sweeps
TRAINED_PER_RESIDUE_KNOCKOUT = 64  # a trained model's knockout sweeps: one per head, so fewer targets each
ACTIVATION_CONTEXTS = 8  # contexts gate-activations evaluates
FLIP_TARGETS = 4  # targets flip moves through the phases
FLIP_CYCLES = 2  # stride cycles of flip's shifts
PROBE_BACKENDS = ("reference", "llama.cpp")  # besides "auto"
FLIP_DESIGN = "dense"  # flip's reference design where the file is not a trained one


@dataclass(frozen=True)
class ProbeOptions:
    """What every probe's sweeps take (None: not given, the probe's default)."""

    context: Optional[int] = None  # tokens before every query
    per_residue: Optional[int] = None  # targets per residue (cycle, knockout)
    task: Optional[str] = None  # a task of prompts/
    seed: int = 0
    threads: Optional[int] = None  # llama.cpp's CPU threads; default the CPUs this process may use
    backend: str = "auto"  # "auto" or one of PROBE_BACKENDS
    gpu_layers: int = BackendSettings.gpu_layers  # llama.cpp: layers offloaded to a GPU (-1: every layer)

    def __post_init__(self) -> None:
        check_record(self)  # types, and --threads in llama.cpp's range
        if self.backend not in ("auto", *PROBE_BACKENDS):
            raise PlanError(f"unknown backend {self.backend!r}; expected auto, {', '.join(PROBE_BACKENDS)}")


def probe_defaults(info: ModelInfo) -> SweepDefaults:
    """What a probe's sweeps use where no option is given: a trained file's own settings, else a
    PROBE_CONTEXT-token prefix-padded plan with PROBE_PER_RESIDUE per residue."""
    if info.trained is not None:
        return SweepDefaults.for_model(info)
    return SweepDefaults(context=PROBE_CONTEXT, per_residue=PROBE_PER_RESIDUE, padding="prefix")


def auto_backend(info: ModelInfo) -> str:
    """The reference for kvphase-trained gpt2 files (their heads and gates are the reference's),
    llama.cpp for every other file, trained engine layouts included."""
    trained = info.trained
    return "reference" if trained is not None and not trained.in_engine_layout else "llama.cpp"


def probe_plan(info: ModelInfo, stride: Optional[int], options: ProbeOptions, backend: str, per_residue: int,
               density: str = AUTO_DENSITY, context: Optional[int] = None, design: Optional[str] = None,
               design_options: Optional[dict] = None, say: Say = log_notice) -> SweepPlan:
    """The sweep plan a probe's contexts come from, on `backend` (under the reference: `design`,
    default the model's own); PlanError for what the backend cannot run. `context`: the probe's
    own, where it is not the option's or the default."""
    defaults = probe_defaults(info)
    if backend == "llama.cpp":
        refuse_trained_compressor(info)
    if backend != "reference" or info.trained is None:  # the reference reads a trained file's tokenizer itself
        check_llama_limits(info.header)
    context = context if context is not None else defaults.context if options.context is None else options.context
    plan = make_plan(info, stride=stride, modulus=None, context=context, per_residue=per_residue,
                     padding=defaults.padding, task=options.task or defaults.task, seed=options.seed,
                     targets_per_context=density)
    if backend == "reference":
        plan = with_reference_design(plan, design or defaults.design, design_options or {}, info.n_layer)
    elif design not in (None, "dense") or design_options:
        raise PlanError("--design and --option apply to --backend reference only")
    return with_gpu_layers(plan, BackendSettings(gpu_layers=options.gpu_layers), say)


def probe_gates(model: Path, out: Optional[Path] = None, layers: Optional[Sequence[int]] = None) -> tuple[str, Path]:
    """`kvphase gates`: (headline, run folder)."""
    from kvphase.probes.gates import run_gates

    run_dir = out or Path("reports") / f"{model.name.removesuffix('.gguf')}-gates"
    return run_gates(model, run_dir, list(layers) if layers else None), run_dir


def probe_gate_activations(model: Path, options: ProbeOptions, contexts: int = ACTIVATION_CONTEXTS,
                           layers: Optional[Sequence[int]] = None, out: Optional[Path] = None,
                           say: Say = log_notice) -> tuple[str, Path]:
    """`kvphase gate-activations`: the plan's contexts on the model's shortest gate window; (headline, run folder)."""
    from kvphase.defaults import default_threads
    from kvphase.probes.activations import run_gate_activations
    from kvphase.probes.gates import find_sources, select_sources

    info = read_model_info(model)
    declared = find_sources(info.header)  # refuses a model without a gate
    stride = min(s.stride for s in declared)  # the plan only provides contexts: the model's shortest window
    sources = select_sources(declared, list(layers) if layers else None, info.path.name)
    plan = probe_plan(info, stride, options, auto_backend(info), probe_defaults(info).per_residue, say=say)
    run_dir = out or Path("reports") / f"{info.short_name}-gate-activations"
    threads = options.threads or default_threads()
    with open_backend(plan, info, threads, say=say) as backend:
        return run_gate_activations(plan, backend, run_dir, info, sources, contexts, threads), run_dir


def probe_flip(model: Optional[Path], options: ProbeOptions, stride: Optional[int] = None,
               targets: int = FLIP_TARGETS, cycles: int = FLIP_CYCLES, design: str = FLIP_DESIGN,
               design_options: Optional[dict] = None, out: Optional[Path] = None,
               say: Say = log_notice) -> tuple[str, Path]:
    """`kvphase flip`: single targets moved through `cycles` stride cycles; (headline, run folder)."""
    from kvphase.defaults import default_model_path
    from kvphase.probes.flip import run_flip
    from kvphase.sweep.plan import TASK_DENSITY

    if cycles < 1 or targets < 1:
        raise PlanError(f"--targets and --cycles must be at least 1, got {targets} and {cycles}")
    info = read_model_info(model if model is not None else default_model_path())
    defaults = probe_defaults(info)
    backend = defaults.backend if options.backend == "auto" else options.backend
    if backend == "reference" and info.trained is not None and design == FLIP_DESIGN and not design_options:
        design = defaults.design  # a trained file on the reference runs its own compressor, as the sweep does
    s = stride if stride is not None else (info.compression.stride or CONTROL_STRIDE)
    if s < 2:  # before the shifts and the plan's size are derived from it
        raise PlanError(f"--stride must be at least 2, got {s}")
    modulus = stride_and_modulus(info, s, None)[1]
    most_targets = MAX_TARGETS // modulus * s  # the plan flip picks from holds ceil(targets / S) per residue
    if targets > most_targets:
        raise PlanError(f"--targets must be at most {most_targets} (one run holds {MAX_TARGETS} targets at mod "
                        f"{modulus}), got {targets}")
    context = options.context
    if context is None and info.trained is not None and cycles > (defaults.context - modulus) // s:
        raise PlanError(f"--cycles must be at most {(defaults.context - modulus) // s}: {info.path.name} was trained "
                        f"at {defaults.context} tokens and each cycle shifts targets {s} tokens; got {cycles}")
    if context is None:  # a trained model's positions end at its context: the longest shift must fit it
        context = defaults.context - (cycles * s if info.trained is not None else 0)
    n_ctx = context + cycles * s + query_room(info)
    if info.context_length and n_ctx > info.context_length:
        raise PlanError(f"--context {context} plus {cycles * s} shift tokens and the query does not fit the "
                        f"{info.context_length}-token context of {info.path.name}")
    per_residue = max(1, -(-targets // s))  # the sweep plan only needs to hold `targets` targets (modulus >= S)
    plan = probe_plan(info, s, options, backend, per_residue, TASK_DENSITY, context, design, design_options, say)
    run_dir = out or Path("reports") / f"{info.short_name}-flip-S{plan.stride}-L{context}"
    with open_backend(plan, info, options.threads, say=say, n_ctx=n_ctx) as backend:
        return run_flip(plan, backend, run_dir, targets, cycles, info), run_dir


def probe_cycle(model: Path, k: int, options: ProbeOptions, out: Optional[Path] = None,
                say: Say = log_notice) -> tuple[str, Path]:
    """`kvphase cycle`: the model and its copy with every gate bias rolled by k; (headline, run folder)."""
    from kvphase.probes.cycle import check_k, run_cycle
    from kvphase.probes.gates import find_sources

    info = read_model_info(model)
    stride = min(s.stride for s in find_sources(info.header))  # refuses a model without a gate bias
    check_k(k, stride)
    backend = auto_backend(info) if options.backend == "auto" else options.backend
    per_residue = probe_defaults(info).per_residue if options.per_residue is None else options.per_residue
    plan = probe_plan(info, stride, options, backend, per_residue, say=say)
    run_dir = out or Path("reports") / f"{info.short_name}-cycle-k{k}"

    def open_copy(swept: ModelInfo):
        return open_backend(replace(plan, model=str(swept.path)), swept, options.threads, say=say)

    return run_cycle(plan, k, run_dir, open_copy, info), run_dir


def probe_knockout(model: Path, options: ProbeOptions, layers: Optional[Sequence[int]] = None, slots: bool = False,
                   out: Optional[Path] = None, say: Say = log_notice,
                   progress: Optional[Callable[[str, int, int], None]] = None) -> tuple[str, Path]:
    """`kvphase knockout`: each head (or gate phase slot) mean-ablated in turn; (headline, run folder)."""
    from kvphase.probes.knockout import run_knockout

    info = read_model_info(model)
    backend = auto_backend(info) if options.backend == "auto" else options.backend
    trained_count = TRAINED_PER_RESIDUE_KNOCKOUT if info.trained is not None else PROBE_PER_RESIDUE
    per_residue = trained_count if options.per_residue is None else options.per_residue
    plan = probe_plan(info, None, options, backend, per_residue, say=say)
    run_dir = out or Path("reports") / f"{info.short_name}-knockout{'-slots' if slots else ''}"
    with open_backend(plan, info, options.threads, say=say, head_tap=backend == "llama.cpp") as engine:
        return run_knockout(plan, engine, run_dir, info, list(layers) if layers else None, slots, progress), run_dir
