"""`kvphase theory`'s options: the idealized model and its integration (`TheoryConfig`, one field per
option, checked where it is made) and the study's cases. No numpy: the command's help is formatted
from these defaults when the command line starts.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from pathlib import Path

from kvphase.errors import PlanError

DEFAULT_COMPONENTS = (2, 4, 8)  # K < S, K = S, K > S at S = 4: the trained models' capacity study (2, 4, 8 heads)
STAGGER_CHOICES = {"none": ("none",), "component": ("component",), "both": ("none", "component")}  # --stagger
DEFAULT_STAGGER_CHOICE = "both"
STAGGERS = ("none", "component")  # none: every window starts at position 0; component: component k's at k mod S
OFFSET_NAMES = {"none": "fixed", "component": "staggered"}  # how a report says each --stagger
READOUTS = ("mixture", "sum")
LIMIT = 64  # largest S and K: the report draws a line per phase and a column per component
MAX_STEPS = 10**6  # about a minute of integration; more is a typo
MAX_BETA, MAX_DISTRACTORS = 1e4, 1e12  # far past any threshold S ln D of S <= LIMIT; beta^2 stays a float
MIN_DT, MAX_DT = 1e-4, 10.0  # a shorter step measures rounding, not the flow; a longer one is unstable at any useful beta
MAX_INIT_SCALE = 10.0  # noise of 10 is no longer a start near the uniform gate


@dataclass(frozen=True)
class TheoryConfig:
    """One idealized model and how its gradient flow is integrated."""

    stride: int = 4  # S: phases of a window
    components: int = 4  # K: heads or gate slots, each with its own softmax gate over the S phases
    stagger: str = "none"  # window offsets: none (all start at 0) or component (component k starts at k mod S)
    beta: float = 6.0  # retrieval sharpness: the score of a target whose phase holds a component's whole gate
    distractors: float = 16.0  # D: entries competing with the target's, each scoring 0
    attenuation: float = 0.5  # rho: the share of its score a component keeps for a target at its boundary phase
    readout: str = "mixture"  # mixture: components attend apart, the answer averages them; sum: one softmax
    init_scale: float = 1e-3  # epsilon: standard deviation of the initial gate logits (uniform plus noise)
    dt: float = 0.5  # time step of the RK4 integration
    steps: int = 4000  # RK4 steps; the flow runs for dt x steps units of time
    seed: int = 0  # seed of the initial noise

    def __post_init__(self) -> None:
        _check_whole("--stride", self.stride, 2, LIMIT)
        _check_whole("--components", self.components, 1, LIMIT)
        _check_whole("--steps", self.steps, 1, MAX_STEPS)
        _check_whole("--seed", self.seed, 0, 2**32 - 1)
        _check_range("--beta", self.beta, 0, MAX_BETA)
        _check_range("--dt", self.dt, MIN_DT, MAX_DT)
        if not (math.isfinite(self.distractors) and 1 <= self.distractors <= MAX_DISTRACTORS):
            raise PlanError(f"--distractors must be a number from 1 to {MAX_DISTRACTORS:g}, got {self.distractors}")
        if not (math.isfinite(self.attenuation) and 0 < self.attenuation <= 1):
            raise PlanError(f"--attenuation must lie in (0, 1], got {self.attenuation}")
        if not (math.isfinite(self.init_scale) and 0 <= self.init_scale <= MAX_INIT_SCALE):
            raise PlanError(f"--init-scale must be a number from 0 to {MAX_INIT_SCALE:g}, got {self.init_scale}")
        if self.stagger not in STAGGERS:
            raise PlanError(f"unknown --stagger {self.stagger!r}; expected one of {', '.join(STAGGERS)}")
        if self.readout not in READOUTS:
            raise PlanError(f"unknown --readout {self.readout!r}; expected one of {', '.join(READOUTS)}")

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _check_whole(option: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
        raise PlanError(f"{option} must be a whole number from {low} to {high}, got {value}")


def _check_range(option: str, value: float, above: float, high: float) -> None:
    if not (math.isfinite(value) and above < value <= high):
        raise PlanError(f"{option} must be a number above {above:g} and at most {high:g}, got {value}")


def theory_run_dir(config: TheoryConfig) -> Path:
    """The default run folder of a study around `config`."""
    return Path("reports") / f"theory-S{config.stride}-beta{config.beta:g}"
