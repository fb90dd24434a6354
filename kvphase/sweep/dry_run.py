"""`--dry-run` of a planned sweep: each run's plan checked against its folder, one context scored and
timed, the estimated wall time and llama.cpp's expected memory; no folder created or written
(the counts and timing themselves are `sweep.estimate`'s)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kvphase.engines.llamacpp import Vocab
from kvphase.errors import PlanError
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.sweep.backend_setup import backend_context, open_backend
from kvphase.sweep.notices import Notice, Say, log_notice
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.planning import PlannedSweep, plan_notices
from kvphase.sweep.run import check_run_dir


@dataclass(frozen=True)
class DryRun:
    """What --dry-run found for one run: its estimate (`sweep.estimate`), whether one context
    was timed (not for a header-only file), and llama.cpp's expected memory (None otherwise)."""

    run_dir: Path
    plan: SweepPlan
    model: Path
    estimate: object  # sweep.estimate.SweepEstimate
    timed: bool
    memory: Optional[str]


def dry_run_planned(planned: PlannedSweep, say: Say = log_notice) -> list[DryRun]:
    """--dry-run of every planned run: the plan's counts, one context scored and timed, the
    estimated wall time and the peak memory; the folders are read (a resume's checks), never
    created or written."""
    if planned.runs[0][0].offsets:
        raise PlanError("--dry-run times plain scoring; a dry run without --offsets, --shift or --random-offset "
                        "estimates one shift (K shifts cost about K times its tokens)")
    return [dry_run_sweep(planned, plan, run_dir, say) for plan, run_dir in planned.runs]


def dry_run_sweep(planned: PlannedSweep, plan: SweepPlan, run_dir: Path, say: Say) -> DryRun:
    """One run's dry run (`dry_run_planned`)."""
    from kvphase.sweep.estimate import estimate_sweep

    info = planned.info
    check_run_dir(run_dir, plan, info)  # before the model loads, as a sweep checks it
    for notice in plan_notices(info, plan, planned.options.detect):
        say(notice)
    timed = info.weights_size is None or plan.backend == "server"
    # a header-only file: the prompts from its vocabulary, nothing to run here
    opened = open_backend(plan, info, planned.options.threads, planned.connect, say) if timed else \
        nullcontext(Vocab.load(info))  # the bare vocabulary frees itself
    with opened as backend:
        estimate = estimate_sweep(plan, backend, run_dir, info, timed, announce=lambda line: say(Notice(line)))
    memory = expected_memory(info, plan) if plan.backend == "llama.cpp" and estimate.pending_contexts else None
    return DryRun(run_dir, plan, info.path, estimate, timed, memory)


def expected_memory(info: ModelInfo, plan: SweepPlan) -> str:
    """The estimate of `engines.memory` for the plan's backend context, and what is available."""
    from kvphase.engines.memory import available_memory, memory_need

    need = memory_need(info, backend_context(info, plan), cache_type=plan.backend_options.get("cache_type", "f16"))
    available = available_memory()
    return need.describe() + (f"; {available.describe()}" if available else "")
