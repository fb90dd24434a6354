"""Knockouts inside llama.cpp's graph (taps on each layer's per-head attention output and on
the compressor gate weights of glm5-next and deepseek4): equal to the numpy reference's on a model both run, a head
nothing reads and a content-free gate are known zeros, and bad input is one line."""

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
from kvphase.gguf.tensors import tensor_array
from kvphase.gguf.writer import overwrite_tensor
from tests.helpers.paths import TRAINED

runner = CliRunner()


def _silence(model: Path, tensor: str, head: int, head_width: int, axis: int) -> None:
    """Zero the slice of `tensor` (numpy order) that reads head `head`'s output: nothing reads that head."""
    info = next(t for t in read_gguf_header(model).tensors if t.name == tensor)
    weight = tensor_array(np.memmap(model, dtype=np.uint8, mode="r"), info).copy()
    index = [slice(None)] * 2
    index[axis] = slice(head * head_width, (head + 1) * head_width)
    weight[tuple(index)] = 0.0
    overwrite_tensor(model, tensor, weight)


def _diff(a, b) -> str:
    d = np.abs(np.asarray(a, float) - np.asarray(b, float))
    return f"max {d.max():.3g}, mean {d.mean():.3g}"


PER_RESIDUE = 8  # targets per phase in the two engines' knockouts: the agreement does not need more


@pytest.mark.slow
def test_llama_cpp_head_knockouts_equal_the_numpy_references_on_a_model_both_run(tmp_path):
    """The trained dense model runs in llama.cpp (gpt2) and in the numpy reference, whose
    knockout wraps its own attention code: the per-head calibration means and every
    component's per-phase changes agree; its layer-1 head 1, whose output columns are zeroed,
    changes nothing through llama.cpp."""
    model = tmp_path / "dense.gguf"
    shutil.copy(TRAINED / "dense.gguf", model)
    _silence(model, "blk.1.attn_output.weight", head=1, head_width=16, axis=1)  # (d_out, d_in): 4 heads of 16
    runs = {}
    for backend in ("llama.cpp", "reference"):
        out = tmp_path / backend
        result = runner.invoke(app, ["knockout", str(model), "--per-residue", str(PER_RESIDUE), "--backend", backend,
                                     "--threads", "1", "--out", str(out)])
        assert result.exit_code == 0, result.output
        runs[backend] = (json.loads((out / "head_means.json").read_text()), pd.read_csv(out / "effects.csv"))
    (engine_means, engine), (reference_means, reference) = runs["llama.cpp"], runs["reference"]
    assert engine_means.keys() == reference_means.keys() == {"0", "1"}
    for layer in engine_means:
        a, b = np.array(engine_means[layer]), np.array(reference_means[layer])  # (n_head, head_dim)
        assert a.shape == b.shape == (4, 16) and np.abs(a - b).max() < 1e-3, (layer, _diff(a, b))
    joined = engine.merge(reference, on=["component", "phase"], suffixes=("_engine", "_reference"))
    assert len(joined) == len(engine) == len(reference) == 2 * 4 * 4
    assert np.abs(joined.d_logprob_engine - joined.d_logprob_reference).max() < 0.01, \
        _diff(joined.d_logprob_engine, joined.d_logprob_reference)
    assert np.abs(joined.d_correct_engine - joined.d_correct_reference).max() <= 100 / PER_RESIDUE, \
        _diff(joined.d_correct_engine, joined.d_correct_reference)  # one target of a phase may flip between engines
    assert joined.d_logprob_engine.abs().max() > 0.3  # the knockouts do something
    silent = engine[engine.component == "L1H1"]
    assert (silent.d_correct == 0).all() and silent.d_logprob.abs().max() < 1e-6, silent


