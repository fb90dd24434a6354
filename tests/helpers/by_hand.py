"""Results and statistics written out by hand, independent of kvphase.statistics: a results frame
whose accuracies are known, the generalized Cochran-Mantel-Haenszel statistic one stratum at a time, and the
power of kvphase's test by simulation."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from kvphase.statistics.stratified import cmh_statistic


def results_frame(accuracies, n=40, stride=4, spread=8):
    """Residue r has round(accuracies[r] * n) hits; context k holds target k of every residue;
    target k of residue r sits at 1000 + spread * k + r."""
    rows = []
    for residue, acc in enumerate(accuracies):
        hits = int(round(acc * n))
        for i in range(n):
            rows.append({"residue": residue, "phase": residue % stride, "target_pos": 1000 + i * spread + residue,
                         "context": i, "correct": i < hits, "logprob": -1.0 - 0.01 * ((i * 7 + residue) % 13)})
    return pd.DataFrame(rows)


def generalized_cmh_loop(y, groups, strata, n_groups):
    """The generalized CMH statistic, one stratum at a time, dropping the last group."""
    d = np.zeros(n_groups - 1)
    v = np.zeros((n_groups - 1, n_groups - 1))
    for h in np.unique(strata):
        yh, gh = y[strata == h], groups[strata == h]
        n = len(yh)
        if n < 2:
            continue
        s2 = yh.var(ddof=1)
        for a in range(n_groups - 1):
            na = (gh == a).sum()
            d[a] += yh[gh == a].sum() - na * yh.mean()
            for b in range(n_groups - 1):
                nb = (gh == b).sum()
                v[a, b] += s2 * ((na if a == b else 0) - na * nb / n)
    return d @ np.linalg.solve(v, d)


def simulated_power(design, rates, runs=2000, seed=5):
    """Share of `runs` draws of 0/1 outcomes at per-target `rates` that the CMH test (chi-square law)
    rejects at 0.05."""
    y = (np.random.default_rng(seed).random((runs, len(rates))) < rates).astype(float)
    q, dof = cmh_statistic(y, design)
    return float((stats.chi2.sf(q, dof) < 0.05).mean())
