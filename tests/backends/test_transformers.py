"""`--backend transformers` and `kvphase export-hf` (the hf extra): a tiny llama GGUF exported as an HF
checkpoint, swept through transformers' modeling code and checked against the numpy reference model
(an implementation of its own, which reads the GGUF as llama.cpp does) on the same plan; an HF
checkpoint's config.json read as a GGUF's metadata is (inspect, the reach); bad folders in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="the hf extra (pip install -e '.[hf]') is not installed")

from kvphase.cli import app  # noqa: E402
from kvphase.gguf.tiny import _take_tokenizer, init_tensor, write_tiny_model  # noqa: E402
from kvphase.gguf.tiny_archs import _dense_spec  # noqa: E402
from kvphase.gguf.writer import write_gguf  # noqa: E402
from tests.helpers.cli_checks import last_line_error, one_line_error  # noqa: E402

pytestmark = pytest.mark.slow
runner = CliRunner()
PLAN = ["--stride", "4", "--modulus", "8", "--context", "256", "--per-residue", "2"]


def _plain_tiny_llama(path: Path, tokenizer_from: Path) -> Path:
    """The tiny llama without rope_freqs.weight (Llama-3 RoPE divisors, which transformers' GGUF reader
    drops: export-hf refuses that file), with SmolLM2's tokenizer."""
    spec = _dense_spec("llama", head_dim=8, tied=True)
    spec.keys["llama.context_length"] = 1024
    _take_tokenizer(spec, tokenizer_from)
    rng = np.random.default_rng(0)
    write_gguf(path, "llama", spec.keys, ((name, init_tensor(rng, ne, kind)) for name, ne, kind in spec.tensors))
    return path


@pytest.fixture(scope="module")
def plain_llama(default_model, tmp_path_factory):
    return _plain_tiny_llama(tmp_path_factory.mktemp("plain") / "plain-llama.gguf", default_model)


