"""The flip probe: the phase response of single targets.

A sweep's context is taken as built (`kvphase.sweep.contexts`), and for each of a few
of its targets `shift` filler tokens (0 .. cycles x S - 1) are inserted right before the
target record, everything else unchanged: the target moves to phase (p + shift) mod S
while its content and its neighbours stay the same (docs/protocol.md, "Flip probe"). At each
shift the probe scores the right value and, as distractors, every other value of the
task's list that occurs in the context, and records the logprob of the right value, of
the strongest distractor, and their margin. A phase-sensitive model switches its
preference with period S; a model without one drifts smoothly with length.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from kvphase.backends.base import Backend, Query
from kvphase.errors import PlanError
from kvphase.runfolder import MANIFEST_FILE, ReportPage, figure, markdown_table, write_csv, write_json
from kvphase.sweep.contexts import build_contexts
from kvphase.sweep.layout import Context, Target
from kvphase.sweep.offsets import prefix_pad
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.records import RecordMaker
from kvphase.sweep.tasks import load_task

RESULTS_FILE, FIGURE_FILE = "results.csv", "flip.png"
COLUMNS = ["target_id", "shift", "position", "phase", "query_pos", "logprob_right", "logprob_distractor",
           "distractor", "margin", "correct"]


def pick_targets(contexts: Sequence[Context], n_targets: int) -> list[tuple[Context, Target]]:
    """The first `n_targets` targets of the plan, in context order."""
    picked = [(c, t) for c in contexts for t in c.targets][:n_targets]
    if len(picked) < n_targets:
        raise PlanError(f"the plan holds {len(picked)} targets, fewer than --targets {n_targets}; "
                        "use a longer --context or fewer --targets")
    return picked


def distractors(records: RecordMaker, tokens: Sequence[int], target: Target) -> list[tuple[str, tuple[int, ...]]]:
    """(value, answer ids) of every other value of the task that occurs in the context."""
    answers = {v: records.segments(records.task.answer, target.key, v) for v in records.values if v != target.answer}
    lengths = {len(ids) for ids in answers.values()}
    present = {tuple(tokens[i : i + n]) for n in lengths for i in range(len(tokens) - n + 1)}
    found = [(v, ids) for v, ids in answers.items() if ids in present]
    if not found:
        raise PlanError(f"no other value of task {records.task.name} occurs in the context of target "
                        f"{target.target_id}: nothing to compare the right value with")
    return found


def shifted(context: Context, target: Target, filler: Sequence[int], shift: int) -> list[int]:
    """The context with `shift` filler tokens inserted right before the target record."""
    tokens = list(context.tokens)
    return tokens[: target.position] + list(filler[:shift]) + tokens[target.position :]


def flip_rows(backend: Backend, records: RecordMaker, context: Context, target: Target, filler: Sequence[int],
              n_shifts: int, stride: int) -> list[dict]:
    """One row per shift: logprobs of the right value and of the strongest distractor."""
    others = distractors(records, context.tokens, target)
    queries = [target.query] + [Query(target.query.prompt, ids) for _, ids in others]
    rows = []
    for shift in range(n_shifts):
        tokens = shifted(context, target, filler, shift)
        scores = backend.score(tokens, queries)
        best = int(np.argmax([s.logprob for s in scores[1:]]))
        right, wrong = scores[0].logprob, scores[1 + best].logprob
        position = target.position + shift
        rows.append({"target_id": target.target_id, "shift": shift, "position": position, "phase": position % stride,
                     "query_pos": len(tokens), "logprob_right": round(right, 6), "logprob_distractor": round(wrong, 6),
                     "distractor": others[best][0], "margin": round(right - wrong, 6),
                     "correct": bool(scores[0].correct)})
    return rows


def run_flip(plan: SweepPlan, backend: Backend, run_dir: Path, n_targets: int, cycles: int, model_info) -> str:
    """Build the sweep's contexts, shift each picked target through `cycles` stride cycles, write the folder."""
    from kvphase.probes import folder

    if n_targets < 1 or cycles < 1:
        raise PlanError(f"--targets and --cycles must be at least 1, got {n_targets} and {cycles}")
    started = time.time()
    task = load_task(plan.task)
    records = RecordMaker(task, backend)
    if not records.values:
        raise PlanError(f"task {task.name} generates its values; the flip probe needs a task with a value list")
    picked = pick_targets(build_contexts(task, backend, plan.context_settings), n_targets)
    n_shifts = cycles * plan.stride
    filler = prefix_pad(backend.tokenize(task.filler_text), n_shifts)
    config = {"probe": "flip", "model": plan.model, "plan": asdict(plan), "targets": n_targets, "cycles": cycles}
    folder.start_folder(run_dir, config, [RESULTS_FILE, FIGURE_FILE])
    rows = [row for c, t in picked for row in flip_rows(backend, records, c, t, filler, n_shifts, plan.stride)]
    write_csv(run_dir / RESULTS_FILE, pd.DataFrame(rows, columns=COLUMNS))
    write_json(run_dir / MANIFEST_FILE, folder.manifest(
        Path(plan.model), model_info.architecture, time.time() - started, backend=plan.describe_backend(),
        tokens_evaluated=sum(len(c.tokens) + r for c, _ in picked for r in range(n_shifts))))
    return build_report(run_dir)


# --------------------------------------------------------------------------- summary and report


