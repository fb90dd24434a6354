"""What the idealized model's gradient flow does, in closed form (derived in docs/theory.md).

Around the uniform gate (theta = 0, no attenuation) the linearized flow splits into two
kinds of zero-sum directions with one eigenvalue each:

- differential (components trade phases, sum over components zero; (K - 1)(S - 1) of them):
  mixture readout  lambda_diff = beta^2 (1 - a0)(1 - 2 a0) / (K S^3),  a0 = e^(beta/S) / (e^(beta/S) + D);
  sum readout      lambda_diff = 0 (the loss sees only the summed coverage: no drive to specialize);
- common (all components tilt alike; S - 1 of them):
  mixture  lambda_common = -beta^2 a0 (1 - a0) / (K S^3);  sum  lambda_common = -K beta^2 P (1 - P) / S^3,
  P = e^(beta K/S) / (e^(beta K/S) + D).

So with the mixture readout and K >= 2 the uniform gate is unstable exactly when a0 < 1/2,
beta < beta* = S ln D, and a perturbation of size eps grows to delta in ln(delta/eps)/lambda_diff.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from kvphase.theory.model import TheoryConfig, attention


class UniformPoint(NamedTuple):
    """The uniform gate as a fixed point of the flow without attenuation, and its linearization."""

    accuracy: float  # p_correct at every phase
    differential_rate: float  # eigenvalue of the directions where components trade phases (> 0: specialization grows)
    common_rate: float  # eigenvalue of the directions where all components tilt alike (< 0: coverage rebalances)
    differential_directions: int  # (K - 1)(S - 1)
    common_directions: int  # S - 1
    threshold_beta: float  # beta below which the uniform gate is unstable; nan where no such beta exists

    @property
    def unstable(self) -> bool:
        return self.differential_rate > 0


def uniform_point(config: TheoryConfig) -> UniformPoint:
    """The uniform fixed point's accuracy, eigenvalues and stability threshold for `config`'s S, K, beta, D
    and readout (attenuation and stagger ignored: with rho < 1 the uniform gate is not a fixed point)."""
    s, k, beta, d = config.stride, config.components, config.beta, config.distractors
    directions = dict(differential_directions=(k - 1) * (s - 1), common_directions=s - 1)
    if config.readout == "sum":
        p = float(attention(beta * k / s, d))
        return UniformPoint(p, 0.0, -k * beta**2 * p * (1 - p) / s**3, **directions, threshold_beta=float("nan"))
    a0 = float(attention(beta / s, d))
    differential = beta**2 * (1 - a0) * (1 - 2 * a0) / (k * s**3) if k > 1 else 0.0
    threshold = s * math.log(d) if k > 1 and d > 1 else float("nan")
    return UniformPoint(a0, differential, -beta**2 * a0 * (1 - a0) / (k * s**3), **directions, threshold_beta=threshold)


def time_to_reach(rate: float, start: float, level: float) -> float:
    """t = ln(level / start) / rate: when a mode growing as start x e^(rate t) reaches `level`; inf when it does not grow."""
    if rate <= 0 or start <= 0:
        return float("inf")
    return math.log(level / start) / rate


def norm_at_entropy(config: TheoryConfig, drop: float) -> float:
    """Differential norm at which the mean normalized gate entropy has fallen to 1 - drop, to second
    order: each component's entropy is ln S - |theta_k|^2 / (2S) nats for small zero-sum theta_k."""
    s = config.stride
    return math.sqrt(config.components * 2 * drop * s * math.log(s))


class SymmetricPoint(NamedTuple):
    """The fixed point of the flow inside the symmetric family (see `symmetric_point`)."""

    boundary_weight: float  # w_b: the weight a component puts on its own boundary phase
    other_weight: float  # w_n = (1 - w_b) / (S - 1): on each of its other phases
    accuracy: tuple[float, ...]  # p_correct per phase


GRID = 20001  # points of the one-number search over w_b in [0, 1]: a resolution of 5e-5


