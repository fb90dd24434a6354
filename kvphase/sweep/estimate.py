"""`kvphase sweep --dry-run`: what a sweep would evaluate and how long it would take, from its
plan and one scored context, with no run folder created or touched.

The counts are the sweep's own: the contexts `build_contexts` lays out, less the targets a
folder already holds (checked as a resume checks them), and the tokens a backend decodes for
them: each context once, then per query its prompt and every answer token but the last
(teacher forcing: `LlamaCppBackend.tokens_evaluated` counts the same). The wall time is the
first remaining context's, scored through the backend with its queries, times the remaining
contexts: contexts are all the same length, so each costs about the same.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from kvphase.backends.base import Backend, score_contexts
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.sweep.contexts import build_contexts, plan_fingerprint
from kvphase.sweep.layout import Target
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.run import _check_finished_rows_match, check_run_dir, load_results
from kvphase.sweep.tasks import load_task


@dataclass(frozen=True)
class SweepEstimate:
    """What a sweep of `plan` into a folder would do, and what one context of it cost here."""

    contexts: int  # contexts in the plan
    targets: int  # targets in the plan
    tokens: int  # tokens the whole plan evaluates: contexts + queries
    done: int  # targets the folder already holds
    pending_contexts: int  # contexts with a target still to score
    pending_tokens: int  # tokens those contexts and their remaining queries evaluate
    timed_tokens: int  # tokens of the one context scored (0 when nothing remains)
    timed_queries: int
    seconds_per_context: float  # wall time of that context with its queries
    peak_rss_mib: float  # this process's peak resident memory after scoring it (ru_maxrss)

    @property
    def pending_targets(self) -> int:
        return self.targets - self.done

    @property
    def seconds(self) -> float:
        """The estimated wall time of the sweep: one context's time, times the contexts left."""
        return self.seconds_per_context * self.pending_contexts


def evaluated_tokens(context: Sequence[int], targets: Sequence[Target]) -> int:
    """Tokens a backend decodes for a context and these targets' queries (teacher-forced: the
    prompt and every answer token but the last)."""
    return len(context) + sum(len(t.query.prompt) + len(t.query.answer) - 1 for t in targets)


def estimate_sweep(plan: SweepPlan, backend: Backend, run_dir: Path, info: ModelInfo, timed: bool = True,
                   announce: Callable[[str], object] = lambda line: None) -> SweepEstimate:
    """Build the plan's contexts, check the folder's finished rows against them (as a resumed
    sweep does: a folder it would refuse is refused here too), and score the first context with
    a target left, timing it (`timed`; `backend` need only tokenize when not), after a line to
    `announce` saying so (a long context's hundreds of queries take minutes). Reads `run_dir` only."""
    check_run_dir(run_dir, plan, info)
    contexts = build_contexts(load_task(plan.task), backend, plan.context_settings)
    done = _check_finished_rows_match(load_results(run_dir), contexts, run_dir, plan_fingerprint(contexts))
    pending = [(c, [t for t in c.targets if t.target_id not in done]) for c in contexts]
    pending = [(c, todo) for c, todo in pending if todo]
    seconds, timed_tokens, timed_queries = 0.0, 0, 0
    if pending and timed:
        context, todo = pending[0]
        announce(f"Timing one context: {evaluated_tokens(context.tokens, todo):,} tokens with its {len(todo)} "
                 f"{'query' if len(todo) == 1 else 'queries'}...")
        started = time.perf_counter()
        for _ in score_contexts(backend, [(context.tokens, [t.query for t in todo])]):
            pass
        seconds = time.perf_counter() - started
        timed_tokens, timed_queries = evaluated_tokens(context.tokens, todo), len(todo)
    return SweepEstimate(
        contexts=len(contexts), targets=sum(len(c.targets) for c in contexts),
        tokens=sum(evaluated_tokens(c.tokens, c.targets) for c in contexts), done=len(done),
        pending_contexts=len(pending), pending_tokens=sum(evaluated_tokens(c.tokens, todo) for c, todo in pending),
        timed_tokens=timed_tokens, timed_queries=timed_queries, seconds_per_context=seconds,
        peak_rss_mib=peak_rss_mib())


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


__all__ = ["SweepEstimate", "estimate_sweep", "evaluated_tokens", "peak_rss_mib"]
