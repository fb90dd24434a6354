"""Whether the targets transformers scores otherwise than a reference's llama.cpp folder follow an
indexer tie that the two engines broke their own ways.

A k-pool indexer keeps the top-k of its pool scores; transformers' `torch.topk` and llama.cpp's CPU
`top_k` (a `std::partial_sort`, `conform.ties`) keep different pools where scores tie at the edge of
the kept set, and from that token on the two compute different attention, each correctly. ReLU'd
scores tie often (exactly 0 wherever every indexer head is negative), in random weights and trained.

For each target that moved (a flag that differs on a profile check, a log-probability beyond the
tolerance on a logprobs check), its whole text (context, prompt and answer) is scored as one prompt
by both engines with every token's indexer selection recorded: llama.cpp's through its graph tap
(`engines.selection.IndexerRowsTap`), transformers' by hooks on its indexer modules
(`validate.transformers_indexer.indexer_selections`). `conform.ties.first_tie` decides as it does for
an engine path: up to the first token whose kept pools differ both engines' scores agree within
rounding, and there the pools one kept and the other did not score within rounding of the kept set's
edge. A target is explained when that token comes before the answer's last scored row. Only where the
transformers backend reads its indexer (`records_indexer`: glm5-next's k-pool, which both engines expose);
for another architecture nothing is explained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from kvphase.conform.ties import IndexerTie, first_tie, recorded


@dataclass(frozen=True)
class TieAccount:
    """Of the targets that moved between the engines, how many an indexer tie explains, and the first."""

    moved: int
    explained: int
    first: Optional[tuple[int, IndexerTie]] = None  # (target_id, its tie) of the first target explained
    looked: bool = True  # False: the architecture's selections are not read (every target unexplained)

    @property
    def every_one(self) -> bool:
        return self.moved > 0 and self.explained == self.moved

    def phrase(self, what: str) -> str:
        """One clause: how many of the moved `what` (e.g. "flags that differ") follow a tie, and the first."""
        if not self.looked:
            return f"{self.moved} {what}; whether an indexer tie explains them is not read for this architecture"
        said = f"an indexer tie explains {self.explained} of the {self.moved} {what}"
        if self.first is not None:
            target, tie = self.first
            said += (f" (target {target}: {tie.phrase(one='through llama.cpp', other='through transformers')}, "
                     "each engine on the text as one prompt)")
        return said

    def to_json(self) -> dict:
        return {"moved": self.moved, "explained": self.explained, "looked": self.looked,
                "first": None if self.first is None else {"target_id": self.first[0], **self.first[1].to_json()}}


def engine_ties(info, transformers_backend, contexts: Sequence, moved: Sequence[int],
                threads: Optional[int] = None) -> TieAccount:
    """The TieAccount of the `moved` target ids among `contexts` (`sweep.contexts.Context`), the reference
    GGUF `info` through llama.cpp against `transformers_backend` (its HF copy)."""
    moved = sorted(int(t) for t in moved)
    if not moved:
        return TieAccount(0, 0)
    if not transformers_backend.records_indexer:
        return TieAccount(len(moved), 0, looked=False)
    from kvphase.backends.base import Query
    from kvphase.backends.llamacpp import LlamaCppBackend
    from kvphase.validate.transformers_indexer import indexer_selections

    wanted = set(moved)
    texts = {t.target_id: (tuple(c.tokens) + tuple(t.query.prompt), tuple(t.query.answer))
             for c in contexts for t in c.targets if t.target_id in wanted}
    n_ctx = max(len(p) + len(a) for p, a in texts.values()) + 16
    llama = LlamaCppBackend(info, n_ctx=n_ctx, n_threads=threads, head_tap=True)
    explained, first = 0, None
    try:
        for target in moved:
            prompt, answer = texts[target]
            query = [Query(prompt, answer)]
            _, ours = recorded(llama, lambda b: b.answer_logprobs((), query))
            _, theirs = indexer_selections(transformers_backend, lambda b: b.answer_logprobs((), query))
            tie = first_tie(ours, theirs)
            if tie is not None and tie.position < len(prompt) + len(answer) - 1:
                explained += 1
                first = first or (target, tie)
    finally:
        llama.close()
    return TieAccount(len(moved), explained, first)


def moved_targets(rows, check: str, tolerance: float) -> list[int]:
    """The target ids that moved between a folder's rows and an engine's (`compare.paired_rows`): a flag
    that differs (profile) or a log-probability beyond `tolerance` (logprobs; one that is not a number too)."""
    if check == "profile":
        moved = rows["correct"] != rows["correct_ref"]
    else:
        moved = ~((rows["logprob"] - rows["logprob_ref"]).abs() <= tolerance)
    return [int(t) for t in np.asarray(rows.loc[moved, "target_id"])]
