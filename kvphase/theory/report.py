"""The page and figures of a `kvphase theory` folder: closed forms next to the simulation."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from kvphase.runfolder import REPORT_FILE, SUMMARY_FILE, ReportPage, figure, markdown_table, write_atomic, write_json
from kvphase.theory.config import OFFSET_NAMES, TheoryConfig

SPECIALIZATION_FIGURE, ACCURACY_FIGURE, STABILITY_FIGURE = "specialization.png", "accuracy.png", "stability.png"
NO_GAP = 0.005  # a best - worst phase under half a point of p_correct: no weak phase
LEGEND_LIMIT = 8  # phases named in the accuracy figure's legend; past that the lines only show the spread


def write_report(run_dir: Path, base: TheoryConfig, cases: Sequence, checks: Sequence, summary: dict) -> None:
    plot_specialization(cases, run_dir / SPECIALIZATION_FIGURE)
    plot_accuracy(cases, run_dir / ACCURACY_FIGURE)
    plot_stability(checks, run_dir / STABILITY_FIGURE)
    write_json(run_dir / SUMMARY_FILE, summary)
    write_atomic(run_dir / REPORT_FILE, render_markdown(base, summary))


def headline(summary: dict) -> str:
    """The finding in one line: the uniform gate's stability, then what the offsets leave weak."""
    point = summary["uniform_point"]
    threshold = point["threshold_beta"]
    stable = "unstable" if point["unstable"] else "stable" if point["differential_rate"] < 0 else "neutral"
    measured = summary["stability"][0]["measured_rate"]
    parts = [f"uniform gate {stable} (lambda_diff {point['differential_rate'] + 0.0:.4g} predicted, "
             f"{'-' if measured is None else f'{measured:.4g}'} simulated"
             + (f"; beta* = {threshold:.3g})" if threshold else ")")]
    for stagger in dict.fromkeys(c["stagger"] for c in summary["cases"]):
        rows = [c for c in summary["cases"] if c["stagger"] == stagger]
        parts.append(f"{OFFSET_NAMES[stagger]} offsets: "
                     + ", ".join(f"K={c['components']} {_weak_phase(c)}" for c in rows))
    return "; ".join(parts)


def _weak_phase(case: dict) -> str:
    if case["gap"] < NO_GAP:
        return "no weak phase"
    return f"weakest phase {case['weakest_phase']} (gap {100 * case['gap']:.1f} points)"


def plot_specialization(cases: Sequence, path: Path) -> None:
    """Mean normalized gate entropy over time, one line per case."""
    staggers = list(dict.fromkeys(c.config.stagger for c in cases))
    with figure(path, 1, len(staggers), figsize=(5 * len(staggers), 3.6), dpi=110, squeeze=False) as (fig, axes):
        for ax, stagger in zip(axes[0], staggers):
            for case in (c for c in cases if c.config.stagger == stagger):
                t = case.trajectory
                ax.plot(t.time, t.normalized_entropy, label=f"K = {case.config.components}")
            ax.set(title=f"{OFFSET_NAMES[stagger]} offsets", xlabel="flow time", ylabel="gate entropy / log2 S",
                   ylim=(-0.02, 1.02))
            ax.legend()


def plot_accuracy(cases: Sequence, path: Path) -> None:
    """p_correct per phase over time: one panel per case (rows: stagger, columns: K)."""
    staggers = list(dict.fromkeys(c.config.stagger for c in cases))
    ks = list(dict.fromkeys(c.config.components for c in cases))
    with figure(path, len(staggers), len(ks), figsize=(3.6 * len(ks), 2.9 * len(staggers)), dpi=110,
                squeeze=False) as (fig, axes):
        for case in cases:
            ax = axes[staggers.index(case.config.stagger)][ks.index(case.config.components)]
            t = case.trajectory
            for p in range(t.accuracy.shape[1]):
                ax.plot(t.time, t.accuracy[:, p], label=f"phase {p}")
            ax.set(title=case.label, xlabel="flow time", ylabel="p_correct", ylim=(0, 1))
        if cases and cases[0].trajectory.accuracy.shape[1] <= LEGEND_LIMIT:
            axes[0][0].legend(fontsize="small")