def symmetric_point(config: TheoryConfig) -> SymmetricPoint | None:
    """Where the flow settles inside the family of gates in which every component puts w_b on its own
    boundary phase and (1 - w_b) / (S - 1) on each other phase. The flow keeps that family (its
    symmetries: components with the same offset are alike, phases other than a boundary are alike)
    and is a gradient flow on it, so it settles at a minimum of the loss over the one number w_b,
    found here by a grid search. Defined for fixed offsets (all components alike) and for
    staggered offsets with K a multiple of S (each phase the boundary of K / S components, and the
    cyclic shift of components and phases a symmetry); None otherwise. Below beta* the family's
    point is unstable to specialization and the simulation leaves it."""
    s, k = config.stride, config.components
    if config.stagger == "component" and k % s:
        return None
    w_b = np.linspace(0.0, 1.0, GRID)  # (G,)
    losses, accuracy = _family_accuracy(config, w_b)  # (G,), (G, S)
    best = int(np.argmin(losses))
    return SymmetricPoint(float(w_b[best]), float((1 - w_b[best]) / (s - 1)), tuple(float(a) for a in accuracy[best]))


def _family_accuracy(config: TheoryConfig, w_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Loss and per-phase accuracy of the symmetric family at each boundary weight."""
    s, k, beta, d, rho = config.stride, config.components, config.beta, config.distractors, config.attenuation
    w_n = (1 - w_b) / (s - 1)  # (G,)
    gain = beta * k if config.readout == "sum" else beta  # the sum readout adds K alike components' scores
    at_boundary, elsewhere = attention(gain * rho * w_b, d), attention(gain * w_n, d)  # (G,), (G,)
    if config.stagger == "component":  # every phase is the boundary of K / S components and not of the rest
        if config.readout == "sum":
            share = attention(beta * (k / s) * (rho * w_b + (s - 1) * w_n), d)  # (G,)
        else:
            share = (at_boundary + (s - 1) * elsewhere) / s  # (G,)
        accuracy = np.repeat(share[:, None], s, axis=1)  # (G, S)
    else:  # fixed offsets: phase S - 1 is every component's boundary
        accuracy = np.repeat(elsewhere[:, None], s, axis=1)  # (G, S)
        accuracy[:, s - 1] = at_boundary
    return -np.log(accuracy).mean(axis=1), accuracy  # (G,), (G, S)


def balanced_split(config: TheoryConfig) -> tuple[int, float]:
    """(m, accuracy): how many phases m each component should cover, at weight 1/m each, when the
    K components share the S phases evenly (each phase covered by K m / S of them), and the
    accuracy at every phase then: (m / S) a(beta / m) + (1 - m / S) a(0) for the mixture readout,
    which does not depend on K. The best m is where the attention's convexity (which rewards
    concentrating) meets its saturation (which does not): no attenuation, mixture readout only."""
    s, beta, d = config.stride, config.beta, config.distractors
    m = np.arange(1, s + 1)  # (S,)
    accuracy = (m / s) * attention(beta / m, d) + (1 - m / s) * attention(0.0, d)  # (S,)
    best = int(np.argmax(accuracy))
    return int(m[best]), float(accuracy[best])


def trade_rate(config: TheoryConfig, point: SymmetricPoint) -> float:
    """Eigenvalue, at the fixed-offset symmetric point, of the directions in which components trade
    boundary weight (component k raises its boundary logit by u_k, sum_k u_k = 0; K - 1 of them):

        lambda_trade = w_b^2 (1 - w_b + w_n) [kappa_b (1 - w_b) + kappa_n w_n],
        kappa_p = beta^2 c_p^2 (1 - a_p)(1 - 2 a_p) / (S K)       (mixture; 0 for the sum readout).

    > 0: the point is unstable to a division of labour: some components take the boundary phase,
    whose attention sits in the logistic's convex part, and the others drop it. At rho = 1 it is
    lambda_diff. Fixed offsets only (nan otherwise)."""
    if config.stagger != "none" or config.components < 2:
        return float("nan")
    if config.readout == "sum":
        return 0.0
    s, k, beta, rho = config.stride, config.components, config.beta, config.attenuation
    w_b, w_n = point.boundary_weight, point.other_weight
    a_n, a_b = point.accuracy[0], point.accuracy[s - 1]  # every component alike: p_correct is each one's attention
    kappa_b = beta**2 * rho**2 * (1 - a_b) * (1 - 2 * a_b) / (s * k)
    kappa_n = beta**2 * (1 - a_n) * (1 - 2 * a_n) / (s * k)
    return w_b**2 * (1 - w_b + w_n) * (kappa_b * (1 - w_b) + kappa_n * w_n)
