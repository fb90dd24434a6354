"""What answer phases (issue 70) cost in wall time: a plan with each target's answer at its own phase
(up to M - 1 filler tokens before each question) against the same plan without, scored through
llama.cpp in one run, context by context alternating (`bench_query_phases.wall_time_ratio`).

Two files: the default SmolLM2 at its default plan (1,024 tokens, 32 targets a context), and a tiny
deepseek4 (a compressed file, SmolLM2's vocabulary) at 8K tokens (`--context`). The power and false
positives are bench_answer_power.py's.

Run: `python bench/bench_answer_phases.py [--contexts 8] [--repeats 3] [--context 8192]` (`--quick`: 4
contexts of 1,024 and 2,048 tokens once, for CI).
"""

from __future__ import annotations

import argparse

from bench_query_phases import wall_time_ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context", type=int, default=8192, help="the compressed tiny file's context")
    parser.add_argument("--model", choices=("both", "default", "tiny-deepseek4"), default="both")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.contexts, args.repeats, args.context = 4, 1, 2048
    for model, context in (("default", 1024), ("tiny-deepseek4", args.context)):
        if args.model not in ("both", model):
            continue
        ratio, plain, cpu = wall_time_ratio(context, args.contexts, args.repeats, model, varied_field="answer_phases")
        print(f"wall time on {model} at {context} tokens, answer phases / without: {ratio:.3f} (CPU time {cpu:.3f}; "
              f"{args.contexts} contexts x {args.repeats}, without {plain:.1f} s in all)", flush=True)


if __name__ == "__main__":
    main()
