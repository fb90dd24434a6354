"""`kvphase theory`: the idealized gradient-flow model of phase specialization (docs/theory.md)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kvphase.cli import app
from kvphase.cli.options import own_folder
from kvphase.cli.text import plain
from kvphase.theory.config import (DEFAULT_COMPONENTS, DEFAULT_STAGGER_CHOICE, STAGGER_CHOICES, TheoryConfig,
                                   theory_run_dir)

DEFAULT = TheoryConfig()


@app.command()
def theory(
    stride: int = typer.Option(DEFAULT.stride, help="S: phases of a window."),
    components: Optional[List[int]] = typer.Option(None, help="K: components (heads or gate slots); repeatable; "
                                                   f"default {', '.join(map(str, DEFAULT_COMPONENTS[:-1]))} and "
                                                   f"{DEFAULT_COMPONENTS[-1]}."),
    stagger: str = typer.Option(DEFAULT_STAGGER_CHOICE, help="Window offsets: none (all at 0), component (component "
                                "k at k mod S) or both."),
    beta: float = typer.Option(DEFAULT.beta, help="Retrieval sharpness: the score of a target whose phase holds a "
                               "whole gate."),
    distractors: float = typer.Option(DEFAULT.distractors, help="D: distractor entries competing with the target's."),
    attenuation: float = typer.Option(DEFAULT.attenuation, help="rho in (0, 1]: the score a component keeps at its "
                                      "boundary phase."),
    readout: str = typer.Option(DEFAULT.readout, help="mixture (each component attends alone, the answer averages "
                                "them) or sum (one softmax over the components' summed scores)."),
    steps: int = typer.Option(DEFAULT.steps, help="RK4 steps of the gradient flow."),
    dt: float = typer.Option(DEFAULT.dt, help="Time step of the flow."),
    init_scale: float = typer.Option(DEFAULT.init_scale, "--init-scale", help="epsilon: standard deviation of the "
                                     "initial gate logits."),
    seed: int = typer.Option(DEFAULT.seed, help="Seed of the initial noise."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/theory-S<S>-beta<beta>."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress line."),
) -> None:
    """Integrate the idealized model's gradient flow and check its closed forms (seconds; written at the end)."""
    from kvphase.errors import PlanError
    from kvphase.runfolder import REPORT_FILE
    from kvphase.theory.report import headline
    from kvphase.theory.study import run_study

    if stagger not in STAGGER_CHOICES:
        raise PlanError(f"unknown --stagger {stagger!r}; expected none, component or both")
    base = TheoryConfig(stride=stride, components=(components or DEFAULT_COMPONENTS)[0], beta=beta,
                        distractors=distractors, attenuation=attenuation, readout=readout, steps=steps, dt=dt,
                        init_scale=init_scale, seed=seed)
    run_dir = out or theory_run_dir(base)
    with _ProgressLine(quiet) as progress:
        summary = run_study(base, components or DEFAULT_COMPONENTS, STAGGER_CHOICES[stagger], run_dir, progress)
    typer.echo(plain(headline(summary), limit=2000))
    typer.echo(f"Report: {plain(run_dir / REPORT_FILE)}")


class _ProgressLine:
    """A rich line naming the case being integrated and its steps; nothing with --quiet."""

    def __init__(self, quiet: bool):
        self._bar = None if quiet else Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                                                console=Console(stderr=True), transient=True)
        self._task = None

    def __enter__(self):
        if self._bar is not None:
            self._bar.start()
            self._task = self._bar.add_task("theory", total=1)
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, label: str, done: int, total: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=f"theory {label}", completed=done, total=total)
