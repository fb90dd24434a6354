"""A probe's run folder, shaped like a sweep's: config.json, data CSVs, summary.json,
report.md, a figure and manifest.json, rebuilt by `kvphase report` from config and data.

`config.json` names the probe (`"probe": "gates"`), which is how `kvphase report` tells a
probe folder from a sweep's. The atomic writes and checked reads are every run folder's
(`kvphase.runfolder`); a probe writes its data whole at the end (probes are fast).
"""

from __future__ import annotations

import platform
from pathlib import Path

import pandas as pd

from kvphase import __version__
from kvphase.errors import RunFolderError
from kvphase.runfolder import (CONFIG_FILE, MANIFEST_FILE, REPORT_FILE, SUMMARY_FILE, check_writable, flags_in,
                               make_folder, numbers_in, read_json_object, read_table, write_atomic, write_json)


def start_folder(run_dir: Path, config: dict, data_files: list[str]) -> None:
    """Create the folder (or reuse one of the same probe) and write its config."""
    run_dir = Path(run_dir)
    old = load_probe_config(run_dir) if (run_dir / CONFIG_FILE).exists() else None
    if (run_dir / CONFIG_FILE).exists() and (old is None or old["probe"] != config["probe"]):
        raise RunFolderError(f"{run_dir} holds another kind of run; choose another --out or delete the folder")
    make_folder(run_dir)
    check_writable(run_dir, [CONFIG_FILE, MANIFEST_FILE, SUMMARY_FILE, REPORT_FILE, *data_files])
    write_json(run_dir / CONFIG_FILE, config)


def load_probe_config(run_dir: Path) -> dict | None:
    """config.json of a probe folder, or None when the folder is a sweep's (no "probe" key)."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise RunFolderError(f"{run_dir} is not a run folder: {CONFIG_FILE} is missing")
    config = read_json_object(path)
    if "probe" not in config:
        return None
    if not isinstance(config["probe"], str) or not isinstance(config.get("model"), str):
        raise RunFolderError(f"{path}: expected text values for probe and model")
    return config


def load_csv(run_dir: Path, name: str, columns: list[str], text: tuple[str, ...] = (),
             flags: tuple[str, ...] = (), empty: str = "run the probe again") -> pd.DataFrame:
    """One of a probe's data tables, with at least one row, finite numbers in every column but the
    `text` and True/False `flags` ones; RunFolderError naming the file and the problem."""
    path = Path(run_dir) / name
    if not path.exists() and not path.is_symlink():
        raise RunFolderError(f"{run_dir} lacks {name}; run the probe again")
    frame = read_table(path, columns)
    if frame.empty:
        raise RunFolderError(f"{path} holds no rows; {empty}")
    for column in columns:
        if column in flags:
            frame[column] = flags_in(path, frame, column)
        elif column not in text:
            frame[column] = numbers_in(path, frame, column)
    return frame


def manifest(model: Path, architecture: str, wall_s: float, **extra) -> dict:
    """Model identity, versions, host and cost; `extra` adds what identifies the inputs
    (the gate probe hashes the tensors it read, not a file of hundreds of GB)."""
    import numpy

    return {
        "model": {"file": model.name, "size": model.stat().st_size, "architecture": architecture},
        **extra,
        "versions": {"kvphase": __version__, "numpy": numpy.__version__, "pandas": pd.__version__,
                     "python": platform.python_version()},
        "host": {"machine": platform.machine(), "system": platform.system(), "node": platform.node()},
        "wall_time_s": round(wall_s, 3),
    }


def write_report(run_dir: Path, summary: dict, markdown: str) -> None:
    write_json(Path(run_dir) / SUMMARY_FILE, summary)
    write_atomic(Path(run_dir) / REPORT_FILE, markdown)


def read_manifest(run_dir: Path) -> dict:
    path = Path(run_dir) / MANIFEST_FILE
    return read_json_object(path) if path.exists() else {}


def rebuild_probe_report(run_dir: Path) -> str | None:
    """Rebuild a probe folder's summary, report and figure and return its headline; None
    when `run_dir` is not a probe's folder (a sweep's, or no run folder at all)."""
    from kvphase.probes import FIGURES, REPORTS

    if not (Path(run_dir) / CONFIG_FILE).is_file():
        return None
    config = load_probe_config(run_dir)
    if config is None:
        return None
    if config["probe"] not in REPORTS:
        raise RunFolderError(f"{run_dir}: unknown probe {config['probe']!r}; expected one of {', '.join(REPORTS)}")
    check_writable(Path(run_dir), [SUMMARY_FILE, REPORT_FILE, FIGURES[config["probe"]]])
    return REPORTS[config["probe"]](Path(run_dir))
