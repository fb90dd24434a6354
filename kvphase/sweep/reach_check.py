"""Whether a run's compressor touched its targets: the file's reach (`gguf.reach`) read against the
run's length and the engine that scored it, before any test is read."""

from __future__ import annotations

from typing import Optional

from kvphase.errors import GGUFError
from kvphase.gguf.modelinfo import CompressionSpec
from kvphase.gguf.reach import Reach, reach_of

QUERY_TOKENS_MOST = 64  # the query and its answer fit in plan.QUERY_ROOM tokens: an answer is predicted before this


def compressor_inactive(compression: CompressionSpec, context: int, backend: str,
                        design: Optional[str] = None, engine_ran_it: bool = True) -> Optional[str]:
    """Why no part of the compressor touched a target of a run with `context` tokens before its
    queries, in words for a headline; None when a part did, or when the run's backend does not run the
    file's own compressor (the reference under a design of its own). Every answer is predicted with
    fewer than QUERY_TOKENS_MOST more tokens in the sequence, so "inactive" holds for every target.
    `engine_ran_it`: False when the engine is known to have skipped a compressor that needs conditions
    of its own (kvphase's llama.cpp backend ran minimax-m3 dense before it opened it under flash attention)."""
    if backend == "reference" and design != "trained":
        return None
    reach = reach_of(compression)
    if not reach.declared:
        return None
    if reach.engine_condition and not engine_ran_it:
        return (f"llama.cpp ran every layer dense ({reach.engine_condition}; kvphase's in-process backend then "
                "scored a query on a second sequence in one unified cache without flash attention)")
    idle = reach.idle_at(context + QUERY_TOKENS_MOST)
    if idle is None:
        return None
    return f"at {context:,} tokens {idle}"


def recorded_inactive(manifest: dict, context: int, backend: str, design: Optional[str]) -> Optional[str]:
    """`compressor_inactive` from a run folder's manifest (its `compression`); None where the manifest
    predates it or declares settings no engine would run."""
    recorded = manifest.get("compression")
    if not recorded:
        return None
    ran = backend != "llama.cpp" or bool(manifest.get("engine", {}).get("flash_attn"))  # MSA needs it (backends.llamacpp)
    try:
        spec = CompressionSpec(**recorded)
        return compressor_inactive(spec, context, backend, design, engine_ran_it=ran)
    except (GGUFError, TypeError):
        return None


def reach_notice(reach: Reach, context: int, inactive: Optional[str]) -> list[str]:
    """The plan's lines on the compressor's reach (sweep, dry run): where each part acts and what the
    indexer reads at this length; a warning line first when it touches no target."""
    if not reach.declared:
        return []
    lines = [f"compressor reach: {line}." for line in reach.lines()]
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
