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
Numpy only; imports nothing of kvphase but its settings (`theory.config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kvphase.theory.config import TheoryConfig  # the model's settings, defined without numpy for the command line

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
