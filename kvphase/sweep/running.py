"""Running a planned sweep: every run's folder and contexts checked first, each run scored into its
folder (resuming what it holds) through a backend `backend_setup` opens and closes, calibration's
pilot where `--calibrate` asks for one, and each run's report.

Nothing here prints; what a user should read goes to a `say` callback as a `Notice`.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Callable, ContextManager, Optional

from kvphase.engines.llamacpp import Vocab
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.runfolder import RunLock
from kvphase.sweep.backend_setup import open_backend
from kvphase.sweep.calibrate import Calibration, held_calibration, plan_for_folder
from kvphase.sweep.notices import Notice, Say, log_notice
from kvphase.sweep.plan import SweepPlan, query_room
from kvphase.sweep.planning import CalibrationAim, PlannedSweep, plan_notices
from kvphase.sweep.reach_check import acting_context, backend_reach
from kvphase.sweep.run import SweepProgress, check_run_dir, execute_sweep
from kvphase.sweep.tasks import load_task


def check_runs(info: ModelInfo, runs: list[tuple[SweepPlan, Path]]) -> None:
    """Each run's folder, and that its contexts can be laid out (a sweep finds that out only once
    its model has loaded; one round of contexts shows it): PlanError or RunFolderError for the first
    that cannot run."""
    from kvphase.sweep.contexts import build_contexts

    vocab = Vocab.load(info)
    for plan, run_dir in runs:
        check_run_dir(run_dir, plan, info)
        build_contexts(load_task(plan.task), vocab, plan.context_settings, rounds=1)


ProgressBar = Callable[[], ContextManager[SweepProgress]]  # entered around each run's scoring


def run_planned(planned: PlannedSweep, progress: Optional[ProgressBar] = None, say: Say = log_notice,
                on_run: Callable[[Path, object], None] = lambda run_dir, summary: None) -> list[Path]:
    """Score every planned run into its folder (resuming what each holds) and build its report;
    `on_run(run_dir, summary)` as each finishes. Returns the run folders."""
    info = planned.info
    if len(planned.runs) > 1:  # every run's folder and contexts are checked before the first run spends its time
        check_runs(info, planned.runs)
    for plan, run_dir in planned.runs:
        on_run(run_dir, run_sweep(info, plan, run_dir, planned, progress, say))
    return [run_dir for _, run_dir in planned.runs]


def run_sweep(info: ModelInfo, plan: SweepPlan, run_dir: Path, planned: PlannedSweep,
              progress: Optional[ProgressBar], say: Say):
    """Score the plan into its folder (resuming what it holds) and build the report; returns its
    summary. With --calibrate, at the setting a pilot chooses first (or the one the folder's pilot chose)."""
    from kvphase.sweep.report import build_report  # scipy: imported when used, not at start-up

    threads, connect, aim = planned.options.threads, planned.connect, planned.aim
    with RunLock(run_dir) as lock:  # one sweep per folder; the folder and its files are checked before any model loads
        check_run_dir(run_dir, aim and held_calibration(run_dir, plan, aim.band, aim.knobs) or plan, info)
        if lock.stale:  # a sweep died here
            say(Notice(f"{run_dir}: the sweep that held it ({lock.stale}) ended without releasing it; resuming.",
                       "warning"))
        for notice in plan_notices(info, plan, planned.options.detect):
            say(notice)
        if aim is not None:
            plan = calibrated(info, plan, run_dir, aim, threads, connect, say)
        with open_backend(plan, info, threads, connect, say) as backend, \
                (progress or (lambda: nullcontext(SweepProgress())))() as bar:
            execute_sweep(plan, backend, run_dir, info, bar)
        return build_report(run_dir)


def calibrated(info: ModelInfo, plan: SweepPlan, run_dir: Path, aim: CalibrationAim, threads: Optional[int],
               connect: dict, say: Say) -> SweepPlan:
    """The plan at the setting the folder's pilot chose, or a new pilot's choice (its steps said)."""
    longest = info.context_length - query_room(info) if info.context_length else plan.context

    def pilot_backend(context: int):
        return open_backend(replace(plan, context=context), info, threads, connect, say)

    def say_step(step) -> None:
        say(Notice(f"calibration pilot: {step.task} at {step.context} tokens: {step.accuracy:.1f}% "
                   f"({step.correct}/{step.targets}), {step.tokens:,} tokens"))

    chosen, held = plan_for_folder(plan, run_dir, aim.band, aim.knobs, max(longest, plan.context), pilot_backend,
                                   aim.fit, say_step, shortest_acting_context(info, plan))
    calibration = Calibration.from_json(chosen.calibration)
    say(Notice(f"--calibrate {'(as this folder chose it before) ' if held else ''}chose task {chosen.task} at "
               f"{chosen.context} tokens for {aim.band} (the pilot stopped {calibration.stopped} and cost "
               f"{100 * calibration.pilot_tokens / calibration.choice.sweep_tokens:.1f}% of the sweep)."))
    return chosen


def shortest_acting_context(info: ModelInfo, plan: SweepPlan) -> int:
    """The shortest --context at which the file's indexer acts on every query (0 where it has none, or
    where the plan's backend does not run it): --calibrate searches no shorter one."""
    return acting_context(backend_reach(info.compression, plan.backend, plan.backend_options.get("design")))