@pytest.fixture(scope="module")
def checkpoint(plain_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "plain-llama-hf"
    result = runner.invoke(app, ["export-hf", str(plain_llama), str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def sweeps(plain_llama, checkpoint, tmp_path_factory):
    """The same plan swept through transformers on the checkpoint and through the reference on the GGUF."""
    root = tmp_path_factory.mktemp("sweeps")
    for name, model, backend in (("hf", checkpoint, "transformers"), ("ref", plain_llama, "reference")):
        result = runner.invoke(app, ["sweep", str(model), "--backend", backend, *PLAN, "--out", str(root / name)])
        assert result.exit_code == 0, result.output
    return root


def test_the_checkpoint_holds_what_transformers_loads(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "tokenizer.json").is_file()


def test_transformers_scores_as_the_reference_does_on_the_same_plan(sweeps):
    manifests = {name: json.loads((sweeps / name / "manifest.json").read_text()) for name in ("hf", "ref")}
    assert manifests["hf"]["plan_sha256"] == manifests["ref"]["plan_sha256"]  # the checkpoint's tokenizer: same ids
    engine = manifests["hf"]["engine"]
    assert engine["device"] == "cpu" and engine["query_scoring"] == "context cache cropped back after each query"
    hf, ref = (pd.read_csv(sweeps / name / "results.csv").sort_values("target_id").reset_index() for name in ("hf", "ref"))
    assert list(hf.target_id) == list(ref.target_id) and len(hf) == 16
    # float32 in torch against float32 in numpy, a random model whose answers are tens of nats down
    np.testing.assert_allclose(hf.logprob, ref.logprob, rtol=1e-4, atol=1e-3)
    assert list(hf.predicted) == list(ref.predicted)


def test_a_query_after_the_cached_context_scores_as_the_whole_text_does(checkpoint):
    """The cache rolled back after each query (`_roll_back`): the second query sees the context alone."""
    from kvphase.backends.base import Query, log_softmax_rows
    from kvphase.backends.hf import TransformersBackend
    from kvphase.gguf.modelinfo import read_model_info

    backend = TransformersBackend(read_model_info(checkpoint), n_threads=1)
    context = backend.tokenize("record 12: alpha. record 13: beta. record 14: gamma. " * 4)
    queries = [Query(tuple(backend.tokenize(" record 13:")), tuple(backend.tokenize(" beta."))),
               Query(tuple(backend.tokenize(" record 14:")), tuple(backend.tokenize(" gamma.")))]
    scores = backend.score(context, queries)
    for query, score in zip(queries, scores):
        whole = list(context) + list(query.prompt) + list(query.answer[:-1])
        rows = log_softmax_rows(backend.logits(whole))[len(context) + len(query.prompt) - 1:]
        expected = rows[np.arange(len(query.answer)), list(query.answer)].sum()
        assert score.logprob == pytest.approx(expected, abs=1e-4)
    backend.close()


def test_inspect_reads_the_checkpoints_config(checkpoint):
    result = runner.invoke(app, ["inspect", str(checkpoint)])
    assert result.exit_code == 0, result.output
    assert "llama" in result.output and "BPE, 49152 tokens" in result.output and "1.6 M" in result.output


def test_planning_a_checkpoint_sweep_imports_no_torch(checkpoint, tmp_path):
    code = ("import sys; from pathlib import Path; from kvphase.sweep.planning import plan_sweep_runs; "
            "from kvphase.sweep.options import SweepOptions; "
            f"p = plan_sweep_runs(Path({str(checkpoint)!r}), SweepOptions(stride='4', modulus=8, context=256, "
            f"per_residue='2', out=Path({str(tmp_path / 'r')!r}))); "
            "assert p.runs[0][0].backend == 'transformers', p.runs[0][0].backend; "
            "assert not {'torch', 'transformers'} & set(sys.modules), 'torch loaded'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def _write_checkpoint(folder: Path, config: dict | None, weights: bool = True) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    if weights:
        save_file({"w": np.zeros((2, 3), dtype=np.float32)}, str(folder / "model.safetensors"))
    return folder


GLM = {"model_type": "glm5_next", "text_config": {"num_hidden_layers": 4, "index_kpool": 16, "index_topk": 64,
                                                  "layer_types": ["linear_attention"] * 3 + ["indexed_attention"]}}
DSV4 = {"model_type": "deepseek_v4", "num_hidden_layers": 3, "index_topk": 8, "sliding_window": 16,
        "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]}


def test_inspect_states_a_compressed_checkpoints_reach_by_hand(tmp_path):
    # glm5-next: 64 / 16 = 4 pools kept, so one is dropped from (4 + 1) x 16 = 80 tokens on
    result = runner.invoke(app, ["inspect", str(_write_checkpoint(tmp_path / "glm", GLM))])
    assert result.exit_code == 0, result.output
    assert "kpool: stride 16" in result.output and "selects from 80 tokens on" in result.output
    assert "layers 3" in result.output
    # deepseek4: 8 entries of 4 tokens kept on the CSA layer: one dropped from 4 x (8 + 1) = 36 tokens on
    result = runner.invoke(app, ["inspect", str(_write_checkpoint(tmp_path / "ds", DSV4))])
    assert result.exit_code == 0, result.output
    assert "dsv4: stride 4" in result.output and "selects from 36 tokens on" in result.output
    assert "last 16 tokens" in result.output


@pytest.mark.parametrize("config, weights, fragments", [
    (None, True, ["holds no config.json"]),
    ({"model_type": "llama", "num_hidden_layers": 2}, False, ["holds no .safetensors"]),
    ({"model_type": "gpt_neox", "num_hidden_layers": 2}, True, ["model_type 'gpt_neox'"]),
    ({**DSV4, "index_topk": None}, True, ["index_topk is missing"]),
    ({k: v for k, v in DSV4.items() if k != "sliding_window"}, True, ["sliding_window is missing"]),
    ({"model_type": "glm5_next", "text_config": {**GLM["text_config"], "index_topk": 40}}, True,
     ["index_topk is 40, expected a multiple of index_kpool (16)"]),
    ({**DSV4, "layer_types": ["sliding_attention"]}, True, ["layer_types is not a list of 3"]),
    ({"model_type": ["llama"], "num_hidden_layers": 2}, True, ["model_type \"['llama']\" is not one"]),
    ({**GLM, "text_config": [1]}, True, ["text_config is a list"]),
])
def test_a_bad_checkpoint_folder_is_one_line_naming_the_key(tmp_path, config, weights, fragments):
    if config is not None and config.get("index_topk", 0) is None:
        config = {k: v for k, v in config.items() if k != "index_topk"}
    folder = _write_checkpoint(tmp_path / "bad", config, weights)
    for command in (["inspect", str(folder)], ["sweep", str(folder), *PLAN, "--out", str(tmp_path / "r")]):
        one_line_error(runner.invoke(app, command), *fragments)
    assert not (tmp_path / "r").exists()


def test_a_checkpoint_runs_through_transformers_only(checkpoint, tmp_path):
    one_line_error(runner.invoke(app, ["sweep", str(checkpoint), "--backend", "llama.cpp", *PLAN, "--out",
                                       str(tmp_path / "r")]), "HF checkpoint folder", "--backend transformers only")
    assert not (tmp_path / "r").exists()


def test_export_hf_refuses_what_it_cannot_copy_faithfully(tiny_llama, plain_llama, checkpoint, tmp_path):
    # the session's tiny llama holds rope_freqs.weight, which transformers' GGUF reader would drop
    one_line_error(runner.invoke(app, ["export-hf", str(tiny_llama), str(tmp_path / "a")]), "rope_freqs.weight")
    one_line_error(runner.invoke(app, ["export-hf", str(plain_llama), str(checkpoint)]), "not an empty folder")
    qwen = write_tiny_model("qwen3", tmp_path / "qwen3.gguf")
    one_line_error(runner.invoke(app, ["export-hf", str(qwen), str(tmp_path / "b")]), "qwen3",
                   "not written yet")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert not any(p.name.endswith(".partial") for p in tmp_path.iterdir())


def test_conform_through_transformers_runs_transformers_itself(tmp_path):
    """transformers' GGUF reader has no deepseek4: conform exports the reference to HF layout and scores that
    (before, it scored through llama.cpp under transformers' name, then said "cannot run")."""
    result = runner.invoke(app, ["conform", "--backend", "transformers", "--model", "csa-disjoint", "--contexts", "8",
                                 "--out", str(tmp_path / "c")])
    assert "csa-disjoint: PASS" in result.output, result.output
    check = json.loads((tmp_path / "c" / "conform.json").read_text())["models"][0]["check"]
    # llama.cpp scoring its own folder's plan again moves no log-probability; float32 transformers against
    # llama.cpp's F16 cache moves them by about 1e-2
    assert 0 < check["max_logprob_difference"] < 0.05, check


def test_weights_that_are_not_the_configs_model_are_refused_before_loading(checkpoint, tmp_path):
    """A config whose model is far larger than its weights (six numbers for a 1.6 M-parameter llama; a
    deepseek_v4 config left at transformers' default sizes) would be filled with random weights and swept."""
    folder = _write_checkpoint(tmp_path / "small", json.loads((checkpoint / "config.json").read_text()))
    (folder / "tokenizer.json").write_bytes((checkpoint / "tokenizer.json").read_bytes())
    result = runner.invoke(app, ["sweep", str(folder), *PLAN, "--out", str(tmp_path / "r")])
    last_line_error(result, "hold 6 parameters", "the weights are not this model's")
    assert not (tmp_path / "r" / "results.csv").exists()


def test_conform_through_transformers_runs_glm5_next_and_minimax_m3(tmp_path):
    """Both random references exported by their layouts and scored by transformers: minimax-m3 matches
    llama.cpp's folder (2.7e-3 nats was measured at 48 tokens); glm5-next's targets move after indexer
    ties (ReLU scores exactly 0 at the edge of the kept pools), which torch.topk and llama.cpp's partial
    sort break their own ways: UNDECIDED with the tie named, and so are transformers' own paths."""
    result = runner.invoke(app, ["conform", "--backend", "transformers", "--model", "glm5-next-random", "--model",
                                 "minimax-m3-random", "--contexts", "8", "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    models = {m["name"]: m for m in json.loads((tmp_path / "c" / "conform.json").read_text())["models"]}
    assert models["minimax-m3-random"]["status"] == "PASS", models["minimax-m3-random"]["reason"]
    glm = models["glm5-next-random"]
    assert glm["status"] == "UNDECIDED" and glm["ties"]["moved"] > 0, glm["reason"]
    assert glm["ties"]["explained"] == glm["ties"]["moved"] and glm["ties"]["first"]["margin"] < 1e-3
    assert "an indexer tie explains" in glm["reason"]
    assert {p["status"] for p in glm["paths"]} <= {"PASS", "UNDECIDED"}


def test_a_wrong_top_k_through_transformers_is_no_tie(tmp_path, monkeypatch):
    """The HF copy conform reuses, damaged: index_topk 4 (one pool kept) where the file keeps two. The
    engines keep different numbers of pools, which no tie does: FAIL, exit 1."""
    import shutil

    from kvphase.conform import check
    from kvphase.conform.references import DEFAULT_REFERENCES

    reference = next(r for r in DEFAULT_REFERENCES if r.name == "glm5-next-random")
    copy = tmp_path / "copies" / f"{reference.model.stem}-{reference.sha256[:16]}"
    assert runner.invoke(app, ["export-hf", str(reference.model), str(copy)]).exit_code == 0
    config = json.loads((copy / "config.json").read_text())
    config["text_config"]["index_topk"] = 4
    (copy / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(check, "HF_COPIES", tmp_path / "copies")
    result = runner.invoke(app, ["conform", "--backend", "transformers", "--model", "glm5-next-random",
                                 "--contexts", "8", "--out", str(tmp_path / "c")])
    assert result.exit_code == 1, result.output
    glm = json.loads((tmp_path / "c" / "conform.json").read_text())["models"][0]
    assert glm["status"] == "FAIL" and glm["ties"]["explained"] < glm["ties"]["moved"], glm["reason"]
    shutil.rmtree(copy)
