"""`kvphase theory`: integrate the idealized model's gradient flow for several K and window
offsets, check the closed forms against the simulation, and write a run folder.

The folder holds config.json, trajectories.csv (one row per case and recorded time),
stability.csv (closed form against simulation at the uniform gate), summary.json,
report.md with its figures, and manifest.json. The work takes seconds, so everything is
written at the end: an interrupted run writes nothing (run it again).
"""

from __future__ import annotations

import math
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import numpy as np
import pandas as pd

from kvphase import __version__
from kvphase.errors import Interrupted, PlanError, RunFolderError
from kvphase.runfolder import (CONFIG_FILE, MANIFEST_FILE, REPORT_FILE, SUMMARY_FILE, check_writable, make_folder,
                               read_json_object, write_csv, write_json)
from kvphase.theory.closed_form import (balanced_split, norm_at_entropy, symmetric_point, time_to_reach, trade_rate,
                                        uniform_point)
from kvphase.theory.flow import (Trajectory, check_descent, crossing_time, growth_rate, integrate, linear_records,
                                 mode_norms)
from kvphase.theory.config import OFFSET_NAMES, STAGGERS, TheoryConfig
from kvphase.theory.model import IdealModel, boundary_phases, gates
from kvphase.theory.report import write_report

TRAJECTORIES_FILE, STABILITY_FILE = "trajectories.csv", "stability.csv"
CHECK_SCALE = 1e-4  # epsilon of the stability checks: small enough that the linearization holds for a while
CHECK_SPAN = 20.0  # a stability check runs until |lambda| t = 20 (e^20: far past the linear stretch), at most --steps
ENTROPY_DROP = 0.01  # "left the uniform gate": mean normalized entropy 0.99, still close enough for the linearization
Progress = Callable[[str, int, int], None]  # (what runs, its steps done, its steps in all)


class Case(NamedTuple):
    """One simulated configuration of the study and its trajectory."""

    config: TheoryConfig
    trajectory: Trajectory

    @property
    def label(self) -> str:
        return f"K={self.config.components}, {OFFSET_NAMES[self.config.stagger]} offsets"


class StabilityCheck(NamedTuple):
    """The uniform gate's linearization against a simulation started near it (no attenuation)."""

    beta: float
    components: int
    predicted_rate: float  # lambda_diff, closed form
    measured_rate: float  # slope of log(differential norm) over the linear stretch
    predicted_common_rate: float  # lambda_common, closed form
    measured_common_rate: float
    predicted_time: float  # ln(delta / eps) / lambda_diff to mean normalized entropy 0.99; inf when stable
    simulated_time: float  # when the simulation got there; nan when it did not
    time: np.ndarray  # (T,) for the figure
    differential: np.ndarray  # (T,) differential norm over time


def study_cases(base: TheoryConfig, components: Sequence[int], staggers: Sequence[str]) -> list[TheoryConfig]:
    """The configurations the study runs: every K with every stagger (each validated as it is made)."""
    if not components:
        raise PlanError("--components needs at least one value")
    unknown = [s for s in staggers if s not in STAGGERS]
    if unknown or not staggers:
        raise PlanError(f"unknown --stagger {unknown[0] if unknown else ''!r}; expected none, component or both")
    return [replace(base, components=k, stagger=s) for s in dict.fromkeys(staggers) for k in dict.fromkeys(components)]


def check_betas(base: TheoryConfig) -> list[float]:
    """Where to check the uniform gate's stability: the study's beta, and 0.8 and 1.2 x beta* when a
    threshold exists, so the simulation is seen on both sides of it."""
    threshold = uniform_point(replace(base, components=2)).threshold_beta
    return [base.beta] + ([] if math.isnan(threshold) else [0.8 * threshold, 1.2 * threshold])


