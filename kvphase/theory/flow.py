"""Gradient flow d theta / dt = -dL/dtheta of an `IdealModel`, integrated by RK4 in numpy.

Deterministic: the same config (seed included) gives the same trajectory. The flow keeps
each component's sum of logits (a softmax's gradient sums to zero over its inputs), so the
state moves in the zero-sum directions, which split into two kinds (docs/theory.md):
*common* (every component tilts the same way: phases gain or lose coverage) and
*differential* (components trade phases: specialization). `mode_norms` measures both.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from kvphase.errors import PlanError
from kvphase.theory.model import IdealModel, gates, initial_logits

RECORDS = 200  # states kept per trajectory, evenly spaced in time


class Trajectory(NamedTuple):
    """Recorded states of one integration, every `steps // RECORDS` steps and the last."""

    time: np.ndarray  # (T,) flow time of each record
    theta: np.ndarray  # (T, K, S) gate logits
    accuracy: np.ndarray  # (T, S) p_correct per phase
    loss: np.ndarray  # (T,)
    entropy_bits: np.ndarray  # (T, K) each component's gate entropy in bits (log2 S: uniform, 0: one phase)

    @property
    def normalized_entropy(self) -> np.ndarray:
        """Mean component entropy over log2 S, per record: 1 uniform, 0 every component on one phase."""
        return self.entropy_bits.mean(axis=1) / np.log2(self.theta.shape[2])  # (T,)


def entropy_bits(theta: np.ndarray) -> np.ndarray:
    """Entropy of each component's gate, in bits."""
    w = gates(theta)  # (K, S)
    return -(w * np.log2(np.clip(w, 1e-300, None))).sum(axis=1)  # (K,)


def mode_norms(theta: np.ndarray) -> tuple[float, float]:
    """(differential, common) size of a state: the Frobenius norm of its part where the components
    disagree (theta minus its mean over components) and of the part they share, both after
    removing each component's mean logit (which no gate sees)."""
    zero_sum = theta - theta.mean(axis=1, keepdims=True)  # (K, S)
    shared = zero_sum.mean(axis=0, keepdims=True)  # (1, S)
    differential = zero_sum - shared  # (K, S)
    return float(np.linalg.norm(differential)), float(np.linalg.norm(np.broadcast_to(shared, theta.shape)))


def rk4_step(model: IdealModel, theta: np.ndarray, dt: float) -> np.ndarray:
    """One classical Runge-Kutta step of d theta / dt = -gradient."""
    k1 = -model.gradient(theta)  # (K, S)
    k2 = -model.gradient(theta + dt / 2 * k1)  # (K, S)
    k3 = -model.gradient(theta + dt / 2 * k2)  # (K, S)
    k4 = -model.gradient(theta + dt * k3)  # (K, S)
    return theta + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)  # (K, S)


def integrate(model: IdealModel, theta0: np.ndarray | None = None,
              on_step: Callable[[int], None] = lambda step: None) -> Trajectory:
    """Run the flow for `config.steps` steps from `theta0` (default: the seeded near-uniform start)."""
    config = model.config
    theta = initial_logits(config) if theta0 is None else np.array(theta0, dtype=float)  # (K, S)
    every = max(1, config.steps // RECORDS)
    kept = [(0, theta)]
    for step in range(1, config.steps + 1):
        theta = rk4_step(model, theta, config.dt)
        if step % every == 0 or step == config.steps:
            kept.append((step, theta))
            on_step(step)
    return Trajectory(time=np.array([step * config.dt for step, _ in kept]),  # (T,)
                      theta=np.stack([t for _, t in kept]),  # (T, K, S)
                      accuracy=np.stack([model.accuracy(t) for _, t in kept]),  # (T, S)
                      loss=np.array([model.loss(t) for _, t in kept]),  # (T,)
                      entropy_bits=np.stack([entropy_bits(t) for _, t in kept]))  # (T, K)


def linear_records(differential: np.ndarray, linear_below: float = 0.05) -> int:
    """How many records come before the differential norm first reaches `linear_below`: the stretch
    where the linearized flow holds (the modes then grow or decay on their own)."""
    over = np.flatnonzero(differential >= linear_below)  # (n,)
    return int(over[0]) if over.size else len(differential)


def growth_rate(time: np.ndarray, norms: np.ndarray, floor: float = 1e-6) -> float:
    """Exponential rate of a mode's norm: the least-squares slope of log(norm) over time, fitted
    until the norm first falls below `floor` x its start (a decaying mode then meets rounding);
    nan with fewer than 3 records."""
    under = np.flatnonzero(norms < floor * norms[0]) if len(norms) else np.array([], dtype=int)  # (n,)
    end = int(under[0]) if under.size else len(norms)
    span = float(np.ptp(time[:end])) if end else 0.0
    if end < 3 or not span > 0:
        return float("nan")
    slope, _ = np.polyfit((time[:end] - time[0]) / span, np.log(norms[:end]), 1)  # time scaled to [0, 1]
    return float(slope) / span


def check_descent(trajectory: Trajectory, dt: float) -> None:
    """Gradient flow never raises the loss; an integration whose loss rose took too long a step."""
    rises = np.diff(trajectory.loss) > 1e-9 * (1 + np.abs(trajectory.loss[:-1]))  # (T - 1,)
    if rises.any() or not np.isfinite(trajectory.loss).all():
        at = trajectory.time[int(np.argmax(rises)) + 1] if rises.any() else float("nan")
        raise PlanError(f"the integration is unstable at --dt {dt:g} (the loss rose at flow time {at:g}); "
                        "use a smaller --dt")


def crossing_time(time: np.ndarray, values: np.ndarray, level: float) -> float:
    """First time a falling series reaches `level`, interpolated between records; nan when it never does."""
    below = np.flatnonzero(values <= level)  # (n,)
    if not below.size:
        return float("nan")
    i = below[0]
    if i == 0:
        return float(time[0])
    t0, t1, v0, v1 = time[i - 1], time[i], values[i - 1], values[i]
    return float(t0 + (t1 - t0) * (v0 - level) / (v0 - v1))
