"""`kvphase report` on the largest run a sweep can hold, as ratios taken in one run.

A run folder is made from the committed example (its config, manifest and plan) with
`--rows` results: the example's contexts repeated with fresh outcomes. Measured in one
process, the best of `--repeats` for each:

- the whole report (`build_report`: statistics, summary, figure, markdown) on the example's
  rows and on about `--rows` rows (whole copies of the example),
- inside it, the two stratified tests (where the time went before the permutations were
  grouped by context size), the bootstrap, the power, and the simulation of the mean interval's
  coverage (`intervals.mean_coverage`, 400 runs like this one).

Seconds per 1,000 rows at both sizes say whether the report grows linearly.

Run: `python bench/bench_report.py` (or `--rows 16384 --repeats 1`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

EXAMPLE = Path(__file__).resolve().parents[1] / "reports" / "example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024"


def large_run(folder: Path, rows: int, seed: int = 0) -> Path:
    """A copy of the example run with about `rows` results (whole copies of its rows, one at least) and ~70% correct."""
    shutil.copytree(EXAMPLE, folder)
    example = pd.read_csv(EXAMPLE / "results.csv")
    n_contexts, rng = example["context"].nunique(), np.random.default_rng(seed)
    parts = []
    for copy in range(max(1, rows // len(example))):
        part = example.copy()
        part["context"] += copy * n_contexts
        part["target_id"] += copy * len(example)
        part["correct"] = rng.random(len(part)) < 0.7
        part["logprob"] = np.where(part["correct"], -rng.exponential(0.3, len(part)), -1 - rng.exponential(2, len(part)))
        parts.append(part)
    results = pd.concat(parts)
    results.to_csv(folder / "results.csv", index=False)
    config = json.loads((folder / "config.json").read_text())
    config["per_residue"] = len(results) // config["modulus"]
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def main() -> None:
    from bench_reference import best_time  # this folder is on the path when a bench runs as a script
    from kvphase.statistics.intervals import mean_coverage
    from kvphase.sweep.report import build_report
    from kvphase.sweep.run import load_results
    from kvphase.statistics.intervals import bootstrap_gaps
    from kvphase.statistics.power import detectable_dip
    from kvphase.statistics.stratified import Stratification, stratified_test

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=65_536, help="results in the large run (one run holds at most 65,536)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one repetition at 4,096 rows (CI: the bench still runs)")
    args = parser.parse_args()
    rows, repeats = (4_096, 1) if args.quick else (args.rows, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        small, large = large_run(Path(tmp) / "small", 0), large_run(Path(tmp) / "large", rows)
        table = []
        for folder in (small, large):
            results = load_results(folder)
            correct, logprob = results["correct"].to_numpy(float), results["logprob"].to_numpy(float)
            residues, contexts = results["residue"].to_numpy(), results["context"].to_numpy()
            stratification = Stratification.of(residues, contexts)
            build_report(folder)  # warm-up: imports, fonts
            table.append((len(results), {
                "whole report": best_time(lambda: build_report(folder), repeats),
                "test, correct": best_time(lambda: stratified_test(correct, stratification, binary=True), repeats),
                "test, log-probability (permutations)": best_time(lambda: stratified_test(logprob, stratification, binary=False), repeats),
                "bootstrap of the gap": best_time(lambda: bootstrap_gaps(correct, residues, contexts), repeats),
                "power": best_time(lambda: detectable_dip(correct, stratification), repeats),
                "coverage of the mean's interval": best_time(lambda: mean_coverage(correct, stratification, contexts), repeats),
            }))
    (n_small, small_times), (n_large, large_times) = table
    print(f"kvphase report, best of {repeats}: {n_small} rows against {n_large} rows")
    print(f"| part | {n_small} rows (s) | {n_large} rows (s) | s per 1K rows, small | s per 1K rows, large | ratio |")
    print("|---|---|---|---|---|---|")
    for part in small_times:
        a, b = small_times[part], large_times[part]
        per_small, per_large = 1000 * a / n_small, 1000 * b / n_large
        print(f"| {part} | {a:.3f} | {b:.3f} | {per_small:.4f} | {per_large:.4f} | {per_large / per_small:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
