"""Training speed of `kvphase train`'s default model size, as ratios taken in one run.

    .venv/bin/python bench/bench_train.py [--quick]

Prints steps/s and trained tokens/s for the default configuration of each design, and each
design's time per step relative to the dense control (the cost of the compressor). Then the
ingredients of DeepSeek-V4 as it ships (issue 43's cells, scripts/deepseek4_ablation.sh): each
one's time per step against csa at its defaults, and the minutes its training takes on this core.
"""

from __future__ import annotations

import argparse
import time

from kvphase.train.config import TrainConfig
from kvphase.train.loop import Trainer

# the study's cells: `kvphase train csa` with these options (scripts/deepseek4_ablation.sh)
INGREDIENTS = {
    "csa ctx128": dict(context=128, steps=2000),
    "csa ctx128 top-k 4": dict(context=128, steps=2000, top_k=4),
    "csa ctx256": dict(context=256, steps=3000),
    "csa ctx256 HCA (ratios 4,128)": dict(context=256, steps=3000, ratios="4,128"),
    "csa ctx256 top-k 4 3 layers 4,128,4": dict(context=256, steps=1200, top_k=4, layers=3, ratios="4,128,4"),
}


def steps_per_second(design: str, steps: int, hinted: bool = False, **options) -> tuple[float, int]:
    trainer = Trainer.new(TrainConfig.for_design(design, **options))  # the defaults `kvphase train DESIGN` uses
    # the steps after the first stage: glm's sparse ones, meanpool's uniform ones after its gated start,
    # csa-dense's after its induction hint (or, `hinted`, the first ones, which train the hint too)
    config = trainer.config
    after_first_stage = config.dense_steps if config.dense_first else max(config.first_stage_steps, config.hint_steps)
    trainer.step = 0 if hinted else after_first_stage
    trainer.train_step()  # compile
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    rate = steps / (time.perf_counter() - start)
    return rate, trainer.config.batch * trainer.config.n_positions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per design (after one that compiles)")
    parser.add_argument("--quick", action="store_true", help="2 timed steps per design (CI: the bench still runs)")
    args = parser.parse_args()
    rates = {}
    designs = ("dense", "gated", "rolling", "meanpool", "kpool", "csa", "csa-disjoint", "csa-dense", "csa-dense hinted",
               "glm-kpool", "glm-dense", "glm-msa")
    for name in designs:
        design, _, hinted = name.partition(" ")
        rate, tokens = steps_per_second(design, 2 if args.quick else args.steps, hinted=bool(hinted))
        rates[name] = rate
        print(f"train {name:16s} {rate:6.2f} steps/s  {rate * tokens:9.0f} tokens/s"
              f"  time per step vs dense {rates['dense'] / rate:.2f}x")
    for name, options in INGREDIENTS.items():
        training = dict(options)
        trained_steps = training.pop("steps")
        rate, tokens = steps_per_second("csa", 2 if args.quick else args.steps, **training)
        print(f"train {name:36s} {rate:6.2f} steps/s  {rate * tokens:9.0f} tokens/s  time per step vs csa "
              f"{rates['csa'] / rate:.2f}x  its {trained_steps} steps: {trained_steps / rate / 60:.1f} min")


if __name__ == "__main__":
    main()