def stability_check(base: TheoryConfig, beta: float, components: int, progress: Progress) -> StabilityCheck:
    """Simulate the flow from CHECK_SCALE noise around the uniform gate (rho = 1, fixed offsets) and
    measure what the closed forms predict."""
    config = replace(base, beta=beta, components=components, attenuation=1.0, stagger="none", init_scale=CHECK_SCALE)
    point = uniform_point(config)
    rate = point.differential_rate or point.common_rate
    span = min(config.dt * config.steps, CHECK_SPAN / abs(rate)) if rate else config.dt * config.steps
    config = replace(config, steps=max(20, math.ceil(span / config.dt)))
    trajectory = integrate(IdealModel(config), on_step=lambda step: progress(f"check beta={beta:.3g}", step, config.steps))
    check_descent(trajectory, config.dt)
    differential, common = np.array([mode_norms(theta) for theta in trajectory.theta]).T  # (T,), (T,)
    linear = linear_records(differential)
    # the differential mode feeds the common one at second order: read the common rate only while
    # the common norm is far above that source (differential norm squared)
    common_linear = min(linear, int(np.argmin(common >= 100 * differential**2)) or len(common))
    predicted_time = time_to_reach(point.differential_rate, differential[0], norm_at_entropy(config, ENTROPY_DROP))
    return StabilityCheck(beta, components, point.differential_rate,
                          growth_rate(trajectory.time[:linear], differential[:linear]), point.common_rate,
                          growth_rate(trajectory.time[:common_linear], common[:common_linear]), predicted_time,
                          crossing_time(trajectory.time, trajectory.normalized_entropy, 1 - ENTROPY_DROP),
                          trajectory.time, differential)


def run_study(base: TheoryConfig, components: Sequence[int], staggers: Sequence[str], run_dir: Path,
              progress: Progress = lambda label, done, total: None) -> dict:
    """Run every case and the stability checks, write the run folder, return the summary."""
    configs = study_cases(base, components, staggers)
    run_dir = Path(run_dir)
    created = make_folder(run_dir)  # a bad --out fails here, before any work
    check_own_folder(run_dir)
    try:
        return _run_in(run_dir, base, configs, components, staggers, progress)
    except BaseException as exc:  # an error or a Ctrl-C before the end wrote nothing: leave no empty folder behind
        if created and run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()
        if isinstance(exc, KeyboardInterrupt):  # the CLI's usual "finished results are kept" does not apply here
            raise Interrupted("nothing was written (the run takes seconds); run the same command again",
                              getattr(exc, "exit_code", 130) - 128) from None
        raise


