"""The default sweep against the sweep before targets per context grew with the context, in one run.

On the default model at `--context` tokens (1024), `kvphase sweep` as a user runs it (its
default: as many targets as a context holds, the fewest rounds of contexts that detect a
25-point dip at any accuracy) and the plan every run made before `--targets-per-context`
(`--targets-per-context task --per-residue 32`: 16 targets in each of 16 contexts), each in a
fresh folder, alternated `--repeats` times (the machine's load moves both alike); the best wall
time of each, the detectable dip each run's report states, and their ratios.

Run: `make bench` (or `python bench/bench_density.py --threads 2`); `--quick`: one round of
512-token contexts, once (CI: the bench still runs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLANS = {"default": [], "before (task, 32 per residue)": ["--targets-per-context", "task", "--per-residue", "32"]}


def sweep(args: list[str], out: Path) -> tuple[float, dict]:
    """Wall seconds of one `kvphase sweep` command, and the summary it wrote."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kvphase.cli", "sweep", *args, "--quiet", "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started, json.loads((out / "summary.json").read_text())


def main() -> int:
    from kvphase.defaults import default_threads

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--quick", action="store_true", help="one round of 512-token contexts, once (nothing judged)")
    args = parser.parse_args()
    plans = dict(PLANS)
    if args.quick:  # one round of 8 small contexts each
        args.context, args.repeats = 512, 1
        plans = {name: options + ["--contexts", "8"] if not options else options[:-1] + ["8"]
                 for name, options in PLANS.items()}
    best, summaries = {name: float("inf") for name in PLANS}, {}
    with tempfile.TemporaryDirectory() as work:
        for repeat in range(args.repeats):
            for index, (name, options) in enumerate(plans.items()):
                out = Path(work) / f"{index}-{repeat}"
                seconds, summaries[name] = sweep(["--context", str(args.context), "--threads", str(args.threads),
                                                  *options], out)
                best[name] = min(best[name], seconds)
    print(f"default model, {args.context}-token contexts, {args.threads} threads, best of {args.repeats} (alternated)")
    print(f"{'plan':<34}{'contexts':>9}{'targets':>9}{'wall s':>9}{'dip, points':>13}{'mean acc %':>12}")
    for name, summary in summaries.items():
        print(f"{name:<34}{summary['n_contexts']:>9}{summary['n_targets']:>9}{best[name]:>9.1f}"
              f"{summary['detectable_dip'] or float('nan'):>13.1f}{summary['mean_accuracy']:>12.1f}")
    new, old = (summaries[n] for n in PLANS)
    times = [best[n] for n in PLANS]
    print(f"default / before: wall time {times[0] / times[1]:.2f}x, detectable dip "
          f"{(new['detectable_dip'] or 0) / (old['detectable_dip'] or 1):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
