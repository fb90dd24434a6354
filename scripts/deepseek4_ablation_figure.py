"""Issue 43's ablation at a glance: every cell's per-residue accuracy (mod 8, one line per seed,
through llama.cpp) beside DeepSeek-V4-Flash-Base's published profile, from the run folders
scripts/deepseek4_ablation.sh wrote (and the engine study's csa and csa-disjoint, swept mod 8).

    .venv/bin/python scripts/deepseek4_ablation_figure.py   # writes reports/trained/ds4-ablation/profiles.png
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from claims import DS4_CELLS, PUBLISHED_DEEPSEEK4  # noqa: E402

BASELINES = {"ctx64 (engine study)": "csa", "ctx64 disjoint (engine study)": "csa-disjoint"}
COLUMNS = 5


def cells() -> dict[str, list[Path]]:
    """Sweep folders by cell: each study cell in claims.py's order, then the engine study's 64-token models."""
    trained = ROOT / "reports" / "trained"
    by_cell = {cell.name: [trained / run / "sweep" for run in cell.runs()] for cell in DS4_CELLS}
    for label, design in BASELINES.items():
        by_cell[label] = sorted((trained / "engine").glob(f"{design}-seed[0-2]/sweep-mod8"))
    return by_cell


def main() -> None:
    by_cell = cells()
    rows = -(-len(by_cell) // COLUMNS)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(3.2 * COLUMNS, 3.2 * rows), sharey=True, squeeze=False)
    for ax in axes.flat[len(by_cell):]:
        ax.axis("off")
    for ax, (cell, sweeps) in zip(axes.flat, by_cell.items()):
        ax.plot(range(8), PUBLISHED_DEEPSEEK4, "k--", lw=1.5, label="DeepSeek-V4 (published)")
        for sweep in sweeps:
            summary = json.loads((sweep / "summary.json").read_text())
            seed = re.search(r"seed(\d+)", sweep.parent.name).group(1)
            ax.plot(range(8), [r["accuracy"] for r in summary["per_residue"]], marker="o", ms=3, lw=1,
                    label=f"seed {seed}: gap {summary['gap']:.1f}")
        for end in (3, 7):
            ax.axvline(end, color="grey", lw=0.5, alpha=0.5)
        ax.set(title=cell, xlabel="residue (position mod 8)", xticks=range(8), ylim=(0, 102))
        ax.legend(fontsize=6, loc="lower left")
    for row in axes:
        row[0].set_ylabel("accuracy (%) through llama.cpp")
    fig.tight_layout()
    out = ROOT / "reports" / "trained" / "ds4-ablation" / "profiles.png"
    fig.savefig(out, dpi=110)
    print(out.relative_to(ROOT))


if __name__ == "__main__":
    main()
