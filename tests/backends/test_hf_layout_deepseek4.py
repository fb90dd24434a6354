"""`kvphase export-hf` for deepseek4 (kvphase/backends/hf_layout/deepseek4.py): the checkpoint transformers'
deepseek_v4 loads, checked against two implementations of its own, not against the export:
- the trained csa-disjoint reference against kvphase's numpy reference (written from llama.cpp's sources);
- make-tiny's random deepseek4 (hyper-connections, four routed experts, two output groups, a ratio-0, a CSA
  and an HCA layer) against llama.cpp itself, with an F32 KV cache and an indexer top-k that keeps every
  block (so no tie at the top-k boundary can decide what is kept);
and, where the top-k does bite, the one named disagreement: the kept set differs from llama.cpp's
(`kvphase.designs.DSV4`, which `kvphase validate` proves equal to llama.cpp's) only at queries whose
indexer scores tie at the boundary, which torch.topk and llama.cpp's partial sort break differently."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch", reason="the hf extra (pip install -e '.[hf]') is not installed")
pytest.importorskip("transformers", reason="the hf extra (pip install -e '.[hf]') is not installed")

from kvphase.backends.hf_export import export_hf  # noqa: E402
from kvphase.cli import app  # noqa: E402
from kvphase.gguf.tiny import init_tensor, write_tiny_model  # noqa: E402
from kvphase.gguf.tiny_archs import TINY_VOCAB, deepseek4_spec  # noqa: E402
from kvphase.gguf.writer import write_gguf  # noqa: E402
from tests.helpers.cli_checks import one_line_error  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CSA_DISJOINT = ROOT / "tests/data/trained/csa-disjoint.gguf"
runner = CliRunner()


def _load(folder: Path):
    from transformers import AutoModelForCausalLM

    model, loading = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, output_loading_info=True)
    assert not any(loading.values()), loading  # every tensor has its place, none is left at random
    return model.eval()


def _log_softmax(x: np.ndarray) -> np.ndarray:
    top = x.max(-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))


def _transformers_logits(model, tokens: list[int]) -> np.ndarray:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0].numpy()  # (n_tokens, n_vocab)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds4") / "csa-disjoint"
    export_hf(CSA_DISJOINT, out)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """make-tiny's deepseek4, once with an indexer that keeps every block and once with its own top 4."""
    root = tmp_path_factory.mktemp("tiny-ds4")
    files = {}
    for name, top_k in (("all", 1024), ("top4", None)):
        gguf = write_tiny_model("deepseek4", root / f"{name}.gguf", top_k=top_k)
        export_hf(gguf, root / name)
        files[name] = (gguf, root / name)
    return files


TOKENS = np.random.default_rng(0).integers(1, 800, size=60).tolist()


def test_the_trained_reference_scores_in_transformers_as_the_numpy_reference_does(trained):
    from kvphase.reference.deepseek4 import DeepSeek4

    reference = DeepSeek4.from_gguf(CSA_DISJOINT)
    expected = _log_softmax(reference.forward(TOKENS, reference.new_cache()))
    got = _log_softmax(_transformers_logits(_load(trained), TOKENS))
    assert np.abs(got - expected).max() < 1e-4  # measured 2e-5: float32 rounding of the same sums
    assert (got.argmax(-1) == expected.argmax(-1)).all()


def test_the_config_carries_the_trained_plan_and_the_indexer_keys(trained):
    config = json.loads((trained / "config.json").read_text())
    assert config["layer_types"] == ["compressed_sparse_attention"] * 2  # the file's compress_ratios [4, 4]
    assert config["index_topk"] == 1 << 20 and config["sliding_window"] == 8 and config["hc_sinkhorn_iters"] == 1
    assert config["swiglu_limit"] > 1e38  # the file's clamp 0, llama.cpp's "none"
    assert config["kvphase_trained"]["kvphase.trained.design"] == "csa-disjoint"
    result = runner.invoke(app, ["inspect", str(trained)])
    assert result.exit_code == 0, result.output


def test_the_checkpoints_tokenizer_lays_out_the_committed_plan_as_the_gguf_does(trained):
    """The committed llama.cpp folder's plan, built with the copy's tokenizer.json: the same contexts, token for
    token (its BOS included), so a transformers sweep of the copy scores what llama.cpp scored."""
    from kvphase.engines.llamacpp import Vocab
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.runfolder import read_json_object
    from kvphase.sweep.contexts import build_contexts, plan_fingerprint
    from kvphase.sweep.run import load_plan
    from kvphase.sweep.tasks import load_task

    folder = ROOT / "reports/trained/engine/csa-disjoint-seed0/sweep"
    plan = load_plan(folder)
    contexts = build_contexts(load_task(plan.task), Vocab.load(read_model_info(trained)), plan.context_settings)
    assert plan_fingerprint(contexts) == read_json_object(folder / "manifest.json")["plan_sha256"]


