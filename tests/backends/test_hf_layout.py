"""`kvphase export-hf` for glm5-next and minimax-m3 (kvphase/backends/hf_layout/: llama.cpp's converter
read backwards): the exported folders run through transformers' own glm5_next / minimax_m3_vl code and
score as the GGUF does through llama.cpp and the numpy reference (independent implementations: a
transposed, mis-split or mis-shifted tensor, or a wrong indexer key in config.json, moves the
log-probabilities); `kvphase validate FOLDER` compares transformers' indexer with kvphase's designs
layer by layer; a config.json with an indexer key missing is one line naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="the hf extra (pip install -e '.[hf]') is not installed")

from kvphase.backends.base import Query  # noqa: E402
from kvphase.cli import app  # noqa: E402
from kvphase.gguf.modelinfo import read_model_info  # noqa: E402
from kvphase.gguf.tiny import init_tensor  # noqa: E402
from kvphase.gguf.tiny_archs import glm5_next_spec  # noqa: E402
from kvphase.gguf.writer import write_gguf  # noqa: E402
from tests.helpers.cli_checks import one_line_error  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GGUFS = {"glm-dense": ROOT / "tests/data/trained/glm-dense.gguf",
         "glm5-next-random": ROOT / "tests/data/conform/glm5-next-random.gguf",
         "minimax-m3-random": ROOT / "tests/data/conform/minimax-m3-random.gguf"}
runner = CliRunner()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-layout")
    out = {}
    for name, gguf in GGUFS.items():
        result = runner.invoke(app, ["export-hf", str(gguf), str(root / name)])
        assert result.exit_code == 0, result.output
        out[name] = root / name
    return out


def _logprobs(backend, n: int, vocab: int) -> np.ndarray:
    """Log-probabilities of a seeded random text's second half after its first half, (n_rows, vocab)."""
    tokens = [int(t) for t in np.random.default_rng(0).integers(1, vocab, size=n)]
    query = Query(prompt=tuple(tokens[n // 2:n // 2 + 1]), answer=tuple(tokens[n // 2 + 1:]))
    try:
        return backend.answer_logprobs(tokens[:n // 2], [query])[0]
    finally:
        backend.close()


def _transformers(folder: Path, n: int) -> np.ndarray:
    from kvphase.backends.hf import TransformersBackend

    info = read_model_info(folder)
    return _logprobs(TransformersBackend(info), n, info.vocab_size)


def _llamacpp(gguf: Path, n: int) -> np.ndarray:
    from kvphase.backends.llamacpp import LlamaCppBackend

    info = read_model_info(gguf)
    return _logprobs(LlamaCppBackend(info, n_ctx=256), n, info.vocab_size)


def test_glm_dense_through_transformers_scores_as_the_reference_does(exported):
    """KDA, nope MLA (kv_b rebuilt from k_b / v_b), identity mHC: max |d log p| was 9.6e-5 on this text."""
    from kvphase.backends.reference import ReferenceBackend

    info = read_model_info(GGUFS["glm-dense"])
    ref = _logprobs(ReferenceBackend(info), 64, info.vocab_size)
    np.testing.assert_allclose(_transformers(exported["glm-dense"], 64), ref, atol=1e-3)


def test_random_hyper_connections_score_as_llamacpp_before_the_first_tie(exported):
    """The random mHC weights (fn, base, scale): 16 tokens, before the first top-k tie of this text
    (position 16, where torch and llama.cpp may keep different tied pools); llama.cpp's f16 cache
    gave 1.1e-3."""
    np.testing.assert_allclose(_transformers(exported["glm5-next-random"], 16),
                               _llamacpp(GGUFS["glm5-next-random"], 16), atol=1e-2)


def test_minimax_through_transformers_scores_as_llamacpp(exported):
    """48 tokens: 12 blocks of 4, 3 kept per head (MSA acts); partial RoPE, (1 + w) norms, fused
    gate/up experts. llama.cpp's f16 cache gave 2.7e-3."""
    np.testing.assert_allclose(_transformers(exported["minimax-m3-random"], 48),
                               _llamacpp(GGUFS["minimax-m3-random"], 48), atol=1e-2)


def test_a_wrong_top_k_in_config_json_is_seen(exported, tmp_path):
    """index_topk 4 (one pool) where the GGUF keeps 8 (two): past the second pool the texts part."""
    folder = shutil.copytree(exported["glm5-next-random"], tmp_path / "wrong-top-k")
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["index_topk"] = 4
    (folder / "config.json").write_text(json.dumps(config))
    gap = np.abs(_transformers(folder, 16) - _llamacpp(GGUFS["glm5-next-random"], 16)).max()
    assert gap > 0.05


@pytest.mark.parametrize("name", ["glm5-next-random", "minimax-m3-random"])
def test_the_indexer_as_transformers_runs_it_is_the_design_up_to_ties(exported, name):
    result = runner.invoke(app, ["validate", str(exported[name]), "--tokens", "64"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == "PASS"
    if name == "glm5-next-random":  # ReLU scores tie at 0: the first tie of each layer is named
        assert "first tie at pos" in result.output


@pytest.mark.parametrize("name, key", [("glm5-next-random", "index_topk"), ("glm5-next-random", "index_kpool"),
                                       ("minimax-m3-random", "index_block_size"),
                                       ("minimax-m3-random", "index_topk_blocks")])
def test_a_config_without_an_indexer_key_is_one_line_naming_it(exported, tmp_path, name, key):
    folder = shutil.copytree(exported[name], tmp_path / "damaged")
    config = json.loads((folder / "config.json").read_text())
    del (config.get("text_config") or config)[key]
    (folder / "config.json").write_text(json.dumps(config))
    one_line_error(runner.invoke(app, ["inspect", str(folder)]), key, "missing")


def test_an_impossible_tensor_leaves_no_folder(tmp_path):
    """ssm_a holds -exp(A_log): a positive value has no A_log; refused by name, and no OUT is left."""
    spec = glm5_next_spec()
    rng = np.random.default_rng(0)
    tensors = ((name, init_tensor(rng, ne, "ones" if name.endswith("ssm_a") else kind)) for name, ne, kind in spec.tensors)
    gguf = write_gguf(tmp_path / "bad-a.gguf", "glm5-next", spec.keys, tensors) or tmp_path / "bad-a.gguf"
    out = tmp_path / "out"
    one_line_error(runner.invoke(app, ["export-hf", str(gguf), str(out)]), "blk.1.ssm_a")
    assert not out.exists() and not any(p.name.startswith(".out") for p in tmp_path.iterdir())


@pytest.mark.parametrize("tokens, fragment", [("0", "--tokens must be at least 2"), ("100000", "does not fit")])
def test_validate_of_a_folder_refuses_an_impossible_length(exported, tokens, fragment):
    one_line_error(runner.invoke(app, ["validate", str(exported["minimax-m3-random"]), "--tokens", tokens]), fragment)


def test_a_trained_files_declarations_travel_with_its_checkpoint(exported, tmp_path):
    """The trained context (the sweep's query room), design and starts read back as the GGUF's."""
    assert read_model_info(exported["glm-dense"]).trained == read_model_info(GGUFS["glm-dense"]).trained
    folder = shutil.copytree(exported["glm-dense"], tmp_path / "damaged")
    config = json.loads((folder / "config.json").read_text())
    config["kvphase_trained"]["kvphase.trained.context"] = "many"
    (folder / "config.json").write_text(json.dumps(config))
    one_line_error(runner.invoke(app, ["inspect", str(folder)]), "kvphase_trained", "context")


def test_contradictory_indexer_keys_leave_no_folder(tmp_path):
    """A top-k of 9 tokens over pools of 4: the config.json export-hf would write is read back before the
    rename, as inspect and sweep read it, and refused by name; no OUT is left."""
    spec = glm5_next_spec()
    spec.keys["glm5-next.attention.indexer.top_k"] = 2 * spec.keys["glm5-next.attention.indexer.kpool"] + 1
    rng = np.random.default_rng(0)
    gguf = tmp_path / "bad-top-k.gguf"
    write_gguf(gguf, "glm5-next", spec.keys, ((name, init_tensor(rng, ne, kind)) for name, ne, kind in spec.tensors))
    out = tmp_path / "out"
    one_line_error(runner.invoke(app, ["export-hf", str(gguf), str(out)]), "index_topk is 9",
                   "multiple of index_kpool (4)")
    assert not out.exists() and not any(p.name.startswith(".out") for p in tmp_path.iterdir())
