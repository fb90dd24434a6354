"""`kvphase gates`: static gate concentration, on tiny models whose per-phase bias is set by hand.

Every expected number below is worked out by hand from the bias written into the file,
not by the probe's own functions.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.gguf.tiny import write_tiny_model
from kvphase.gguf.writer import overwrite_tensor, write_gguf
from kvphase.probes.gates import measure_gates

runner = CliRunner()
BIG = 1e4  # a finite bias that makes exp() of every other slot exactly 0 in float64


def _glm_with_ape(tmp_path, row_values):
    """A tiny glm5-next (kpool 4, 16 indexer channels) whose layer-0 bias rows are `row_values`."""
    path = write_tiny_model("glm5-next", tmp_path / "glm.gguf")
    ape = np.zeros((4, 16), np.float32)  # (kpool, n_embd_indexer): row p = phase p
    ape[:] = np.asarray(row_values, np.float32)[:, None]
    overwrite_tensor(path, "blk.0.indexer_compressor_ape.weight", ape)
    return path


def _layer(tables, layer, source=None):
    rows = tables.channels[tables.channels.layer == layer]
    return rows if source is None else rows[rows.source == source]


@pytest.mark.parametrize("phase", [0, 2, 3])
def test_one_hot_bias_gives_its_phase_with_zero_entropy(tmp_path, phase):
    bias = [0.0] * 4
    bias[phase] = BIG
    _, tables = measure_gates(_glm_with_ape(tmp_path, bias))
    rows = _layer(tables, 0)
    assert len(rows) == 16
    assert (rows.dominant_phase == phase).all(), rows.dominant_phase.tolist()
    assert rows.dominant_share.min() == 1.0 and rows.entropy_bits.max() == 0.0


def test_finite_bias_share_and_entropy_match_the_closed_form(tmp_path):
    # bias log(3) on phase 1, 0 elsewhere: weights 3/6 and 1/6 three times
    _, tables = measure_gates(_glm_with_ape(tmp_path, [0.0, math.log(3.0), 0.0, 0.0]))
    rows = _layer(tables, 0)
    expected_bits = 0.5 * 1 + 3 * (1 / 6) * math.log2(6)  # 1.79248...
    err = np.abs(rows.entropy_bits - expected_bits)
    assert err.max() < 1e-5, f"max diff {err.max():.2e}, mean {err.mean():.2e}"
    assert (rows.dominant_phase == 1).all() and np.allclose(rows.dominant_share, 0.5, atol=1e-6)


def test_uniform_bias_is_log2_s_bits(tmp_path):
    _, tables = measure_gates(_glm_with_ape(tmp_path, [0.7] * 4))
    assert np.allclose(_layer(tables, 0).entropy_bits, 2.0, atol=1e-6)
    phases = tables.phases[tables.phases.layer == 0]
    assert np.allclose(phases.mean_share, 0.25, atol=1e-6)


def test_csa_softmax_spans_both_halves(tmp_path):
    """deepseek4 ratio 4: output channel c mixes the previous block's column c and its own column c + d."""
    path = write_tiny_model("deepseek4", tmp_path / "ds4.gguf")
    ape = np.zeros((4, 128), np.float32)  # (ratio, 2d), d = 64
    ape[1, :64] = BIG  # previous block, phase 1
    ape[3, 64:] = BIG  # own block, phase 3: the two tie, so each takes half
    overwrite_tensor(path, "blk.1.attn_compressor_ape.weight", ape)
    hca = np.zeros((128, 64), np.float32)  # (ratio, d)
    hca[100] = BIG
    overwrite_tensor(path, "blk.2.attn_compressor_ape.weight", hca)
    _, tables = measure_gates(path)
    csa = _layer(tables, 1, "csa-compressor")
    assert len(csa) == 64  # d output channels, not 2d
    assert np.allclose(csa.entropy_bits, 1.0, atol=1e-9) and np.allclose(csa.dominant_share, 0.5)
    shares = tables.phases[(tables.phases.layer == 1) & (tables.phases.source == "csa-compressor")]
    assert np.allclose(shares.sort_values("phase").mean_share, [0, 0.5, 0, 0.5])
    hca_rows = _layer(tables, 2, "hca-compressor")
    assert (hca_rows.stride == 128).all() and (hca_rows.dominant_phase == 100).all() and (hca_rows.entropy_bits == 0).all()


def _trained_file(tmp_path, design="gated", starts=(0, 1), with_ape=True, offsets="fixed"):
    """The keys and tensors `gates` reads of a kvphase-trained model: 1 layer, 2 heads, S = 4."""
    ape = np.zeros((2, 4, 8), np.float32)  # (heads, S, head_dim)
    ape[:, 2, :] = BIG  # both heads favour slot 2 of their windows
    keys = {"gpt2.block_count": 1, "gpt2.attention.head_count": 2, "kvphase.trained.design": design,
            "kvphase.trained.stride": 4, "kvphase.trained.starts": list(starts), "kvphase.trained.offsets": offsets}
    tensors = [("blk.0.attn_gate_ape.weight", ape)] if with_ape else [("blk.0.attn_norm.weight", np.ones(8, np.float32))]
    path = tmp_path / "trained.gguf"
    write_gguf(path, "gpt2", keys, tensors)
    return path


