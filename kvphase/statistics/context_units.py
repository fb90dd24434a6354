"""Tests whose unit is a whole context: the query's phase and its interaction with the residue.

A query's phase is a property of its context, so a context is the unit of both tests: their
p-values come from permutations of whole contexts' query-phase labels (fixed seed), never of
targets. What each statistic is, and why labels move only among contexts at the same place in
their round for the interaction, is in `sweep.query_phases`, which reads a run with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

QUERY_PERMUTATIONS = 4_000
_CHUNK = 256  # permutations whose cell sums are held at once


@dataclass(frozen=True)
class ContextPermutationTest:
    """A test whose p-value comes from permuting whole contexts' query-phase labels."""

    name: str
    statistic: float
    p_value: float | None  # None: no permutation moves a label (the note says why)
    permutations: int
    note: str


@dataclass(frozen=True)
class ContextUnits:
    """A run's outcomes gathered by context, the unit whose labels the tests permute."""

    labels: np.ndarray  # (C,) each context's query residue code 0..Q-1
    n_labels: int  # Q
    sums: np.ndarray  # (C, G) each context's correct answers per target residue
    counts: np.ndarray  # (C, G) each context's targets per target residue
    places: np.ndarray  # (C,) each context's place in its round (index mod M), its residues' lanes

    @classmethod
    def of(cls, frame: pd.DataFrame, modulus: int) -> "ContextUnits":
        contexts, rows = np.unique(frame["context"].to_numpy(dtype=np.int64), return_inverse=True)  # (C,), (N,)
        _, groups = np.unique(frame["residue"].to_numpy(), return_inverse=True)  # (N,)
        shape = (len(contexts), groups.max() + 1)
        sums, counts = np.zeros(shape), np.zeros(shape)  # (C, G)
        np.add.at(sums, (rows, groups), frame["correct"].to_numpy(dtype=float))
        np.add.at(counts, (rows, groups), 1)
        query_codes, labels = np.unique(frame["query_residue"].to_numpy()[np.unique(rows, return_index=True)[1]],
                                        return_inverse=True)
        return cls(labels.ravel(), len(query_codes), sums, counts, contexts % modulus)

    def strata(self, by_place: bool) -> np.ndarray:
        """(C,) codes of the contexts among which labels may move: those holding the same residues in
        the same numbers, and with `by_place` at the same place in their round."""
        keys = np.column_stack([self.counts, self.places if by_place else np.zeros(len(self.places))])  # (C, G + 1)
        return np.unique(keys, axis=0, return_inverse=True)[1].ravel()


def query_phase_test(units: ContextUnits, seed: int = 0) -> ContextPermutationTest:
    """Whether the contexts' accuracy depends on their query's phase (module docstring)."""
    totals, sizes = units.sums.sum(axis=1), units.counts.sum(axis=1)  # (C,), (C,)
    rate = totals.sum() / sizes.sum()

    def statistic(labels: np.ndarray) -> np.ndarray:  # (B, C) -> (B,)
        hits, n = _by_label(labels, totals, units.n_labels), _by_label(labels, sizes, units.n_labels)  # (B, Q)
        return (np.where(n > 0, (hits - n * rate) ** 2 / np.maximum(n, 1), 0.0)).sum(axis=1)

    return _permutation_test("query phase: context accuracy by query residue, permuting whole contexts' labels",
                             units, statistic, units.strata(by_place=False), seed)


def interaction_test(units: ContextUnits, seed: int = 0) -> ContextPermutationTest:
    """Whether the within-context residue profile depends on the query's phase (module docstring)."""
    sizes = units.counts.sum(axis=1, keepdims=True)  # (C, 1)
    centred = units.sums - units.counts * units.sums.sum(axis=1, keepdims=True) / sizes  # (C, G)
    profile = centred.sum(axis=0) / units.counts.sum(axis=0)  # (G,) each residue's mean centred outcome

    def statistic(labels: np.ndarray) -> np.ndarray:  # (B, C) -> (B,)
        cell_sums = _by_label(labels, centred, units.n_labels)  # (B, Q, G)
        cell_counts = _by_label(labels, units.counts, units.n_labels)  # (B, Q, G)
        excess = cell_sums - cell_counts * profile  # (B, Q, G)
        return np.where(cell_counts > 0, excess ** 2 / np.maximum(cell_counts, 1), 0.0).sum(axis=(1, 2))

    return _permutation_test("interaction: within-context residue profile by query residue, permuting whole "
                             "contexts' labels among contexts at the same place in their round", units, statistic,
                             units.strata(by_place=True), seed)


def _by_label(labels: np.ndarray, values: np.ndarray, n_labels: int) -> np.ndarray:
    """Sums of `values` (C, ...) over the contexts of each label, for each row of `labels` (B, C):
    (B, Q, ...)."""
    one_hot = np.eye(n_labels)[labels]  # (B, C, Q)
    return np.einsum("bcq,c...->bq...", one_hot, values)


def _permutation_test(name: str, units: ContextUnits, statistic, strata: np.ndarray, seed: int) -> ContextPermutationTest:
    """p = the share of within-stratum permutations of the labels whose statistic reaches the
    observed one (the observed arrangement counted, so p is never 0)."""
    observed = float(statistic(units.labels[None, :])[0])
    movable = [s for s in np.unique(strata) if len(np.unique(units.labels[strata == s])) > 1]
    if not movable:
        return ContextPermutationTest(name, observed, None, 0, "no two contexts that may swap labels hold different "
                                      "query phases (one round of M contexts); a run of two rounds or more tests it")
    rng = np.random.default_rng([seed, 61])
    order = np.argsort(strata, kind="stable")  # (C,) contexts grouped by stratum
    reached, moved = 0, False
    for start in range(0, QUERY_PERMUTATIONS, _CHUNK):
        b = min(_CHUNK, QUERY_PERMUTATIONS - start)
        shuffled = np.argsort(strata[order][None, :] + rng.random((b, len(order))), axis=1)  # (b, C) within strata
        labels = np.empty((b, len(order)), dtype=int)
        labels[:, order] = units.labels[order][shuffled]
        permuted = statistic(labels)  # (b,)
        reached += int((permuted >= observed * (1 - 1e-9) - 1e-12).sum())
        moved = moved or bool(np.abs(permuted - observed).max() > 1e-9 * max(1.0, abs(observed)))
    if not moved:  # one context per query residue: relabelling them leaves the statistic as it was
        return ContextPermutationTest(name, observed, None, QUERY_PERMUTATIONS, "no permutation moves the "
                                      "statistic (one context per query residue: one round of M contexts); a run of "
                                      "two rounds or more tests it")
    return ContextPermutationTest(name, observed, (reached + 1) / (QUERY_PERMUTATIONS + 1), QUERY_PERMUTATIONS,
                                  f"p from {QUERY_PERMUTATIONS} permutations of whole contexts' query-phase labels")
