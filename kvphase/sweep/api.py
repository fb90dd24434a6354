"""kvphase from Python (exported by `kvphase`): the functions `kvphase sweep`, `report`,
`compare` and `inspect` call.

    import kvphase
    run = kvphase.sweep("model.gguf", context=512, per_residue=8)
    run.summary.headline(); run.results  # a pandas DataFrame, one row per target
    options = kvphase.SweepOptions(context=512, per_residue=8)
    run = kvphase.sweep("model.gguf", options, seed=1)  # the record, a field or two changed

Every keyword of `sweep` is the command's option of the same name (`--per-residue` is
`per_residue=`; `--option KEY=VALUE` is `design_options={"KEY": VALUE}`), a field of
`SweepOptions`; `help(kvphase.sweep)` lists them with their types and defaults. Bad input raises the
library's errors (`kvphase.errors`: ModelFileError, PlanError, RunFolderError, ...), each a
`KvphaseError` whose message is the line the command prints.
"""

from __future__ import annotations

import inspect as _signatures
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from kvphase.errors import PlanError, RunFolderError
from kvphase.options_check import check_callback, check_path, check_run_list
from kvphase.runfolder import REPORT_FILE
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.run import SweepProgress, load_manifest, load_plan, load_results
from kvphase.sweep.strides import ALL
from kvphase.sweep.dry_run import DryRun, dry_run_planned
from kvphase.sweep.notices import Notice, Say, log_notice
from kvphase.sweep.options import SweepOptions
from kvphase.sweep.planning import plan_sweep_runs
from kvphase.sweep.running import run_planned

PathLike = Union[str, Path]
Progress = Union[SweepProgress, Callable[[int, int], None], None]  # an object, or progress(done, total)


class Run:
    """One run folder of `kvphase sweep`: its plan, summary, results, report and figure."""

    def __init__(self, path: PathLike, plan: SweepPlan, summary=None):
        self.path = Path(path)
        self.plan = plan
        self._summary = summary

    @property
    def summary(self):
        """The report's numbers (`sweep.analysis.Summary`: mean_accuracy, gap, test.p_value, headline())."""
        if self._summary is None:
            from kvphase.sweep.report import run_summary  # scipy: imported when used

            self._summary = run_summary(self.plan, self.results, load_manifest(self.path))
        return self._summary

    @property
    def results(self):
        """results.csv as a pandas DataFrame: one row per scored target (residue, phase, correct, logprob, ...)."""
        return load_results(self.path)

    @property
    def report_path(self) -> Path:
        return self.path / REPORT_FILE

    def figure(self):
        """Accuracy by residue with 95% intervals, the report's figure, as a matplotlib Figure."""
        from kvphase.sweep.report import accuracy_figure

        return accuracy_figure([(self.path.name, self.summary)], self.plan.stride)

    def __repr__(self) -> str:
        plan = self.plan
        return f"Run({str(self.path)!r}, stride={plan.stride}, context={plan.context}, task={plan.task!r})"


@dataclass(frozen=True)
class StrideSweep:
    """`sweep_strides`: one run per stride the model declares, and their comparison."""

    runs: list[Run]
    comparison: object  # sweep.compare.Comparison: .table (a DataFrame), .markdown, .figure, .csv


def _takes_sweep_options(function):
    """`function` with a signature that lists every `SweepOptions` field as a keyword (its type and
    default), where its code takes them as **overrides: `help()` and editors show the options, and the
    record that defines them stays the one place they are written."""
    signature = _signatures.signature(function)
    given = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    keywords = [_signatures.Parameter(f.name, _signatures.Parameter.KEYWORD_ONLY, annotation=f.type,
                                      default=None if f.default is MISSING else f.default)
                for f in fields(SweepOptions) if f.name not in signature.parameters]
    function.__signature__ = signature.replace(parameters=given + keywords)
    return function


@_takes_sweep_options
def sweep(model: Optional[PathLike] = None, options: Optional[SweepOptions] = None, *, progress: Progress = None,
          on_notice: Optional[Say] = None, **overrides) -> Run:
    """Score a model's retrieval accuracy by token phase into a run folder (resuming what it holds)
    and write its report: `kvphase sweep MODEL`. `model` None: the default SmolLM2-135M.
    `progress(done, total)` as targets are scored; `on_notice(Notice)` hears what the command
    prints on stderr (default: the "kvphase" logger). `options`: a `SweepOptions` record, whose options
    left unset `overrides` (its fields as keywords) set; one it sets to another value is refused."""
    options = _options(options, overrides)
    if str(options.stride).strip().lower() == ALL:
        raise PlanError("stride='all' makes one run per stride: call kvphase.sweep_strides")
    _check_progress(progress)
    return _run_all(_planned(model, options, on_notice), progress, on_notice)[0]


