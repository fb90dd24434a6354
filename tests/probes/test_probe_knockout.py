"""kvphase knockout: each head mean-ablated in turn, the accuracy change mapped per phase."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.probes.knockout_hooks import HeadKnockout, HeadRecorder
from kvphase.reference.model import DenseAttention
from tests.helpers.fakes import CharBackend
from tests.helpers.paths import TRAINED

runner = CliRunner()
GATED = TRAINED / "gated.gguf"


def _qkv(rng, n_head=4, n_q=5, hd=3):
    q = rng.normal(size=(n_head, 1, n_q, hd))  # (n_head_kv, n_group, n_q, head_dim)
    k, v = rng.normal(size=(2, n_head, n_q, hd))  # (n_head_kv, n_kv, head_dim)
    return q, k, v, np.arange(n_q)


def test_a_knockout_replaces_exactly_one_head_of_one_layer():
    rng = np.random.default_rng(0)
    q, k, v, pos = _qkv(rng)
    dense = DenseAttention()
    plain = dense.attend(1, q, k, v, pos, 0.5)
    mean = np.array([7.0, 8.0, 9.0])
    knocked = HeadKnockout(dense, layer=1, head=2, mean=mean)
    out = knocked.attend(1, q, k, v, pos, 0.5)
    assert (out[2, 0] == mean).all()
    np.testing.assert_array_equal(np.delete(out, 2, axis=0), np.delete(plain, 2, axis=0))
    np.testing.assert_array_equal(knocked.attend(0, q, k, v, pos, 0.5), plain)  # other layers untouched
    late = HeadKnockout(dense, layer=1, head=2, mean=mean, from_position=3).attend(1, q, k, v, pos, 0.5)
    assert (late[2, 0, 3:] == mean).all() and (late[2, 0, :3] == plain[2, 0, :3]).all()  # only the query rows


def test_the_recorder_returns_outputs_unchanged_and_their_mean_per_head():
    rng = np.random.default_rng(1)
    recorder, dense, outputs = HeadRecorder(DenseAttention(), from_position=2), DenseAttention(), []
    for _ in range(3):
        q, k, v, pos = _qkv(rng)
        out = recorder.attend(0, q, k, v, pos, 0.5)
        np.testing.assert_array_equal(out, dense.attend(0, q, k, v, pos, 0.5))
        outputs.append(out[:, 0, 2:])  # (n_head, n_q - 2, head_dim): the rows from position 2 on
    expected = np.concatenate(outputs, axis=1).mean(axis=1)  # (n_head, head_dim)
    np.testing.assert_allclose(recorder.means()[0], expected, rtol=1e-12)


@pytest.mark.slow
def test_knockouts_on_a_trained_model_find_the_head_that_matters_and_none_in_a_silent_one(tmp_path):
    """Known answers on the committed positive control: a head whose output projection is zeroed
    contributes nothing, so mean-ablating it changes no target at any phase; the base run is the
    plain sweep; and some head carries the retrieval (its knockout costs at least 20 points)."""
    from kvphase.gguf.header import read_gguf_header
    from kvphase.gguf.tensors import tensor_array
    from kvphase.gguf.writer import overwrite_tensor

    model = tmp_path / "gated.gguf"
    shutil.copy(GATED, model)
    info = next(t for t in read_gguf_header(model).tensors if t.name == "blk.1.attn_output.weight")
    wo = tensor_array(np.memmap(model, dtype=np.uint8, mode="r"), info).copy()  # (d_out, d_in): columns are head channels
    hd = wo.shape[1] // 4
    wo[:, 1 * hd : 2 * hd] = 0.0  # layer 1, head 1 writes nothing to the residual stream
    overwrite_tensor(model, "blk.1.attn_output.weight", wo)

    out = tmp_path / "ko"
    result = runner.invoke(app, ["knockout", str(model), "--per-residue", "16", "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "effects.csv")
    silent = table[table.component == "L1H1"]
    assert len(silent) == 4 and (silent.d_correct == 0).all() and (silent.d_logprob.abs() < 1e-4).all()
    assert table.d_correct.min() <= -20, table.groupby("component").d_correct.min()

    swept = runner.invoke(app, ["sweep", str(model), "--per-residue", "16", "--out", str(tmp_path / "plain"), "--quiet"])
    assert swept.exit_code == 0, swept.output
    base = pd.read_csv(out / "base" / "results.csv").sort_values("target_id").reset_index(drop=True)
    plain = pd.read_csv(tmp_path / "plain" / "results.csv").sort_values("target_id").reset_index(drop=True)
    assert (base.correct == plain.correct).all() and np.allclose(base.logprob, plain.logprob, atol=1e-5)

    summary = json.loads((out / "summary.json").read_text())
    (out / "report.md").unlink()
    rebuilt = runner.invoke(app, ["report", str(out)])
    assert rebuilt.exit_code == 0 and (out / "report.md").is_file()
    assert json.loads((out / "summary.json").read_text()) == summary


def test_a_layer_the_model_lacks_is_one_line_and_leaves_no_folder(tmp_path):
    result = runner.invoke(app, ["knockout", str(GATED), "--layer", "5", "--out", str(tmp_path / "ko")])
    assert result.exit_code == 1 and "--layer must be from 0 to 1, got [5]" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "ko").exists()


def test_a_held_phase_keeps_its_weight_fixed_and_the_others_in_proportion():
    from kvphase.designs import GatedPool
    from kvphase.designs.heldphase import held_phase

    gate = np.zeros((1, 2, 2), np.float32)  # (n_kv_head, head_dim, head_dim): no content term
    ape = np.log(np.array([[1.0, 2.0], [2.0, 2.0], [3.0, 2.0], [4.0, 2.0]], np.float32))[:, None, :]  # (S, 1, hd)
    design = GatedPool(window=4, stride=4, start=1, gate=gate, ape=ape)  # slot j sits at phase (1 + j) % 4
    held = held_phase(design, phase=3, weight=np.array([0.5, 0.25]))  # phase 3 is slot 2
    weights = held.pool_weights(np.zeros((1, 4, 1, 2), np.float32))[0, :, 0]  # (W, hd)
    # channel 0: static weights 0.1, 0.2, 0.3, 0.4; slot 2 held at 0.5, the rest 0.5 split 1 : 2 : 4
    np.testing.assert_allclose(weights[:, 0], [0.5 / 7, 1.0 / 7, 0.5, 2.0 / 7], rtol=1e-6)
    np.testing.assert_allclose(weights[:, 1], [0.25, 0.25, 0.25, 0.25], rtol=1e-6)  # uniform, slot 2 held at 0.25


@pytest.mark.slow
def test_holding_slots_at_their_mean_changes_nothing_when_the_gate_ignores_content(tmp_path):
    """With the content term zeroed every window's weights are the static ones, equal to their
    calibration mean, so a slot knockout is the model itself: 0 change at every phase."""
    from kvphase.gguf.tensors import read_model_tensor
    from kvphase.gguf.writer import overwrite_tensor

    model = tmp_path / "gated.gguf"
    shutil.copyfile(GATED, model)
    for layer in range(2):
        name = f"blk.{layer}.attn_gate.weight"
        overwrite_tensor(model, name, np.zeros_like(read_model_tensor(model, name)))
    out = tmp_path / "run"
    result = runner.invoke(app, ["knockout", str(model), "--slots", "--layer", "0", "--per-residue", "16",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    effects = pd.read_csv(out / "effects.csv")
    assert sorted(effects.component.unique()) == ["L0P0", "L0P1", "L0P2", "L0P3"]
    assert (effects.d_correct == 0).all(), effects
    assert effects.d_logprob.abs().max() < 1e-3, f"max {effects.d_logprob.abs().max():.2e}"
    means = json.loads((out / "gate_means.json").read_text())
    assert sorted(means) == ["0,0", "0,1", "0,2", "0,3"]
    np.testing.assert_allclose(np.array(means["0,0"]).sum(axis=0), 1.0, atol=1e-5)  # shares of the 4 phases sum to 1


def test_slots_need_a_trained_gate(tmp_path):
    dense = GATED.parent / "dense.gguf"
    result = runner.invoke(app, ["knockout", str(dense), "--slots", "--out", str(tmp_path / "r")])
    assert result.exit_code == 1 and "--slots knocks out phase slots of a trained gate" in result.output, result.output
    assert not (tmp_path / "r").exists()


class PhaseHeads(CharBackend):
    """A hand-built model for the knockout plumbing: one layer of S heads, every head carrying
    a value unique to the context, and head p alone read for targets at phase p (a target is
    right when head p's output at the query row is its own context's value). Knocking out
    head p must therefore cost phase p all its targets and no other phase anything."""

    def __init__(self, stride: int):
        from types import SimpleNamespace

        super().__init__()
        self.stride = stride
        self.model = SimpleNamespace(config=SimpleNamespace(n_layer=1, n_head=stride))
        self.policy = DenseAttention()

    def score(self, context, queries):
        import zlib

        from kvphase.backends.base import Score

        self.tokens_evaluated += len(context)
        own = np.sqrt(zlib.crc32(np.asarray(context, np.int64).tobytes()) % 1000 + 2.0)  # this context's value
        q, k = np.zeros((self.stride, 1, 1, 1)), np.zeros((self.stride, 1, 1))  # one key: attention copies v
        v = np.full((self.stride, 1, 1), own)  # (n_head_kv, n_kv, head_dim)
        out = self.policy.attend(0, q, k, v, np.array([len(context)]), 1.0)  # (n_head, 1, 1, 1) at the query row
        text = "".join(map(chr, context))
        scores = []
        for query in queries:
            phase = text.index("".join(map(chr, query.prompt))) % self.stride  # the record starts with the query
            right = bool(out[phase, 0, 0, 0] == own)
            scores.append(Score(right, 0.0 if right else -5.0, tuple(query.answer)))
        return scores


@pytest.mark.slow
def test_knocking_out_the_head_that_serves_phase_p_hurts_phase_p_only(tmp_path, default_model):
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.probes.knockout import run_knockout
    from kvphase.sweep.plan import SweepPlan

    info = read_model_info(default_model)  # identity for the manifest only; the fake scores
    plan = SweepPlan(model=str(info.path), task="records", stride=4, modulus=8, context=600, per_residue=4,
                     padding="prefix", seed=0, control=True, backend="fake")
    run_knockout(plan, PhaseHeads(4), tmp_path / "ko", info)
    effects = pd.read_csv(tmp_path / "ko" / "effects.csv")
    assert (effects.accuracy_base == 100).all()
    for row in effects.itertuples():
        expected = -100.0 if row.component == f"L0H{row.phase}" else 0.0
        assert row.d_correct == expected, (row.component, row.phase, row.d_correct)
    summary = json.loads((tmp_path / "ko" / "summary.json").read_text())
    assert [(p["phase"], p["component"], p["d_correct_other_phases"]) for p in summary["by_phase"]] == \
        [(p, f"L0H{p}", 0.0) for p in range(4)]


@pytest.mark.slow
@pytest.mark.parametrize("saved", ['{"0": "not numbers"}', '{"layer 0": [[1.0]]}', "[1, 2]", "{"])
def test_a_damaged_means_file_is_named_in_one_error(tmp_path, default_model, saved):
    from kvphase.errors import RunFolderError
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.probes.knockout import run_knockout
    from kvphase.sweep.plan import SweepPlan

    info = read_model_info(default_model)
    plan = SweepPlan(model=str(info.path), task="records", stride=4, modulus=8, context=600, per_residue=4,
                     padding="prefix", seed=0, control=True, backend="fake")
    (tmp_path / "ko").mkdir()
    (tmp_path / "ko" / "head_means.json").write_text(saved)
    with pytest.raises(RunFolderError, match="head_means.json is damaged"):
        run_knockout(plan, PhaseHeads(4), tmp_path / "ko", info)
