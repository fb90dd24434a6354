"""A large-modulus run read against a smaller stride that divides its modulus (kvphase.statistics.nested):
the split by phase, the test within each phase, and the sentence a comparison prints."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import chi2_contingency

from kvphase.statistics.nested import inner_stride, read_nested
from kvphase.statistics.stratified import Stratification


def one_per_context(hits_per_residue: dict[int, int], n: int) -> pd.DataFrame:
    """`n` targets per residue, each in a context of its own, the first `hits` of them correct."""
    rows = [(r, int(i < hits)) for r, hits in hits_per_residue.items() for i in range(n)]
    return pd.DataFrame({"residue": [r for r, _ in rows], "correct": [c for _, c in rows],
                         "context": np.arange(len(rows))})


def clustered(accuracy_by_residue, contexts: int, seed: int) -> pd.DataFrame:
    """Every residue once per context; each context has a level of its own (hard and easy contexts),
    on top of the residue's accuracy."""
    rng = np.random.default_rng(seed)
    modulus = len(accuracy_by_residue)
    level = rng.normal(0, 1.5, contexts)  # (C,) logit shift of each context
    base = np.log(np.array(accuracy_by_residue) / (1 - np.array(accuracy_by_residue)))  # (M,)
    p = 1 / (1 + np.exp(-(base[None, :] + level[:, None])))  # (C, M)
    correct = rng.random(p.shape) < p  # (C, M)
    return pd.DataFrame({"residue": np.tile(np.arange(modulus), contexts), "correct": correct.ravel().astype(int),
                         "context": np.repeat(np.arange(contexts), modulus)})


def test_residues_that_differ_only_by_phase_differ_between_phases_and_not_within():
    """Mod 8, read against 4: residues 3 and 7 weak alike. Independent targets: the between test is
    (N - 1) / N times Pearson's chi-square of the pooled classes, the within one exactly 0."""
    results = one_per_context({r: 60 if r % 4 == 3 else 90 for r in range(8)}, 100)
    reading = read_nested(results, stride=8, modulus=8, inner=4)
    pearson = chi2_contingency([[180, 20], [180, 20], [180, 20], [120, 80]], correction=False)[0]
    assert reading.phase_accuracy == (90.0, 90.0, 90.0, 60.0)
    assert reading.between.statistic == pytest.approx(pearson * 799 / 800, rel=1e-9)
    assert reading.between.dof == 3 and reading.between.p_value < 1e-10
    assert reading.within.statistic == pytest.approx(0, abs=1e-9) and reading.within.dof == 4
    assert reading.within.p_value == pytest.approx(1.0)
    assert "no more than chance" in reading.sentence() and "the stride-4 phase seen through residues mod 8" in reading.sentence()


def test_the_within_test_compares_residues_only_inside_their_phase_class():
    """With one target per context, the within-phase statistic is the sum over the classes of each
    class's own (n - 1) / n Pearson chi-square (scipy, class by class): strata that mixed the classes
    (the singletons of every class pooled together) would compare across classes too."""
    rng = np.random.default_rng(3)
    hits = {r: int(h) for r, h in enumerate(rng.integers(40, 95, 16))}
    results = one_per_context(hits, 100)
    reading = read_nested(results, stride=16, modulus=16, inner=4)
    expected = 0.0
    for k in range(4):
        table = [[hits[r], 100 - hits[r]] for r in range(k, 16, 4)]
        expected += chi2_contingency(table, correction=False)[0] * 399 / 400
    assert reading.within.statistic == pytest.approx(expected, rel=1e-9)
    assert reading.within.dof == 12  # M - s


def test_a_dip_of_one_residue_is_an_effect_within_its_phase():
    """Mod 8, read against 4, residue 5 alone weak, contexts of every residue with levels of their own:
    an effect of stride 8's own."""
    accuracy = [0.85] * 8
    accuracy[5] = 0.45
    reading = read_nested(clustered(accuracy, 400, seed=0), stride=8, modulus=8, inner=4)
    assert reading.within.p_value < 1e-6
    assert "an effect of stride 8's own, beyond the stride-4 phase" in reading.sentence()


def test_context_levels_alone_make_no_effect_within_phases():
    """Mod 16, phase-only profile (position mod 4), strongly clustered contexts, 5 seeds: the within
    test rejects no more often than its level allows and the between test always rejects."""
    accuracy = [0.5 if r % 4 == 3 else 0.85 for r in range(16)]
    readings = [read_nested(clustered(accuracy, 300, seed), stride=16, modulus=16, inner=4) for seed in range(5)]
    assert all(r.between.p_value < 1e-6 for r in readings)
    assert sum(r.within.p_value < 0.05 for r in readings) <= 1
    assert all(r.within_dip is not None and r.within_dip < 20 for r in readings)


def test_blocks_keep_strata_apart():
    """Two contexts, each holding targets of two blocks: four strata; without blocks, two."""
    residues, contexts, blocks = [0, 1, 2, 3, 0, 1, 2, 3], [0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 0, 1, 0, 1]
    assert len(set(Stratification.of(residues, contexts, blocks).strata)) == 4
    assert len(set(Stratification.of(residues, contexts).strata)) == 2
    # singletons pool within their block only
    assert Stratification.of([0, 1, 2, 3], [0, 1, 2, 3], [0, 0, 1, 1]).strata.tolist() == [0, 0, 1, 1]


def test_the_inner_stride_is_the_largest_smaller_one_that_divides_the_modulus():
    assert inner_stride(128, 128, [4, 128]) == 4
    assert inner_stride(8, 4, [4, 128]) is None  # nothing smaller than 4
    assert inner_stride(128, 128, [4, 8, 12, 128]) == 8  # 12 does not divide 128
    assert inner_stride(96, 96, [64, 96]) is None
    with pytest.raises(ValueError, match="divides the modulus 8"):
        read_nested(one_per_context({0: 1, 1: 1}, 2), stride=8, modulus=8, inner=3)