def summarize(results: pd.DataFrame, stride: int) -> dict:
    """Per phase: mean margin and accuracy; per target: whether its preference flips, and
    how much of its margin's variation over shifts is periodic in S."""
    per_phase = results.groupby("phase").agg(n=("margin", "size"), mean_margin=("margin", "mean"),
                                             sd_margin=("margin", "std"), accuracy=("correct", "mean"))
    per_phase = per_phase.reindex(range(stride)).reset_index()
    targets = []
    for target_id, rows in results.groupby("target_id", sort=True):
        margins = rows.sort_values("shift")["margin"].to_numpy()  # (n_shifts,)
        phases = rows.sort_values("shift")["phase"].to_numpy()  # (n_shifts,)
        targets.append({"target_id": int(target_id), "flips": bool((margins > 0).any() and (margins < 0).any()),
                        "min_margin": round(float(margins.min()), 4), "max_margin": round(float(margins.max()), 4),
                        "periodic_share": round(periodic_share(margins, phases), 4)})
    table = pd.DataFrame(targets)
    return {
        "stride": stride,
        "per_phase": [{k: (None if pd.isna(v) else (round(float(v), 4) if isinstance(v, float) else int(v)))
                       for k, v in row.items()} for row in per_phase.to_dict("records")],
        "targets": targets,
        "n_targets": len(targets),
        "flipping_targets": int(table["flips"].sum()),
        "mean_periodic_share": round(float(table["periodic_share"].mean()), 4),
        # what a margin of pure noise scores: S - 1 of the n_shifts - 1 degrees of freedom are phase means
        "chance_periodic_share": round((stride - 1) / max(1, results["shift"].nunique() - 1), 4),
    }


def periodic_share(margins: np.ndarray, phases: np.ndarray) -> float:
    """Share of the margin's variance over shifts that the phase explains (between-phase
    variance / total, i.e. R^2 of a per-phase mean); 0 when the margin does not vary."""
    total = float(np.var(margins))
    if total <= 1e-12:
        return 0.0
    means = pd.Series(margins).groupby(phases).transform("mean").to_numpy()  # (n_shifts,)
    return float(np.var(means) / total)


def headline(summary: dict) -> str:
    best = max((p for p in summary["per_phase"] if p["mean_margin"] is not None), key=lambda p: p["mean_margin"])
    worst = min((p for p in summary["per_phase"] if p["mean_margin"] is not None), key=lambda p: p["mean_margin"])
    return (f"{summary['flipping_targets']} of {summary['n_targets']} targets flip between the right value and a "
            f"distractor as they move through the phases; phase explains {100 * summary['mean_periodic_share']:.0f}% "
            f"of the margin's variation (noise alone: {100 * summary['chance_periodic_share']:.0f}%); mean margin best at phase {best['phase']} ({best['mean_margin']:+.2f} nats), "
            f"worst at phase {worst['phase']} ({worst['mean_margin']:+.2f})")


def plot(results: pd.DataFrame, stride: int, path: Path) -> None:
    """Margin (right - strongest distractor) per shift, one line per target; dotted lines mark cycles."""
    with figure(path, figsize=(7, 3.8), dpi=120) as (fig, ax):
        for target_id, rows in results.groupby("target_id"):
            rows = rows.sort_values("shift")
            ax.plot(rows["shift"], rows["margin"], "o-", markersize=3, label=f"target {target_id}")
        for cycle in range(stride, int(results["shift"].max()) + 1, stride):
            ax.axvline(cycle - 0.5, color="gray", linestyle=":", linewidth=1)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xlabel(f"filler tokens inserted before the target (stride {stride})")
        ax.set_ylabel("logprob right - strongest distractor (nats)")
        if results["target_id"].nunique() <= 10:
            ax.legend(fontsize=7)


def render_markdown(config: dict, summary: dict, manifest: dict) -> str:
    plan = config["plan"]
    return ReportPage(
        title=f"Flip probe: {Path(config['model']).name}",
        headline=headline(summary),
        prose=f"Each target is moved through {config['cycles']} stride cycle(s) by inserting 0 to "
              f"{config['cycles'] * plan['stride'] - 1} filler tokens right before it, everything else unchanged. "
              "Margin: logprob of the right value minus that of the strongest distractor (any other value of the "
              "task that occurs in the context); above 0 the model prefers the right value. `periodic_share`: the share "
              "of a target's margin variation that its phase explains (1: purely periodic in S); a margin of pure noise "
              "scores (S - 1) / (shifts - 1) on average, so use several cycles before reading it.",
        figure=(FIGURE_FILE, "margin per shift"),
        sections=[("Per phase", markdown_table(pd.DataFrame(summary["per_phase"]))),
                  ("Per target", markdown_table(pd.DataFrame(summary["targets"])))],
        measured=[f"Model `{manifest.get('model', {}).get('file', '?')}`, backend {manifest.get('backend', '?')}; task "
                  f"`{plan['task']}`, contexts of {plan['context']} tokens (+ the shift), stride {plan['stride']}, "
                  f"seed {plan['seed']}.",
                  f"Wall time {manifest.get('wall_time_s', '?')} s, {manifest.get('tokens_evaluated', '?')} context "
                  "tokens evaluated."],
        files=f"Files: `config.json`, `{RESULTS_FILE}` (one row per target and shift), `summary.json`, `manifest.json`. "
              "`kvphase report <this folder>` rebuilds this page from the first two.",
    ).markdown()


def build_report(run_dir: Path) -> str:
    from kvphase.probes import folder

    config = folder.load_probe_config(run_dir)
    results = folder.load_csv(run_dir, RESULTS_FILE, COLUMNS, text=("distractor",), flags=("correct",))
    stride = int(config["plan"]["stride"])
    summary = summarize(results, stride)
    plot(results, stride, Path(run_dir) / FIGURE_FILE)
    folder.write_report(run_dir, summary, render_markdown(config, summary, folder.read_manifest(run_dir)))
    return headline(summary)
