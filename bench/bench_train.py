"""Training speed of `kvphase train`'s default model size, as ratios taken in one run.

    .venv/bin/python bench/bench_train.py [--quick]

Prints steps/s and trained tokens/s for the default configuration of each design, and each
design's time per step relative to the dense control (the cost of the compressor).
"""

from __future__ import annotations

import argparse
import time

from kvphase.train.config import TrainConfig
from kvphase.train.loop import Trainer

def steps_per_second(design: str, steps: int, hinted: bool = False) -> tuple[float, int]:
    trainer = Trainer.new(TrainConfig.for_design(design))  # the defaults `kvphase train DESIGN` uses
    # the steps after the first stage: glm's sparse ones, meanpool's uniform ones after its gated start,
    # csa-dense's after its induction hint (or, `hinted`, the first ones, which train the hint too)
    config = trainer.config
    after_first_stage = config.dense_steps if config.layout == "glm5-next" else max(config.first_stage_steps, config.hint_steps)
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


if __name__ == "__main__":
    main()
