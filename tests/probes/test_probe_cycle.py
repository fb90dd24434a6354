"""`kvphase cycle`: rolling a one-hot gate bias by k must move the weak phase by exactly k.

The fake backend reads the gate bias from the file it is given (the rolled copy for the
rolled sweep) and fails exactly the targets at the phase the bias favours: a model whose
weak phase is set by its gate, so the known answer is R^2 = 1 and a shift of exactly k.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

from kvphase.backends.base import Query, Score
from kvphase.errors import PlanError
from kvphase.gguf.tensors import read_model_tensor
from kvphase.gguf.tiny import write_tiny_model
from kvphase.gguf.writer import overwrite_tensor
from kvphase.probes.cycle import build_report, run_cycle, write_rolled_model
from kvphase.sweep.backend_setup import closed_after
from kvphase.sweep.plan import SweepPlan
from tests.helpers.fakes import CharBackend

S, WEAK = 4, 1
APE = "blk.0.indexer_compressor_ape.weight"


class GateBackend(CharBackend):
    """Fails a target whose record starts at the phase layer 0's bias favours (row argmax)."""

    def __init__(self, path: Path):
        super().__init__()
        self.weak = int(read_model_tensor(path, APE)[:, 0].argmax())  # (kpool, channels): row p = phase p

    def score(self, context: Sequence[int], queries: Sequence[Query]) -> list[Score]:
        text = "".join(map(chr, context))
        out = []
        for q in queries:
            position = text.index("".join(map(chr, q.prompt)))
            ok = position % S != self.weak
            out.append(Score(ok, 0.0 if ok else -3.0, tuple(q.answer)))
        return out


def _model(tmp_path) -> Path:
    path = write_tiny_model("glm5-next", tmp_path / "glm.gguf")
    for layer in (0, 2):
        ape = np.zeros((S, 16), np.float32)  # (kpool, n_embd_indexer)
        ape[WEAK] = 5.0
        overwrite_tensor(path, f"blk.{layer}.indexer_compressor_ape.weight", ape)
    return path


def _plan(path: Path) -> SweepPlan:
    return SweepPlan(model=str(path), task="records", stride=S, modulus=2 * S, context=600, per_residue=3,
                     padding="prefix", seed=0, control=False)


def _open(path):
    """The fake gated backend on `path`, closed after its sweep as `backend_setup.open_backend` closes one."""
    return closed_after(GateBackend(path))


def test_rolled_copy_moves_each_row_by_k(tmp_path):
    model = _model(tmp_path)
    tensors = write_rolled_model(model, tmp_path / "rolled.gguf", 3)
    assert tensors == ["blk.0.indexer_compressor_ape.weight", "blk.2.indexer_compressor_ape.weight"]
    before, after = read_model_tensor(model, APE), read_model_tensor(tmp_path / "rolled.gguf", APE)
    assert after[(WEAK + 3) % S].max() == 5.0 and after[WEAK].max() == 0.0
    assert np.array_equal(after[[3, 0, 1, 2]], before)  # row p of the original is row p + 3 of the copy
    other = "blk.0.attn_q_a.weight"  # payloads untouched
    assert np.array_equal(read_model_tensor(model, other), read_model_tensor(tmp_path / "rolled.gguf", other))


def test_weak_phase_moves_by_exactly_k(tmp_path):
    model, out = _model(tmp_path), tmp_path / "run"
    headline = run_cycle(_plan(model), 1, out, _open)
    assert f"weakest phase off the boundary {WEAK} -> {WEAK + 1} (predicted {WEAK + 1})" in headline
    summary = json.loads((out / "summary.json").read_text())
    assert summary["r_squared"] == 1.0
    table = {row["phase"]: row for row in summary["phases"]}
    assert table[WEAK]["accuracy_k0"] == 0.0 and table[WEAK + 1]["accuracy_k"] == 0.0
    assert (out / "k0" / "results.csv").is_file() and (out / "k1" / "results.csv").is_file()
    (out / "summary.json").unlink()
    assert build_report(out) == headline


def test_k_out_of_range(tmp_path):
    model = _model(tmp_path)
    for k in (0, S):
        with pytest.raises(PlanError, match="between 1 and S - 1 = 3"):
            run_cycle(_plan(model), k, tmp_path / "run", _open)
    assert not (tmp_path / "run").exists()


def test_cli_refuses_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from kvphase.cli import app

    runner = CliRunner()
    assert runner.invoke(app, ["cycle", "--help"]).exit_code == 0
    model = _model(tmp_path)
    llama = write_tiny_model("llama", tmp_path / "llama.gguf")
    for args, message in (([str(model), "--k", "4"], "--k must be between 1 and S - 1 = 3, got 4"),
                          ([str(llama), "--k", "1"], "declares no compressor"),
                          ([str(model), "--k", "1"], "has no tokenizer")):
        result = runner.invoke(app, ["cycle", *args, "--out", str(tmp_path / "run")])
        assert result.exit_code == 1 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
