"""A sweep's runs from its options: each stride's plan (the model's defaults, the sample size, phase
shifts, selection records, calibration's aim, every declared stride), the run folders' names, and
what the user should read before a run starts.

Nothing here prints or scores; what a user should read goes to a `say` callback as a `Notice`, and
errors are the library's (`kvphase.errors`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple, Optional

from kvphase.defaults import default_model_path
from kvphase.errors import PlanError, RunFolderError
from kvphase.gguf.limits import check_llama_limits
from kvphase.gguf.modelinfo import ModelInfo, read_model_info
from kvphase.runfolder import CONFIG_FILE
from kvphase.sweep.backend_setup import (refuse_trained_compressor, server_connection, with_backend, with_gpu_layers,
                                         with_reference_design)
from kvphase.sweep.calibrate import DEFAULT_BAND, Band, calibrated_run_dir, calibration_knobs
from kvphase.sweep.notices import Notice, Say, log_notice
from kvphase.sweep.offsets import offset_plan_from_options
from kvphase.sweep.options import SweepOptions
from kvphase.sweep.plan import (SweepDefaults, SweepPlan, default_context, make_plan, query_room,
                                stride_and_modulus)
from kvphase.sweep.context_settings import MIN_CONTEXTS
from kvphase.sweep.reach_check import backend_reach, plan_inactive, reach_notice
from kvphase.sweep.run import default_run_dir, load_plan
from kvphase.sweep.selection import check_selection_plan, indexer_unit
from kvphase.sweep.strides import ALL, LARGE_STRIDE, declared_strides, modulus_for, parse_stride, planned_dip


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


def plan_sweep_runs(model: Optional[Path], options: SweepOptions, dry_run: bool = False,
                    say: Say = log_notice) -> PlannedSweep:
    """Every run the options ask for, planned and named; PlanError, ModelFileError or GGUFError
    before any weights load. `say` hears the strides --stride all skips and each stride's power."""
    info = read_model_info(model if model is not None else default_model_path())
    if info.header is not None:  # an HF checkpoint (no header) runs in transformers only
        check_llama_limits(info.header)  # both backends read the file with llama.cpp: refuse what it would abort on
    if options.selection:
        indexer_unit(info)  # a file without an indexer is refused before its plans are built
    chosen = parse_stride(options.stride)  # None (the file's own), S, or ALL
    every_stride = chosen == ALL
    plans, skipped = plans_that_fit(info, declared_strides(info) if every_stride else [chosen], options, every_stride)
    settings = options.backend_settings
    connect = server_connection(options.backend or SweepDefaults.for_model(info).backend, settings)
    plans = [with_gpu_layers(with_backend(plan, connect, settings), settings, say) for plan in plans]
    plans = [with_offsets(info, plan, options.offsets, options.combine, options.shift, options.random_offset)
             for plan in plans]
    plans = [with_selection(info, plan) for plan in plans] if options.selection else plans
    aim = calibration_aim(info, plans[0], options, dry_run)
    runs = [(plan, run_dir_for(info, plan, options.out, every_stride, aim)) for plan in plans]
    if options.query_phases is None:
        runs = [(held_setting(plan, run_dir, "query_phases"), run_dir) for plan, run_dir in runs]
    if options.answer_phases is None:
        runs = [(held_setting(plan, run_dir, "answer_phases"), run_dir) for plan, run_dir in runs]
    for stride, reason in skipped:
        say(Notice(f"--stride all: stride {stride} is not swept: {reason}", "attention"))
    if every_stride:
        for line in stride_plan_lines(plans, options.per_residue is not None):
            say(Notice(line))
    return PlannedSweep(info, runs, connect, aim, every_stride, options)


