"""`kvphase train DESIGN [OUT]`: grow a tiny compressed transformer on the CPU and export it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from kvphase.cli import app
from kvphase.cli.options import own_folder
from kvphase.cli.text import plain
from kvphase.train.config import DESIGN_DEFAULTS, HINT_SHARE, LAYOUT_DEFAULTS, TrainConfig
from kvphase.train.watchdog import STALL_LIMIT_S, TrainingStalled


@app.command()
def train(
    design: str = typer.Argument(..., help="dense (the control), gated, meanpool, kpool, cowa (CoWA head slices) or rolling (gated's "
                                 "pooling at every position: the control that retrieves) (gpt2 files "
                                 "the reference runs); "
                                 "csa, csa-disjoint or csa-dense (deepseek4 files llama.cpp runs); glm-kpool or glm-dense "
                                 "(glm5-next files llama.cpp runs); glm-msa (MiniMax-M3's MSA block selection in "
                                 "glm5-next's layout; the reference runs it)."),
    out: Optional[Path] = typer.Argument(None, callback=own_folder, help="Run folder; default reports/trained/<design>-S<stride>-seed<seed>."),
    stride: Optional[int] = typer.Option(None, help=f"S: tokens per pooled entry; default {TrainConfig.stride}. cowa: L, "
                                         f"tokens per head slice; default {DESIGN_DEFAULTS['cowa']['stride']}."),
    layers: int = typer.Option(TrainConfig.layers, help="Transformer blocks."),
    heads: Optional[int] = typer.Option(None, help="Attention heads (each has its own compressor offset); default "
                                       f"{TrainConfig.heads}, {LAYOUT_DEFAULTS['deepseek4']['heads']} for the csa and glm designs "
                                       f"and {DESIGN_DEFAULTS['cowa']['heads']} for cowa."),
    d_model: int = typer.Option(TrainConfig.d_model, "--d-model", help="Width of the residual stream."),
    context: int = typer.Option(TrainConfig.context, help="Tokens before the questions (the sweep's default --context)."),
    records: int = typer.Option(TrainConfig.records, help="Key value records in each training context."),
    queries: int = typer.Option(TrainConfig.queries, help="Questions after the context of every training sequence."),
    steps: Optional[int] = typer.Option(None, help=f"Optimisation steps; default {TrainConfig.steps}, "
                                       f"{LAYOUT_DEFAULTS['deepseek4']['steps']} for the csa designs, "
                                       f"{LAYOUT_DEFAULTS['glm5-next']['steps']} for the glm designs, "
                                       f"{DESIGN_DEFAULTS['cowa']['steps']} for cowa, "
                                       f"{DESIGN_DEFAULTS['meanpool']['steps']} for meanpool."),
    seed: int = typer.Option(0, help="Seed for weights, data and offsets."),
    eval_every: int = typer.Option(TrainConfig.eval_every, "--eval-every", help="Steps between held-out evaluations and checkpoints."),
    stagger: str = typer.Option("none", help="Window offsets staggered per layer, head or layer_head."),
    offsets: str = typer.Option("fixed", help="fixed, random (per sequence and head) or jitter (per sequence, shared)."),
    local_window: int = typer.Option(TrainConfig.local_window, "--local-window", help="Recent tokens every query sees exactly."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="kpool, glm-kpool: windows (pools) each query reads; default "
                                        f"{TrainConfig.top_k}, {LAYOUT_DEFAULTS['glm5-next'].get('top_k', TrainConfig.top_k)} "
                                        "for glm-kpool. csa, csa-disjoint: compressed entries DeepSeek-V4's lightning indexer "
                                        "selects (trained by distillation after --dense-steps); default 0, every entry read."),
    ratios: str = typer.Option(TrainConfig.ratios, "--ratios", help="csa designs: compress ratio per layer, a comma pattern "
                               "repeated over --layers: 4 (CSA), 128 (HCA, needs --context 256 or more), 0 (window only)."),
    dense_steps: int = typer.Option(TrainConfig.dense_steps, "--dense-steps",
                                    help="glm designs and csa with --top-k: steps of dense attention, the indexer distilled, "
                                    "before sparse training."),
    kda: str = typer.Option(TrainConfig.kda, "--kda", help="glm designs: the KDA layer trained (first: what gives the NoPE "
                            "model token order) or off (a no-op layer, the MLA layers alone)."),
    copy_steps: int = typer.Option(TrainConfig.copy_steps, "--copy-steps", help="Of --steps, the first ones spent on an "
                                   "induction warm-up (a run of words repeated at a random place) before the pairs."),
    gate_steps: Optional[int] = typer.Option(None, "--gate-steps", help="meanpool: of --steps, the first ones pool with a "
                                             "trained gate (as gated), which is then dropped; default a third "
                                             "of --steps for meanpool, 0 (not allowed) for the others."),
    hint_steps: Optional[int] = typer.Option(None, "--hint-steps", help="csa-dense: of --steps, the first ones also train "
                                             "the induction hint (a layer-0 head on the previous token, the last layer at "
                                             "each question on the asked record's value); default "
                                             f"{HINT_SHARE:.0%} of --steps for csa-dense, 0 (not allowed) for the others."),
    batch: Optional[int] = typer.Option(None, help=f"Sequences per step; default {TrainConfig.batch}, "
                                        f"{LAYOUT_DEFAULTS['deepseek4']['batch']} for the csa and glm designs."),
    lr: float = typer.Option(TrainConfig.lr, help="Peak learning rate."),
    init: Optional[Path] = typer.Option(None, "--init", help="Start from the weights of a finished or stopped run folder of "
                                        "the same design and sizes (its checkpoint; e.g. at a longer --context), with a fresh "
                                        "optimiser and schedule; a csa run that read every entry may start one with --top-k "
                                        "(the indexer's weights start fresh)."),
    stall_minutes: float = typer.Option(STALL_LIMIT_S / 60, "--stall-minutes", min=0, help="Minutes without a step, "
                                        "evaluation or checkpoint finished after which the run is taken for hung (an XLA "
                                        "computation that never returns) and ends with exit 1, its last checkpoint kept; "
                                        "0: wait forever."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Train a model with a chunked compressor from scratch; Ctrl-C keeps a checkpoint, the same command resumes."""
    from kvphase.train.report import build_training_report, headline
    from kvphase.train.run import MODEL_FILE, default_train_dir, train as run_training

    config = TrainConfig.for_design(design, stride=stride, layers=layers, heads=heads, d_model=d_model, context=context,
                         records=records, queries=queries, steps=steps, seed=seed, eval_every=eval_every, stagger=stagger, offsets=offsets,
                         local_window=local_window, top_k=top_k, ratios=ratios, batch=batch, lr=lr, dense_steps=dense_steps, kda=kda,
                         copy_steps=copy_steps, gate_steps=gate_steps, hint_steps=hint_steps,
                         init=None if init is None else str(init))
    out = out or default_train_dir(config)
    with _TrainingProgress(quiet) as progress:
        run_training(config, out, on_start=progress.start, on_step=progress.step,
                     on_stall=_end_stalled if stall_minutes else None, stall_limit_s=60 * stall_minutes)
    summary = build_training_report(out)
    typer.echo(headline(summary))
    typer.echo(f"Model: {out / MODEL_FILE}  (measure it: kvphase sweep {out / MODEL_FILE})")


def _end_stalled(stalled: TrainingStalled) -> NoReturn:
    """The main thread is stuck in native code, where no exception reaches it: one line, then the
    process ends here (every file it wrote is whole: checkpoints and tables are written atomically
    or repaired on resume)."""
    sys.stderr.write(f"\nError: {plain(stalled, limit=2000)}\n")
    sys.stderr.flush()
    os._exit(1)


class _TrainingProgress:
    """A rich bar with loss, training accuracy, steps/s and ETA; nothing with --quiet."""

    def __init__(self, quiet: bool):
        self._bar = None if quiet else Progress(
            TextColumn("training"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.3f}  acc {task.fields[accuracy]:.0%}  {task.fields[rate]:.1f} steps/s"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True))
        self._task = None

    def __enter__(self):
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()

    def start(self, total: int, done: int) -> None:
        if self._bar is not None:
            self._task = self._bar.add_task("training", total=total, completed=done, loss=float("nan"), accuracy=0.0, rate=0.0)

    def step(self, metrics) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=metrics.step, loss=metrics.loss, accuracy=metrics.accuracy,
                             rate=metrics.steps_per_s)