@pytest.mark.slow
def test_head_outputs_of_a_multi_token_query_are_read_and_written_as_the_reference_computes_them():
    """Token by token and head by head: on one context and a 7-row query through the trained
    dense model, the tap's per-head means equal the reference's, and a head held at a mean
    gives the reference's log-probability (a layout that mixed tokens and heads would not)."""
    from kvphase.backends.base import Query
    from kvphase.backends.llamacpp import LlamaCppBackend
    from kvphase.backends.reference import ReferenceBackend
    from kvphase.probes.knockout_hooks import EngineHeads, PolicyHeads

    rng = np.random.default_rng(0)
    context, query = rng.integers(3, 800, size=40).tolist(), Query(rng.integers(3, 800, 5).tolist(), [7, 9, 11])
    engine = EngineHeads(LlamaCppBackend(TRAINED / "dense.gguf", n_ctx=64, n_threads=1, head_tap=True))
    reference = PolicyHeads(ReferenceBackend(TRAINED / "dense.gguf"))
    means, scores = [], []
    for heads in (engine, reference):
        recorder = heads.recorder(len(context))
        heads.install(recorder)
        plain = heads.backend.score(context, [query])[0]
        means.append(recorder.means())
        heads.install(heads.knockout(0, 2, np.linspace(-1, 1, 16), len(context)))
        scores.append((plain.logprob, heads.backend.score(context, [query])[0].logprob))
        heads.restore()
    for layer in (0, 1):
        assert np.abs(means[0][layer] - means[1][layer]).max() < 1e-3, (layer, _diff(means[0][layer], means[1][layer]))
    (engine_plain, engine_knocked), (reference_plain, reference_knocked) = scores
    engine_change, reference_change = engine_knocked - engine_plain, reference_knocked - reference_plain
    assert abs(engine_plain - reference_plain) < 0.01 and abs(engine_change - reference_change) < 0.01, scores
    assert abs(engine_change) > 0.5, scores


