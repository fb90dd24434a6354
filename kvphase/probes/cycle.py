"""Gate cycling: roll every per-phase gate bias by k slots and see whether the weak phase moves by k.

If a gate's per-phase bias is what makes a phase weak, rolling the bias by k (the bias
that served phase p now serves p + k, payloads fixed) moves the accuracy curve by k:
A_k(r) ~= A_0((r - k) mod S) (docs/protocol.md, "Gate cycling"). The probe writes a copy of
the model with every bias tensor `kvphase.probes.gates` finds rolled (a GGUF both
llama.cpp and the reference backend read), sweeps the original and the copy with the same
plan into two sweep folders inside its own, and reports per phase the observed and the
predicted accuracy and R^2 between them, leaving out the boundary phase S - 1, which
stays weak whatever the gate does (the next token falls into the next entry).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, ContextManager, Optional

import numpy as np
import pandas as pd

from kvphase.backends.base import Backend
from kvphase.errors import ModelFileError, PlanError
from kvphase.gguf.keys import Keys
from kvphase.gguf.modelinfo import ModelInfo, as_model_info
from kvphase.gguf.tensors import tensor_array
from kvphase.gguf.writer import overwrite_tensor
from kvphase.probes.gates import find_sources
from kvphase.runfolder import MANIFEST_FILE, ReportPage, figure, markdown_table, write_csv, write_json
from kvphase.runfolder.files import cannot_write
from kvphase.sweep.plan import SweepPlan

BASE_RUN, PHASES_FILE, FIGURE_FILE = "k0", "phases.csv", "cycling.png"


def rolled_run(k: int) -> str:
    return f"k{k}"


def check_k(k: int, stride: int) -> None:
    if not 1 <= k < stride:
        raise PlanError(f"--k must be between 1 and S - 1 = {stride - 1}, got {k}")


def write_rolled_model(model: Path | ModelInfo, out: Path, k: int) -> list[str]:
    """Copy `model` to `out` with every per-phase bias rolled by k phases; the tensors rolled."""
    header = as_model_info(model).header
    model = header.path
    sources = find_sources(header)
    for source in sources:
        check_k(k, source.stride)
    try:
        shutil.copyfile(model, out)
    except OSError as exc:
        out.unlink(missing_ok=True)  # a copy a full disk cut short is no model
        raise ModelFileError(cannot_write(out, exc)) from None
    infos = {t.name: t for t in header.tensors}
    raw = np.memmap(model, dtype=np.uint8, mode="r")
    for source in sources:
        ape = tensor_array(raw, infos[source.tensor])  # phase axis second to last: (S, C) or (heads, S, head_dim)
        overwrite_tensor(out, source.tensor, np.roll(ape, k, axis=-2))  # row p moves to p + k
    return [s.tensor for s in sources]


def phase_table(base: pd.DataFrame, rolled: pd.DataFrame, stride: int, k: int) -> pd.DataFrame:
    """Per phase r: accuracy before (A_0) and after (A_k) the roll, and the prediction A_0((r - k) mod S)."""
    a0 = base.groupby("phase")["correct"].mean().reindex(range(stride)) * 100  # (S,)
    ak = rolled.groupby("phase")["correct"].mean().reindex(range(stride)) * 100  # (S,)
    phases = np.arange(stride)
    return pd.DataFrame({"phase": phases, "accuracy_k0": a0.to_numpy().round(4), "accuracy_k": ak.to_numpy().round(4),
                         "predicted": a0.to_numpy()[(phases - k) % stride].round(4), "boundary": phases == stride - 1})


def r_squared(table: pd.DataFrame) -> float | None:
    """R^2 of observed A_k against predicted A_0((r - k) mod S) off the boundary phase; None when
    the observed accuracy does not vary there (R^2 is undefined)."""
    rows = table[~table["boundary"]].dropna()
    observed, predicted = rows["accuracy_k"].to_numpy(), rows["predicted"].to_numpy()
    total = float(((observed - observed.mean()) ** 2).sum())
    if len(rows) < 2 or total == 0:
        return None
    return 1.0 - float(((observed - predicted) ** 2).sum()) / total


def run_cycle(plan: SweepPlan, k: int, run_dir: Path, open_model: Callable[[ModelInfo], ContextManager[Backend]],
              info: Optional[ModelInfo] = None) -> str:
    """Sweep the model and its rolled copy with `plan` into run_dir/k0 and run_dir/k<k> (each on the
    backend `open_model(its ModelInfo)` opens and closes); report. `info`: the plan's model, already opened."""
    from kvphase.probes import folder
    from kvphase.sweep.run import execute_sweep

    check_k(k, plan.stride)
    started = time.time()
    info = as_model_info(Path(plan.model) if info is None else info)
    model, run_dir = info.path, Path(run_dir)
    folder.start_folder(run_dir, {"probe": "cycle", "model": str(model), "k": k, "stride": plan.stride},
                        [PHASES_FILE, FIGURE_FILE])
    rolled = run_dir / f"{model.name.removesuffix('.gguf')}-rolled-k{k}.gguf"
    tensors = write_rolled_model(info, rolled, k)
    for swept, name in ((info, BASE_RUN), (rolled, rolled_run(k))):
        swept = as_model_info(swept)  # the rolled copy: another file, opened here
        with open_model(swept) as backend:
            execute_sweep(replace(plan, model=str(swept.path)), backend, run_dir / name, swept)
    write_json(run_dir / MANIFEST_FILE, folder.manifest(
        model, str(info.header.fields.get(Keys.General.ARCHITECTURE, "unknown")), time.time() - started,
        rolled_tensors=tensors, rolled_model=rolled.name))
    return build_report(run_dir)


