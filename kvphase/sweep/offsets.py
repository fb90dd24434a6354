"""Fixes at inference time for a weak phase: score each target with every token's phase moved.

A shift `d` moves every token's phase by `d`, in one of two ways:

- `prefix`: `d` filler tokens go in front of the context, right after BOS; the rest is unchanged.
  llama.cpp's block grid is fixed at absolute position 0, so this is what a deployed model
  allows. Queries still come right after the (now longer) context.
- `window`: the reference backend moves its compressor's window starts back by `d` tokens
  (`CompressedAttention.shifted`) and every token stays at its position. Used for the numpy
  reference: a `kvphase train` gpt2-layout file learned absolute positions with every query at
  the same position, so a prefix shift would move the query to positions the model never asked
  from, mixing a position change into the phase change.

Three uses, as `SweepPlan.offsets` records them (`OffsetPlan`): one fixed shift for every context
(`--shift d`); an ensemble of k shifts spread over the stride, combined per target (`--offsets k
--combine mean|max`); one shift per context drawn at random (`--random-offset`, seeded). The
residue a target is reported under stays its position's in the unshifted plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from kvphase.backends.base import AnswerLogprobs, Backend, Score, ShiftsWindows, score_from_logprobs
from kvphase.errors import PlanError

SHIFT_BY = ("prefix", "window")
COMBINE_RULES = ("mean", "max")
OFFSETS_FILE = "offsets.csv"  # one row per (target, shift): each shift's own score
OFFSET_COLUMNS = ["target_id", "shift", "correct", "logprob", "confidence", "predicted"]
RANDOM_STREAM = 20  # keeps the random offsets' draws apart from build_contexts's rng([seed, context])


@dataclass(frozen=True)
class OffsetPlan:
    """How a sweep moves phases; the empty plan is the plain sweep."""

    shifts: tuple[int, ...] = ()  # the shifts every target is scored under (() with `random`)
    combine: str = ""  # with several shifts: "mean" (average the log-prob rows) or "max" (the most confident)
    random: bool = False  # one shift per context, drawn uniformly in [0, stride) from the seed
    shift_by: str = "prefix"  # "prefix" (filler tokens after BOS) or "window" (the compressor's starts)

    def __post_init__(self) -> None:
        if self.shift_by not in SHIFT_BY:
            raise PlanError(f"offsets: shift_by must be one of {', '.join(SHIFT_BY)}, got {self.shift_by!r}")
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in self.shifts):
            raise PlanError(f"offsets: shifts must be whole numbers from 0, got {list(self.shifts)}")
        if len(set(self.shifts)) != len(self.shifts):
            raise PlanError(f"offsets: shifts must differ, got {list(self.shifts)}")
        if self.random and self.shifts:
            raise PlanError("--random-offset draws each context's shift itself; it takes no --offsets or --shift")
        several = len(self.shifts) > 1
        if several and self.combine not in COMBINE_RULES:
            raise PlanError(f"--combine must be one of {', '.join(COMBINE_RULES)}, got {self.combine!r}")
        if self.combine and not several:
            raise PlanError("--combine applies to --offsets K (several shifts) only")

    @classmethod
    def from_json(cls, raw: dict) -> OffsetPlan:
        """The plan `config.json` records (`{}`: the plain sweep); PlanError when damaged."""
        try:
            return cls(**{**raw, "shifts": tuple(raw.get("shifts", ()))})
        except TypeError as exc:
            raise PlanError(f"offsets: {str(exc).replace('__init__() ', '')}") from None

    def to_json(self) -> dict:
        """What `config.json` records: {} for the plain sweep."""
        if not self.active:
            return {}
        return {**asdict(self), "shifts": list(self.shifts)}

    @property
    def active(self) -> bool:
        return bool(self.shifts) or self.random

    def max_shift(self, stride: int) -> int:
        """The longest shift any context can get."""
        return stride - 1 if self.random else max(self.shifts, default=0)

    def shifts_for(self, context_index: int, seed: int, stride: int) -> tuple[int, ...]:
        """The shifts one context is scored under."""
        if self.random:
            return (int(np.random.default_rng([seed, RANDOM_STREAM, context_index]).integers(stride)),)
        return self.shifts

    def folder_suffix(self) -> str:
        """What the default run folder's name adds: -shift2, -offsets4-mean, -random-offset."""
        if self.random:
            return "-random-offset"
        if len(self.shifts) > 1:
            return f"-offsets{len(self.shifts)}-{self.combine}"
        return f"-shift{self.shifts[0]}" if self.shifts else ""

    def describe(self) -> str:
        """One sentence for the report."""
        how = ("filler tokens after BOS" if self.shift_by == "prefix" else
               "the compressor's window starts moved back, positions unchanged")
        if self.random:
            return f"each context scored under one shift drawn at random in [0, S) ({how})"
        if len(self.shifts) > 1:
            rule = ("the per-shift log-probability rows averaged" if self.combine == "mean" else
                    "the most confident shift's answer (highest summed top probability over the answer tokens)")
            return f"each target scored under shifts {list(self.shifts)} ({how}), combined by {self.combine}: {rule}"
        return f"every context scored under shift {self.shifts[0]} ({how})"


