"""summary.json, report.md and training_curve.png of a training run, from its CSV files alone.

The gap of a model still at chance is noise (a stuck model looks flat, and
small samples at chance give spurious p-values), so the summary only reads a gap once
the held-out accuracy has reached `READABLE_ACCURACY`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvphase.errors import RunFolderError
from kvphase.runfolder import (REPORT_FILE, SUMMARY_FILE, check_writable, figure, figure_link, markdown_table,
                               write_atomic, write_json)
from kvphase.statistics.intervals import wilson_interval
from kvphase.statistics.stratified import homogeneity_test
from kvphase.train.config import TrainConfig
from kvphase.train.run import CURVE_FILE, RESULT_COLUMNS, RESULTS_FILE, load_csv, load_train_config
READABLE_ACCURACY = 0.8


def curve(results: pd.DataFrame) -> pd.DataFrame:
    """Held-out accuracy per evaluation step: mean over all questions, worst and best residue, gap."""
    by_step = results.assign(acc=results.correct / results.n.clip(lower=1)).groupby("step")
    out = pd.DataFrame({
        "accuracy": by_step.correct.sum() / by_step.n.sum(),
        "worst": by_step.acc.min(),
        "best": by_step.acc.max(),
    })
    out["gap"] = out.best - out.worst
    return out.reset_index()


def final_table(results: pd.DataFrame) -> pd.DataFrame:
    last = results[results.step == results.step.max()].sort_values("residue")
    rows = []
    for r in last.itertuples():
        low, high = wilson_interval(int(r.correct), int(r.n))
        rows.append({"residue": int(r.residue), "phase": int(r.phase), "n": int(r.n), "correct": int(r.correct),
                     "accuracy": 100 * r.correct / max(r.n, 1), "ci_low": 100 * low, "ci_high": 100 * high,
                     "logprob": float(r.logprob)})
    return pd.DataFrame(rows)


def summarize_training(out: Path) -> dict:
    config = load_train_config(out)
    results = load_csv(out / RESULTS_FILE, RESULT_COLUMNS)
    if results.empty:
        raise RunFolderError(f"{out} has no evaluation yet; train at least --eval-every steps")
    table = final_table(results)
    correct = np.concatenate([np.r_[np.ones(r.correct, bool), np.zeros(r.n - r.correct, bool)] for r in table.itertuples()])
    groups = np.repeat(table.residue.to_numpy(), table.n.to_numpy())
    test = homogeneity_test(correct, groups)
    accuracy = float(correct.mean())
    return {
        "design": config.design, "stride": config.stride, "stagger": config.stagger, "offsets": config.offsets,
        "heads": config.heads, "seed": config.seed,
        "step": int(results.step.max()), "steps": config.steps,
        "accuracy": 100 * accuracy,
        "worst": float(table.accuracy.min()), "best": float(table.accuracy.max()),
        "gap": float(table.accuracy.max() - table.accuracy.min()),
        "readable": accuracy >= READABLE_ACCURACY,
        "test": {"name": test.name, "p_value": test.p_value, "statistic": test.statistic, "dof": test.dof},
        "by_residue": table.to_dict(orient="records"),
        "curve": curve(results).to_dict(orient="records"),
    }


def headline(summary: dict) -> str:
    what = f"{summary['design']} S={summary['stride']} after {summary['step']} steps: held-out accuracy {summary['accuracy']:.1f}%"
    if not summary["readable"]:
        return f"{what}; below {100 * READABLE_ACCURACY:.0f}%, so its gap ({summary['gap']:.1f} points) is not read as a phase effect."
    return (f"{what}, gap {summary['gap']:.1f} points between residues (worst {summary['worst']:.1f}%, "
            f"best {summary['best']:.1f}%; {summary['test']['name']} p = {summary['test']['p_value']:.2g}).")


def plot_curve(summary: dict, path: Path) -> None:
    frame = pd.DataFrame(summary["curve"])
    with figure(path, figsize=(6.4, 3.6), dpi=110) as (fig, ax):
        ax.plot(frame.step, 100 * frame.accuracy, label="mean accuracy")
        ax.plot(frame.step, 100 * frame.gap, label="gap (best - worst residue)")
        ax.plot(frame.step, 100 * frame.worst, ":", label="worst residue")
        ax.set_xlabel("training step")
        ax.set_ylabel("%")
        ax.set_ylim(0, 100)
        ax.set_title(f"{summary['design']} S={summary['stride']} seed {summary['seed']}")
        ax.legend(fontsize=8)


def build_training_report(out: Path) -> dict:
    """Write summary.json, report.md and the curve; return the summary."""
    check_writable(out, [SUMMARY_FILE, REPORT_FILE, CURVE_FILE])
    summary = summarize_training(out)
    write_json(out / SUMMARY_FILE, summary)
    plot_curve(summary, out / CURVE_FILE)
    table = pd.DataFrame(summary["by_residue"]).round(2)
    steps = pd.DataFrame(summary["curve"]).assign(accuracy=lambda f: (100 * f.accuracy).round(1),
                                                   gap=lambda f: (100 * f.gap).round(1),
                                                   worst=lambda f: (100 * f.worst).round(1),
                                                   best=lambda f: (100 * f.best).round(1))
    text = "\n".join([
        f"# Training run: {summary['design']}, S = {summary['stride']}, seed {summary['seed']}", "",
        headline(summary), "",
        "Held-out questions by the residue of the asked key's position (mod 2S), at the last evaluation "
        "(accuracy and its 95% Wilson interval in %, mean log-probability of the right value):", "",
        markdown_table(table), "",
        figure_link(CURVE_FILE, "training curve"), "",
        "Over training (held-out accuracy in %):", "",
        markdown_table(steps), "",
        "The model file is `model.gguf`: `kvphase sweep model.gguf` measures it with the standard protocol.", "",
    ])
    write_atomic(out / REPORT_FILE, text)
    return summary


__all__ = ["build_training_report", "headline", "summarize_training", "TrainConfig"]
