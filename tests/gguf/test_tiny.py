"""Tiny random-weight models: written fast and reproducibly, loaded and run by real llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from kvphase.engines.capture import EngineSettings, by_name, run_and_capture
from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.gguf.modelinfo import read_model_info
from kvphase.gguf.tiny import TINY_ARCHS, write_tiny_model

ARCHS = sorted(TINY_ARCHS)
# per architecture: a compression tensor llama.cpp must compute, and the spec `inspect` shows
EXPECTED = {
    "glm5-next": ("indexer_pool_k", "kpool", 4, (0, 2)),
    "minimax-m3": ("msa_bs", "msa", 4, (1, 2)),
    "deepseek4": ("lid_top_k", "dsv4", 4, (1, 2)),
}


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_is_small_and_reproducible(arch, tmp_path):
    a = write_tiny_model(arch, tmp_path / "a.gguf", seed=1)
    b = write_tiny_model(arch, tmp_path / "b.gguf", seed=1)
    c = write_tiny_model(arch, tmp_path / "c.gguf", seed=2)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert a.stat().st_size < 1_000_000


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_declares_its_compression(arch, tmp_path):
    _, family, stride, layers = EXPECTED[arch]
    info = read_model_info(write_tiny_model(arch, tmp_path / "m.gguf"))
    assert info.architecture == arch
    assert info.compression.family == family
    assert info.compression.stride == stride
    assert info.compression.layers == layers


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_loads_and_decodes_in_llama_cpp(arch, tmp_path):
    name, _, _, layers = EXPECTED[arch]
    path = write_tiny_model(arch, tmp_path / "m.gguf")
    tokens = np.arange(40) % 64
    run = run_and_capture(path, tokens.tolist(), [30, 1, 9], by_name([name]), EngineSettings(n_ctx=256, n_threads=1))
    assert [u.index for u in run.ubatches] == [0, 1, 2]
    assert layers[0] in run.layers(name)
    for ub in run.ubatches:
        captured = run.get(name, layers[0], ub.index)
        assert captured.size and np.isfinite(captured).all() and np.abs(captured).max() > 0, captured


def test_unknown_architecture_is_a_plan_error(tmp_path):
    with pytest.raises(PlanError, match="no tiny model for architecture 'gpt2'"):
        write_tiny_model("gpt2", tmp_path / "m.gguf")


def test_make_tiny_cli_writes_a_model_inspect_can_read(tmp_path):
    out = tmp_path / "glm.gguf"
    result = CliRunner().invoke(app, ["make-tiny", "glm5-next", str(out), "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and out.exists()
    shown = CliRunner().invoke(app, ["inspect", str(out)])
    assert shown.exit_code == 0, shown.output
    assert "kpool: stride 4" in shown.output
    assert "top_k=8" in shown.output


def test_make_tiny_cli_rejects_an_unknown_architecture(tmp_path):
    result = CliRunner().invoke(app, ["make-tiny", "nope", str(tmp_path / "x.gguf")])
    assert result.exit_code == 1
    assert "no tiny model for architecture 'nope'" in result.output


def test_make_tiny_help():
    result = CliRunner().invoke(app, ["make-tiny", "--help"])
    assert result.exit_code == 0
    assert "glm5-next" in result.output


def test_a_donors_tokenizer_is_copied_whole(tmp_path):
    """Every `tokenizer.*` key as gguf's own reader reads it from the donor: arrays longer than the
    header reader's summary limit and a chat template longer than its string limit included."""
    import gguf

    from kvphase.gguf.header import KEPT_ARRAY_LIMIT, KEPT_STRING_LIMIT

    n_vocab = KEPT_ARRAY_LIMIT + 904
    rng = np.random.default_rng(0)
    donor_keys = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": [f"tök{i}" if i % 7 else f"Ġ{i}€" for i in range(n_vocab)],
        "tokenizer.ggml.token_type": [int(t) for t in rng.integers(1, 4, n_vocab)],
        "tokenizer.ggml.scores": [float(np.float32(s)) for s in rng.standard_normal(n_vocab)],
        "tokenizer.ggml.merges": [f"t ö{i}" for i in range(KEPT_ARRAY_LIMIT + 1)],
        "tokenizer.chat_template": "{{ messages }}" * (KEPT_STRING_LIMIT // 10),
        "tokenizer.ggml.bos_token_id": 3,
        "tokenizer.ggml.add_bos_token": True,
    }
    writer = gguf.GGUFWriter(str(tmp_path / "donor.gguf"), "llama")
    for key, value in donor_keys.items():
        {str: writer.add_string, list: writer.add_array, int: writer.add_uint32, bool: writer.add_bool}[type(value)](key, value)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.close()

    tiny = write_tiny_model("llama", tmp_path / "tiny.gguf", tokenizer_from=tmp_path / "donor.gguf")
    donor, copy = (gguf.GGUFReader(path).fields for path in (tmp_path / "donor.gguf", tiny))
    assert len(donor_keys["tokenizer.chat_template"]) > KEPT_STRING_LIMIT
    for key, value in donor_keys.items():
        assert donor[key].contents() == value, key  # the donor holds what was written
        assert copy[key].contents() == value and copy[key].types == donor[key].types, key
    assert read_model_info(tiny).vocab_size == n_vocab
