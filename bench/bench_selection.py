"""The cost of selection records (`kvphase sweep --selection`) on the trained indexer models.

A selection sweep installs an eval callback that llama.cpp asks about every graph node of
every decode, and copies each indexer layer's score and top-k nodes out of the query decodes.
Measured in one run, for the committed trained deepseek4 (csa-top4: the lightning indexer keeps
4 of 32 entries) and glm5-next (glm-kpool-top4: 4 of 16 pools) files: the wall time of the same
sweep (each file's default plan at `--per-residue` targets per residue, llama.cpp, 2 threads)
without and with `--selection`, alternating, the best of `--repeats` each, and their ratio.
The issue's bound: the ratio at most 1.10.

Run: `python bench/bench_selection.py`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"deepseek4 csa-top4": ROOT / "tests" / "data" / "trained" / "csa-top4.gguf",
          "glm5-next glm-kpool-top4": ROOT / "reports" / "trained" / "engine" / "glm-kpool-top4-seed0" / "model.gguf"}


def sweep_seconds(model: Path, selection: bool, per_residue: int, threads: int, folder: Path) -> float:
    """Wall time of one sweep into a new folder (model load, scoring, report)."""
    from kvphase.sweep.api import sweep

    started = time.perf_counter()
    sweep(model, per_residue=str(per_residue), threads=threads, selection=selection, out=folder)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--per-residue", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="8 targets per residue, one repetition (CI)")
    args = parser.parse_args()
    if args.quick:
        args.per_residue, args.repeats = 8, 1
    print(f"| model | targets per residue | plain sweep (s) | with --selection (s) | ratio |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for label, model in MODELS.items():
            best = {False: float("inf"), True: float("inf")}
            for repeat in range(args.repeats):
                for selection in (False, True):
                    folder = Path(scratch) / f"{label}-{selection}-{repeat}".replace(" ", "-")
                    best[selection] = min(best[selection], sweep_seconds(model, selection, args.per_residue,
                                                                         args.threads, folder))
            print(f"| {label} | {args.per_residue} | {best[False]:.2f} | {best[True]:.2f} | "
                  f"{best[True] / best[False]:.3f} |")


if __name__ == "__main__":
    main()
