"""Fixes at inference time (issue 20, item 3), measured: each model swept plain and under each
fix (`kvphase sweep --offsets K --combine RULE`, `--random-offset`), one sweep after the other in
this one run, into reports/trained/fixes/<model>-<fix>/; then reports/trained/fixes/fixes.md: each
fix's mean accuracy and gap with their 95% intervals, each shift of an ensemble alone, and the cost
as ratios of the plain sweep's evaluated tokens and wall time (the manifests' own counts).

    .venv/bin/python scripts/fixes_study.py [--per-residue N] [MODEL_NAME ...]

Resumable: a finished folder is only reported again. Sweeps run on one thread.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from kvphase.statistics.printed import fixed

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "trained" / "fixes"
KV = str(ROOT / ".venv" / "bin" / "kvphase")

HCA_RUNS = ("ctx256-hca-long-seed1", "ctx256-hca-long-seed2", "ctx256-hca-cont-seed0")
FAITHFUL_RUNS = tuple(f"ctx256-top4-from-hca-seed{k}" for k in (0, 1, 2))
MODELS = {  # name -> (file, what it is)
    "gated-seed0": ("reports/trained/gated-seed0/model.gguf", "gpt2 layout + gated compressor, fixed offsets "
                    "(numpy reference; window shifts)"),
    "csa-disjoint-seed0": ("tests/data/trained/csa-disjoint.gguf", "deepseek4 layout, disjoint CSA "
                           "(llama.cpp; prefix shifts)"),
    "glm-dense-seed0": ("tests/data/trained/glm-dense.gguf", "glm5-next layout, dense: the twin with no compressor (llama.cpp)"),
    "gated-offsets-random-seed0": ("reports/trained/gated-offsets-random-seed0/model.gguf", "gated, trained with "
                                   "random offsets (numpy reference)"),
    # more seeds of csa-disjoint, trained on the machine that measured the fix (training is machine-bound: the
    # committed seed 2 held out 85.5%, this one 84.2%; seed 3 learned there and not here), kept beside the runs
    **{f"csa-disjoint-seed{k}-retrained": (f"reports/trained/fixes/models/csa-disjoint-seed{k}-retrained.gguf",
                                           f"deepseek4 layout, disjoint CSA, seed {k} retrained (llama.cpp; prefix "
                                           "shifts)") for k in (2, 5, 6)},
    # DeepSeek-V4's own overlapped compressor: seed 0 as committed, seeds 1-3 (the others that learned in the
    # study) retrained here as csa-disjoint's were
    "csa-seed0": ("reports/trained/engine/csa-seed0/model.gguf", "deepseek4 layout, overlapped CSA (the shipped "
                  "design), seed 0 (llama.cpp; prefix shifts)"),
    **{f"csa-seed{k}-retrained": (f"reports/trained/fixes/models/csa-seed{k}-retrained.gguf", f"deepseek4 layout, "
                                  f"overlapped CSA, seed {k} retrained (llama.cpp; prefix shifts)") for k in (1, 2, 3)},
    # DeepSeek-V4 closer to as it ships (issue 43): the lightning indexer's top-4 at a 128-token context
    **{f"ds4-ctx128-top4-seed{k}": (f"reports/trained/ds4-ablation/ctx128-top4-seed{k}/model.gguf", "deepseek4 "
                                    f"layout, overlapped CSA, indexer top-4, 128-token context, seed {k} (llama.cpp; "
                                    "prefix shifts)") for k in (0, 2, 4, 5)},
    # and with an HCA layer (ratios 4,128) at 256 tokens: the three runs that learned; then every ingredient
    # together (those HCA models given the indexer's top-4)
    **{f"ds4-{run}": (f"reports/trained/ds4-ablation/{run}/model.gguf", "deepseek4 layout, overlapped CSA then HCA "
                      f"(ratios 4,128){indexer}, 256-token context, {run.split('-')[-1].replace('seed', 'seed ')} "
                      "(llama.cpp; prefix shifts)")
       for runs, indexer in ((HCA_RUNS, ""), (FAITHFUL_RUNS, ", indexer top-4")) for run in runs},
}
QUANTIZED = ("csa-disjoint-seed0", "csa-seed0", "ds4-ctx128-top4-seed0", f"ds4-{HCA_RUNS[0]}", f"ds4-{FAITHFUL_RUNS[1]}")
QUANTIZED_FROM = {f"{name}-Q4_0": MODELS[name][0] for name in QUANTIZED}  # each copy's source file
# quantized copies (scripts/quantize_model.py, the gguf package's quantizer), kept beside the runs
MODELS.update({f"{name}-Q4_0": (f"reports/trained/fixes/models/{name}-Q4_0.gguf", f"{name} quantized to Q4_0 "
                                "(llama.cpp; prefix shifts)") for name in QUANTIZED})
FIXES = {  # name -> sweep options
    "plain": [],
    "offsets2-mean": ["--offsets", "2", "--combine", "mean"],
    "offsets4-mean": ["--offsets", "4", "--combine", "mean"],
    "offsets4-max": ["--offsets", "4", "--combine", "max"],
    "random-offset": ["--random-offset"],
}


def quantized(model: str) -> None:
    """Write a quantized model's file once, from the file it copies."""
    file = ROOT / MODELS[model][0]
    if model in QUANTIZED_FROM and not file.exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "quantize_model.py"), QUANTIZED_FROM[model],
                        model.rsplit("-", 1)[1], str(file)], check=True, cwd=ROOT)


