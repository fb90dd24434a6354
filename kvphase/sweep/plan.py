"""The plan of a sweep: everything that defines a run, as its `config.json` holds it."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from functools import cache
from typing import Callable, Optional

import numpy as np

from kvphase.backends.base import Tokenizer
from kvphase.errors import PlanError, RecordLayoutError
from kvphase.gguf.keys import Keys
from kvphase.gguf.reach import reach_of
from kvphase.sweep.contexts import build_contexts, check_density
from kvphase.sweep.layout import Layout
from kvphase.sweep.offsets import OffsetPlan
from kvphase.sweep.positions import query_phase
from kvphase.sweep.context_settings import MAX_TARGETS, MIN_CONTEXTS, TASK_DENSITY, ContextSettings
from kvphase.sweep.tasks import load_task

CONTROL_STRIDE = 4  # the stride of a control run: a model that declares no compression
QUERY_ROOM = 64  # tokens kept free after the context for the query and its answer
CONTEXT_STEP = 1024  # a default context lengthened for a compressor's reach is a whole number of these
DEFAULT_DETECT = 25.0  # points: a run whose size no option sets detects at least this one-residue dip at any accuracy

_FIELD_TYPES = {"str": str, "int": int, "bool": bool, "dict": dict}  # annotation -> the type a value must have


@dataclass(frozen=True)
class SweepPlan:
    """Everything that defines a run; `config.json` holds exactly this."""

    model: str  # path to the GGUF file
    task: str
    stride: int
    modulus: int
    context: int  # tokens per context; every query starts at this position
    per_residue: int
    padding: str
    seed: int
    control: bool  # True when the model declares no compression and the stride is the user's
    backend: str = "llama.cpp"
    backend_options: dict = field(default_factory=dict)  # the reference backend's design and its options
    adjusted: str = ""  # what kvphase changed in the default plan to fit the model, and why ("" when nothing)
    calibration: dict = field(default_factory=dict)  # --calibrate's pilot and choice (sweep.calibrate); {} without
    offsets: dict = field(default_factory=dict)  # phase shifts at inference (sweep.offsets.OffsetPlan); {} without
    # targets one context holds: "auto" (as many as fit), a number (at most that), or "task" (at most the task
    # file's targets_per_context: the default, so folders whose config.json has no such key read as planned)
    targets_per_context: str = TASK_DENSITY
    # how per_residue was sized where it was not given (both 0 when it was): for `contexts` contexts, or as the
    # fewest whole rounds of contexts holding `least_per_residue`; re-sized where calibration changes the context
    contexts: int = 0
    least_per_residue: int = 0
    selection: bool = False  # record whether the indexer selected each target's pool (sweep.selection)
    # each context's query at its own phase mod M (positions.query_phase); False (and in a config.json
    # without the key): every query at `context`
    query_phases: bool = False
    # the last tokens before the query that the compressor reads raw (`gguf.reach`): targets end before them.
    # 0 where the layout keeps targets out of them anyway (and in a config.json without the key)
    raw_window: int = 0
    # each target's answer at its own phase mod M, balanced within every context and crossed with the target's
    # (positions.answer_residue, by filler before the question); False (and in a config.json without the key,
    # every folder written before it): the answer's phase was not planned
    answer_phases: bool = False

    def __post_init__(self) -> None:
        """Fields of the declared types (a config.json is data from disk), then settings a sweep can run."""
        for f in fields(self):
            kind = _FIELD_TYPES.get(str(f.type))
            value = getattr(self, f.name)
            if kind is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
                raise PlanError(f"{f.name} is {str(value)[:60]!r}, expected {f.type}")
        self.context_settings  # context, stride, modulus, sample size, padding and seed in range
        self.offset_plan  # shifts, rule and how they are made

    @property
    def offset_plan(self) -> OffsetPlan:
        """How this run moves phases at inference (the empty OffsetPlan for a plain sweep)."""
        return OffsetPlan.from_json(self.offsets)

    def describe_backend(self) -> str:
        """`backend` alone, or `backend (key=value, ...)` with the reference design's options."""
        if not self.backend_options:
            return self.backend
        options = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in self.backend_options.items())
        return f"{self.backend} ({options})"

    @property
    def context_settings(self) -> ContextSettings:
        return ContextSettings(self.context, self.stride, self.modulus, self.per_residue, self.padding, self.seed,
                             self.targets_per_context, self.query_phases, self.raw_window, self.answer_phases)

    def query_positions(self, contexts) -> np.ndarray:
        """Where each of `contexts` (context indices) starts its query: (n,)."""
        contexts = np.asarray(contexts, dtype=np.int64)  # (n,)
        return self.context + (query_phase(contexts, self.modulus) if self.query_phases else np.zeros_like(contexts))

    @property
    def query_shift_room(self) -> int:
        """Tokens the longest context adds after `context` for its query's phase, and the longest query for
        its answer's (0 without either)."""
        return (self.modulus - 1) * (int(self.query_phases) + int(self.answer_phases))

    def comparable(self) -> dict:
        """The fields that must match for a folder to resume this plan."""
        out = asdict(self)
        out["model"] = Path(self.model).name
        return out


