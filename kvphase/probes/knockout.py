"""Knockouts: which attention head serves which phase.

A calibration sweep with its own seed (`calibration/`, contexts disjoint from the
measured ones) averages every head's attention output over the query rows, the final
positions where the answer is read. The sweep plan is then scored on the unchanged model
(`base/`) and, for each (layer, head), with that head's output at the query rows replaced
by its mean (mean ablation: the head still contributes its average, but nothing that
depends on the context; `L<l>H<h>/`). The report maps the change of accuracy and of the
answer's log-probability per component and phase, with 95% intervals from the paired
per-target differences: a head that serves phase p shows a drop at p and not elsewhere
(docs/protocol.md, "Knockouts").

With `slots=True` the components are the gate's phase slots instead: for a model whose
compressor has a trained gate (kvphase-trained gated or kpool; in llama.cpp glm5-next's
k-pool indexer and deepseek4's CSA and indexer compressors), the calibration sweep averages
the weight each phase gets per head (or gate) and channel (`GateRecorder`;
`GateSlotRecorder`), and component
`L<l>P<p>` holds phase p's weight in every window of layer l at that mean, the other slots
sharing the rest in their own proportions (`designs.heldphase`): the slot keeps its average
say but loses everything that depends on content.

This file holds the probe's runs and its report; the hooks that reach a head or a gate slot, on
the numpy reference's policy or in llama.cpp's graph, are `probes.knockout_hooks`.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from kvphase.errors import PlanError, RunFolderError
from kvphase.probes.knockout_hooks import model_heads
from kvphase.runfolder import MANIFEST_FILE, ReportPage, figure, markdown_table, write_csv, write_json
from kvphase.sweep.plan import SweepPlan

BASE_RUN, CALIBRATION_RUN = "base", "calibration"
MEANS_FILE, GATE_MEANS_FILE, EFFECTS_FILE, FIGURE_FILE = "head_means.json", "gate_means.json", "effects.csv", "knockouts.png"
CALIBRATION_SEED_OFFSET = 1000  # the calibration plan's seed is the sweep's plus this: other contexts
Z95 = 1.959964


def component_run(layer: int, index: int, slots: bool = False) -> str:
    """L<layer>H<head>, or L<layer>P<phase> for a gate slot."""
    return f"L{layer}{'P' if slots else 'H'}{index}"


def run_knockout(plan: SweepPlan, backend, run_dir: Path, info, layers: Sequence[int] | None = None,
                 slots: bool = False, progress: Callable[[str, int, int], None] | None = None) -> str:
    """Score `plan` on the model, then once per knocked-out head (or gate slot); write the folder
    and its report. `progress(run name, its number, number of runs)` is called before each sweep."""
    from kvphase.probes import folder
    from kvphase.sweep.run import execute_sweep

    started, run_dir = time.time(), Path(run_dir)
    heads = model_heads(backend)
    available = heads.slot_layers(plan.stride) if slots else heads.layers
    chosen = sorted(set(layers)) if layers else available
    if not set(chosen) <= set(available):
        raise PlanError(f"--layer must be {_layer_range(available, 'a per-phase gate' if slots else 'attention heads')}, "
                        f"got {sorted(chosen)}")
    if slots:
        heads.check_slots(chosen)
    folder.start_folder(run_dir, {"probe": "knockout", "model": plan.model, "plan": asdict(plan), "layers": chosen,
                                  "heads": heads.n_head, "slots": slots},
                        [MEANS_FILE, GATE_MEANS_FILE, EFFECTS_FILE, FIGURE_FILE])
    knockouts = _slot_knockouts if slots else _head_knockouts
    step, total = progress or (lambda name, number, runs: None), 2 + len(chosen) * (plan.stride if slots else heads.n_head)
    step(BASE_RUN, 1, total)
    execute_sweep(plan, backend, run_dir / BASE_RUN, info)
    step(CALIBRATION_RUN, 2, total)  # the knockouts calibrate (or read the saved means) before their first
    try:
        for number, (name, hook) in enumerate(knockouts(plan, heads, run_dir, info, chosen), start=3):
            step(name, number, total)
            heads.install(hook)
            execute_sweep(plan, backend, run_dir / name, info)
    finally:
        heads.restore()
    write_json(run_dir / MANIFEST_FILE, folder.manifest(
        Path(plan.model), info.architecture, time.time() - started, backend=plan.describe_backend()))
    return build_report(run_dir)


def _layer_range(layers: Sequence[int], having: str) -> str:
    """"from 0 to 11", or "one of 1, 3, 5 (the layers with `having`)" for a hybrid model."""
    if list(layers) == list(range(len(layers))):
        return f"from 0 to {len(layers) - 1}"
    return "one of " + ", ".join(map(str, layers)) + f" (the layers with {having})"



def _head_knockouts(plan, heads, run_dir: Path, info, layers: Sequence[int]):
    """(run name, hook) per head: its output at the query rows held at its calibration mean."""
    means = _calibrate(plan, heads, run_dir, info, heads.recorder(plan.context), MEANS_FILE, int)
    for layer in layers:
        for head in range(heads.n_head):
            yield component_run(layer, head), heads.knockout(layer, head, means[layer][head], plan.context)


def _slot_knockouts(plan, heads, run_dir: Path, info, layers: Sequence[int]):
    """(run name, hook) per layer and phase: that phase's gate weight held at its calibration mean
    (per head and channel, (layer, head) -> (S, channels) over the calibration windows) in every head."""
    means = _calibrate(plan, heads, run_dir, info, heads.slot_recorder(plan.stride, layers), GATE_MEANS_FILE,
                       lambda text: tuple(int(x) for x in text.split(",")))
    for layer in layers:
        for phase in range(plan.stride):
            yield component_run(layer, phase, slots=True), heads.slot_knockout(layer, phase, means)


def _calibrate(plan, heads, run_dir: Path, info, recorder, means_file: str, parse_key) -> dict:
    """The recorder's means as saved in `means_file` (keys as text: "3", "3,1"; `parse_key` reads
    them back); the calibration sweep is (re)scored whole with the recorder installed when they
    were not saved yet. A fresh run returns what it saved, so a resumed one sees the same."""
    from kvphase.sweep.run import RESULTS_FILE, execute_sweep

    def parsed(saved: dict) -> dict:
        return {parse_key(key): np.array(rows, dtype=np.float32) for key, rows in saved.items()}

    path = run_dir / means_file
    if path.is_file():
        try:
            return parsed(json.loads(path.read_text()))
        except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise RunFolderError(f"{path} is damaged ({exc}); delete it to calibrate again") from None
    (run_dir / CALIBRATION_RUN / RESULTS_FILE).unlink(missing_ok=True)  # a partial run saw part of the set only
    heads.install(recorder)
    try:
        execute_sweep(replace(plan, seed=plan.seed + CALIBRATION_SEED_OFFSET), heads.backend, run_dir / CALIBRATION_RUN,
                      info)
    finally:
        heads.restore()
    saved = {",".join(map(str, np.atleast_1d(key))): m.round(7).tolist() for key, m in recorder.means().items()}
    write_json(path, saved)
    return parsed(saved)


# --------------------------------------------------------------------------- report


def effects(base: pd.DataFrame, knocked: pd.DataFrame, component: str) -> pd.DataFrame:
    """Per phase: the change in accuracy (points) and in mean answer log-probability, with
    95% intervals from the paired per-target differences (same targets in both runs)."""
    joined = base.merge(knocked, on="target_id", suffixes=("_base", "_ko"))
    if len(joined) != len(base):
        raise RunFolderError(f"{component}: scored {len(joined)} of the base run's {len(base)} targets; run the probe again")
    joined["d_correct"] = 100 * (joined.correct_ko.astype(float) - joined.correct_base.astype(float))
    joined["d_logprob"] = joined.logprob_ko - joined.logprob_base
    rows = []
    for phase, group in joined.groupby("phase_base"):
        n = len(group)
        row = {"component": component, "phase": int(phase), "n": n,
               "accuracy_base": 100 * group.correct_base.mean(), "accuracy_ko": 100 * group.correct_ko.mean()}
        for name in ("d_correct", "d_logprob"):
            mean, half = group[name].mean(), Z95 * group[name].std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
            row |= {name: mean, f"{name}_low": mean - half, f"{name}_high": mean + half}
        rows.append(row)
    return pd.DataFrame(rows)


def summarize(table: pd.DataFrame) -> dict:
    """For each phase, the head whose knockout hurts it most, and whether the harm is specific."""
    by_phase = []
    for phase, group in table.groupby("phase"):
        worst = group.loc[group.d_correct.idxmin()]
        elsewhere = table[(table.component == worst.component) & (table.phase != phase)].d_correct
        by_phase.append({"phase": int(phase), "component": worst.component, "d_correct": round(float(worst.d_correct), 2),
                         "ci": [round(float(worst.d_correct_low), 2), round(float(worst.d_correct_high), 2)],
                         "significant": bool(worst.d_correct_high < 0),
                         "d_correct_other_phases": round(float(elsewhere.mean()), 2) if len(elsewhere) else None})
    moved = table.loc[table.d_logprob.abs().idxmax()]
    largest = {"component": moved.component, "phase": int(moved.phase), "d_logprob": round(float(moved.d_logprob), 3),
               "ci": [round(float(moved.d_logprob_low), 3), round(float(moved.d_logprob_high), 3)]}
    return {"components": sorted(table.component.unique().tolist()), "by_phase": by_phase,
            "any_answer_changed": bool((table.d_correct != 0).any()), "largest_logprob_change": largest}


def headline(summary: dict) -> str:
    parts = []
    for p in summary["by_phase"]:
        mark = "" if p["significant"] else ", not significant"
        other = "" if p["d_correct_other_phases"] is None else f"; {p['d_correct_other_phases']:+.1f} at the other phases"
        parts.append(f"phase {p['phase']}: {p['component']} {p['d_correct']:+.1f} points "
                     f"(CI {p['ci'][0]:+.1f} to {p['ci'][1]:+.1f}{mark}{other})")
    moved = summary["largest_logprob_change"]
    logprob = (f"largest change of the answer's log-probability: {moved['component']} at phase {moved['phase']}, "
               f"{moved['d_logprob']:+.3f} nats (CI {moved['ci'][0]:+.3f} to {moved['ci'][1]:+.3f})")
    if not summary["any_answer_changed"]:
        return f"No knockout changed whether any answer was right; {logprob}"
    return "Largest knockout harm per phase: " + "; ".join(parts) + f". The {logprob}"


def build_report(run_dir: Path) -> str:
    from kvphase.probes import folder
    from kvphase.sweep.run import load_results

    run_dir = Path(run_dir)
    config = folder.load_probe_config(run_dir)
    base = load_results(run_dir / BASE_RUN)
    slots = bool(config.get("slots", False))
    per_layer = int(config["plan"]["stride"]) if slots else int(config["heads"])
    components = [component_run(layer, i, slots) for layer in config["layers"] for i in range(per_layer)]
    if base.empty:
        raise RunFolderError(f"{run_dir}: the base sweep has no results; run the probe again")
    table = pd.concat([effects(base, load_results(run_dir / c), c) for c in components], ignore_index=True)
    write_csv(run_dir / EFFECTS_FILE, table.round(4))
    summary = summarize(table)
    _plot(table, run_dir / FIGURE_FILE, "gate slot (layer, phase)" if slots else "knocked-out head")
    shown = table[["component", "phase", "n", "accuracy_base", "accuracy_ko", "d_correct", "d_correct_low",
                   "d_correct_high", "d_logprob", "d_logprob_low", "d_logprob_high"]].round(2)
    page = ReportPage(
        title=f"Knockouts: {Path(config['model']).name}",
        headline=headline(summary),
        prose=(SLOT_TEXT if slots else HEAD_TEXT).format(calibration=CALIBRATION_RUN),
        figure=(FIGURE_FILE, "accuracy change per component and phase"),
        sections=[(None, markdown_table(shown))],
        files=f"Files: `config.json`, `{CALIBRATION_RUN}/`, `{BASE_RUN}/` and one sweep folder per component, "
              f"`{GATE_MEANS_FILE if slots else MEANS_FILE}`, `{EFFECTS_FILE}`, `summary.json`, `manifest.json`; "
              "`kvphase report <this folder>` rebuilds this page from the sweeps.")
    folder.write_report(run_dir, summary, page.markdown())
    return headline(summary)


HEAD_TEXT = ("Each head's attention output at the query rows replaced by its mean there over a calibration sweep of "
             "other contexts (`{calibration}/`; mean ablation), the same targets scored again; changes per phase "
             "(position mod S) with 95% intervals from the paired per-target differences. A head that serves one "
             "phase shows a drop at that phase only.")
SLOT_TEXT = ("Component `L<l>P<p>`: in every window of layer l, the gate weight of phase p held at its mean over a "
             "calibration sweep of other contexts (`{calibration}/`), per head and channel, the other slots sharing "
             "the rest in their own proportions; the same targets scored again. Changes per phase (position mod S) "
             "with 95% intervals from the paired per-target differences. A slot whose content-driven weight serves "
             "phase p shows a drop at that phase.")


def _plot(table: pd.DataFrame, path: Path, ylabel: str) -> None:
    """Two maps, component x phase: the accuracy change and the mean answer log-probability change."""
    order = sorted(table.component.unique(), key=lambda c: tuple(int(x) for x in re.findall(r"\d+", c)))
    n_phase = table.phase.nunique()
    with figure(path, ncols=2, figsize=(2.4 * n_phase + 5, 0.35 * len(order) + 1.5), dpi=110) as (fig, axes):
        for ax, column, title in zip(axes, ("d_correct", "d_logprob"),
                                     ("accuracy change (points)", "answer log-prob change (nats)")):
            grid = table.pivot(index="component", columns="phase", values=column).loc[order]  # (components, S)
            limit = max(1.0 if column == "d_correct" else 0.01, float(np.nanmax(np.abs(grid.to_numpy()))))
            image = ax.imshow(grid.to_numpy(), cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
            ax.set(xticks=range(grid.shape[1]), xticklabels=grid.columns, yticks=range(grid.shape[0]),
                   yticklabels=grid.index, xlabel="phase (position mod S)", ylabel=ylabel, title=title)
            fig.colorbar(image, ax=ax)
