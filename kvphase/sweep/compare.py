"""Several run folders side by side: one table (`comparison.md`, `comparison.csv`) and one
accuracy-by-residue figure (`comparison.png`). Statistics come from `analysis.summarize`
on each folder's `results.csv` and `config.json`; this module computes none itself."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import pandas as pd

from kvphase.errors import PlanError, RunFolderError
from kvphase.runfolder import check_writable, make_folder, markdown_table, write_atomic, write_csv
from kvphase.statistics.nested import NestedReading, inner_stride, read_nested
from kvphase.statistics.stratified import p_text
from kvphase.statistics.printed import fixed
from kvphase.sweep.analysis import GapDifference, Summary, gap_difference
from kvphase.sweep.options import COMPARISON_DIR
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.report import plot_accuracy, run_summary
from kvphase.sweep.run import load_manifest, load_plan, load_results

DEFAULT_OUT = COMPARISON_DIR
MARKDOWN_FILE, FIGURE_FILE, CSV_FILE = "comparison.md", "comparison.png", "comparison.csv"

# comparison.csv: one row per run, numbers unformatted
CSV_COLUMNS = ["label", "run_dir", "model", "backend", "backend_options", "task", "stride", "modulus", "context",
               "n", "mean_accuracy", "worst_accuracy", "worst_residue", "best_accuracy", "best_residue", "gap",
               "gap_ci_low", "gap_ci_high", "periodicity", "detectable_dip", "p_value", "test", "logprob_p_value",
               "verdict", "gap_minus_first", "gap_minus_first_ci_low", "gap_minus_first_ci_high", "inner_stride",
               "between_phases_p_value", "within_phases_p_value"]


@dataclass(frozen=True)
class ComparedRun:
    """One run folder as the comparison sees it."""

    label: str  # the folder name, lengthened with its parents only when two folders share a name
    run_dir: Path
    plan: SweepPlan
    summary: Summary
    results: pd.DataFrame  # one row per scored target
    versus_first: GapDifference | None = None  # this run's gap minus the first run's (None for the first)
    nested: NestedReading | None = None  # read against a smaller stride of the same model that divides its modulus

    @property
    def design(self) -> str:
        """`backend` alone, or `backend (key=value, ...)` from config.json's backend_options."""
        return self.plan.describe_backend()


@dataclass(frozen=True)
class Comparison:
    """What `write_comparison` made: the runs, the table, and the files written."""

    runs: list[ComparedRun]
    table: pd.DataFrame  # CSV_COLUMNS, one row per run
    markdown: Path
    figure: Path
    csv: Path

    @property
    def readings(self) -> list[tuple[str, NestedReading]]:
        """(label, reading) of each run read against a smaller stride (`nested`)."""
        return [(run.label, run.nested) for run in self.runs if run.nested]


def load_runs(run_dirs: Sequence[Path]) -> list[ComparedRun]:
    """Plan and summary of every folder, in the order given; RunFolderError for a folder that
    is not a run or has nothing scored, PlanError for no folder or one given twice."""
    if not run_dirs:
        raise PlanError("compare needs at least one run folder")
    paths = [Path(p) for p in run_dirs]
    seen: dict[Path, Path] = {}
    for path in paths:
        if not path.is_dir():
            raise RunFolderError(f"{path} is not a run folder: " + ("it is a file" if path.exists() else "no such directory"))
        key = path.resolve()
        if key in seen:
            raise PlanError(f"{path} is given twice (also as {seen[key]})")
        seen[key] = path
    runs = []
    for path, label in zip(paths, _labels(paths)):
        plan = load_plan(path)
        results = load_results(path)
        if results.empty:
            raise RunFolderError(f"{path} has no scored targets yet; run the sweep first")
        summary = run_summary(plan, results, load_manifest(path))
        runs.append(ComparedRun(label, path, plan, summary, results))
    # the first run is the baseline: did a fix change the gap?
    runs = runs[:1] + [replace(run, versus_first=gap_difference(runs[0].results, run.results, run.plan.seed))
                       for run in runs[1:]]
    return [replace(run, nested=nested_reading(run, runs)) for run in runs]