def sweep(model: str, fix: str, per_residue: int) -> Path:
    out = OUT / f"{model}-{fix}"
    if not (out / "summary.json").exists():
        quantized(model)
        # the model's path as config.json records it: relative to the repository, as in every other report
        subprocess.run([KV, "sweep", MODELS[model][0], "--per-residue", str(per_residue), "--threads", "1", "--quiet",
                        "--out", str(out), *FIXES[fix]], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return out


def row(model: str, fix: str, out: Path, plain: Path) -> dict:
    from kvphase.sweep.analysis import exact_accuracies

    summary = json.loads((out / "summary.json").read_text())
    exact = exact_accuracies(summary["per_residue"])  # rounded once, below
    cost = [json.loads((folder / "manifest.json").read_text()) for folder in (out, plain)]
    per_residue = json.loads((out / "config.json").read_text())["per_residue"]
    return {"model": model, "fix": fix, "targets per residue": str(per_residue),
            "mean accuracy % (95% CI)": f"{fixed(exact['mean'])} ({fixed(summary['mean_ci'][0])} to "
                                        f"{fixed(summary['mean_ci'][1])})",
            "worst residue": f"{summary['worst_residue']}: {fixed(exact['worst'])}",
            "gap, points (95% CI)": f"{fixed(exact['gap'])} ({fixed(summary['gap_ci'][0])} to {fixed(summary['gap_ci'][1])})",
            "p": f"{summary['test']['p_value']:.2g}",
            "tokens x plain": f"{fixed(cost[0]['tokens_evaluated'] / cost[1]['tokens_evaluated'], 2)}",
            "wall time x plain": f"{fixed(cost[0]['wall_time_s'] / cost[1]['wall_time_s'], 2)}"}


def shift_rows(model: str, out: Path) -> list[dict]:
    """Each shift of an ensemble scored alone (from offsets.csv), as the report shows them."""
    from kvphase.sweep.analysis import summarize_shifts
    from kvphase.sweep.run import load_offsets, load_plan, load_results

    from kvphase.sweep.report import task_chance

    plan = load_plan(out)
    alone = summarize_shifts(load_results(out), load_offsets(out), plan.stride, plan.modulus, plan.seed,
                             task_chance(plan))
    return [{"model": model, "shift": d, "mean accuracy % (95% CI)": f"{fixed(s.exact['mean'])} ({fixed(s.mean_ci[0])} "
             f"to {fixed(s.mean_ci[1])})", "worst residue": f"{s.worst_residue}: {fixed(s.exact['worst'])}",
             "gap, points (95% CI)": f"{fixed(s.exact['gap'])} ({fixed(s.gap_ci[0])} to {fixed(s.gap_ci[1])})"}
            for d, s in alone.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-residue", type=int, default=256, help="for folders not made yet")
    parser.add_argument("--fixes", nargs="+", choices=list(FIXES), default=list(FIXES),
                        help="the fixes to sweep (plain always); fixes.md lists every folder made")
    parser.add_argument("models", nargs="*", default=list(MODELS),
                        help="the models to sweep; fixes.md lists every model swept before too")
    args = parser.parse_args()
    if set(args.models) - set(MODELS):
        parser.error(f"unknown models: {', '.join(sorted(set(args.models) - set(MODELS)))}")
    sys.path.insert(0, str(ROOT))
    listed = [m for m in MODELS if m in args.models or (OUT / f"{m}-plain" / "summary.json").exists()]
    for model in listed:
        sweep(model, "plain", args.per_residue)
        chosen = args.fixes if model in args.models else []
        for fix in [f for f in FIXES if f in chosen or (OUT / f"{model}-{f}").is_dir()]:
            sweep(model, fix, args.per_residue)
            print(f"{model}-{fix}", flush=True)
    (OUT / "fixes.md").write_text(page())


def page() -> str:
    """fixes.md from the folders under reports/trained/fixes/ alone (nothing is swept): every model with a plain
    sweep, each fix swept for it, and each shift of its 4-offset ensemble. `scripts/claims.py` rewrites it too."""
    import pandas as pd

    from kvphase.runfolder import markdown_table

    fixes, shifts = [], []
    listed = [m for m in MODELS if (OUT / f"{m}-plain" / "summary.json").exists()]
    for model in listed:
        fixes += [row(model, fix, OUT / f"{model}-{fix}", OUT / f"{model}-plain") for fix in FIXES
                  if (OUT / f"{model}-{fix}" / "summary.json").exists()]
        shifts += shift_rows(model, OUT / f"{model}-offsets4-mean")
    models = "\n".join(f"- `{name}`: {MODELS[name][1]}" for name in listed)
    return (f"# Fixes at inference time\n\nEach model swept plain and under each fix (`kvphase sweep --offsets K "
            f"--combine RULE`, `--random-offset`), one sweep after the other by `scripts/fixes_study.py` (one "
            f"thread). Tokens are the manifests' counts; wall times are the sweeps' own, on a machine shared with "
            f"other work (`bench/bench_offsets.py` measures them interleaved).\n\n{models}\n\n"
            f"## Gap and mean accuracy\n\n"
            f"{markdown_table(pd.DataFrame(fixes))}\n\n## Each shift of the 4-offset ensemble alone\n\n"
            f"{markdown_table(pd.DataFrame(shifts))}\n")


if __name__ == "__main__":
    main()
