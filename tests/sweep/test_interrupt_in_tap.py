"""A Ctrl-C that lands inside llama.cpp's graph tap (a `--selection` sweep's eval callback, which must
catch every exception so none unwinds through C) is the usual interrupt, not an engine error (issue 77):
the interrupted line, exit 130, finished contexts kept for the resume."""

from __future__ import annotations

import os
import signal

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.engines.selection import SelectionTap
from tests.helpers.paths import REPO

GLM_TOP4 = REPO / "reports" / "trained" / "engine" / "glm-kpool-top4-seed0" / "model.gguf"
SIGNAL_AT = 12  # the tap's update calls before the signal: past the first contexts, so some rows are kept


def test_ctrl_c_inside_the_graph_tap_is_an_interrupt_and_the_sweep_resumes(tmp_path, monkeypatch):
    update, calls = SelectionTap.update, []

    def interrupted_update(self, key, array, positions):
        calls.append(key)
        if len(calls) == SIGNAL_AT:
            os.kill(os.getpid(), signal.SIGINT)  # its handler runs here, inside the C callback
        return update(self, key, array, positions)

    monkeypatch.setattr(SelectionTap, "update", interrupted_update)
    argv = ["sweep", str(GLM_TOP4), "--selection", "--per-residue", "2", "--threads", "1", "--out",
            str(tmp_path / "run"), "-q"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 130, result.output
    assert result.output.strip() == "Interrupted: finished results are kept; run the same command again to resume.", \
        result.output
    kept = pd.read_csv(tmp_path / "run" / "results.csv")
    monkeypatch.setattr(SelectionTap, "update", update)
    again = CliRunner().invoke(app, argv)
    assert again.exit_code == 0, again.output
    rows = pd.read_csv(tmp_path / "run" / "results.csv")
    assert len(rows) == rows["target_id"].nunique() > len(kept) > 0


def test_every_eval_callback_raises_an_interrupt_as_it_caught_it():
    """The graph tap and the capture run (`kvphase capture`'s callback) share this one rule."""
    from kvphase.engines.capture import callback_error
    from kvphase.errors import BackendError, Interrupted

    interrupt = Interrupted("kept", signal.SIGINT)
    assert callback_error(interrupt, "the graph tap failed") is interrupt
    assert isinstance(callback_error(KeyboardInterrupt(), "x"), KeyboardInterrupt)
    wrapped = callback_error(ValueError("bad shape"), "capture callback failed")
    assert isinstance(wrapped, BackendError) and str(wrapped) == "capture callback failed: ValueError('bad shape')"
