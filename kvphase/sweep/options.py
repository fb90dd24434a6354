"""A sweep's options: `SweepOptions` (one field per `kvphase sweep` option, checked where it is made;
the backend's share of them as `backend_setup.BackendSettings`), the run folder's own-folder rule and
`--option KEY=VALUE`.

Both front ends make these: `kvphase sweep` from its command line and the Python API
(`kvphase.sweep`) from its keywords. Messages name the command line's options (`--context`); in
Python each is the keyword of the same name (`context=`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional, Union

from kvphase.backends import BACKENDS
from kvphase.errors import PlanError
from kvphase.options_check import check_choices, check_record
from kvphase.sweep.backend_setup import BackendSettings
from kvphase.sweep.context_settings import AUTO_DENSITY, PADDINGS
COMPARISON_DIR = Path("reports") / "comparison"  # where `compare` writes without an `out`


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
    # the reference design's options: a dict, or KEY=VALUE strings (values read as JSON); held as a dict
    design_options: Union[dict, tuple[str, ...]] = ()
    url: Union[str, tuple[str, ...]] = ()  # backend="server": the servers (one: its URL)
    slots: Optional[int] = None
    engine: str = BackendSettings.engine
    scoring: Optional[str] = None  # the servers' scoring route; None: the engine's default
    request_timeout: Optional[float] = None
    deadline: Optional[float] = None
    allow_model_mismatch: bool = False  # score servers whose model's facts differ from the file's
    cache_type: Optional[str] = None  # llama.cpp's K and V cache type
    gpu_layers: Union[int, str] = BackendSettings.gpu_layers  # a count, -1 or "all"
    calibrate: bool = False
    target_accuracy: Optional[str] = None  # with calibrate: "LOW-HIGH" percent
    offsets: Optional[int] = None
    combine: Optional[str] = None
    shift: Optional[int] = None
    random_offset: bool = False
    selection: bool = False  # record whether the indexer selected each target's pool (sweep.selection)
    query_phases: Optional[bool] = None  # each context's query at its own phase; None: on where it costs no target
    answer_phases: Optional[bool] = None  # each target's answer at its own phase; None: on where it costs no target

    def __new__(cls, *args, **keywords):
        """PlanError naming a keyword that is no option (before Python's own TypeError would)."""
        cls.refuse_unknown(keywords)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        check_record(self)  # types and ranges, as every command's and API function's options are checked
        normal = {"design_options": design_options_dict(self.design_options),
                  "targets_per_context": str(self.targets_per_context).strip().lower(),
                  "per_residue": None if self.per_residue is None else str(self.per_residue),
                  "stride": None if self.stride is None else str(self.stride),
                  "out": None if self.out is None else Path(self.out)}
        for name, value in normal.items():
            object.__setattr__(self, name, value)
        check_choices(self, {"padding": PADDINGS, "backend": tuple(BACKENDS)})
        settings = self.backend_settings  # checks the backend's options
        object.__setattr__(self, "url", settings.url)
        object.__setattr__(self, "gpu_layers", settings.gpu_layers)  # a count, -1 or 'all': every layer
        check_own_folder(self.out)

    @property
    def backend_settings(self) -> BackendSettings:
        """How the backend runs (servers, cache type, GPU layers, threads), apart from the plan."""
        return BackendSettings(**{f.name: getattr(self, f.name) for f in fields(BackendSettings)})

    @classmethod
    def from_keywords(cls, keywords: dict) -> "SweepOptions":
        """The options from keyword arguments; PlanError naming any keyword that is no option."""
        return cls(**keywords)

    @classmethod
    def refuse_unknown(cls, keywords: dict) -> None:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(keywords) - known)
        if unknown:
            raise PlanError(f"sweep has no option {', '.join(map(repr, unknown))}; its options: "
                            f"{', '.join(sorted(known))}")

    def overridden(self, overrides: dict) -> "SweepOptions":
        """This record with `overrides` (keywords) applied to the options it leaves at their default;
        PlanError for one it sets to another value (`sweep(options=SweepOptions(context=256), context=512)`)."""
        self.refuse_unknown(overrides)
        defaults = {f.name: getattr(SweepOptions(), f.name) for f in fields(self)}
        for name, value in overrides.items():
            held = getattr(self, name)
            if held != defaults[name] and value != held and str(value) != str(held):
                raise PlanError(f"{name} is given twice, {held!r} in options and {value!r} as a keyword; give it once")
        return SweepOptions.from_keywords({**{f.name: getattr(self, f.name) for f in fields(self)}, **overrides})


def check_own_folder(folder: Optional[Path]) -> None:
    """A run folder must be a folder of the run's own: "" and "." (the current folder) would mix
    the run's files with whatever is there."""
    if folder is not None and Path(folder) == Path("."):
        raise PlanError(f"the run folder {str(folder)!r} is the current folder; name a folder for the run "
                        "(e.g. --out run1)")


def design_options_dict(options: Union[dict, tuple[str, ...]]) -> dict:
    """A reference design's options as a dict whose keys are Python names (`local-window` is `local_window`),
    from a dict or from KEY=VALUE strings (`parse_options`)."""
    if isinstance(options, dict):
        return {str(key).strip().replace("-", "_"): value for key, value in options.items()}
    return parse_options(list(options))


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