def test_the_random_tiny_model_scores_in_transformers_as_in_llama_cpp(tiny):
    """160 tokens: the CSA blocks and the first HCA entry (ratio 128) are read; F32 cache on both sides."""
    from kvphase.reference.agreement import llamacpp_logits

    gguf, folder = tiny["all"]
    tokens = np.random.default_rng(1).integers(1, TINY_VOCAB, size=160).tolist()
    expected = _log_softmax(llamacpp_logits(gguf, tokens, n_threads=1, type_k=0, type_v=0))
    got = _log_softmax(_transformers_logits(_load(folder), tokens))
    assert np.abs(got - expected).max() < 1e-4  # measured 4e-6


def test_the_kept_sets_differ_from_llama_cpps_only_where_the_indexer_ties(tiny):
    """Layer by layer (`validate.hf_dsv4`): transformers' pooled entries, indexer scores and kept sets against
    the design llama.cpp is validated against, on transformers' own inputs. make-tiny's CSA layer keeps 4
    blocks: its relu scores tie at exactly 0 often, and every kept set that differs differs among those."""
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.validate.hf_dsv4 import transformers_layer_checks
    from kvphase.validate.options import Tolerances

    gguf, folder = tiny["top4"]
    tokens = np.random.default_rng(0).integers(1, TINY_VOCAB, size=140).tolist()
    checks = {check.layer: check for check in transformers_layer_checks(read_model_info(gguf), folder, tokens)}
    assert sorted(checks) == [1, 2]  # the CSA and the HCA layer; layer 0 has no compressor
    assert all(check.failures(Tolerances()) == [] for check in checks.values()), {
        il: check.failures(Tolerances()) for il, check in checks.items()}
    csa = checks[1]
    assert csa.keys.count == 35 * 64 and csa.rows == 140  # 35 blocks of 4 in 140 tokens; one kept set per query
    assert csa.ties > 0 and csa.mismatched == 0
    assert checks[2].keys.count == 64 and checks[2].rows == 0  # one HCA entry (128 tokens), no indexer


def _deepseek4_file(path: Path, **keys) -> Path:
    spec = deepseek4_spec()
    for name, value in keys.items():
        if value is None:
            del spec.keys[f"deepseek4.{name}"]
        else:
            spec.keys[f"deepseek4.{name}"] = value
    rng = np.random.default_rng(0)
    write_gguf(path, "deepseek4", spec.keys, ((n, init_tensor(rng, ne, kind)) for n, ne, kind in spec.tensors))
    return path


@pytest.mark.parametrize("keys, fragments", [
    ({"attention.indexer.top_k": None}, ["deepseek4.attention.indexer.top_k"]),
    ({"attention.compress_ratios": [0, 4]}, ["deepseek4.attention.compress_ratios", "3 per-layer ratios"]),
    ({"attention.compress_ratios": [4, 64, 128]}, ["deepseek4.attention.compress_ratios", "at most one other"]),
    ({"hash_layer_count": 1}, ["deepseek4.hash_layer_count", "tid2eid"]),
    ({"swiglu_clamp_exp": [10.0, 7.0, 10.0]}, ["deepseek4.swiglu_clamp_exp", "one clamp"]),
])
def test_a_deepseek4_file_transformers_cannot_express_is_one_line_naming_the_key(tmp_path, keys, fragments):
    gguf = _deepseek4_file(tmp_path / "bad.gguf", **keys)
    one_line_error(runner.invoke(app, ["export-hf", str(gguf), str(tmp_path / "out")]), *fragments)
    assert not (tmp_path / "out").exists() and not any(p.name.endswith(".partial") for p in tmp_path.iterdir())


def test_export_hf_refuses_an_architecture_without_a_layout_and_a_full_folder(trained, tmp_path):
    qwen = write_tiny_model("qwen3", tmp_path / "qwen3.gguf")
    one_line_error(runner.invoke(app, ["export-hf", str(qwen), str(tmp_path / "q")]), "qwen3", "not written yet")
    one_line_error(runner.invoke(app, ["export-hf", str(CSA_DISJOINT), str(trained)]), "not an empty folder")
    assert not (tmp_path / "q").exists()


def test_validate_through_transformers_prints_validates_table(tiny, tmp_path):
    gguf, _ = tiny["top4"]
    result = runner.invoke(app, ["validate", str(gguf), "--engine", "transformers", "--tokens", "130"])
    assert result.exit_code == 0, result.output
    assert "130 tokens, splits 130" in result.output and result.output.strip().endswith("PASS")
    qwen = write_tiny_model("qwen3", tmp_path / "qwen3.gguf")
    one_line_error(runner.invoke(app, ["validate", str(qwen), "--engine", "transformers"]), "deepseek4 files", "qwen3")
    one_line_error(runner.invoke(app, ["validate", str(gguf), "--engine", "vllm"]), "--engine 'vllm'")