# the tensor that reads each head's output, its axis over heads (numpy order) and a head's width there
OUTPUT_READERS = {
    "glm5-next": ("attn_output.weight", 1, 8),  # (n_embd, n_head * v_mla)
    "minimax-m3": ("attn_output.weight", 1, 16),  # (n_embd, n_head * head_dim)
    "deepseek4": ("attn_output_a.weight", 0, 16),  # (o_groups * o_lora, group width): one head per group
}
HEAD_LAYERS = {"glm5-next": [0, 2], "minimax-m3": [0, 1, 2], "deepseek4": [0, 1, 2]}  # glm5-next's layer 1 is KDA
N_HEAD = {"glm5-next": 2, "minimax-m3": 4, "deepseek4": 2}


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(OUTPUT_READERS))
def test_a_head_nothing_reads_is_a_known_zero_in_each_compressed_architecture(arch, tiny_compressed, tmp_path):
    """Through llama.cpp's own glm5-next, deepseek4 and minimax-m3 graphs: with the output
    projection's slice for head 1 of the first layer zeroed, knocking that head out changes no
    log-probability, while its neighbour's knockout does (the tap writes where the projection reads)."""
    model = tmp_path / f"{arch}.gguf"
    shutil.copy(tiny_compressed / f"{arch}.gguf", model)
    tensor, axis, width = OUTPUT_READERS[arch]
    first = HEAD_LAYERS[arch][0]
    _silence(model, f"blk.{first}.{tensor}", head=1, head_width=width, axis=axis)
    out = tmp_path / "ko"
    result = runner.invoke(app, ["knockout", str(model), "--context", "256", "--per-residue", "1",
                                 "--threads", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    runs = 2 + len(HEAD_LAYERS[arch]) * N_HEAD[arch]
    assert f"[1/{runs}] base" in result.output and f"[{runs}/{runs}] L{HEAD_LAYERS[arch][-1]}H" in result.output
    config = json.loads((out / "config.json").read_text())
    assert config["layers"] == HEAD_LAYERS[arch] and config["heads"] == N_HEAD[arch]
    assert config["plan"]["backend"] == "llama.cpp" and config["plan"]["stride"] == 4
    means = json.loads((out / "head_means.json").read_text())
    assert sorted(map(int, means)) == HEAD_LAYERS[arch] and all(len(m) == N_HEAD[arch] for m in means.values())
    effects = pd.read_csv(out / "effects.csv")
    silent, neighbour = effects[effects.component == f"L{first}H1"], effects[effects.component == f"L{first}H0"]
    assert len(silent) == 4 and silent.d_logprob.abs().max() < 1e-6, silent
    assert neighbour.d_logprob.abs().max() > 1e-3, neighbour


@pytest.mark.slow
def test_bad_knockout_input_on_llama_cpp_is_one_line(tiny_compressed, tmp_path):
    glm = tiny_compressed / "glm5-next.gguf"
    cases = [
        (["knockout", str(glm), "--layer", "1"], "--layer must be one of 0, 2 (the layers with attention heads), got [1]"),
        (["knockout", str(glm), "--slots", "--layer", "1"], "--layer must be one of 0, 2 (the layers with a per-phase gate)"),
        (["knockout", str(tiny_compressed / "minimax-m3.gguf"), "--slots"], "minimax-m3 has none"),
        (["knockout", str(glm), "--backend", "vllm"], "unknown backend 'vllm'"),
        (["knockout", str(glm), "--threads", "0"], "--threads must be from 1"),
        (["knockout", str(TRAINED / "gated.gguf"), "--backend", "llama.cpp"], "which llama.cpp cannot run"),
    ]
    for args, message in cases:
        out = tmp_path / "ko"
        result = runner.invoke(app, [*args, "--context", "256", "--out", str(out)])
        assert result.exit_code == 1 and message in result.output, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1 and not out.exists(), (args, result.output)


@pytest.mark.slow
def test_glm5_next_gate_slots_held_at_their_mean_change_nothing_when_the_gate_ignores_content(tiny_compressed, tmp_path):
    """glm5-next's k-pool gate inside llama.cpp: with the content gate zeroed, every pool's
    weights are softmax(ape) per channel, so the calibration means are exactly that (read from
    the file, row p = phase p) and holding any phase at its mean changes no log-probability;
    holding one at the wrong slot would. With the random content gate, slots do matter."""
    model = tmp_path / "glm5-next.gguf"
    shutil.copy(tiny_compressed / "glm5-next.gguf", model)
    tensors = {t.name: t for t in read_gguf_header(model).tensors}
    data = np.memmap(model, dtype=np.uint8, mode="r")
    apes = {layer: tensor_array(data, tensors[f"blk.{layer}.indexer_compressor_ape.weight"]) for layer in (0, 2)}
    for layer in (0, 2):
        gate = tensor_array(data, tensors[f"blk.{layer}.indexer_compressor_gate.weight"])
        overwrite_tensor(model, f"blk.{layer}.indexer_compressor_gate.weight", np.zeros_like(gate))
    out = tmp_path / "slots"
    result = runner.invoke(app, ["knockout", str(model), "--slots", "--context", "256", "--per-residue", "1",
                                 "--threads", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    means = json.loads((out / "gate_means.json").read_text())
    assert sorted(means) == ["0,0", "2,0"]
    for layer, ape in apes.items():  # (S, channels)
        expected = np.exp(ape - ape.max(axis=0)) / np.exp(ape - ape.max(axis=0)).sum(axis=0)  # softmax over phases
        assert np.abs(np.array(means[f"{layer},0"]) - expected).max() < 1e-5, _diff(means[f"{layer},0"], expected)
    effects = pd.read_csv(out / "effects.csv")
    assert sorted(effects.component.unique()) == [f"L{l}P{p}" for l in (0, 2) for p in range(4)]
    assert (effects.d_correct == 0).all() and effects.d_logprob.abs().max() < 1e-4, _diff(effects.d_logprob, 0)

    random_gate = tmp_path / "random"
    result = runner.invoke(app, ["knockout", str(tiny_compressed / "glm5-next.gguf"), "--slots", "--layer", "0",
                                 "--context", "256", "--per-residue", "1", "--threads", "1", "--out", str(random_gate)])
    assert result.exit_code == 0, result.output
    assert pd.read_csv(random_gate / "effects.csv").d_logprob.abs().max() > 1e-3


# per architecture: the layer whose gates are held, its per-phase bias tensors (gate number -> name), channels per gate
GATE_BIASES = {
    "glm5-next": (0, {0: "blk.0.indexer_compressor_ape.weight"}, 16),
    "deepseek4": (1, {0: "blk.1.attn_compressor_ape.weight", 1: "blk.1.indexer_compressor_ape.weight"}, 64),
}


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(GATE_BIASES))
def test_a_slot_held_at_one_equals_a_gate_bias_that_picks_that_phase(arch, tiny_compressed, tmp_path):
    """Holding phase p's gate weight at 1 in every window of a layer, context and queries, is
    what llama.cpp computes itself when the file's per-phase biases make phase p take every
    window (+100 on its row: exp(-100) is 0 in float32, and at 100 float32 still resolves
    the gate logits to 1e-5): glm5-next's k-pool gate, and deepseek4's CSA and indexer
    compressors (whose windows span two blocks: the two phase-p rows keep their proportions
    either way). Checked for two phases in turn on one backend and one context, so a context
    decoded under the first hold must not be reused under the second."""
    from kvphase.backends.base import Query
    from kvphase.backends.llamacpp import LlamaCppBackend
    from kvphase.engines.taps import GATE_SOFTMAX
    from kvphase.probes.knockout_hooks import GateSlotKnockout

    source = tiny_compressed / f"{arch}.gguf"
    layer, biases, channels = GATE_BIASES[arch]
    tensors = {t.name: t for t in read_gguf_header(source).tensors}
    apes = {name: tensor_array(np.memmap(source, dtype=np.uint8, mode="r"), tensors[name]) for name in biases.values()}
    rng = np.random.default_rng(1)
    context = rng.integers(1000, 20000, 150).tolist()
    queries = [Query(rng.integers(1000, 20000, 4).tolist(), rng.integers(1000, 20000, 2).tolist()) for _ in range(3)]
    tapped = LlamaCppBackend(source, n_ctx=256, n_threads=1, head_tap=True)
    for phase in (2, 0):
        picked = tmp_path / f"picks-{phase}.gguf"
        shutil.copy(source, picked)
        for name, ape in apes.items():  # (S, channels): row p = phase p
            overwrite_tensor(picked, name, ape + 100 * (np.arange(4) == phase)[:, None])
        expected = [s.logprob for s in LlamaCppBackend(picked, n_ctx=256, n_threads=1).score(context, queries)]
        ones = {number: np.ones(channels) for number in biases}
        tapped.tap_point.tap = GateSlotKnockout(GATE_SOFTMAX[arch], 4, 16 if arch == "glm5-next" else 0, layer, phase, ones)
        held = [s.logprob for s in tapped.score(context, queries)]
        assert np.abs(np.subtract(held, expected)).max() < 1e-4, (phase, _diff(held, expected))
    tapped.tap_point.tap = None
    plain = [s.logprob for s in tapped.score(context, queries)]
    assert np.abs(np.subtract(plain, held)).max() > 1e-3  # the holds did something


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(GATE_BIASES))
def test_recorded_gate_means_equal_the_pooling_kvphase_validate_proves(arch, tiny_compressed):
    """The slot recorder's per-phase means over one context and a query after it (the query's
    decode completes one more window: glm5-next pools it last, after the copied sequence's
    pools, deepseek4 first, before a snapshot of a partial block) equal those of the same
    tokens' gate logits captured from llama.cpp and pooled as `KPool` / `DSV4.pool_weights`
    pool them (the code `kvphase validate` proves equal to llama.cpp's pooling)."""
    from kvphase.backends.base import Query
    from kvphase.backends.llamacpp import LlamaCppBackend
    from kvphase.engines.capture import EngineSettings, by_name, run_and_capture
    from kvphase.engines.taps import GATE_SOFTMAX
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.gguf.tensors import read_model_tensor
    from kvphase.probes.activations import captured_node, engine_weights
    from kvphase.probes.gates import find_sources, sum_by_phase
    from kvphase.probes.knockout_hooks import GateSlotRecorder

    model = tiny_compressed / f"{arch}.gguf"
    layer, biases, channels = GATE_BIASES[arch]
    rng = np.random.default_rng(2)
    context, query = rng.integers(1000, 20000, 150).tolist(), Query(rng.integers(1000, 20000, 3).tolist(), [1500, 1600])
    backend = LlamaCppBackend(model, n_ctx=256, n_threads=1, head_tap=True)
    recorder = GateSlotRecorder(GATE_SOFTMAX[arch], 4, 16 if arch == "glm5-next" else 0, [layer])
    backend.tap_point.tap = recorder
    backend.score(context, [query])
    means = recorder.means()

    tokens = context + query.prompt + query.answer[:-1]  # the query's decode: positions 150 .. 153
    sources = [s for s in find_sources(read_gguf_header(model)) if s.layer == layer]
    names = sorted({captured_node(arch, s) for s in sources})
    run = run_and_capture(model, tokens, [len(tokens)], by_name(names), EngineSettings(n_ctx=256, n_threads=1))
    info = read_model_info(model)
    assert sorted(means) == [(layer, number) for number in biases]
    for number, tensor in biases.items():
        source = next(s for s in sources if s.tensor == tensor)
        weights, first = engine_weights(info, run, source, read_model_tensor(model, tensor))  # (n_windows, W, C)
        expected = sum_by_phase(weights, first, 4).mean(axis=0)  # (S, C)
        assert len(weights) == 153 // 4 + 1 - 1 and expected.shape == (4, channels)  # windows ending by position 153
        # 1e-4: the scoring context caches in F16 what the capture keeps in F32 (measured up to 1.2e-5)
        assert np.abs(means[layer, number] - expected).max() < 1e-4, (tensor, _diff(means[layer, number], expected))
