"""A run at a large modulus read against a smaller stride that divides it.

Residues mod 128 carry the phase mod 4, because 4 divides 128. A DeepSeek-V4 file's stride-128
row therefore shows its CSA layers' stride-4 weak spot even when its HCA layers add nothing
(reports/README.md, the ablation's `--stride all` row). Two tests stratified by context
(`stratified.stratified_test`) tell the two apart:

- between phases: the residues pooled by position mod the inner stride;
- within phases: the residues of one phase class against each other, with strata that never mix
  classes (`Stratification.of(..., blocks=)`), so neither a context's level nor a phase's counts. Its
  degrees of freedom are M - s: M / s - 1 in each of the s classes.

An effect between phases and none within them is the inner stride's weak spot seen through the
larger modulus. An effect within them belongs to the larger stride.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from kvphase.statistics.power import POWER, detectable_dip
from kvphase.statistics.stratified import ALPHA, Stratification, StratifiedTest, p_text, stratified_test
from kvphase.statistics.printed import fixed


@dataclass(frozen=True)
class NestedReading:
    """One run's residues mod `modulus` split by their phase mod `inner`."""

    inner: int  # the smaller stride, which divides the modulus
    stride: int  # the run's own stride
    modulus: int
    phase_accuracy: tuple[float, ...]  # % correct per phase mod inner, its residues pooled
    between: StratifiedTest  # phase mod inner, stratified by context
    within: StratifiedTest  # residue within each phase class, stratified by context within the class
    within_dip: Optional[float]  # points: the one-residue dip within a class the within test finds with 80% power

    def sentence(self) -> str:
        """What the split says, in the words of a report."""
        s, m, k = self.stride, self.modulus, self.inner
        pooled = ", ".join(fixed(a) for a in self.phase_accuracy[:-1]) + f" and {fixed(self.phase_accuracy[-1])}"
        opening = (f"Read against stride {k}, which divides the modulus {m}: pooled by position mod {k} the residues "
                   f"read {pooled}% (p {p_text(self.between)})")
        power = ("accuracy never varies within a context and phase" if self.within_dip is None else
                 f"a one-residue dip of {fixed(self.within_dip)} points within a phase would be detected {POWER:.0%} "
                 "of the time")
        if self.within.p_value < ALPHA:
            return (f"{opening}, and within each phase mod {k} they still differ (p {p_text(self.within)}): "
                    f"an effect of stride {s}'s own, beyond the stride-{k} phase.")
        within = (f"within each phase mod {k} they differ no more than chance (p {p_text(self.within)}; "
                  f"{power})")
        if self.between.p_value < ALPHA:
            return (f"{opening}; {within}. So what varies here is the stride-{k} phase seen through residues mod {m}: "
                    f"no effect of stride {s}'s own at this power.")
        return f"{opening}; {within}. No effect by phase mod {k} nor of stride {s}'s own at this power."


def read_nested(results: pd.DataFrame, stride: int, modulus: int, inner: int, seed: int = 0) -> NestedReading:
    """Split a run's results (one row per scored target) by phase mod `inner`; ValueError when
    `inner` does not divide the modulus or is not smaller than it."""
    if not 1 < inner < modulus or modulus % inner:
        raise ValueError(f"expected a stride that divides the modulus {modulus} and is smaller, got {inner}")
    correct = results["correct"].to_numpy(dtype=float)  # (N,)
    residues = results["residue"].to_numpy()  # (N,)
    contexts = results["context"].to_numpy()  # (N,)
    phases = residues % inner  # (N,)
    accuracy = [100 * correct[phases == k].mean() for k in range(inner)]
    within = Stratification.of(residues, contexts, blocks=phases)
    dip = detectable_dip(correct, within)
    return NestedReading(
        inner=inner, stride=stride, modulus=modulus, phase_accuracy=tuple(float(a) for a in accuracy),
        between=stratified_test(correct, Stratification.of(phases, contexts), binary=True, seed=seed),
        within=stratified_test(correct, within, binary=True, seed=seed),
        within_dip=None if dip is None else float(100 * dip))


def inner_stride(modulus: int, stride: int, strides: Sequence[int]) -> Optional[int]:
    """The largest of `strides` smaller than `stride` that divides `modulus` (None if none does)."""
    fitting = [s for s in strides if 1 < s < stride and modulus % s == 0]
    return max(fitting, default=None)


__all__ = ["NestedReading", "read_nested", "inner_stride"]
