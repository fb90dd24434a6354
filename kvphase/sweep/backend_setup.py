"""A plan's backend: which one runs it and with what (`BackendSettings`: servers, llama.cpp's cache
type, GPU layers and threads; a reference design), the tokens it must hold, and opening it, with the memory warning,
as a context manager that closes it. Sweeps, the mechanism probes, conform, the benches and the
tests all open a backend here."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Union

from kvphase.backends import BACKENDS, Backend
from kvphase.backends.base import ServerFleet
from kvphase.defaults import DEFAULT_GPU_LAYERS, default_threads, gpu_layer_count
from kvphase.errors import PlanError
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.options_check import check_choices, check_record
from kvphase.sweep.notices import Notice, Say, log_notice
from kvphase.sweep.plan import SweepPlan, query_room

SERVER_ENGINES = ("llama-server", "openai", "sglang")  # llama-server, an OpenAI-compatible engine (vLLM), SGLang's native API


@dataclass(frozen=True)
class BackendSettings:
    """How a plan's backend runs, apart from what the plan measures: the servers and their limits,
    llama.cpp's cache type, GPU layers and threads (None: not given, the backend's default). Checked
    here, where they are made; each is the `kvphase sweep` option of the same name."""

    url: Union[str, tuple[str, ...]] = ()  # backend "server": the servers (one: its URL)
    slots: Optional[int] = None  # requests per server at once; default its -np
    engine: str = SERVER_ENGINES[0]  # what the servers are
    scoring: Optional[str] = None  # the route they score by (dialects.SCORING_ROUTES); None: the engine's default
    request_timeout: Optional[float] = None  # seconds one request may take
    deadline: Optional[float] = None  # seconds the whole sweep may take
    allow_model_mismatch: bool = False  # score servers whose model's facts differ from the file's
    cache_type: Optional[str] = None  # llama.cpp's K and V cache type
    gpu_layers: Union[int, str] = DEFAULT_GPU_LAYERS  # a count, -1 or "all": every layer
    threads: Optional[int] = None  # llama.cpp's CPU threads; default the CPUs this process may use

    def __post_init__(self) -> None:
        from kvphase.engines.llamacpp import CACHE_TYPES

        check_record(self)  # types and ranges, as every command's options are checked
        object.__setattr__(self, "url", (self.url,) if isinstance(self.url, str) else tuple(self.url))
        from kvphase.backends.dialects import ENGINES, SCORING_ROUTES, route_for

        check_choices(self, {"engine": SERVER_ENGINES, "cache_type": tuple(CACHE_TYPES), "scoring": SCORING_ROUTES})
        route_for(ENGINES[self.engine], self.scoring)  # an engine without the route: one line, before any model loads
        object.__setattr__(self, "gpu_layers", gpu_layer_count(self.gpu_layers))

    @property
    def serves(self) -> bool:
        """Whether any server option is given (they apply to backend "server" only)."""
        return bool(self.url) or self.engine != SERVER_ENGINES[0] or self.allow_model_mismatch or any(
            value is not None for value in (self.slots, self.request_timeout, self.deadline, self.scoring))


def server_connection(backend: str, settings: BackendSettings) -> dict:
    """Where a server sweep runs, how long it may wait and whether a server holding another model
    may score (not part of the plan: a run may resume on other servers); empty for the other
    backends, which take none of these options."""
    if backend != "server":
        if settings.serves:
            raise PlanError("--url, --slots, --engine, --scoring, --request-timeout, --deadline and "
                            "--allow-model-mismatch apply to --backend server only")
        return {}
    if not settings.url:
        raise PlanError("--backend server needs --url http://HOST:PORT (once per server)")
    given = {"request_timeout": settings.request_timeout, "deadline": settings.deadline,
             "allow_model_mismatch": settings.allow_model_mismatch or None}
    return {"urls": list(settings.url), "slots": settings.slots, **{k: v for k, v in given.items() if v is not None}}


def with_backend(plan: SweepPlan, connect: dict, settings: BackendSettings) -> SweepPlan:
    """The plan with the server engine (when `connect` names servers) and llama.cpp's cache type:
    recorded in backend_options only when it is not the default f16, so an f16 plan's config.json
    holds no key for it (and matches folders written without the option), and a folder cannot be
    resumed with another cache type."""
    if connect:
        plan = replace(plan, backend="server", backend_options={"engine": settings.engine, **scoring_option(settings)})
    if settings.cache_type is None:
        return plan
    if plan.backend != "llama.cpp":
        raise PlanError(f"--cache-type applies to --backend llama.cpp only, not {plan.backend}")
    if settings.cache_type == "f16":
        return plan
    return replace(plan, backend_options={**plan.backend_options, "cache_type": settings.cache_type})


def scoring_option(settings: BackendSettings) -> dict:
    """The scoring route as the plan records it: only when it is not the engine's default, so a plan
    scored by the default route matches folders written before routes had a name; PlanError when the
    engine lacks the route."""
    from kvphase.backends.dialects import ENGINES, route_for

    route = route_for(ENGINES[settings.engine], settings.scoring)
    return {} if route == ENGINES[settings.engine].routes[0] else {"scoring": route}


def with_gpu_layers(plan: SweepPlan, settings: BackendSettings, say: Say = log_notice) -> SweepPlan:
    """The plan with --gpu-layers in its backend options (only when above 0, so a CPU plan's
    config.json holds no key for it); a warning when this llama.cpp build cannot offload."""
    if not settings.gpu_layers:
        return plan
    if plan.backend != "llama.cpp":
        raise PlanError(f"--gpu-layers applies to the llama.cpp backend only, not {plan.backend}")
    from kvphase.engines.llamacpp import gpu_offload_note

    note = gpu_offload_note(settings.gpu_layers)
    if note:
        say(Notice(note, "warning"))
    return replace(plan, backend_options={**plan.backend_options, "gpu_layers": settings.gpu_layers})


def with_reference_design(plan: SweepPlan, design: str, options: dict, n_layer: int) -> SweepPlan:
    """The plan with the reference design filled in: its options for the sweep's stride (`Design.for_stride`),
    the sweep's own over them."""
    from kvphase.designs import DESIGNS
    from kvphase.reference.policy import check_policy_layers, make_policy

    registered = DESIGNS.get(design)
    defaults = registered.for_stride(plan.stride) if registered is not None and registered.post_hoc else {}
    options = {**defaults, **options}
    if design == "trained":
        if options:
            raise PlanError(f"design 'trained' reads every setting from the model file, got options {sorted(options)}")
        return replace(plan, backend="reference", backend_options={"design": "trained"})
    check_policy_layers(make_policy(design, **options), n_layer)  # a bad design or option fails before any weights load
    return replace(plan, backend="reference", backend_options={"design": design, **options},
                   control=plan.control and design == "dense")


