"""The plan of a sweep: everything that defines a run, as its `config.json` holds it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

from kvphase.errors import PlanError, RecordLayoutError
from kvphase.sweep.offsets import OffsetPlan
from kvphase.sweep.placement import ProbeSettings, Tokenizer, build_probes
from kvphase.sweep.tasks import load_task

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

    def __post_init__(self) -> None:
        """Fields of the declared types (a config.json is data from disk), then settings a sweep can run."""
        for f in fields(self):
            kind = _FIELD_TYPES.get(str(f.type))
            value = getattr(self, f.name)
            if kind is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
                raise PlanError(f"{f.name} is {str(value)[:60]!r}, expected {f.type}")
        self.probe_settings  # context, stride, modulus, sample size, padding and seed in range
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
    def probe_settings(self) -> ProbeSettings:
        return ProbeSettings(self.context, self.stride, self.modulus, self.per_residue, self.padding, self.seed)

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
    depth (`build_probes` checks it); PlanError when neither fits. `open_tokenizer` is called only
    for a prefix plan: loading a vocabulary is the cost."""
    if plan.padding != "prefix":
        return plan
    task, tokenizer = load_task(plan.task), open_tokenizer()
    try:
        build_probes(task, tokenizer, plan.probe_settings)
        return plan
    except RecordLayoutError as prefix_failed:
        fitted = replace(plan, padding="in-sequence", adjusted="in-sequence padding, because prefix padding cannot "
                         f"lay out this tokenizer's records ({str(prefix_failed).split('; use ')[0]})")
        try:
            build_probes(task, tokenizer, fitted.probe_settings)
        except PlanError as failed:
            raise PlanError(f"no padding fits this tokenizer: prefix: {prefix_failed}; in-sequence: {failed}") from None
        return fitted
    except PlanError:  # not the padding's doing: the sweep reports it where it always has, after the other checks
        return plan


TRAINED_PER_RESIDUE = 256  # the study's sample size; short contexts through numpy make it cheap


@dataclass(frozen=True)
class SweepDefaults:
    """What `kvphase sweep` uses where an option is not given: fitted to the model file."""

    context: int = 1024
    per_residue: int = 32
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
            return cls()
        in_llamacpp = trained.in_engine_layout or not trained.compressed
        return cls(context=trained.context, per_residue=TRAINED_PER_RESIDUE,
                   task=trained.task, padding="in-sequence",
                   backend="llama.cpp" if in_llamacpp else "reference", design="trained")