def offset_plan_from_options(offsets: int | None, combine: str | None, shift: int | None, random_offset: bool,
                             stride: int, shift_by: str) -> OffsetPlan:
    """The OffsetPlan `--offsets K --combine RULE`, `--shift D` or `--random-offset` ask for; PlanError
    for a combination or value that cannot run. K shifts are spread over the stride (0, S/K, ...)."""
    if combine is not None and offsets is None:
        raise PlanError("--combine applies to --offsets K only")
    if sum(x is not None for x in (offsets, shift)) + random_offset > 1:
        raise PlanError("choose one of --offsets, --shift and --random-offset")
    if offsets is not None:
        if not 2 <= offsets <= stride:
            raise PlanError(f"--offsets must be from 2 to the stride {stride} (shifts d and d + {stride} put every "
                            f"token at the same phase), got {offsets}")
        return OffsetPlan(shifts=tuple(i * stride // offsets for i in range(offsets)),
                          combine="mean" if combine is None else combine.strip().lower(), shift_by=shift_by)
    if shift is not None:
        if not 0 <= shift < stride:
            raise PlanError(f"--shift must be from 0 to {stride - 1} (below the stride), got {shift}")
        return OffsetPlan(shifts=(shift,), shift_by=shift_by)
    return OffsetPlan(random=True, shift_by=shift_by) if random_offset else OffsetPlan()


class ShiftedScore(NamedTuple):
    """One target's score under one shift, and how sure the model was (the max rule's measure)."""

    shift: int
    score: Score
    confidence: float  # sum over the answer tokens of the top probability; nan when not computed


def combine_scores(rule: str, rows: Sequence[np.ndarray], answer: Sequence[int]) -> Score:
    """One target's score from its log-softmax rows under each shift, (n_answer, n_vocab) each.
    mean: the rows averaged; correct when each averaged row's argmax is its answer token, logprob
    the averaged rows' sum at the answer tokens. max: the score of the shift whose top
    probabilities, summed over the answer tokens, are highest (the first such shift on a tie)."""
    if rule == "mean":
        return score_from_logprobs(np.mean(np.stack(rows), axis=0), answer)  # (n_answer, n_vocab)
    if rule == "max":
        best = int(np.argmax([confidence(r) for r in rows]))
        return score_from_logprobs(rows[best], answer)
    raise PlanError(f"--combine must be one of {', '.join(COMBINE_RULES)}, got {rule!r}")


def confidence(logprobs: np.ndarray) -> float:
    """Sum over the answer positions of the top probability: (n_answer, n_vocab) -> float."""
    return float(np.exp(logprobs.max(axis=1)).sum())


def prefix_pad(filler: Sequence[int], shift: int) -> tuple[int, ...]:
    """`shift` filler tokens (the filler repeated as needed)."""
    if shift and not filler:
        raise PlanError("a prefix shift needs filler tokens; the task's filler text made none")
    return tuple((tuple(filler) * (1 + shift // max(len(filler), 1)))[:shift])


class ShiftedScorer:
    """Scores a context's queries under the shifts an OffsetPlan gives it, through `backend`."""

    def __init__(self, backend: Backend, plan: OffsetPlan, filler: Sequence[int], seed: int, stride: int):
        if plan.shift_by == "window" and not isinstance(backend, ShiftsWindows):
            raise PlanError("window shifts need the reference backend (it moves its compressor's windows)")
        if len(plan.shifts) > 1 and not isinstance(backend, AnswerLogprobs):
            raise PlanError(f"--offsets needs a backend that returns answer log-probability rows (llama.cpp or "
                            f"reference), not {type(backend).__name__}")
        self.backend, self.plan, self.filler, self.seed, self.stride = backend, plan, tuple(filler), seed, stride
        self.n_prefix = len(backend.prefix_ids)

    def score(self, context_index: int, tokens: Sequence[int],
              queries: Sequence) -> tuple[list[Score], list[list[ShiftedScore]]]:
        """The combined score of each query, and each query's score under every shift."""
        shifts = self.plan.shifts_for(context_index, self.seed, self.stride)
        if len(shifts) == 1:  # one shift: a plain score, no rows needed
            scores = self._under(shifts[0], tokens, queries, self.backend.score)
            return scores, [[ShiftedScore(shifts[0], s, float("nan"))] for s in scores]
        rows = [self._under(d, tokens, queries, self.backend.answer_logprobs) for d in shifts]  # [shift][query]
        answers = [q.answer for q in queries]
        each = [[ShiftedScore(d, score_from_logprobs(r[i], a), confidence(r[i])) for d, r in zip(shifts, rows)]
                for i, a in enumerate(answers)]
        combined = [combine_scores(self.plan.combine, [r[i] for r in rows], a) for i, a in enumerate(answers)]
        return combined, each

    def _under(self, shift: int, tokens: Sequence[int], queries: Sequence, method):
        """`method` (the backend's score or answer_logprobs) with every token's phase moved by `shift`."""
        if self.plan.shift_by == "window":
            self.backend.shift_windows(shift)
            try:
                return method(tokens, queries)
            finally:
                self.backend.shift_windows(0)
        shifted = tuple(tokens[:self.n_prefix]) + prefix_pad(self.filler, shift) + tuple(tokens[self.n_prefix:])
        return method(shifted, queries)


def score_shifted(scorer: ShiftedScorer, jobs: Sequence[tuple[int, Sequence[int], Sequence]]
                  ) -> Iterator[tuple[int, list[Score], list[list[ShiftedScore]]]]:
    """(job index, combined scores, per-shift scores) for each (context index, tokens, queries)
    job, one context after the other."""
    for index, (context_index, tokens, queries) in enumerate(jobs):
        yield (index, *scorer.score(context_index, tokens, queries))


__all__ = ["OffsetPlan", "ShiftedScorer", "combine_scores", "offset_plan_from_options", "score_shifted",
           "COMBINE_RULES", "OFFSETS_FILE", "OFFSET_COLUMNS"]