def plot_stability(checks: Sequence, path: Path) -> None:
    """The differential norm (log scale) of each stability check, with the closed form's e^(lambda t) dashed."""
    with figure(path, figsize=(6, 3.8), dpi=110) as (fig, ax):
        for check in checks:
            line, = ax.semilogy(check.time, check.differential, label=f"beta = {check.beta:.3g}")
            exponent = np.clip(check.predicted_rate * check.time, -700, 700)  # (T,) within a float's range
            ax.semilogy(check.time, check.differential[0] * np.exp(exponent), "--", color=line.get_color(), alpha=0.7)
        ax.set(xlabel="flow time", ylabel="differential norm", ylim=(1e-8, 1e2),
               title="simulated (solid) and e^(lambda_diff t) (dashed)")
        ax.legend(fontsize="small")


def render_markdown(base: TheoryConfig, summary: dict) -> str:
    point = summary["uniform_point"]
    threshold = point["threshold_beta"]
    return ReportPage(
        title=f"Idealized gradient flow: S = {base.stride}, beta = {base.beta:g}, D = {base.distractors:g}, "
              f"rho = {base.attenuation:g}, {base.readout} readout",
        headline=headline(summary),
        prose=f"K components each hold a softmax gate over the S phases; a target at phase p scores "
              f"beta x c[k, p] x w[k, p] against D distractor entries, where c = rho at a component's boundary "
              f"phase. {_readout_prose(base.readout)} Gradient flow on the mean -log p_correct from gates uniform "
              f"plus noise of {base.init_scale:g}, RK4 with dt = {base.dt:g} for {base.steps} steps "
              f"(flow time {base.dt * base.steps:g}). Derivations: docs/theory.md. Staggered offsets start "
              "component k's windows at k mod S, which makes its boundary phase (S - 1 + k) mod S.",
        figure=(SPECIALIZATION_FIGURE, "mean normalized gate entropy over time"),
        sections=[
            ("Closed forms at the uniform gate (rho = 1)", _uniform_table(point, base),
             "Uniform is unstable where lambda_diff > 0" + (f", i.e. beta < beta* = S ln D = {threshold:.4g}." if threshold
                                                           else ": with this readout it never is.")),
            ("Closed form against simulation", markdown_table(_stability_frame(summary["stability"])),
             f"From noise of {1e-4:g} without attenuation, K = {summary['stability'][0]['components']}. Rates: slope of "
             "log(norm) while the differential norm is under 0.05. Time: to a mean normalized entropy of 0.99, "
             "predicted as ln(delta / eps) / lambda_diff from the measured initial differential norm eps.",
             f"![differential norm over time]({STABILITY_FIGURE})"),
            ("End states, and the symmetric fixed point", markdown_table(_case_frame(summary["cases"])),
             "Predicted: the fixed point of the flow inside the symmetric family (every component w_b on its own "
             "boundary phase, the rest spread evenly; a grid search over w_b, docs/theory.md), defined for fixed "
             "offsets and for staggered ones with K a multiple of S. The simulation settles there where the point is "
             "stable; below beta* it is not, and the components specialize (phases per component = 2^entropy); "
             "with fixed offsets, lambda_trade > 0 says it is unstable to a division of labour (some components take "
             "the boundary phase, the others drop it) even above beta*. "
             f"Balanced split without attenuation: each component on {summary['balanced_split']['phases_per_component']} "
             f"phase(s), accuracy {summary['balanced_split']['accuracy']:.4f} at every phase.",
             f"![accuracy per phase over time]({ACCURACY_FIGURE})"),
            ("Where each component ended", markdown_table(_gate_frame(summary["cases"])),
             "Each component's gate at the end, weight per phase, and its boundary phase, (S - 1 + offset) mod S. "
             "Which component serves which phase is what a knockout of that component would show."),
        ],
        measured=["Numpy only, deterministic for a seed; every number above is recomputed by running the same command.",
                  "Accuracy = p_correct, the model's own probability of the right answer; gap = best - worst phase."],
        files=f"Files: `config.json`, `trajectories.csv` (one row per case and recorded time), `stability.csv`, "
              "`summary.json`, `manifest.json` and the figures. The run takes seconds and writes everything at the end.",
    ).markdown()


