"""Mechanism probes: why a phase is weak. One probe per file, each writing a run folder
like a sweep's (`folder.py`) that `kvphase report` rebuilds through `REPORTS`.

- `gates`: static gate concentration from the per-phase bias tensors alone.
- `activations`: the gate weights the windows of real contexts actually used.
- `flip`: single targets moved through the phases, right value against the strongest distractor.
- `cycle`: every gate bias rolled by k; does the weak phase move by k?
- `knockout`: each head (or gate phase slot) mean-ablated in turn; which phase does it serve?

`setup` takes each probe command from its options to its run folder: the probes' defaults, the
sweep plan their contexts come from, and the backend opened and closed (`sweep.backend_setup`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from kvphase.probes import activations, cycle, flip, gates, knockout

# probe name (config.json "probe") -> rebuild summary.json, report.md and figure; returns the headline
REPORTS: dict[str, Callable[[Path], str]] = {
    "gates": gates.build_report,
    "gate-activations": activations.build_report,
    "flip": flip.build_report,
    "cycle": cycle.build_report,
    "knockout": knockout.build_report,
}
# probe name -> the figure its report rewrites (checked before anything is rebuilt)
FIGURES: dict[str, str] = {"gates": gates.FIGURE_FILE, "gate-activations": activations.FIGURE_FILE,
                           "flip": flip.FIGURE_FILE, "cycle": cycle.FIGURE_FILE, "knockout": knockout.FIGURE_FILE}

__all__ = ["FIGURES", "REPORTS", "activations", "cycle", "flip", "gates", "knockout"]
