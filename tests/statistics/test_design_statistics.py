"""The clustered design on real plans: contexts planned by the real planner with the real
SmolLM2 tokenizer (no model is run), correctness simulated with a random effect per
context as large as the largest observed (`CONTEXT_SD`), scored by the report's own test.

- false positive rate: no residue effect, `kvphase sweep` defaults (32 per residue);
  at most 5% within Monte Carlo error;
- power: one residue 20 points down at 256 per residue, on the default 1024-token
  contexts; at least 90%.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvphase.sweep.contexts import build_contexts
from kvphase.sweep.context_settings import ContextSettings
from kvphase.statistics.stratified import ALPHA, Stratification, stratified_p_values
from kvphase.sweep.tasks import load_task

MEAN_ACCURACY = 0.64  # SmolLM2's mean accuracy in the default sweep
CONTEXT_SD = 0.27  # SD of per-context accuracy, the largest observed (Gemma 3 270M)
NULL_RUNS, POWER_RUNS = 4_000, 1_000


def _plan(backend, per_residue, context=1024):
    """Residue and context of every target of `kvphase sweep`'s default plan (records,
    1024 tokens, a control run's S = 4 and M = 8, prefix padding, seed 0)."""
    contexts = build_contexts(load_task("records"), backend, ContextSettings(context, 4, 8, per_residue, "prefix", 0))
    targets = [t for c in contexts for t in c.targets]
    return np.array([t.residue for t in targets]), np.array([t.context_index for t in targets])


def _simulate(residues, contexts, runs, rng, dip=0.0):
    """0/1 outcomes (runs, N): each context's accuracy drawn from a Beta law whose spread
    makes the observed per-context accuracy SD equal CONTEXT_SD; in run i, residue i mod M
    has every context's accuracy scaled down so that its mean drops by `dip`."""
    m = np.bincount(contexts).max()  # targets per context
    mean = MEAN_ACCURACY
    spread = (CONTEXT_SD**2 - mean * (1 - mean) / m) / (1 - 1 / m)  # Var(p_c): the binomial part is on top
    total = mean * (1 - mean) / spread - 1  # Beta's a + b for that variance
    p = rng.beta(mean * total, (1 - mean) * total, size=(runs, contexts.max() + 1))[:, contexts]  # (runs, N)
    dipped = residues[None, :] == (np.arange(runs) % (residues.max() + 1))[:, None]  # (runs, N)
    p = np.where(dipped, p * (1 - dip / mean), p)
    return (rng.random(p.shape) < p).astype(float)


@pytest.fixture(scope="module")
def default_plan(llama_backend):
    return _plan(llama_backend, 32)


def test_the_plan_serves_every_residue_equally_in_every_context(default_plan):
    residues, contexts = default_plan
    table = np.zeros((contexts.max() + 1, 8), dtype=int)
    np.add.at(table, (contexts, residues), 1)
    assert (table == table[0, 0]).all(), f"targets per context and residue:\n{table}"


def test_false_positive_rate_at_most_five_percent(default_plan):
    residues, contexts = default_plan
    outcomes = _simulate(residues, contexts, NULL_RUNS, np.random.default_rng(0))  # (runs, N)
    per_context = np.stack([outcomes[:, contexts == c].mean(axis=1) for c in np.unique(contexts)], axis=1)
    p, _ = stratified_p_values(outcomes, Stratification.of(residues, contexts), binary=True)
    rate = (p < ALPHA).mean()
    error = np.sqrt(ALPHA * (1 - ALPHA) / NULL_RUNS)
    print(f"\nfalse positive rate {rate:.4f} over {NULL_RUNS} simulated null runs (Monte Carlo SE {error:.4f}); "
          f"per-context accuracy SD {per_context.std(axis=1).mean():.3f}, mean accuracy {outcomes.mean():.3f}")
    assert abs(per_context.std(axis=1).mean() - CONTEXT_SD) < 0.03
    assert rate <= ALPHA + 2 * error


@pytest.mark.slow  # planning 2048 targets takes seconds
def test_power_against_a_20_point_dip_at_256_per_residue(llama_backend):
    residues, contexts = _plan(llama_backend, 256)
    outcomes = _simulate(residues, contexts, POWER_RUNS, np.random.default_rng(1), dip=0.20)
    p, _ = stratified_p_values(outcomes, Stratification.of(residues, contexts), binary=True)
    power = (p < ALPHA).mean()
    print(f"\npower {power:.4f} against one residue 20 points down, {POWER_RUNS} simulated runs of "
          f"{len(residues)} targets in {contexts.max() + 1} contexts")
    assert power >= 0.90