def nested_reading(run: ComparedRun, runs: Sequence[ComparedRun]) -> NestedReading | None:
    """`run` read against the largest smaller stride that another run of the same model file sweeps
    and that divides its modulus (`nested`); None when there is none, or when a residue has no scored
    target yet (an interrupted run)."""
    model = Path(run.plan.model).name
    strides = [other.plan.stride for other in runs if Path(other.plan.model).name == model]
    inner = inner_stride(run.plan.modulus, run.plan.stride, strides)
    if inner is None or run.results["residue"].nunique() < run.plan.modulus:
        return None
    return read_nested(run.results, run.plan.stride, run.plan.modulus, inner, run.plan.seed)


def comparison_table(runs: Sequence[ComparedRun]) -> pd.DataFrame:
    """One row per run with CSV_COLUMNS; numbers as `summarize` gives them."""
    rows = []
    for run in runs:
        s, versus = run.summary, run.versus_first
        rows.append({
            "label": run.label,
            "run_dir": str(run.run_dir),
            "model": Path(run.plan.model).name,
            "backend": run.plan.backend,
            "backend_options": json.dumps(run.plan.backend_options, sort_keys=True),
            "task": run.plan.task,
            "stride": run.plan.stride,
            "modulus": run.plan.modulus,
            "context": run.plan.context,
            "n": s.n_targets,
            "mean_accuracy": s.mean_accuracy,
            "worst_accuracy": s.worst_accuracy,
            "worst_residue": s.worst_residue,
            "best_accuracy": s.best_accuracy,
            "best_residue": s.best_residue,
            "gap": s.gap,
            "gap_ci_low": s.gap_ci[0],
            "gap_ci_high": s.gap_ci[1],
            "periodicity": s.periodicity,
            "detectable_dip": s.detectable_dip,
            "p_value": s.test.p_value,
            "test": s.test.name,
            "logprob_p_value": s.logprob_test.p_value,
            "verdict": s.verdict,
            "gap_minus_first": None if versus is None else versus.difference,
            "gap_minus_first_ci_low": None if versus is None else versus.ci_low,
            "gap_minus_first_ci_high": None if versus is None else versus.ci_high,
            "inner_stride": None if run.nested is None else run.nested.inner,
            "between_phases_p_value": None if run.nested is None else run.nested.between.p_value,
            "within_phases_p_value": None if run.nested is None else run.nested.within.p_value,
        })
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


def display_table(runs: Sequence[ComparedRun]) -> pd.DataFrame:
    """The table a person reads (strings), shared by comparison.md and the terminal."""
    return pd.DataFrame([{
        "run": run.label,
        "model": Path(run.plan.model).name,
        "backend/design": run.design,
        "task": run.plan.task,
        "S": run.plan.stride,
        "L": run.plan.context,
        "n": run.summary.n_targets,
        "mean acc. %": fixed(run.summary.mean_accuracy, 2),
        "worst % (residue)": f"{fixed(run.summary.worst_accuracy, 2)} (r={run.summary.worst_residue})",
        "gap (95% CI)": f"{fixed(run.summary.gap, 2)} ({fixed(run.summary.gap_ci[0])} to {fixed(run.summary.gap_ci[1])})",
        "periodicity": "n/a" if run.summary.periodicity is None else fixed(run.summary.periodicity, 2),
        "detectable dip": "n/a" if run.summary.detectable_dip is None else fixed(run.summary.detectable_dip),
        "p": p_text(run.summary.test).removeprefix("= "),
        "logprob p": p_text(run.summary.logprob_test).removeprefix("= "),
        "verdict": run.summary.verdict,
    } for run in runs])


def figure_stride(runs: Sequence[ComparedRun]) -> int:
    """The stride the figure's dotted lines mark: the runs' common stride, or the largest
    step that divides every run's stride (so each run's cycle boundaries fall on a line).
    Runs of different moduli share the residue axis; each run spans its own 0..M-1."""
    return math.gcd(*(run.plan.stride for run in runs))