def fit_padding(plan: SweepPlan, open_tokenizer: Callable[[], Tokenizer]) -> SweepPlan:
    """The plan, or, when prefix padding cannot lay out this tokenizer's records, the same plan with
    in-sequence padding and the reason in `adjusted`: prefix padding needs runs of records exactly as
    long as the gaps between targets, which record lengths that are all multiples of a few tokens
    cannot make (Gemma 3's tokenizer at the defaults). Both keep every residue balanced and matched in
    depth (`build_contexts` checks it); PlanError when neither fits. One round of contexts is laid out
    for each: it puts every residue in every lane, and the whole plan is laid out once, to score it. `open_tokenizer` is called only
    for a prefix plan: loading a vocabulary is the cost."""
    if plan.padding != "prefix":
        return plan
    task, tokenizer = load_task(plan.task), open_tokenizer()
    try:
        build_contexts(task, tokenizer, sized(plan, tokenizer).context_settings, rounds=1)
        return plan
    except RecordLayoutError as prefix_failed:
        fitted = replace(plan, padding="in-sequence", adjusted="in-sequence padding, because prefix padding cannot "
                         f"lay out this tokenizer's records ({str(prefix_failed).split('; use ')[0]})")
        try:
            build_contexts(task, tokenizer, sized(fitted, tokenizer).context_settings, rounds=1)
        except PlanError as failed:
            raise PlanError(f"no padding fits this tokenizer: prefix: {prefix_failed}; in-sequence: {failed}") from None
        return fitted
    except PlanError:  # not the padding's doing: the sweep reports it where it always has, after the other checks
        return plan


