"""`kvphase gate-activations`: the gate weights windows of real contexts used.

Known answers come from hand-set weights: a bias far larger than any content term makes
every window one-hot at the slot the bias picks (the phase is worked out by hand from the
head's window offset), and with the content gate zeroed every window must show exactly
the static shares that `kvphase gates` reads from the bias alone (another code path).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.gguf.header import read_gguf_header
from kvphase.gguf.tensors import read_model_tensor
from kvphase.gguf.writer import overwrite_tensor
from kvphase.probes.gates import measure_gates, sum_by_phase
from tests.helpers.paths import TRAINED

runner = CliRunner()
DATA = TRAINED
BIG = 1e4


def _copy(tmp_path, name="gated") -> Path:
    path = tmp_path / f"{name}.gguf"
    shutil.copyfile(DATA / f"{name}.gguf", path)
    return path


def _layers_and_starts(path: Path) -> tuple[int, list[int]]:
    fields = read_gguf_header(path).fields
    return int(fields["gpt2.block_count"]), [int(s) for s in fields["kvphase.trained.starts"]]


def _zero_content_gate(path: Path, n_layer: int) -> None:
    for layer in range(n_layer):
        name = f"blk.{layer}.attn_gate.weight"
        overwrite_tensor(path, name, np.zeros_like(read_model_tensor(path, name)))


def _run(path: Path, out: Path, *extra: str):
    result = runner.invoke(app, ["gate-activations", str(path), "--out", str(out), "--contexts", "2", *extra])
    assert result.exit_code == 0, result.output
    return result, pd.read_csv(out / "windows.csv")


def test_phase_sums_follow_each_windows_first_position():
    weights = np.zeros((2, 4, 1))  # (n_windows, W, C)
    weights[:, 1, 0] = 1.0  # slot 1 of every window
    shares = sum_by_phase(weights, np.array([0, 5]), 4)  # windows starting at positions 0 and 5
    assert shares[0, :, 0].tolist() == [0, 1, 0, 0]  # position 1
    assert shares[1, :, 0].tolist() == [0, 0, 1, 0]  # position 6


@pytest.mark.slow
def test_a_dominant_bias_makes_every_window_one_hot_at_its_heads_phase(tmp_path):
    path = _copy(tmp_path)
    n_layer, starts = _layers_and_starts(path)
    _zero_content_gate(path, n_layer)
    for layer in range(n_layer):
        name = f"blk.{layer}.attn_gate_ape.weight"
        ape = np.zeros_like(read_model_tensor(path, name))  # (heads, S, head_dim)
        ape[:, 2, :] = BIG  # slot 2 of every head's windows
        overwrite_tensor(path, name, ape)
    result, windows = _run(path, tmp_path / "run")
    n_head = len(starts) // n_layer
    for (layer, head), rows in windows.groupby(["layer", "head"]):
        assert (rows.dominant_phase == (starts[layer * n_head + head] + 2) % 4).all(), (layer, head)
    assert (windows.dominant_share == 1.0).all() and (windows.entropy_bits == 0.0).all()
    assert "median 0.00 of 2.00 bits, one phase over half in 100.0% of window channels" in result.output


def test_without_a_content_term_every_window_shows_the_static_shares(tmp_path):
    path = _copy(tmp_path)
    n_layer, _ = _layers_and_starts(path)
    _zero_content_gate(path, n_layer)
    _, windows = _run(path, tmp_path / "run")
    _, static = measure_gates(path)
    joined = windows.merge(static.channels, on=["layer", "head", "channel"], suffixes=("", "_static"))
    assert len(joined) == len(windows)
    diff = np.abs(joined.entropy_bits - joined.entropy_bits_static)
    assert diff.max() < 1e-5, f"entropy differs from the static gates: max {diff.max():.2e}, mean {diff.mean():.2e}"
    assert (joined.dominant_phase == joined.dominant_phase_static).mean() > 0.99  # ties may pick another phase


@pytest.mark.slow
def test_report_rebuilds_and_the_content_term_shows_on_the_trained_model(tmp_path):
    out = tmp_path / "run"
    _, windows = _run(_copy(tmp_path), out)
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").unlink()
    (out / "report.md").unlink()
    rebuilt = runner.invoke(app, ["report", str(out)])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert json.loads((out / "summary.json").read_text()) == summary
    assert (out / "gate_activations.png").is_file() and "Gate activations" in (out / "report.md").read_text()
    # the trained gate's content term concentrates some windows far beyond its near-uniform bias
    assert windows.entropy_bits.min() < 0.5 and windows.entropy_bits.max() > 1.9


@pytest.mark.parametrize("args, message", [
    (["--layer", "7"], "layer 7 has no gate"),
    (["--contexts", "0"], "--contexts must be at least 1"),
    (["--context", "100000"], "--context 100000 does not fit"),
])
def test_bad_options_are_one_line(tmp_path, args, message):
    result = runner.invoke(app, ["gate-activations", str(DATA / "gated.gguf"), "--out", str(tmp_path / "r"), *args])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output, result.output


def test_a_model_without_a_gate_is_one_line(tmp_path):
    result = runner.invoke(app, ["gate-activations", str(DATA / "dense.gguf"), "--out", str(tmp_path / "r")])
    assert result.exit_code == 1 and "declares no compressor with a per-phase gate bias" in result.output, result.output


@pytest.mark.slow
def test_glm5_next_through_llama_cpp_uses_its_one_hot_bias(tmp_path):
    """The k-pool indexer's gate captured from llama.cpp on a tiny glm5-next with a real tokenizer."""
    from kvphase.defaults import default_model_path
    from kvphase.gguf.tiny import write_tiny_model

    path = write_tiny_model("glm5-next", tmp_path / "glm.gguf", tokenizer_from=default_model_path())
    ape = np.zeros((4, 16), np.float32)  # (kpool, n_embd_indexer): row p = phase p
    ape[3] = BIG
    overwrite_tensor(path, "blk.0.indexer_compressor_ape.weight", ape)
    result, windows = _run(path, tmp_path / "run", "--threads", "1")
    layer0 = windows[windows.layer == 0]
    assert len(layer0) == 2 * (512 // 4) * 16  # 2 contexts of 512 tokens x 128 complete pools x 16 channels
    assert (layer0.dominant_phase == 3).all() and (layer0.entropy_bits == 0.0).all()
    other = windows[windows.layer != 0]
    assert len(other) and other.entropy_bits.max() > 0  # the random bias of the other layers is not one-hot
    assert "layer 0 kpool-indexer: median 0.00 of 2.00 bits" in result.output


@pytest.mark.slow
def test_deepseek4_compressors_through_llama_cpp_use_their_one_hot_biases(tmp_path):
    """A ratio-4 (CSA) entry's softmax spans the previous block's rows (first half of the
    channels) and its own (second half): with row 1 dominant in both halves every entry splits
    its weight over two rows at phase 1, so phase 1 holds all of it. The ratio-128 (HCA)
    compressor with row 100 dominant gives phase 100."""
    from kvphase.defaults import default_model_path
    from kvphase.gguf.tiny import write_tiny_model

    path = write_tiny_model("deepseek4", tmp_path / "ds.gguf", tokenizer_from=default_model_path())
    for name, row in (("blk.1.attn_compressor_ape.weight", 1), ("blk.1.indexer_compressor_ape.weight", 1),
                      ("blk.2.attn_compressor_ape.weight", 100)):
        ape = np.zeros_like(read_model_tensor(path, name))  # (ratio, C)
        ape[row] = BIG
        overwrite_tensor(path, name, ape)
    _, windows = _run(path, tmp_path / "run", "--threads", "1")
    expected = {"csa-compressor": (1, 4), "csa-indexer": (1, 4), "hca-compressor": (100, 128)}
    assert set(windows.source) == set(expected)
    for source, (phase, stride) in expected.items():
        rows = windows[windows.source == source]
        assert (rows.stride == stride).all() and rows.window.nunique() == 512 // stride, source
        assert (rows.dominant_phase == phase).all() and (rows.entropy_bits < 1e-6).all(), source