def write_comparison(run_dirs: Sequence[Path], out_dir: Path = DEFAULT_OUT) -> Comparison:
    """Load the runs, then write comparison.md, comparison.png and comparison.csv into out_dir."""
    runs = load_runs(run_dirs)
    stride = figure_stride(runs)
    out_dir = Path(out_dir)
    make_folder(out_dir)
    check_writable(out_dir, [MARKDOWN_FILE, FIGURE_FILE, CSV_FILE])
    table = comparison_table(runs)
    paths = out_dir / MARKDOWN_FILE, out_dir / FIGURE_FILE, out_dir / CSV_FILE
    write_csv(paths[2], table)
    plot_accuracy([(run.label, run.summary) for run in runs], stride, paths[1])
    write_atomic(paths[0], render_markdown(runs, stride))
    return Comparison(runs, table, *paths)


def render_markdown(runs: Sequence[ComparedRun], stride: int) -> str:
    """comparison.md: the table, the figure, and each run's headline."""
    strides = sorted({run.plan.stride for run in runs})
    lines = [
        f"# Phase sensitivity: {len(runs)} run(s) compared",
        "",
        markdown_table(display_table(runs)),
        "",
        "Accuracies in percent; mean over residues; gap = best - worst residue, with a 95% interval from "
        "resampling contexts; periodicity = mean over r < S of abs(A(r) - A(r+S)) (n/a unless M = 2S); detectable "
        "dip = the one-residue dip each run finds with 80% power; p from each run's Cochran-Mantel-Haenszel test "
        "stratified by context, on accuracy and on the answer log-probability.",
        "",
        f"![accuracy by residue]({FIGURE_FILE})",
        "",
    ]
    if len(strides) > 1:
        lines += [f"The runs' strides differ ({', '.join(map(str, strides))}): dotted lines in the figure fall "
                  f"every {stride} positions, a step that divides every stride.", ""]
    if any(run.nested for run in runs):
        lines += ["## Large moduli read against a smaller stride", "",
                  "Residues mod M carry the phase mod any stride that divides M, so a weak spot of the smaller "
                  "stride shows in the larger one's row. Each such run is split by that phase: a test between "
                  "the phases (residues pooled) and one among the residues within each phase, both stratified "
                  "by context.", ""]
        lines += [f"- **{run.label}**: {run.nested.sentence()}" for run in runs if run.nested]
        lines += [""]
    if len(runs) > 1:
        lines += [f"## Gaps against the first run ({runs[0].label})", "",
                  "Each run's gap minus the first run's, with a 95% interval from resampling each run's contexts; "
                  "an interval that excludes 0 says the gaps differ.", ""]
        lines += [f"- **{run.label}**: {versus.difference:+.2f} points (95% CI {versus.ci_low:+.2f} to "
                  f"{versus.ci_high:+.2f}): {'the gaps differ' if versus.differs else 'no evidence the gaps differ'}."
                  for run in runs[1:] for versus in [run.versus_first]]
        lines += [""]
    lines += ["## Headlines", ""]
    lines += [f"- **{run.label}** (`{run.run_dir}`): {run.summary.headline()}" for run in runs]
    lines += ["", "Numbers per run: `comparison.csv`; each folder's `kvphase report` gives the full detail.", ""]
    return "\n".join(lines)


def _labels(paths: Sequence[Path]) -> list[str]:
    """Folder names; where two share a name, add parent folders until every label differs."""
    parts = [p.resolve().parts for p in paths]
    depth = [1] * len(paths)
    while True:
        labels = ["/".join(pp[-d:]) for pp, d in zip(parts, depth)]
        clashing = {i for i, a in enumerate(labels) for j, b in enumerate(labels) if i != j and a == b}
        grow = [i for i in clashing if depth[i] < len(parts[i])]
        if not grow:
            return labels
        for i in grow:
            depth[i] += 1


__all__ = ["ComparedRun", "Comparison", "load_runs", "comparison_table", "display_table", "write_comparison",
           "DEFAULT_OUT", "MARKDOWN_FILE", "FIGURE_FILE", "CSV_FILE"]