def _readout_prose(readout: str) -> str:
    if readout == "sum":
        return "Sum readout: the components add their scores before one softmax against the distractors."
    return ("Mixture readout: each component attends on its own, a = e^score / (e^score + D), and p_correct is their "
            "average.")


def _uniform_table(point: dict, base: TheoryConfig) -> str:
    rows = [("p_correct at every phase (a0)", f"{point['accuracy']:.4f}"),
            ("lambda_diff, (K-1)(S-1) directions", f"{point['differential_rate']:.5g}"),
            ("lambda_common, S-1 directions", f"{point['common_rate']:.5g}"),
            ("beta* (unstable below)", "none" if point["threshold_beta"] is None else f"{point['threshold_beta']:.4g}"),
            ("uniform gate at this beta", "unstable" if point["unstable"] else "not unstable")]
    return markdown_table(pd.DataFrame(rows, columns=[f"at K = {base.components}", "value"]))


def _stability_frame(rows: list[dict]) -> pd.DataFrame:
    def number(value, digits=4):
        return "-" if value is None else f"{value:.{digits}g}"

    return pd.DataFrame({
        "beta": [number(r["beta"]) for r in rows], "K": [r["components"] for r in rows],
        "lambda_diff closed form": [number(r["predicted_rate"]) for r in rows],
        "lambda_diff simulated": [number(r["measured_rate"]) for r in rows],
        "lambda_common closed form": [number(r["predicted_common_rate"]) for r in rows],
        "lambda_common simulated": [number(r["measured_common_rate"]) for r in rows],
        "t(0.99) closed form": [number(r["predicted_time"]) for r in rows],
        "t(0.99) simulated": [number(r["simulated_time"]) for r in rows]})


def _case_frame(rows: list[dict]) -> pd.DataFrame:
    def percents(values) -> str:
        return " / ".join(f"{100 * v:.1f}" for v in values)

    return pd.DataFrame({
        "offsets": [OFFSET_NAMES[r["stagger"]] for r in rows], "K": [r["components"] for r in rows],
        "accuracy by phase, %": [percents(r["accuracy"]) for r in rows],
        "weakest": [r["weakest_phase"] if r["gap"] >= NO_GAP else "none" for r in rows],
        "gap": [f"{100 * r['gap']:.1f}" for r in rows],
        "entropy / log2 S": [f"{r['normalized_entropy']:.3f}" for r in rows],
        "phases per component": [f"{r['phases_per_component']:.2f}" for r in rows],
        "predicted accuracy, %": [percents(r["symmetric_point"]["accuracy"]) if r["symmetric_point"] else "-"
                                  for r in rows],
        "predicted gap": [f"{100 * r['symmetric_point']['gap']:.1f}" if r["symmetric_point"] else "-" for r in rows],
        "lambda_trade": [_trade(r["symmetric_point"]) for r in rows]})


def _gate_frame(rows: list[dict]) -> pd.DataFrame:
    """One row per case and component: the gate it ended with."""
    lines = []
    for r in rows:
        for k, (gate, boundary) in enumerate(zip(r["gates"], r["boundary_phases"])):
            lines.append((OFFSET_NAMES[r["stagger"]], r["components"], k, boundary, " / ".join(f"{w:.2f}" for w in gate)))
    return pd.DataFrame(lines, columns=["offsets", "K", "component", "boundary phase", "gate weight by phase"])


def _trade(point: dict | None) -> str:
    """The symmetric point's division-of-labour eigenvalue, where one is defined (fixed offsets, K >= 2)."""
    rate = point and point.get("trade_rate")
    return "-" if rate is None else f"{rate:.3g}"