def test_trained_heads_map_slots_through_their_window_offset(tmp_path):
    _, tables = measure_gates(_trained_file(tmp_path))
    rows = tables.channels
    assert (rows[rows["head"] == 0].dominant_phase == 2).all()  # start 0: slot 2 is phase 2
    assert (rows[rows["head"] == 1].dominant_phase == 3).all()  # start 1: slot 2 is phase 3
    assert (rows.source == "trained-gated").all() and (rows.entropy_bits == 0).all()


def test_random_offsets_report_slots(tmp_path):
    _, tables = measure_gates(_trained_file(tmp_path, offsets="random"))
    assert (tables.channels.dominant_phase == 2).all()


def test_cli_writes_a_run_folder_that_report_rebuilds(tmp_path):
    model, out = _glm_with_ape(tmp_path, [0.0, 0.0, BIG, 0.0]), tmp_path / "run"
    result = runner.invoke(app, ["gates", str(model), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Most concentrated: layer 0 kpool-indexer head 0, phase 2 (mean share 1.000, 0.000 of 2 bits)" in result.output
    for name in ("config.json", "results.csv", "phases.csv", "summary.json", "report.md", "gate_phases.png", "manifest.json"):
        assert (out / name).is_file(), name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tensors"] == ["blk.0.indexer_compressor_ape.weight", "blk.2.indexer_compressor_ape.weight"]
    first = (out / "summary.json").read_text()
    (out / "summary.json").unlink()
    (out / "report.md").unlink()
    rebuilt = runner.invoke(app, ["report", str(out)])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert (out / "summary.json").read_text() == first
    assert "| 0 | kpool-indexer | 0 | 4 | 16 | 2.0 | 0.0 |" in (out / "report.md").read_text()


def test_layer_option(tmp_path):
    _, tables = measure_gates(_glm_with_ape(tmp_path, [0.0] * 4), layers=[2])
    assert set(tables.channels.layer) == {2}


@pytest.mark.parametrize("case, message", [
    ("llama", "declares no compressor with a per-phase gate bias"),
    ("meanpool", "trained design 'meanpool' has no gate bias"),
    ("missing", "declares a trained-gated but the file has no tensor blk.0.attn_gate_ape.weight"),
    ("layer", "layer 1 has no gate bias in glm.gguf; layers with one: 0, 2"),
    ("damaged", "results.csv lacks columns: dominant_phase"),
])
def test_bad_input_is_one_line(tmp_path, case, message):
    if case == "llama":
        args = ["gates", str(write_tiny_model("llama", tmp_path / "llama.gguf"))]
    elif case in ("meanpool", "missing"):
        args = ["gates", str(_trained_file(tmp_path, design="gated" if case == "missing" else case, with_ape=False))]
    elif case == "layer":
        args = ["gates", str(_glm_with_ape(tmp_path, [0.0] * 4)), "--layer", "1"]
    else:
        out = tmp_path / "run"
        assert runner.invoke(app, ["gates", str(_glm_with_ape(tmp_path, [0.0] * 4)), "--out", str(out)]).exit_code == 0
        frame = pd.read_csv(out / "results.csv").drop(columns="dominant_phase")
        frame.to_csv(out / "results.csv", index=False)
        args = ["report", str(out)]
    result = runner.invoke(app, args + (["--out", str(tmp_path / "x")] if args[0] == "gates" else []))
    assert result.exit_code == 1
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "x").exists()  # refused before anything is written


def test_help():
    result = runner.invoke(app, ["gates", "--help"])
    assert result.exit_code == 0 and "Static gate concentration" in result.output


@pytest.mark.parametrize("name, damage, message", [
    ("phases.csv", lambda t: t.split("\n")[0] + "\n", "phases.csv holds no rows; run the probe again"),
    ("phases.csv", lambda t: t[: len(t.split("\n")[0]) + 10], "phases.csv holds no rows"),  # half a row only
    ("results.csv", lambda t: t.replace("\n0,", "\n" + "9" * 400 + ",", 1), "results.csv line 2: layer is '9999"),
    ("results.csv", lambda t: t.replace("\n0,", "\nnan,", 1), "results.csv line 2: layer is 'nan', expected a finite"),
    ("results.csv", lambda t: t.replace(",4,", ",four,", 1), "results.csv line 2: stride is 'four'"),
    ("gate_phases.png", None, "gate_phases.png is not a file, so it cannot be rewritten"),
], ids=["header-only", "half-a-row", "huge-number", "nan", "text", "figure-a-folder"])
def test_report_refuses_a_damaged_probe_folder_in_one_line(tmp_path, name, damage, message):
    """Each found by the fuzz campaign as a traceback (an empty table, a number past a float, a
    figure replaced by a folder)."""
    model, out = _glm_with_ape(tmp_path, [0.0, 0.0, BIG, 0.0]), tmp_path / "run"
    assert runner.invoke(app, ["gates", str(model), "--out", str(out)]).exit_code == 0
    path = out / name
    if damage is None:
        path.unlink()
        path.mkdir()
    else:
        path.write_text(damage(path.read_text()))
    result = runner.invoke(app, ["report", str(out)])
    assert result.exit_code == 1 and message in result.output and len(result.output.strip().splitlines()) == 1, \
        result.output
