"""The query's phase as a second factor: accuracy by the query's residue (query_pos mod M) and two
tests that respect the contexts.

A query's phase is a property of its context, so a context is the unit of both tests: their
p-values come from permutations of whole contexts' query-phase labels (fixed seed), never of
targets.

- Query phase: do the contexts' accuracies depend on their query's phase? The statistic is the
  between-phase sum of squares of the context accuracies; labels move among contexts that hold the
  same residues (every context of a query-phase plan holds every residue equally, so a context's
  accuracy is comparable whatever its phase).
- Interaction: does the residue profile within a context depend on its query's phase? Each
  target's outcome is centred on its context's mean (which removes the context's difficulty and its
  query phase's main effect alike); the statistic is the squared distance of each (query phase,
  residue) cell's centred sum from what the residue's overall profile predicts. Within a context
  residue r sits at the lanes its place in the round decides (`positions.plan_contexts`), so a
  depth effect is a pattern of residue and place; labels therefore move only among contexts at the
  same place in their round (`positions.query_phase` gives those contexts different phases from
  round to round), which keeps that pattern in the null distribution. (Under the Latin square a query
  residue's contexts take consecutive places, so in a run of fewer than M rounds a strong depth trend
  alone makes its cells uneven: permuting across places read a 12-logit trend over two rounds as an
  interaction in 183 of 200 simulations, within places in 10: tests/statistics/test_context_units.py.)
  A run of one round has no two such contexts, and the test says so instead of giving a p-value.

The two tests themselves are in `statistics.context_units`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd

from kvphase.statistics.context_units import (ContextPermutationTest, ContextUnits, interaction_test,
                                             query_phase_test)
from kvphase.sweep.analysis import per_group


@dataclass(frozen=True)
class QueryPhaseSummary:
    """Accuracy by the query's residue and the two context-level tests."""

    per_query: list[dict]  # one row per query residue: n, correct, accuracy and its Wilson interval (%)
    cells: list[dict]  # one row per (query residue, target residue): n and accuracy (%)
    query_test: ContextPermutationTest
    interaction_test: ContextPermutationTest

    def to_json(self) -> dict:
        return {"per_query_residue": self.per_query, "cells": self.cells, "query_test": asdict(self.query_test),
                "interaction_test": asdict(self.interaction_test)}


def with_query_residue(results: pd.DataFrame, modulus: int) -> pd.DataFrame:
    """The results with `query_residue`: the query's first position mod M."""
    return results.assign(query_residue=results["query_pos"].astype(int) % modulus)


def summarize_query_phases(results: pd.DataFrame, modulus: int, seed: int = 0) -> QueryPhaseSummary | None:
    """The query-phase summary of a run whose queries sit at more than one residue; None for one
    (every plan without query phases), whose report then has no query-phase section."""
    frame = with_query_residue(results, modulus)
    if frame["query_residue"].nunique() < 2:
        return None
    per_query = per_group(frame, "query_residue")[["query_residue", "n", "correct", "accuracy", "ci_low", "ci_high"]]
    cells = frame.groupby(["query_residue", "residue"])["correct"].agg(["size", "mean"]).reset_index()
    cells = [{"query_residue": int(q), "residue": int(r), "n": int(n), "accuracy": 100 * float(a)}
             for q, r, n, a in cells.itertuples(index=False)]
    units = ContextUnits.of(frame, modulus)
    return QueryPhaseSummary(per_query.to_dict("records"), cells, query_phase_test(units, seed),
                             interaction_test(units, seed))


__all__ = ["QueryPhaseSummary", "summarize_query_phases", "with_query_residue"]
