"""The README's main job, `kvphase sweep` with no options on the bundled default model (SmolLM2 at 1024
tokens), made once a test process: tests/conftest.py's session fixture `default_sweep` runs it, and any
module's test that needs a real model's full run folder takes that fixture (and copies the folder before
changing it). It resumes the committed example with its first `SCORED_CONTEXTS` contexts removed: those
128 targets are scored for real, the other 640 rows are the example's own, a sixth of `make demo`'s cost."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from kvphase.cli import app
from tests.helpers.paths import EXAMPLE

SCORED_CONTEXTS = 4  # of the default plan's 24: each holds every residue 4 times, so every residue gets 16 targets


def sweep_resuming_the_example(out: Path) -> Path:
    """`kvphase sweep --out out` on a folder holding the committed example without its first contexts."""
    out.mkdir()
    for name in ["config.json", "manifest.json"]:
        shutil.copy(EXAMPLE / name, out / name)
    committed = pd.read_csv(EXAMPLE / "results.csv", keep_default_na=False)
    committed[committed["context"] >= SCORED_CONTEXTS].to_csv(out / "results.csv", index=False)
    result = CliRunner().invoke(app, ["sweep", "--out", str(out), "--quiet"])
    assert result.exit_code == 0 and "Report:" in result.output, result.output
    return out
