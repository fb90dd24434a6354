"""Whether a run's compressor touched its targets: the file's reach (`gguf.reach`) read against the
run's length and the engine that scored it, before any test is read."""

from __future__ import annotations

from typing import Optional

from kvphase.errors import GGUFError
from kvphase.gguf.modelinfo import CompressionSpec
from kvphase.gguf.reach import Reach, reach_of
from kvphase.sweep.plan import QUERY_ROOM


def backend_reach(compression: CompressionSpec, backend: str, design: Optional[str] = None) -> Reach:
    """The reach of the compressor a run's backend runs: the file's own, or none for the reference
    under a design of its own."""
    if backend == "reference" and design != "trained":
        return Reach(compression.family)
    return reach_of(compression)


def compressor_inactive(compression: CompressionSpec, context: int, backend: str, design: Optional[str] = None,
                        engine_ran_it: bool = True, query_room: int = QUERY_ROOM) -> Optional[str]:
    """Why no part of the compressor touched a target of a run with `context` tokens before its
    queries, in words for a headline; None when a part did, or when the run's backend does not run the
    file's own compressor. Every answer is predicted within `query_room` more tokens (the query, its
    answer and a query phase's filler), so "inactive" holds for every target.
    `engine_ran_it`: False when the engine is known to have skipped a compressor that needs conditions
    of its own (kvphase's llama.cpp backend ran minimax-m3 dense before it opened it under flash attention)."""
    reach = backend_reach(compression, backend, design)
    if not reach.declared:
        return None
    if reach.engine_condition and not engine_ran_it:
        return (f"llama.cpp ran every layer dense ({reach.engine_condition}; kvphase's in-process backend then "
                "scored a query on a second sequence in one unified cache without flash attention)")
    idle = reach.idle_at(context + query_room)
    if idle is None:
        return None
    return f"at {context:,} tokens {idle}"


def plan_inactive(compression: CompressionSpec, plan, engine_ran_it: bool = True) -> Optional[str]:
    """`compressor_inactive` of a plan (`sweep.plan.SweepPlan`): its length, backend and query phases."""
    return compressor_inactive(compression, plan.context, plan.backend, plan.backend_options.get("design"),
                               engine_ran_it, QUERY_ROOM + plan.query_shift_room)


def recorded_inactive(manifest: dict, plan) -> Optional[str]:
    """`plan_inactive` from a run folder's manifest (its `compression`); None where the manifest
    predates it or declares settings no engine would run."""
    recorded = manifest.get("compression")
    if not recorded:
        return None
    ran = plan.backend != "llama.cpp" or bool(manifest.get("engine", {}).get("flash_attn"))  # MSA needs it
    try:
        return plan_inactive(CompressionSpec(**recorded), plan, engine_ran_it=ran)
    except (GGUFError, TypeError):
        return None


def reach_notice(reach: Reach, context: int, inactive: Optional[str]) -> list[str]:
    """The plan's lines on the compressor's reach (sweep, dry run): where each part acts and what the
    indexer reads at this length; a warning line first when it touches no target."""
    if not reach.declared:
        return []
    lines = [f"compressor reach: {line}." for line in reach.lines()]
    if reach.raw_window:  # `plan.behind_raw_window`, or the task's own layout, keeps them there
        lines.append(f"every target ends before the last {reach.raw_window} tokens ({reach.raw_window_name}), which "
                     "are read exactly.")
    if reach.selection:
        lines.append(f"at {context:,} tokens: {reach.read_share_text(context + 1)}.")
    if inactive:
        lines.insert(0, f"Compressor inactive at this length: {inactive}; the run measures the model without its "
                        f"compressor" + (f" (for this file it acts from --context {acting_context(reach):,})"
                                         if reach.selection else "") + ".")
    return lines


def acting_context(reach: Reach) -> int:
    """The shortest --context whose queries all see more units than every indexer keeps (0 without one)."""
    return max((s.acts_from for s in reach.selection), default=1) - 1
