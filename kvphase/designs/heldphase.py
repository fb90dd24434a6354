"""A trained gate with one phase's weight held at a fixed value: the compressor a slot knockout runs.

`HeldPhaseGate` is `GatedPool` (and `HeldPhaseTopK` is `GatedTopK`) whose window weights keep,
per channel, phase `phase` at `weight` (its calibration mean) and let the other slots share the
rest in their own proportions (`hold_phase`): the slot keeps its average say but loses everything
that depends on content. It is a compression design, so it lives here, but it is left out of
`DESIGNS`: that registry lists the methods a run can name, and a held phase is never named; it is
built from a trained model's own gate and a calibration mean by the knockout probe
(`kvphase.probes.knockout_hooks`, `held_phase`), which also holds phases inside llama.cpp's graph with
the same `hold_phase`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from kvphase.designs.gatedpool import GatedPool, GatedTopK


@dataclass(frozen=True, eq=False)
class HeldPhaseGate(GatedPool):
    """GatedPool with the weight of one phase held at a fixed value per channel (its
    calibration mean); the other slots share the rest in their own proportions."""

    phase: int = 0
    weight: np.ndarray | None = None  # (head_dim,)

    def pool_weights(self, window_keys: np.ndarray) -> np.ndarray:
        weights = super().pool_weights(window_keys)  # (n_windows, W, n_kv_head, head_dim)
        held = ((self.start + np.arange(self.window)) % self.stride == self.phase)[None, :, None, None]  # (1, W, 1, 1)
        return hold_phase(weights, held, np.asarray(self.weight, dtype=weights.dtype), axis=1)


def hold_phase(weights: np.ndarray, held: np.ndarray, target: np.ndarray, axis: int) -> np.ndarray:
    """Softmax weights over a window's slots (`axis`) with the slots `held` (a mask that
    broadcasts against `weights`) scaled to sum to `target` (broadcasting too), the others
    scaled to share the rest in their own proportions."""
    own = np.where(held, weights, 0.0).sum(axis=axis, keepdims=True)  # the held phase's weight per window and channel
    others = (1 - target) / np.maximum(1 - own, 1e-12)
    return np.where(held, weights * target / np.maximum(own, 1e-12), weights * others)


@dataclass(frozen=True, eq=False)
class HeldPhaseTopK(HeldPhaseGate, GatedTopK):
    """The same for a trained kpool model's gated windows."""


def held_phase(design: GatedPool, phase: int, weight: np.ndarray) -> HeldPhaseGate:
    """`design` (a trained gate) with phase `phase` held at `weight`: (head_dim,)."""
    kind = HeldPhaseTopK if isinstance(design, GatedTopK) else HeldPhaseGate
    return kind(**{f.name: getattr(design, f.name) for f in dataclasses.fields(design)}, phase=phase, weight=weight)
