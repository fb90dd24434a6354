"""The cost of selection records (`kvphase sweep --selection`) on the trained indexer models.

A selection sweep installs an eval callback that llama.cpp asks about every graph node of
every decode, and copies each indexer layer's score and top-k nodes out of the query decodes.
Measured in one run, for the committed trained deepseek4 (csa-top4: the lightning indexer keeps
4 of 32 entries) and glm5-next (glm-kpool-top4: 4 of 16 pools) files, and the tiny random-weight
minimax-m3 (`kvphase.gguf.tiny`, SmolLM2's tokenizer, written into the scratch folder: no trained
minimax-m3 is committed; its block indexer keeps 3 blocks of 4 tokens per head group, the local
one among them, in two MSA layers of two head groups), whose records also copy the block scores
and mask of every head group: the wall time of the same
sweep (each file's default plan at `--per-residue` targets per residue, llama.cpp, 2 threads)
without and with `--selection`, alternating, the best of `--repeats` each (wall time and the
process's CPU time, all threads: on a shared machine the CPU time is the steadier), and their
ratios, after one warm-up sweep that pays the imports. The issue's bound: at most 1.10.

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


def sweep_seconds(model: Path, selection: bool, per_residue: int, threads: int, folder: Path) -> tuple[float, float]:
    """Wall time and CPU time (every thread of this process) of one sweep into a new folder (model
    load, scoring, report)."""
    from kvphase.sweep.api import sweep

    wall, cpu = time.perf_counter(), time.process_time()
    sweep(model, per_residue=str(per_residue), threads=threads, selection=selection, out=folder)
    return time.perf_counter() - wall, time.process_time() - cpu


def tiny_minimax(folder: Path) -> Path:
    """The tiny minimax-m3 with the default model's tokenizer, so the sweep can build its prompts."""
    from kvphase.defaults import default_model_path
    from kvphase.gguf.tiny import write_tiny_model

    return write_tiny_model("minimax-m3", folder / "tiny-minimax-m3.gguf", tokenizer_from=default_model_path())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--per-residue", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="8 targets per residue, one repetition (CI)")
    args = parser.parse_args()
    if args.quick:
        args.per_residue, args.repeats = 8, 1
    print("| model | targets per residue | plain sweep: wall s (CPU s) | with --selection: wall s (CPU s) | "
          "wall ratio | CPU ratio |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        sweep_seconds(MODELS["glm5-next glm-kpool-top4"], True, 2, args.threads, Path(scratch) / "warm-up")  # imports
        models = {**MODELS, "minimax-m3 tiny random": tiny_minimax(Path(scratch))}
        for label, model in models.items():
            best = {False: (float("inf"),) * 2, True: (float("inf"),) * 2}
            for repeat in range(args.repeats):
                for selection in (False, True):
                    folder = Path(scratch) / f"{label}-{selection}-{repeat}".replace(" ", "-")
                    took = sweep_seconds(model, selection, args.per_residue, args.threads, folder)
                    best[selection] = tuple(min(a, b) for a, b in zip(best[selection], took))
            (plain_wall, plain_cpu), (chosen_wall, chosen_cpu) = best[False], best[True]
            print(f"| {label} | {args.per_residue} | {plain_wall:.2f} ({plain_cpu:.2f}) | {chosen_wall:.2f} "
                  f"({chosen_cpu:.2f}) | {chosen_wall / plain_wall:.3f} | {chosen_cpu / plain_cpu:.3f} |")

if __name__ == "__main__":
    main()