def sized(plan: SweepPlan, tokenizer: Tokenizer) -> SweepPlan:
    """The plan with `per_residue` sized at the density its context holds: contexts come in rounds
    of M (every residue once in every lane), and a round of t lanes gives t targets per residue; so
    `contexts` contexts, or the fewest rounds (MIN_CONTEXTS contexts at least) that hold
    `least_per_residue`. Unchanged when the sample size was given as --per-residue."""
    if not plan.contexts and not plan.least_per_residue:
        return plan
    lanes = targets_per_context(plan, tokenizer)
    rounds = -(-(plan.contexts or MIN_CONTEXTS) // plan.modulus)
    if not plan.contexts:
        rounds = max(rounds, -(-plan.least_per_residue // lanes))
    most_rounds = MAX_TARGETS // (lanes * plan.modulus)
    if plan.contexts and rounds > most_rounds:
        each = f"--contexts {plan.contexts} of {lanes} target{'s' if lanes > 1 else ''} each"
        raise PlanError(f"{each} asks for {rounds * lanes * plan.modulus} targets; one run holds at most {MAX_TARGETS}: "
                        f"the largest --contexts that fits is {most_rounds * plan.modulus}"
                        if most_rounds * plan.modulus >= MIN_CONTEXTS else
                        f"{each} asks for more than the {MAX_TARGETS} targets one run holds; use fewer "
                        "--targets-per-context")
    return replace(plan, per_residue=rounds * lanes)


def per_residue_for_detect(detect: float, modulus: int) -> int:
    """--per-residue auto: the targets per residue that detect a one-residue dip of `detect` points
    (`statistics.power.per_residue_for_dip`); PlanError naming the smallest --detect that fits in
    MAX_TARGETS when this one does not."""
    from kvphase.statistics.power import per_residue_for_dip  # scipy: imported when used

    def fits(points: float) -> bool:
        return per_residue_for_dip(points / 100, modulus) * modulus <= MAX_TARGETS

    if fits(detect):
        return per_residue_for_dip(detect / 100, modulus)
    low, high = detect, 100.0  # the dip that fits lies above `low` and at or below `high`, to a tenth of a point
    while high - low > 0.05:
        middle = (low + high) / 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    smallest = math.ceil(high * 10) / 10
    smallest = smallest if fits(smallest) else high
    raise PlanError(f"--detect {detect:g} needs {per_residue_for_dip(detect / 100, modulus)} targets per residue "
                    f"({per_residue_for_dip(detect / 100, modulus) * modulus} at modulus {modulus}); one run holds at most "
                    f"{MAX_TARGETS}: the smallest --detect that fits is {smallest:g}")


def targets_per_context(plan: SweepPlan, tokenizer: Tokenizer) -> int:
    """How many targets one context of this plan holds (its lanes); PlanError when a
    --targets-per-context does not fit."""
    task = load_task(plan.task)
    settings = replace(plan.context_settings, per_residue=1)  # the count is what is being sized
    return Layout.of(task, tokenizer, settings).lanes


def make_plan(info, *, stride: Optional[int], modulus: Optional[int], context: int, per_residue: Optional[int],
              padding: str, task: str, seed: int, fit: bool = True, targets_per_context: str = TASK_DENSITY,
              contexts: int = 0, query_phases: Optional[bool] = False,
              answer_phases: Optional[bool] = False) -> SweepPlan:
    """The run's plan from the options (keywords: the fields of `SweepPlan` they fill) and the model's
    metadata; PlanError when impossible. `stride` and `modulus` None: the model's (`stride_and_modulus`). `fit`:
    the padding was not the user's, so kvphase may change it to one the tokenizer can lay out.
    `targets_per_context`: AUTO_DENSITY, a number, TASK_DENSITY. `per_residue` None sizes the
    run at that density (`sized`): for `contexts` contexts, else the fewest rounds of contexts that
    detect a DEFAULT_DETECT-point dip at any accuracy. `query_phases`: each context's query at its own
    phase (None: where `default_query_phases` finds it costs nothing). `answer_phases`: each target's
    answer at its own phase (None: wherever it costs no target, `with_answer_phases`)."""
    from kvphase.engines.llamacpp import Vocab  # llama_cpp: loaded when a plan is made, not at import

    if info.tokenizer_model in ("none", "unknown"):
        raise PlanError(f'{info.path.name} has no tokenizer ({Keys.Tokenizer.MODEL} = {info.tokenizer_model}), so no prompt can be built; random-weight models from make-tiny are for `kvphase validate`')
    control = not info.compression.compressed
    stride, modulus = stride_and_modulus(info, stride, modulus)
    room = query_room(info)
    if info.context_length and context + room > info.context_length:
        raise PlanError(f"--context {context} does not fit: {info.path.name} has a {info.context_length}-token "
                        f"context and the query needs {room} more")
    if contexts < 0:
        raise PlanError(f"--contexts must be a positive number, got {contexts}")
    # SweepPlan checks context, stride, modulus, sample size, padding and density before any model loads
    plan = SweepPlan(model=str(info.path), task=task, stride=stride, modulus=modulus, context=context,
                     per_residue=1 if per_residue is None else per_residue, padding=padding, seed=seed,
                     control=control, targets_per_context=targets_per_context, contexts=contexts)
    if per_residue is None and not contexts:  # after the plan's checks: a modulus to size for
        from kvphase.statistics.power import per_residue_for_dip  # scipy: imported when used

        plan = replace(plan, least_per_residue=per_residue_for_dip(DEFAULT_DETECT / 100, modulus))
    sized_later = per_residue is None
    load_task(task)
    open_tokenizer = cache(lambda: Vocab.load(info))
    plan = behind_raw_window(info, plan, open_tokenizer)
    plan = fit_padding(plan, open_tokenizer) if fit else plan
    plan = sized(plan, open_tokenizer()) if sized_later else plan
    if plan.targets_per_context != TASK_DENSITY:  # a density that cannot be, refused before anything is written
        check_density(load_task(task), open_tokenizer(), plan.context_settings)
    plan = with_query_phases(info, plan, query_phases, open_tokenizer)
    return with_answer_phases(info, plan, answer_phases, open_tokenizer)


def with_answer_phases(info, plan: SweepPlan, asked: Optional[bool],
                       open_tokenizer: Callable[[], Tokenizer]) -> SweepPlan:
    """The plan with each target's answer at its own phase when asked (True): it needs every context to
    hold every residue equally (targets per context a multiple of M), a model that is not a `kvphase
    train` one (it learned its questions at one position), and room for M - 1 more query tokens;
    PlanError when asked for a plan that cannot take it. Not by default (None) yet: turning it on
    changes the default plan, so the committed example folder and its claims must be regenerated with
    it (the pad and its cost: docs/sweep.md, "Where generation starts")."""
    if not asked:  # off by default until the committed example is regenerated with answer phases
        return plan
    if info.trained is not None:
        raise PlanError("--answer-phases does not apply to a `kvphase train` model: it learned its questions at "
                        "exactly one position; use --no-answer-phases")
    chosen = replace(plan, answer_phases=True)
    room = query_room(info)
    if info.context_length and plan.context + chosen.query_shift_room + room > info.context_length:
        raise PlanError(f"--answer-phases does not fit: {info.path.name} has a {info.context_length}-token context "
                        f"and the queries need up to {plan.modulus - 1 + room} tokens after the context; use a "
                        "shorter --context or --no-answer-phases")
    check_density(load_task(plan.task), open_tokenizer(), chosen.context_settings)
    return chosen


def behind_raw_window(info, plan: SweepPlan, open_tokenizer: Callable[[], Tokenizer]) -> SweepPlan:
    """The plan with its targets kept before the tokens the compressor reads raw (deepseek4's sliding
    window, minimax-m3's local blocks: `gguf.reach`), where the layout would otherwise reach into them:
    a target there is not behind the compressor, and its residue says nothing of it. PlanError naming
    the key when the window leaves the context no room. A `kvphase train` model keeps the positions it
    learned."""
    reach = reach_of(info.compression, info.declared_keys) if info.trained is None else None
    if reach is None or not reach.raw_window:
        return plan
    if reach.raw_window >= plan.context:
        raise PlanError(f"{reach.raw_window_key} makes a {reach.raw_window}-token {reach.raw_window_name} that the "
                        f"model reads raw, as long as the --context {plan.context}: no target would sit behind the "
                        "compressor; use a longer --context")
    task = load_task(plan.task)
    layout = Layout.of(task, open_tokenizer(), plan.context_settings)
    reaches_in = layout.records_top > plan.context - reach.raw_window
    return replace(plan, raw_window=reach.raw_window) if reaches_in else plan


def with_query_phases(info, plan: SweepPlan, asked: Optional[bool], open_tokenizer: Callable[[], Tokenizer]) -> SweepPlan:
    """The plan with its queries at every phase when asked (True), or by default (None) for a file that
    declares compression where that costs no target (`default_query_phases`); PlanError when asked for
    a plan that cannot take it."""
    if asked is False or (asked is None and not default_query_phases(info, plan, open_tokenizer)):
        return plan
    if info.trained is not None:
        raise PlanError("--query-phases does not apply to a `kvphase train` model: it learned its questions at "
                        "exactly one position")
    chosen = replace(plan, query_phases=True)
    room = query_room(info)
    if info.context_length and plan.context + chosen.query_shift_room + room > info.context_length:
        raise PlanError(f"--query-phases does not fit: {info.path.name} has a {info.context_length}-token context, "
                        f"the contexts take up to {plan.context + chosen.query_shift_room} and the query needs {room} "
                        "more; use a shorter --context or --no-query-phases")
    check_density(load_task(plan.task), open_tokenizer(), chosen.context_settings)  # every context holds every residue
    return chosen


def default_query_phases(info, plan: SweepPlan, open_tokenizer: Callable[[], Tokenizer]) -> bool:
    """Queries at every phase by default for a file that declares compression (not a `kvphase train`
    model, whose questions sit at one learned position), when every context holds every residue (the
    phase then costs no target, only up to M - 1 filler tokens) and the longest context still fits."""
    if not info.compression.compressed or info.trained is not None:
        return False
    try:
        with_query_phases(info, plan, True, open_tokenizer)
    except PlanError:
        return False
    return True


def default_context(info, default: int) -> tuple[int, str]:
    """The default context and why it is not `default` ("" when it is): for a file whose indexer would
    keep every pool at `default` tokens, long enough that it keeps at most a quarter of them (a
    whole number of CONTEXT_STEP tokens; `gguf.reach`); then at most the longest the model holds beside
    the query. A `kvphase train` model is swept at the context it was trained at."""
    context, why = default, ""
    reach = reach_of(info.compression, info.declared_keys) if info.trained is None else None
    if reach is not None and reach.default_length() > default + 1:
        context = -(-(reach.default_length() - 1) // CONTEXT_STEP) * CONTEXT_STEP
        why = (f"contexts of {context} tokens, so that {reach.read_share_text(context + 1)}: at {default} the "
               "indexer would read every target exactly")
    if info.context_length and context + query_room(info) > info.context_length > query_room(info):
        context = info.context_length - query_room(info)
        why = (f"contexts of {context} tokens, because the model's context is {info.context_length} and the query "
               f"needs {query_room(info)} more")
    return context, why


def query_room(info) -> int:
    """Tokens kept free after the context: a trained model embeds exactly its questions' positions."""
    if info.trained is not None:
        return info.context_length - info.trained.context
    return QUERY_ROOM


def stride_and_modulus(info, stride: Optional[int], modulus: Optional[int]) -> tuple[int, int]:
    """--stride or the model's (CONTROL_STRIDE when it declares none); --modulus, or twice the
    stride (the periodicity check), or for a `kvphase train` file the stride itself: its short
    trained context leaves too few positions to match depths over 2S residues."""
    stride = stride if stride is not None else (info.compression.stride or CONTROL_STRIDE)
    if modulus is None:
        modulus = stride if info.trained is not None else 2 * stride
    return stride, modulus


TRAINED_PER_RESIDUE = 256  # the study's sample size; short contexts through numpy make it cheap


@dataclass(frozen=True)
class SweepDefaults:
    """What `kvphase sweep` uses where an option is not given: fitted to the model file."""

    context: int = 1024
    per_residue: Optional[int] = None  # None: the fewest rounds of contexts that detect a DEFAULT_DETECT dip
    task: str = "records"
    padding: str = "prefix"
    backend: str = "llama.cpp"
    design: str = "dense"

    @classmethod
    def for_model(cls, info) -> SweepDefaults:
        """A `kvphase train` model is swept as it was trained: its context, its task, gaps between
        records (in-sequence), and its own compressor: through llama.cpp where the file is an
        engine's own layout (or the dense control), else through the reference backend."""
        trained = info.trained
        if trained is None:
            return cls(backend="transformers") if info.header is None else cls()  # a checkpoint folder: no GGUF
        in_llamacpp = trained.in_engine_layout or not trained.compressed
        return cls(context=trained.context, per_residue=TRAINED_PER_RESIDUE,
                   task=trained.task, padding="in-sequence",
                   backend="llama.cpp" if in_llamacpp else "reference", design="trained")
