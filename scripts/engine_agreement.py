"""Agreement of every trained engine-layout model with llama.cpp (issue 18, part 3).

For each run folder under reports/trained/engine/: the JAX forward at the checkpoint's
weights, llama.cpp on the exported model.gguf (F32 cache, no flash attention, one batch) and
the numpy reference on the same file, on held-out training sequences; max and mean |diff|
of the logits and top-1 agreement on the rows whose lead exceeds rounding. Also the
held-out accuracy by question index (the sweep asks the first question only; with four
records and four questions the last is answerable by elimination). Writes
reports/trained/engine/agreement.md.

    .venv/bin/python scripts/engine_agreement.py [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from kvphase.reference import open_model
from kvphase.reference.agreement import CLEAR_LEAD, agreement, lead, llamacpp_logits
from kvphase.train.loop import Trainer, model_of
from kvphase.train.run import CHECKPOINT_FILE, MODEL_FILE, load_train_config

ROOT = Path("reports/trained/engine")
SEQUENCES = 8


def one(run: Path) -> tuple[str, str]:
    config = load_train_config(run)
    trainer = Trainer.new(config)
    trainer.load(run / CHECKPOINT_FILE)
    batch = trainer.data.evaluation_batch().tokens[:SEQUENCES]  # (n, T)
    jax_logits = model_of(config).logits
    ours = np.concatenate([np.asarray(jax_logits(trainer.params, tokens[None], config))[0] for tokens in batch])
    engine = np.concatenate([llamacpp_logits(run / MODEL_FILE, tokens.tolist(), type_k=0, type_v=0, flash_attn=False)
                             for tokens in batch])
    model = open_model(run / MODEL_FILE)
    reference = np.concatenate([model.forward(tokens.tolist(), model.new_cache()) for tokens in batch])
    clear = lead(engine) > CLEAR_LEAD
    jax_vs = agreement(ours, engine)
    ref_vs = agreement(reference, engine)
    top1 = f"{np.mean(ours.argmax(1)[clear] == engine.argmax(1)[clear]):.2%}" if clear.any() else "no clear row"
    by_question = trainer.evaluate().correct.reshape(-1, config.queries).mean(0)  # (queries,)
    return (f"| {run.name} | {len(engine)} | {jax_vs.max_diff:.2e} | {jax_vs.mean_diff:.2e} | {top1} | "
            f"{ref_vs.max_diff:.2e} | {ref_vs.mean_diff:.2e} | {np.abs(engine).max():.1f} |",
            f"| {run.name} | " + " | ".join(f"{100 * a:.1f}" for a in by_question) + " |")


def main(runs: list[Path]) -> None:
    lines = ["# The trained engine-layout models: llama.cpp against the JAX forward and the numpy reference", "",
             f"{SEQUENCES} held-out training sequences per model, every row's logits; llama.cpp with F32 weights and "
             "cache, no flash attention, one batch. Top-1: rows whose llama.cpp lead exceeds "
             f"{CLEAR_LEAD} (`scripts/engine_agreement.py`).", "",
             "| model | rows | JAX max abs diff | JAX mean | JAX top-1 | reference max abs diff | reference mean | max abs logit |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    questions = ["", "Held-out accuracy (%) by question index, at the checkpoint:", "",
                 "| model | " + " | ".join(f"question {i + 1}" for i in range(4)) + " |", "| --- |" + " --- |" * 4]
    rows = earlier_rows(ROOT / "agreement.md")
    for run in runs:
        rows[run.name] = one(run)
        print(*rows[run.name], sep="\n", flush=True)
    for name in sorted(rows):
        lines.append(rows[name][0])
        questions.append(rows[name][1])
    (ROOT / "agreement.md").write_text("\n".join(lines + questions) + "\n")


def earlier_rows(path: Path) -> dict[str, tuple[str, str]]:
    """The rows of a previous agreement.md by model: checkpoints stay local (.gitignore), so a run
    on another machine measures the models whose checkpoints it has and keeps the others' rows."""
    if not path.is_file():
        return {}
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        name = line.split("|")[1].strip() if line.startswith("| ") else ""
        if "-seed" in name:
            found.setdefault(name, []).append(line)
    return {name: (lines[0], lines[1]) for name, lines in found.items() if len(lines) == 2}


if __name__ == "__main__":
    main([Path(p) for p in sys.argv[1:]] or sorted(p for p in ROOT.glob("*-seed*")
                                                   if (p / CHECKPOINT_FILE).is_file() and (p / MODEL_FILE).is_file()))
