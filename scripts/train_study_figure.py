"""The trained-models study at a glance: gap and mean held-out accuracy over training steps
(one figure, a line per seed, one colour per configuration) and a markdown table of every
model's final sweep, from the run folders that scripts/train_study.sh wrote.

    python scripts/train_study_figure.py reports/trained
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd

from kvphase.statistics.printed import fixed
from kvphase.statistics.stratified import format_p


def runs(root: Path) -> dict[str, list[Path]]:
    """Run folders by configuration name (the folder name without its -seedN)."""
    by_name = defaultdict(list)
    for folder in sorted(root.glob("*-seed*")):
        if (folder / "summary.json").is_file():
            by_name[re.sub(r"-seed\d+$", "", folder.name)].append(folder)
    return dict(by_name)


LINE_STYLES = ("-", "--", ":")


def style(index: int) -> dict:
    """The index-th configuration's colour and line style: 20 colours, then the next dash,
    so no configuration is dropped however many the study holds."""
    import matplotlib

    colours = matplotlib.colormaps["tab20"].colors
    return {"color": colours[index % len(colours)], "linestyle": LINE_STYLES[index // len(colours) % len(LINE_STYLES)]}


def plot(by_name: dict[str, list[Path]], path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_gap, ax_acc) = plt.subplots(1, 2, figsize=(14, 5), sharex=True)
    for index, (name, folders) in enumerate(by_name.items()):
        for i, folder in enumerate(folders):
            frame = pd.DataFrame(json.loads((folder / "summary.json").read_text())["curve"])
            label = name if i == 0 else None
            ax_gap.plot(frame.step, 100 * frame.gap, lw=1, alpha=0.8, label=label, **style(index))
            ax_acc.plot(frame.step, 100 * frame.accuracy, lw=1, alpha=0.8, label=label, **style(index))
    ax_gap.set(xlabel="training step", ylabel="gap, best - worst residue (points)",
               title="Phase gap on held-out questions (one line per seed)")
    ax_acc.set(xlabel="training step", ylabel="held-out accuracy (%)", title="Mean accuracy")
    ax_acc.legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig


def table(by_name: dict[str, list[Path]]) -> str:
    """Every model's training and final sweep as their reports read them (summary.json, each number rounded once),
    with the sweep's verdict."""
    rows = ["| model | seed | training eval accuracy | sweep accuracy | sweep gap (95% CI) | worst residue | p | log-prob p "
            "| verdict |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, folders in by_name.items():
        for folder in folders:
            train = json.loads((folder / "summary.json").read_text())
            sweep_file = folder / "sweep" / "summary.json"
            if not sweep_file.is_file():
                rows.append(f"| {name} | {train['seed']} | {fixed(train['accuracy'])}% | not swept | | | | | |")
                continue
            s = json.loads(sweep_file.read_text())
            rows.append(f"| {name} | {train['seed']} | {fixed(train['accuracy'])}% | {fixed(s['mean_accuracy'])}% | "
                        f"{fixed(s['gap'])} ({fixed(s['gap_ci'][0])} to {fixed(s['gap_ci'][1])}) | {s['worst_residue']} | "
                        f"{format_p(s['test']['p_value'])} | {format_p(s['logprob_test']['p_value'])} | {s['verdict']} |")
    return "\n".join(rows)


def main(root: Path) -> None:
    by_name = runs(root)
    if not by_name:
        sys.exit(f"no finished training runs under {root}")
    plot(by_name, root / "study.png")
    (root / "study.md").write_text(table(by_name) + "\n")
    print(table(by_name))
    print(f"figure: {root / 'study.png'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "reports/trained"))
