"""The idealized retrieval model whose gradient flow `kvphase theory` integrates (docs/theory.md).

S phases, K components (attention heads, or gate slots), each holding a softmax gate over
the S phases of its window, w[k] = softmax(theta[k]). A retrieval target sits at phase p,
uniform over the S phases. Component k gives the target the score

    x[k, p] = c[k, p] * w[k, p]

where c[k, p] is 1, or rho < 1 at the component's boundary phase (a record whose key is the
window's last token has its value in the next window's entry). Two readouts:

- mixture (the default): each component attends on its own between the target's entry
  (score beta * x) and D distractor entries (score 0), a[k, p] = e^(beta x) / (e^(beta x) + D),
  and the answer is their average, p_correct(p) = mean_k a[k, p];
- sum: the components add their scores before one softmax against the D distractors,
  p_correct(p) = e^(beta s) / (e^(beta s) + D) with s = sum_k x[k, p].

The loss is L = mean_p -log p_correct(p); `gradient` is dL/dtheta in closed form (the tests
check it against finite differences), and gradient flow is d theta / dt = -gradient.
Numpy only; imports nothing of kvphase but its errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cached_property

import numpy as np

from kvphase.errors import PlanError

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
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise PlanError(f"{option} must be a whole number from {low} to {high}, got {value}")


def _check_range(option: str, value: float, above: float, high: float) -> None:
    if not (math.isfinite(value) and above < value <= high):
        raise PlanError(f"{option} must be a number above {above:g} and at most {high:g}, got {value}")


def offsets(config: TheoryConfig) -> np.ndarray:
    """Each component's window offset o[k]: where its windows start, mod S."""
    k = np.arange(config.components)  # (K,)
    return k % config.stride if config.stagger == "component" else np.zeros_like(k)


def boundary_phases(config: TheoryConfig) -> np.ndarray:
    """Each component's boundary phase (S - 1 + o[k]) mod S: the last token of its windows."""
    return (config.stride - 1 + offsets(config)) % config.stride  # (K,)


def attenuation_matrix(config: TheoryConfig) -> np.ndarray:
    """c[k, p]: rho at component k's boundary phase, 1 elsewhere."""
    c = np.ones((config.components, config.stride))  # (K, S)
    c[np.arange(config.components), boundary_phases(config)] = config.attenuation
    return c


def gates(theta: np.ndarray) -> np.ndarray:
    """w[k] = softmax(theta[k]) over the S phases."""
    z = np.exp(theta - theta.max(axis=1, keepdims=True))  # (K, S)
    return z / z.sum(axis=1, keepdims=True)  # (K, S)


def attention(score: np.ndarray, distractors: float) -> np.ndarray:
    """e^score / (e^score + D): the target's share against D entries scoring 0 (a logistic, overflow-free)."""
    return 1.0 / (1.0 + distractors * np.exp(-score))


def initial_logits(config: TheoryConfig) -> np.ndarray:
    """Near-uniform start: theta = epsilon x standard normal noise, the same for the same seed."""
    rng = np.random.default_rng(config.seed)
    return config.init_scale * rng.standard_normal((config.components, config.stride))  # (K, S)


@dataclass(frozen=True)
class IdealModel:
    """The loss, per-phase accuracy and gradient of one `TheoryConfig` (c computed once)."""

    config: TheoryConfig

    @cached_property
    def c(self) -> np.ndarray:
        return attenuation_matrix(self.config)  # (K, S)

    def accuracy(self, theta: np.ndarray) -> np.ndarray:
        """p_correct(p) for a target at each phase."""
        beta, d = self.config.beta, self.config.distractors
        x = self.c * gates(theta)  # (K, S)
        if self.config.readout == "sum":
            return attention(beta * x.sum(axis=0), d)  # (S,)
        return attention(beta * x, d).mean(axis=0)  # (S,)

    def loss(self, theta: np.ndarray) -> float:
        return float(-np.log(self.accuracy(theta)).mean())

    def gradient(self, theta: np.ndarray) -> np.ndarray:
        """dL/dtheta: dL/dx by the readout, times c, back through each component's softmax."""
        beta, d, (k, s) = self.config.beta, self.config.distractors, theta.shape
        w = gates(theta)  # (K, S)
        x = self.c * w  # (K, S)
        if self.config.readout == "sum":
            p = attention(beta * x.sum(axis=0), d)  # (S,)
            dl_dx = np.broadcast_to(-beta * (1 - p) / s, (k, s))  # (K, S) the same for every component
        else:
            a = attention(beta * x, d)  # (K, S)
            dl_dx = -beta * a * (1 - a) / (s * k * a.mean(axis=0))  # (K, S)
        g = dl_dx * self.c  # (K, S) dL/dw
        return w * (g - (w * g).sum(axis=1, keepdims=True))  # (K, S) softmax backward, per component
