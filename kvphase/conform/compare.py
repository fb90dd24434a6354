"""An engine's rows against a reference folder's, target by target and residue by residue.

Both score the very same targets (the folder's plan, the same contexts), so each target's
outcome pairs up: the engine's accuracy at a residue minus the folder's is the mean of per-target
differences (-1, 0 or 1), and its interval is the paired one. The profile is equivalent at a
residue when that 90% interval lies within +-margin points: two one-sided tests (TOST) at 5%.
An engine that reproduces the folder exactly has every difference 0 and an interval [0, 0].
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from kvphase.sweep.analysis import GapDifference, gap_difference

Z_90 = 1.6448536269514722  # one-sided 5% normal quantile: TOST's two 5% tests make a 90% interval
DEFAULT_MARGIN = 10.0  # points a residue may move and pass: below the smallest committed weak spot (csa-top4: 16.9)
DEFAULT_LOGPROB_TOLERANCE = 0.01  # nats one target's answer log-probability may move (random-weight references)


@dataclass(frozen=True)
class ResidueCheck:
    """One residue: the folder's accuracy and the engine's on the same targets (percent)."""

    residue: int
    n: int
    committed: float
    engine: float
    difference: float  # engine - committed, points
    ci_low: float  # 90% paired interval of the difference
    ci_high: float
    committed_ci: tuple[float, float]  # the folder's own 95% Wilson interval at this residue (its summary.json)
    equivalent: bool  # the interval lies within +-margin
    flags_differing: int
    max_logprob_difference: float  # nats, |engine - committed| over the residue's targets
    mean_logprob_difference: float


@dataclass(frozen=True)
class ModelCheck:
    """One reference model through the engine, against its folder; `verdict` PASS or FAIL."""

    name: str
    check: str  # "profile" or "logprobs"
    targets: int
    contexts: int
    flags_differing: int
    max_logprob_difference: float
    mean_logprob_difference: float
    residues: list[ResidueCheck]
    gap: GapDifference  # engine's gap minus the folder's on the same targets, 95% interval
    margin: float
    logprob_tolerance: float
    verdict: str
    reason: str  # what failed, naming the residue; "" on PASS

    def to_json(self) -> dict:
        return asdict(self)


def paired_interval(difference: np.ndarray, z: float = Z_90) -> tuple[float, float, float]:
    """(mean, low, high) of per-target differences in points, normal interval of the paired mean."""
    difference = 100 * np.asarray(difference, dtype=float)  # (n,)
    mean = float(difference.mean())
    if len(difference) < 2:
        return mean, -100.0, 100.0  # one target says nothing about its residue's accuracy
    half = z * float(difference.std(ddof=1)) / np.sqrt(len(difference))
    return mean, mean - half, mean + half


def paired_rows(committed: pd.DataFrame, engine: pd.DataFrame) -> pd.DataFrame:
    """The engine's rows with the folder's outcome for the same target (suffix _ref)."""
    reference = committed[["target_id", "correct", "logprob"]].rename(
        columns={"correct": "correct_ref", "logprob": "logprob_ref"})
    return engine.merge(reference, on="target_id", how="inner", validate="one_to_one")


def compare_rows(name: str, check: str, committed: pd.DataFrame, engine: pd.DataFrame, committed_cis: dict,
                 margin: float = DEFAULT_MARGIN, logprob_tolerance: float = DEFAULT_LOGPROB_TOLERANCE,
                 seed: int = 0) -> ModelCheck:
    """The engine's rows (results.csv columns) against the folder's for the same targets."""
    rows = paired_rows(committed, engine)
    moved = (rows["logprob"] - rows["logprob_ref"]).abs().to_numpy()  # (n,)
    residues = [_residue_check(residue, group, committed_cis.get(residue, (0.0, 100.0)), margin)
                for residue, group in rows.groupby("residue", sort=True)]
    gap = gap_difference(committed[committed["target_id"].isin(rows["target_id"])], engine, seed=seed)
    verdict, reason = _verdict(check, residues, margin, logprob_tolerance)
    return ModelCheck(name, check, len(rows), int(rows["context"].nunique()),
                      int((rows["correct"] != rows["correct_ref"]).sum()), round(float(moved.max()), 6),
                      round(float(moved.mean()), 6), residues, gap, margin, logprob_tolerance, verdict, reason)


def _residue_check(residue: int, group: pd.DataFrame, committed_ci: tuple[float, float], margin: float) -> ResidueCheck:
    engine = group["correct"].to_numpy(dtype=float)  # (n,)
    committed = group["correct_ref"].to_numpy(dtype=float)  # (n,)
    difference, low, high = paired_interval(engine - committed)
    moved = (group["logprob"] - group["logprob_ref"]).abs().to_numpy()  # (n,)
    return ResidueCheck(int(residue), len(group), round(100 * committed.mean(), 2), round(100 * engine.mean(), 2),
                        round(difference, 2), round(low, 2), round(high, 2), tuple(committed_ci),
                        bool(-margin < low and high < margin), int((engine != committed).sum()),
                        round(float(moved.max()), 6), round(float(moved.mean()), 6))


def _verdict(check: str, residues: list[ResidueCheck], margin: float, tolerance: float) -> tuple[str, str]:
    """FAIL naming the residue that moved most: a profile outside the margin, or (random weights)
    a log-probability beyond the tolerance; a difference that is not a number (NaN exceeds no
    tolerance) fails either check."""
    unknown = [r for r in residues if not np.isfinite([r.max_logprob_difference, r.mean_logprob_difference]).all()]
    if unknown:
        return "FAIL", (f"residue {unknown[0].residue}'s log-probability differences are "
                        f"{unknown[0].max_logprob_difference} (not a finite number): the engine or the folder "
                        "holds a score that is none")
    if check == "logprobs":
        worst = max(residues, key=lambda r: r.max_logprob_difference)
        if worst.max_logprob_difference > tolerance:
            # moved at every residue: a fault of the whole model, not of a phase, so no residue is named
            where = "every residue moved" if all(r.max_logprob_difference > tolerance for r in residues) \
                else f"residue {worst.residue} moved"
            return "FAIL", (f"{where}: its answers' log-probabilities by up to "
                            f"{worst.max_logprob_difference:.3g} nats (mean {worst.mean_logprob_difference:.3g}; "
                            f"tolerance {tolerance:g})")
        return "PASS", ""
    failing = [r for r in residues if not r.equivalent]
    if not failing:
        return "PASS", ""
    worst = max(failing, key=lambda r: abs(r.difference))
    return "FAIL", (f"residue {worst.residue} moved {worst.difference:+.1f} points ({worst.committed:.1f}% -> "
                    f"{worst.engine:.1f}%, 90% CI {worst.ci_low:+.1f} to {worst.ci_high:+.1f}; margin {margin:g})")