def plans_that_fit(info: ModelInfo, strides: list[Optional[int]], options: SweepOptions,
                   every_stride: bool) -> tuple[list[SweepPlan], list[tuple[int, str]]]:
    """Each stride's plan; under `--stride all` a stride the contexts leave no room for (a 128-token
    stride in a short trained context) is skipped with its reason, and only when none fits is that an
    error (the first stride's)."""
    plans, skipped = [], []
    for stride in strides:
        try:
            plans.append(plan_sweep(info, stride, options, every_stride))
        except PlanError as exc:
            if not every_stride:
                raise
            skipped.append((stride, str(exc)))
    if not plans:
        raise PlanError(f"--stride all: no stride fits: {'; '.join(f'stride {s}: {r}' for s, r in skipped)}")
    return plans, skipped


def plan_sweep(info: ModelInfo, stride: Optional[int], options: SweepOptions, every_stride: bool = False) -> SweepPlan:
    """One run's plan from the options as given and the model's defaults; PlanError when
    impossible. `every_stride`: one of `--stride all`'s runs, whose modulus is the stride itself
    from LARGE_STRIDE on (`strides.modulus_for`)."""
    defaults = SweepDefaults.for_model(info)
    modulus = modulus_for(stride, options.modulus) if every_stride else options.modulus
    count, contexts = sample_size(options.per_residue, options.detect, stride_and_modulus(info, stride, modulus)[1],
                                  defaults, options.contexts)
    context, why = default_context(info, defaults.context) if options.context is None else (options.context, "")
    plan = make_plan(info, stride=stride, modulus=modulus, context=context, per_residue=count,
                     padding=options.padding or defaults.padding, task=defaults.task if options.task is None else options.task,
                     seed=options.seed, fit=options.padding is None, targets_per_context=options.targets_per_context,
                     contexts=contexts, query_phases=options.query_phases,
                     answer_phases=options.answer_phases)
    if why:
        plan = replace(plan, adjusted="; ".join(filter(None, [plan.adjusted, why])))
    chosen = options.backend or defaults.backend
    if info.header is None and chosen != "transformers":
        raise PlanError(f"{info.path} is an HF checkpoint folder: it runs through --backend transformers only "
                        f"({chosen} reads GGUF files)")
    if chosen == "reference":
        return with_reference_design(plan, options.design or defaults.design, options.design_options, info.n_layer)
    if options.design is not None or options.design_options:
        raise PlanError("--design and --option apply to --backend reference only")
    refuse_trained_compressor(info)
    # llama.cpp is make_plan's own; a server's engine is added with its connection (`with_backend`)
    return plan if chosen in ("llama.cpp", "server") else replace(plan, backend=chosen)


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


def held_setting(plan: SweepPlan, run_dir: Path, name: str) -> SweepPlan:
    """The plan with the setting `name` (query_phases, answer_phases) of the folder it resumes, where the
    option was not given: a folder whose config.json lacks the key resumes as it was planned (one query
    phase; the answer's phase not planned)."""
    if not (run_dir / CONFIG_FILE).is_file():
        return plan
    try:
        held = getattr(load_plan(run_dir), name)
    except RunFolderError:  # a damaged config.json is named where the folder is checked
        return plan
    return replace(plan, **{name: held})


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


def calibration_aim(info: ModelInfo, plan: SweepPlan, options: SweepOptions, dry_run: bool) -> Optional[CalibrationAim]:
    """--calibrate's band and knobs (None without it); PlanError for options it cannot take."""
    if not options.calibrate:
        if options.target_accuracy is not None:
            raise PlanError("--target-accuracy applies to --calibrate only")
        return None
    if plan.offsets:
        raise PlanError("--calibrate chooses a difficulty by plain scoring; run it without --offsets, --shift or "
                        "--random-offset, then sweep the setting it chose (--context, --task) with them")
    if dry_run:
        raise PlanError("--dry-run cannot foresee the setting --calibrate's pilot will choose; dry-run that setting "
                        "(--context, --task) instead")
    band = Band.parse(options.target_accuracy or DEFAULT_BAND)
    knobs = calibration_knobs(plan.task, context_given=options.context is not None, task_given=options.task is not None)
    return CalibrationAim(band, knobs, fit=None if options.padding else SweepDefaults.for_model(info).padding)


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
