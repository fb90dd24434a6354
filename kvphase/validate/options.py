"""`kvphase validate`'s options and their defaults: what counts as equal (`Tolerances`), the prompt's
length and the cache type. No numpy: the command's help is formatted from these when the command
line starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvphase.errors import PlanError

DEFAULT_TOKENS = 64  # prompt length when the caller names none and the family needs no more
TAIL_TOKENS = 32  # deepseek4: tokens after its two blocks of the largest compress ratio
CACHE_TYPES = ("f32", "f16")  # f16: llama.cpp's default cache, which rounds keys, gates and pooled keys
DEFAULT_CACHE_TYPE = CACHE_TYPES[0]
DEFAULT_SEED = 0  # the seed of the prompt's random token ids
NO_PERTURBATION = 0  # the reference's phase as the file declares it (a shift makes the check FAIL on purpose)


def deepseek4_tokens(ratios) -> int:
    """A deepseek4 prompt's default length: two blocks of its largest compress ratio and a tail."""
    return max([DEFAULT_TOKENS] + [2 * ratio + TAIL_TOKENS for ratio in ratios])


@dataclass(frozen=True)
class Tolerances:
    """What counts as equal."""

    keys_abs: float = 1e-5  # compressed keys: max absolute difference
    scores_rel: float = 1e-4  # scores: max absolute difference / largest |score|
    # attention output (deepseek4): max absolute difference / largest |output|; flash
    # attention reads keys and values as F16 and sums them in F16
    attention_rel: float = 5e-3

    def __post_init__(self) -> None:
        for name, value in (("--keys-tol", self.keys_abs), ("--scores-tol", self.scores_rel),
                            ("--attention-tol", self.attention_rel)):
            if not math.isfinite(value) or value < 0:
                raise PlanError(f"{name} must be a finite number >= 0, got {value}")