def refuse_trained_compressor(info) -> None:
    """PlanError for a kvphase-trained model whose compressor llama.cpp cannot run."""
    if info.trained is not None and info.compression.compressed and not info.trained.in_engine_layout:
        raise PlanError(f"{info.path.name} was trained with the {info.trained.design} compressor, which llama.cpp "
                        "cannot run; use --backend reference (the default for it)")


def shift_room(info: ModelInfo, plan: SweepPlan) -> int:
    """Tokens a prefix shift adds to llama.cpp's context (a trained model's whole context is
    already open: its query room holds them)."""
    offsets = plan.offset_plan
    if offsets.shift_by != "prefix" or info.trained is not None:
        return 0
    return offsets.max_shift(plan.stride)


def backend_context(info: ModelInfo, plan: SweepPlan) -> int:
    """The tokens a plan's backend holds: the context, its query phase's filler, its query and the shifts' filler."""
    return plan.context + plan.query_shift_room + query_room(info) + shift_room(info, plan)


@contextmanager
def open_backend(plan: SweepPlan, info: ModelInfo, threads: Optional[int] = None, connect: Optional[dict] = None,
                 say: Say = log_notice, n_ctx: Optional[int] = None, head_tap: bool = False) -> Iterator[Backend]:
    """The backend a plan names, through the `BACKENDS` registry, closed when the block ends;
    `connect` adds where it runs. Before llama.cpp loads a model that will likely not fit in
    memory, a warning says so. `n_ctx`: the tokens it holds, when a probe needs more than the
    plan's (`backend_context`); `head_tap`: llama.cpp with the graph tap head knockouts read."""
    n_ctx = backend_context(info, plan) if n_ctx is None else n_ctx
    if plan.backend == "llama.cpp":
        from kvphase.engines.memory import memory_warning

        warning = memory_warning(info, n_ctx, plan.backend_options.get("cache_type", "f16"))
        if warning:
            say(Notice(warning, "warning"))
    tap = {"selection": True} if plan.selection or head_tap else {}  # the factory's one tap serves both
    backend = BACKENDS[plan.backend](info, n_ctx=n_ctx, n_threads=threads or default_threads(),
                                     options={**plan.backend_options, **(connect or {}), **tap})
    if isinstance(backend, ServerFleet):  # a server that leaves mid-run: the others take its contexts
        backend.on_lost = lambda line: say(Notice(line, "warning"))
    with closed_after(backend):
        yield backend


@contextmanager
def closed_after(backend: Backend) -> Iterator[Backend]:
    """`backend` for the block, closed when it ends."""
    try:
        yield backend
    finally:
        backend.close()