@_takes_sweep_options
def sweep_strides(model: Optional[PathLike] = None, options: Optional[SweepOptions] = None, *,
                  progress: Progress = None, on_notice: Optional[Say] = None,
                  on_run: Callable[[Run], None] = lambda run: None, **overrides) -> StrideSweep:
    """`kvphase sweep MODEL --stride all`: one run per stride the file declares (in `out`, when
    given), then their comparison beside them; `on_run(run)` as each run finishes."""
    from kvphase.sweep.compare import write_comparison  # scipy: imported when used
    from kvphase.sweep.strides import comparison_dir

    _check_progress(progress)
    check_callback("on_run", on_run)
    planned = _planned(model, _options(options, {**overrides, "stride": "all"}), on_notice)
    runs = _run_all(planned, progress, on_notice, on_run)
    comparison = write_comparison([run.path for run in runs], comparison_dir([run.path for run in runs],
                                                                             planned.strides))
    return StrideSweep(runs, comparison)


@_takes_sweep_options
def dry_run(model: Optional[PathLike] = None, options: Optional[SweepOptions] = None, *,
            on_notice: Optional[Say] = None, **overrides) -> list[DryRun]:
    """`kvphase sweep --dry-run`: for each run the options make, its counts, one context scored and
    timed, the estimated wall time and memory; nothing is written."""
    planned = _planned(model, _options(options, overrides), on_notice, dry_run=True)
    return dry_run_planned(planned, on_notice or log_notice)


def load_run(path: PathLike) -> Run:
    """The run a `kvphase sweep` folder holds; RunFolderError when it is not one, is damaged, or
    has nothing scored."""
    path = check_path("path", path)
    plan = load_plan(path)
    if load_results(path).empty:
        raise RunFolderError(f"{path} has no scored targets yet; run the sweep first")
    return Run(path, plan)


def report(path: PathLike) -> Run:
    """Rebuild a sweep folder's summary.json, report.md and figure from its config.json and
    results.csv (`kvphase report RUN_DIR`); RunFolderError as `load_run`."""
    from kvphase.sweep.report import build_report  # scipy: imported when used

    path = check_path("path", path)
    summary = build_report(path)
    return Run(path, load_plan(path), summary)


def compare(runs: Sequence[Union[Run, PathLike]], out: Optional[PathLike] = None):
    """Several runs side by side (`kvphase compare`): writes comparison.md, comparison.png and
    comparison.csv into `out` (default reports/comparison) and returns the `Comparison`."""
    from kvphase.sweep.compare import write_comparison  # scipy: imported when used
    from kvphase.sweep.options import COMPARISON_DIR, check_own_folder

    runs = check_run_list("runs", runs, lambda run: isinstance(run, Run))
    out = check_path("out", out, optional=True)
    check_own_folder(out)
    return write_comparison([run.path if isinstance(run, Run) else Path(run) for run in runs],
                            COMPARISON_DIR if out is None else out)


def inspect(model: PathLike, partial: bool = True):
    """What a GGUF file declares, from its metadata alone (`kvphase inspect`): a `ModelInfo`. `model` is a
    path or an http(s) URL (read by range requests); `partial`: a file cut inside its tensor data is read
    too (its `needed_size` says how far the data runs)."""
    from kvphase.gguf.modelinfo import read_model_info

    check_path("model", model)
    if not isinstance(partial, bool):
        raise PlanError(f"partial expects True or False, got {partial!r}")
    return read_model_info(model if isinstance(model, str) else Path(model), partial=partial)


def _options(options: Optional[SweepOptions], overrides: dict) -> SweepOptions:
    """The record with `overrides` applied to the options it leaves unset (checked as a new record is);
    PlanError naming a keyword that is no option, one the record sets otherwise, or an `options` that is
    not a SweepOptions."""
    if options is None:
        return SweepOptions.from_keywords(overrides)
    if not isinstance(options, SweepOptions):
        raise PlanError(f"options expects a kvphase.SweepOptions, got {type(options).__name__}")
    return options.overridden(overrides)


def _planned(model, options: SweepOptions, on_notice: Optional[Say], dry_run: bool = False):
    check_path("model", model, optional=True)
    check_callback("on_notice", on_notice)
    return plan_sweep_runs(None if model is None else Path(model), options, dry_run, on_notice or log_notice)


def _run_all(planned, progress: Progress, on_notice: Optional[Say],
             on_run: Callable[[Run], None] = lambda run: None) -> list[Run]:
    runs = []

    def finished(run_dir: Path, summary) -> None:
        runs.append(Run(run_dir, load_plan(run_dir), summary))  # the folder's plan: a calibrated one's choice
        on_run(runs[-1])

    run_planned(planned, _progress_bar(progress), on_notice or log_notice, finished)
    return runs


def _check_progress(progress: Progress) -> None:
    if not isinstance(progress, SweepProgress):
        check_callback("progress", progress)


def _progress_bar(progress: Progress):
    """The session's progress context for `progress`: an object's own callbacks, or a function
    of (done, total) called as targets are scored."""
    from contextlib import nullcontext

    if progress is None or isinstance(progress, SweepProgress):
        return lambda: nullcontext(progress or SweepProgress())
    done = [0, 0]  # targets scored, targets planned

    def start(total: int, already: int) -> None:
        done[:] = [already, total]
        progress(already, total)

    def advance(n: int) -> None:
        done[0] += n
        progress(*done)

    return lambda: nullcontext(SweepProgress(start, advance))


__all__ = ["Run", "StrideSweep", "Notice", "SweepOptions", "DryRun", "sweep", "sweep_strides", "dry_run", "load_run",
           "report", "compare", "inspect"]