def headline(summary: dict) -> str:
    r2 = summary["r_squared"]
    fit = "undefined (accuracy does not vary off the boundary)" if r2 is None else f"{r2:.3f}"
    boundary = next((p for p in summary["phases"] if p["boundary"]), None)
    edge = "" if boundary is None else (f"; boundary phase {boundary['phase']}: {boundary['accuracy_k0']:.1f}% -> "
                                        f"{boundary['accuracy_k']:.1f}%")
    return (f"rolling the gate bias by k = {summary['k']}: weakest phase off the boundary {summary['weakest_k0']} -> "
            f"{summary['weakest_k']} (predicted {(summary['weakest_k0'] + summary['k']) % summary['stride']}); "
            f"R^2 of A_k(r) against A_0((r - k) mod S) off the boundary phase: {fit}{edge}")


def build_report(run_dir: Path) -> str:
    from kvphase.probes import folder
    from kvphase.sweep.run import load_results

    config = folder.load_probe_config(run_dir)
    k, stride = int(config["k"]), int(config["stride"])
    base, rolled = load_results(Path(run_dir) / BASE_RUN), load_results(Path(run_dir) / rolled_run(k))
    if base.empty or rolled.empty:
        from kvphase.errors import RunFolderError

        raise RunFolderError(f"{run_dir}: a sweep inside it has no results; run the probe again")
    table = phase_table(base, rolled, stride, k)
    off = table[~table["boundary"]]
    r2 = r_squared(table)
    summary = {"k": k, "stride": stride, "r_squared": None if r2 is None else round(r2, 4),
               "weakest_k0": int(off["accuracy_k0"].idxmin()), "weakest_k": int(off["accuracy_k"].idxmin()),
               "phases": table.to_dict("records")}
    write_csv(Path(run_dir) / PHASES_FILE, table)
    _plot(table, k, Path(run_dir) / FIGURE_FILE)
    page = ReportPage(
        title=f"Gate cycling: {Path(config['model']).name}, k = {k}",
        headline=headline(summary),
        prose=f"Every per-phase gate bias rolled by k = {k} (row p moved to p + k), payloads unchanged; the same sweep "
              f"plan on the original (`{BASE_RUN}/`) and on the rolled copy (`{rolled_run(k)}/`). Prediction: "
              "A_k(r) = A_0((r - k) mod S). The boundary phase S - 1 is left out of R^2.",
        figure=(FIGURE_FILE, "accuracy per phase"),
        sections=[(None, markdown_table(table))],
        files=f"Files: `config.json`, the two sweep folders, `{PHASES_FILE}`, `summary.json`, `manifest.json`; "
              "`kvphase report <this folder>` rebuilds this page from the sweeps' results.")
    folder.write_report(run_dir, summary, page.markdown())
    return headline(summary)


def _plot(table: pd.DataFrame, k: int, path: Path) -> None:
    with figure(path, figsize=(6.5, 3.6), dpi=120) as (fig, ax):
        ax.plot(table["phase"], table["accuracy_k0"], "o-", label="original (k = 0)")
        ax.plot(table["phase"], table["accuracy_k"], "s-", label=f"rolled by k = {k}")
        ax.plot(table["phase"], table["predicted"], "x:", label="predicted A_0((r - k) mod S)")
        ax.axvspan(len(table) - 1.5, len(table) - 0.5, color="gray", alpha=0.15, label="boundary phase")
        ax.set_xlabel("phase of the target (position mod S)")
        ax.set_ylabel("accuracy (%)")
        ax.set_xticks(table["phase"])
        ax.legend(fontsize=7)