def rerun_study(run_dir: Path, progress: Progress = lambda label, done, total: None) -> dict:
    """Run a theory folder's study again from its config.json (deterministic, seconds): what
    `kvphase report` can do for it, since the trajectories' gate logits are not kept."""
    config = read_json_object(Path(run_dir) / CONFIG_FILE)
    try:
        base = TheoryConfig(**config["theory"])
        components, staggers = [int(k) for k in config["components"]], [str(s) for s in config["staggers"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise RunFolderError(f"{Path(run_dir) / CONFIG_FILE}: not a kvphase theory config ({exc})") from None
    return run_study(base, components, staggers, run_dir, progress)


def check_own_folder(run_dir: Path) -> None:
    """A folder that holds another run (a sweep's, a probe's) is not overwritten by this one."""
    config = run_dir / CONFIG_FILE
    if config.exists() and "theory" not in read_json_object(config):
        raise RunFolderError(f"{run_dir} holds another kind of run; choose another --out or delete the folder")


def _run_in(run_dir: Path, base: TheoryConfig, configs: Sequence[TheoryConfig], components: Sequence[int],
            staggers: Sequence[str], progress: Progress) -> dict:
    check_writable(run_dir, [CONFIG_FILE, MANIFEST_FILE, SUMMARY_FILE, REPORT_FILE, TRAJECTORIES_FILE, STABILITY_FILE])
    started = time.monotonic()
    cases = [simulate(c, progress) for c in configs]
    check_k = next((k for k in components if k >= 2), 2)  # a single component has no differential direction
    checks = [stability_check(base, beta, check_k, progress) for beta in check_betas(base)]
    summary = summarize(replace(base, components=check_k), cases, checks)
    write_json(run_dir / CONFIG_FILE, {"theory": base.as_dict(), "components": list(dict.fromkeys(components)),
                                       "staggers": list(dict.fromkeys(staggers))})
    write_csv(run_dir / TRAJECTORIES_FILE, trajectory_table(cases))
    write_csv(run_dir / STABILITY_FILE, pd.DataFrame(summary["stability"]))
    write_report(run_dir, base, cases, checks, summary)
    write_json(run_dir / MANIFEST_FILE, manifest(time.monotonic() - started))
    return summary


def simulate(config: TheoryConfig, progress: Progress) -> Case:
    trajectory = integrate(IdealModel(config), on_step=lambda step: progress(f"K={config.components} {config.stagger}",
                                                                             step, config.steps))
    check_descent(trajectory, config.dt)
    return Case(config, trajectory)


def trajectory_table(cases: Sequence[Case]) -> pd.DataFrame:
    """One row per case and recorded time: loss, mean normalized entropy, accuracy per phase and
    entropy per component (columns past a case's K left empty)."""
    frames = []
    for case in cases:
        t = case.trajectory
        columns = {"components": case.config.components, "stagger": case.config.stagger, "time": t.time,
                   "loss": t.loss, "normalized_entropy": t.normalized_entropy,
                   **{f"accuracy_{p}": t.accuracy[:, p] for p in range(t.accuracy.shape[1])},
                   **{f"entropy_bits_{k}": t.entropy_bits[:, k] for k in range(t.entropy_bits.shape[1])}}
        frames.append(pd.DataFrame(columns))
    return pd.concat(frames, ignore_index=True).round(6)


def summarize(base: TheoryConfig, cases: Sequence[Case], checks: Sequence[StabilityCheck]) -> dict:
    """The numbers of the report: closed forms, the checks, and each case's end state."""
    point = uniform_point(base)
    split = balanced_split(base)
    return {
        "uniform_point": {"accuracy": point.accuracy, "differential_rate": point.differential_rate,
                          "common_rate": point.common_rate, "threshold_beta": _finite(point.threshold_beta),
                          "unstable": point.unstable, "differential_directions": point.differential_directions,
                          "common_directions": point.common_directions},
        "balanced_split": {"phases_per_component": split[0], "accuracy": split[1]},
        "stability": [_check_row(c) for c in checks],
        "cases": [_case_row(c) for c in cases],
    }


def _check_row(check: StabilityCheck) -> dict:
    return {"beta": round(check.beta, 4), "components": check.components,
            "predicted_rate": check.predicted_rate, "measured_rate": _finite(check.measured_rate),
            "predicted_common_rate": check.predicted_common_rate,
            "measured_common_rate": _finite(check.measured_common_rate),
            "predicted_time": _finite(check.predicted_time), "simulated_time": _finite(check.simulated_time)}


def _case_row(case: Case) -> dict:
    """A case's end state next to the symmetric family's fixed point (where one is defined)."""
    t, config = case.trajectory, case.config
    accuracy = t.accuracy[-1]  # (S,)
    point = symmetric_point(config)
    return {"components": config.components, "stagger": config.stagger,
            "accuracy": [float(a) for a in accuracy], "weakest_phase": int(np.argmin(accuracy)),
            "gap": float(accuracy.max() - accuracy.min()), "mean_accuracy": float(accuracy.mean()),
            "normalized_entropy": float(t.normalized_entropy[-1]),
            "phases_per_component": float((2 ** t.entropy_bits[-1]).mean()),
            "time_to_specialize": _finite(crossing_time(t.time, t.normalized_entropy, 1 - ENTROPY_DROP)),
            "gates": gates(t.theta[-1]).round(4).tolist(),  # (K, S) where each component ended: who serves which phase
            "boundary_phases": boundary_phases(config).tolist(),
            "symmetric_point": None if point is None else
            {"accuracy": list(point.accuracy), "boundary_weight": point.boundary_weight,
             "weakest_phase": int(np.argmin(point.accuracy)), "gap": max(point.accuracy) - min(point.accuracy),
             "trade_rate": _finite(trade_rate(config, point))}}


def _finite(value: float) -> float | None:
    """JSON has no inf or nan: None for either."""
    return float(value) if math.isfinite(value) else None


def manifest(wall_s: float) -> dict:
    return {"versions": {"kvphase": __version__, "numpy": np.__version__, "pandas": pd.__version__,
                         "python": platform.python_version()},
            "host": {"machine": platform.machine(), "system": platform.system(), "node": platform.node()},
            "wall_time_s": round(wall_s, 3)}
