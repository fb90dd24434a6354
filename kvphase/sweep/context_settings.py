"""What a sweep's contexts must satisfy (`ContextSettings`), and the limits and density words it is checked against."""

from __future__ import annotations

from dataclasses import dataclass

from kvphase.errors import PlanError

PADDINGS = ("prefix", "in-sequence")
MAX_TARGETS = 1 << 16  # targets in one run: about a minute of planning, and more than any test needs
MAX_CONTEXT = 1 << 22  # tokens; beyond every model's context, and a plan of that size fits in memory
MIN_CONTEXTS = 8  # contexts a run needs at least (but for TASK_DENSITY's plans): the bootstrap resamples them
TASK_DENSITY = "task"  # at most the task file's targets_per_context: a config.json without targets_per_context
AUTO_DENSITY = "auto"  # as many targets as the context's records allow


@dataclass(frozen=True)
class ContextSettings:
    """What a sweep's contexts must satisfy."""

    context_length: int  # tokens in every context; queries start here
    stride: int  # S: tokens per compressed entry
    modulus: int  # M: residues are position mod M
    per_residue: int  # targets in each residue group
    padding: str  # "prefix" or "in-sequence"
    seed: int
    targets_per_context: str = TASK_DENSITY  # TASK_DENSITY, AUTO_DENSITY, or a whole number: the most one context holds
    query_phases: bool = False  # each context's query at its own phase (`query_phase`); False: all at context_length
    raw_window: int = 0  # the last tokens before the query that the compressor reads raw: targets end before them
    answer_phases: bool = False  # each target's answer at its own phase (`positions.answer_residue`): filler in its query

    def __post_init__(self) -> None:
        if self.context_length < 1:
            raise PlanError(f"--context must be a positive number of tokens, got {self.context_length}")
        if self.stride < 2:
            raise PlanError(f"--stride must be at least 2, got {self.stride}")
        if self.modulus < 2 or self.modulus % self.stride:
            raise PlanError(f"--modulus must be a multiple of the stride {self.stride}, got {self.modulus}")
        if self.context_length > MAX_CONTEXT:
            raise PlanError(f"--context must be at most {MAX_CONTEXT} tokens, got {self.context_length}")
        if self.per_residue < 1:
            raise PlanError(f"--per-residue must be at least 1, got {self.per_residue}")
        if self.modulus > self.context_length:
            raise PlanError(f"--context {self.context_length} is shorter than one period of the modulus {self.modulus}")
        if self.per_residue * self.modulus > MAX_TARGETS:  # checked before any planning, however large
            raise PlanError(f"--per-residue {self.per_residue} asks for {self.per_residue * self.modulus} targets "
                            f"(mod {self.modulus}); one run holds at most {MAX_TARGETS}: the largest --per-residue "
                            f"that fits is {MAX_TARGETS // self.modulus}")
        if self.padding not in PADDINGS:
            raise PlanError(f"unknown padding {self.padding!r}; expected one of {', '.join(PADDINGS)}")
        if self.seed < 0:
            raise PlanError(f"--seed must be a non-negative integer, got {self.seed}")
        if not 0 <= self.raw_window < self.context_length:
            raise PlanError(f"a {self.raw_window}-token raw window leaves no room for targets in a "
                            f"{self.context_length}-token context; use a longer --context")
        self.most_per_context  # a density that parses

    @property
    def most_per_context(self) -> int | None:
        """The --targets-per-context a user asked for as a number; None for auto and task."""
        density = self.targets_per_context
        if density in (TASK_DENSITY, AUTO_DENSITY):
            return None
        if not isinstance(density, str) or not density.isascii() or not density.isdigit() or not 1 <= int(density) <= MAX_TARGETS:
            raise PlanError(f"--targets-per-context must be 'auto', 'task' or a whole number from 1 to {MAX_TARGETS} "
                            f"(both included), got {str(density)[:40]!r}")
        return int(density)
