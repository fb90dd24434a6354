"""The compressor's reach: from which length each part of a seed architecture acts, the label of a
run whose compressor read every target exactly, the default plan that puts targets behind it, and
the released models' shapes. Reach numbers are pinned against llama.cpp's rules counted out by
hand (brute force below), not against the code under test."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.helpers.cli_checks import one_line_error
from kvphase.cli import app
from kvphase.gguf.modelinfo import read_model_info
from kvphase.gguf.reach import reach_of
from kvphase.gguf.tiny import write_tiny_model
from kvphase.sweep.calibrate import easier_levels
from kvphase.sweep.reach_check import compressor_inactive

runner = CliRunner()


@pytest.fixture(scope="module")
def shaped(default_model, tmp_path_factory):
    """The three released shapes with SmolLM2's tokenizer, and GLM-5.3's weights with an indexer that keeps all."""
    folder = tmp_path_factory.mktemp("shapes")
    files = {shape: write_tiny_model(arch, folder / f"{shape}.gguf", tokenizer_from=default_model, shape=shape)
             for shape, arch in (("glm-5.3-flash", "glm5-next"), ("deepseek-v4-flash", "deepseek4"),
                                 ("minimax-m3", "minimax-m3"))}
    files["keep-all"] = write_tiny_model("glm5-next", folder / "keep-all.gguf", tokenizer_from=default_model,
                                         shape="glm-5.3-flash", top_k=1 << 20)
    return files


def _kpool_visible(tokens: int, kpool: int) -> int:
    """llama-memory-hybrid-idx.cpp fill_mask: pools start at position 0; a pool is visible to the token
    at position p = tokens - 1 when its last position is at or before p."""
    ends = np.arange(kpool - 1, tokens + kpool, kpool)  # each pool's last position
    return int((ends <= tokens - 1).sum())


def _msa_visible(tokens: int, block: int) -> int:
    """minimax-m3.cpp: blocks of exact tokens, the token's own partial block included (causal mask)."""
    starts = np.arange(0, tokens + block, block)
    return int((starts <= tokens - 1).sum())


def test_released_shapes_reach_where_llama_cpps_rules_say(shaped):
    glm, ds4, msa = (reach_of(read_model_info(shaped[s]).compression)
                     for s in ("glm-5.3-flash", "deepseek-v4-flash", "minimax-m3"))
    # GLM-5.3-Flash: 512 pools of 4 kept; the 513th complete pool ends at position 2051, i.e. 2,052 tokens
    (indexer,) = glm.selection
    assert (indexer.keeps, indexer.acts_from, indexer.quarter_length()) == (512, 2052, 8192)
    # DeepSeek-V4-Flash: 512 entries kept; the 513th complete 4-token block needs 2,052 tokens; window 128
    (lightning,) = ds4.selection
    assert (lightning.keeps, lightning.acts_from, ds4.raw_window) == (512, 2052, 128)
    assert [p.stride for p in ds4.pooling] == [4, 128]
    # MiniMax-M3: 16 blocks of 128 kept; the 17th block starts at position 2048, i.e. 2,049 tokens
    (blocks,) = msa.selection
    assert (blocks.keeps, blocks.acts_from, msa.raw_window) == (16, 2049, 128) and msa.engine_condition
    for tokens in range(1, 2200):
        assert indexer.visible(tokens) == _kpool_visible(tokens, 4)
        assert lightning.visible(tokens) == _kpool_visible(tokens, 4)  # entries: complete blocks, as pools
        assert blocks.visible(tokens) == _msa_visible(tokens, 128)
    for selection, counted in ((indexer, lambda n: _kpool_visible(n, 4)), (blocks, lambda n: _msa_visible(n, 128))):
        first = next(n for n in range(1, 10_000) if counted(n) > selection.keeps)
        assert selection.acts_from == first


def test_inspect_and_dry_run_say_the_reach(shaped):
    result = runner.invoke(app, ["inspect", str(shaped["glm-5.3-flash"])], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert "it selects from 2,052 tokens on" in result.output and "from 8,192 tokens on" in result.output


def test_the_default_plan_puts_targets_behind_the_indexer(shaped, tmp_path):
    from kvphase.sweep.plan import default_context
    from kvphase.sweep.options import SweepOptions
    from kvphase.sweep.planning import plan_sweep_runs

    for shape in ("glm-5.3-flash", "deepseek-v4-flash", "minimax-m3"):
        info = read_model_info(shaped[shape])
        context, why = default_context(info, 1024)
        (selection,) = reach_of(info.compression).selection
        assert context == 8192 and selection.kept_share(context + 1) <= 0.25, (shape, context)
        assert selection.kept_share(context // 2 + 1) > 0.25 and "would read every target exactly" in why
    planned = plan_sweep_runs(shaped["glm-5.3-flash"], SweepOptions(out=tmp_path / "glm"), dry_run=True,
                              say=lambda notice: None)
    assert planned.runs[0][0].context == 8192 and "indexer would read every target exactly" in planned.runs[0][0].adjusted
    tiny = read_model_info(write_tiny_model("glm5-next", tmp_path / "tiny.gguf", context_length=4096))  # acts at 1,024
    assert default_context(tiny, 1024) == (1024, "")


def test_a_run_below_the_reach_is_labelled_and_equals_the_model_without_its_indexer(shaped, tmp_path):
    """At 1,024 tokens GLM-5.3's indexer keeps every pool: the run is labelled, and its answers'
    log-probabilities equal those of the same weights with an indexer that keeps everything."""
    def sweep(model):
        out = tmp_path / model.stem
        result = runner.invoke(app, ["sweep", str(model), "--context", "1024", "--contexts", "8",
                                     "--targets-per-context", "1", "--threads", "1", "--out", str(out)])
        assert result.exit_code == 0, result.output
        return json.loads((out / "summary.json").read_text()), pd.read_csv(out / "results.csv"), result.output

    short, short_rows, said = sweep(shaped["glm-5.3-flash"])
    assert short["verdict"] == "compressor inactive", short["headline"]
    assert "k-pool indexer keeps every pool a query sees" in short["headline"]
    assert "Compressor inactive at this length" in said and "keeps 256 of 256 visible pools (100%)" in said
    _, keep_all_rows, _ = sweep(shaped["keep-all"])
    difference = (short_rows["logprob"] - keep_all_rows["logprob"]).abs()
    assert difference.max() == 0, f"max {difference.max():.3g}, mean {difference.mean():.3g} nats"


def test_past_the_reach_the_indexer_changes_the_answers_and_the_run_is_not_labelled(shaped):
    from kvphase.backends.base import Query
    from kvphase.backends.llamacpp import LlamaCppBackend

    context = 2304
    assert compressor_inactive(read_model_info(shaped["glm-5.3-flash"]).compression, context, "llama.cpp") is None
    tokens = np.random.default_rng(0).integers(100, 20_000, context + 8).tolist()
    queries = [Query(tuple(tokens[context:context + 6]), tuple(tokens[context + 6:]))]
    logprobs = []
    for model in (shaped["glm-5.3-flash"], shaped["keep-all"]):
        backend = LlamaCppBackend(model, n_ctx=context + 64, n_threads=1)
        try:
            logprobs.append(backend.score(tokens[:context], queries)[0].logprob)
        finally:
            backend.close()
    assert abs(logprobs[0] - logprobs[1]) > 1e-3, logprobs


def test_minimax_runs_its_block_indexer_in_process(default_model, tmp_path):
    """llama.cpp runs MSA only under flash attention with a cache per sequence: the in-process backend
    opens minimax-m3 so, its branched query equals the whole text scored as one prompt, and the answers
    move when the indexer keeps fewer blocks than a query sees (dense attention would not move them)."""
    from kvphase.backends.base import Query
    from kvphase.backends.llamacpp import LlamaCppBackend

    tokens = np.random.default_rng(1).integers(100, 20_000, 308).tolist()
    branched = Query(tuple(tokens[300:304]), tuple(tokens[304:]))
    whole = Query(tuple(tokens[1:304]), tuple(tokens[304:]))
    scores = {}
    for top_k in (3, 1000):  # blocks of 4: 3 kept of the 76 a query sees, or every one
        model = write_tiny_model("minimax-m3", tmp_path / f"mm-{top_k}.gguf", tokenizer_from=default_model, top_k=top_k)
        backend = LlamaCppBackend(model, n_ctx=512, n_threads=1)
        try:
            scores[top_k] = backend.score(tokens[:300], [branched])[0].logprob, backend.score(tokens[:1], [whole])[0].logprob
            assert backend.engine_info()["flash_attn"]
        finally:
            backend.close()
    assert abs(scores[3][0] - scores[3][1]) < 1e-3, scores  # the branch is the whole prompt's answer
    assert abs(scores[3][0] - scores[1000][0]) > 0.01, scores  # the indexer acted (dense: equal to the last digit)


def test_minimax_runs_recorded_dense_are_labelled(shaped):
    spec = read_model_info(shaped["minimax-m3"]).compression
    assert "ran every layer dense" in compressor_inactive(spec, 8192, "llama.cpp", engine_ran_it=False)
    assert compressor_inactive(spec, 8192, "llama.cpp") is None
    assert "keeps every block" in compressor_inactive(spec, 1024, "server")


def test_calibration_searches_no_length_below_the_reach(shaped):
    from kvphase.sweep.plan import SweepPlan

    plan = SweepPlan(model="m.gguf", task="records", stride=4, modulus=8, context=8192, per_residue=8,
                     padding="prefix", seed=0, control=False)
    assert [level.context for level in easier_levels(plan, ("context",))] == [4096, 2048, 1024, 512, 256]
    assert [level.context for level in easier_levels(plan, ("context",), shortest=2051)] == [4096]


@pytest.mark.parametrize("top_k, fragment", [(6, "expected a multiple of attention.indexer.kpool (4)"),
                                             (0, "expected a positive whole number")])
def test_contradictory_indexer_settings_get_one_line(default_model, tmp_path, top_k, fragment):
    model = write_tiny_model("glm5-next", tmp_path / "bad.gguf", tokenizer_from=default_model, shape="glm-5.3-flash",
                             top_k=4)
    data = bytearray(model.read_bytes())
    key = b"glm5-next.attention.indexer.top_k"
    value_at = data.index(key) + len(key) + 4  # a key-value pair: the key, its type (uint32), then a uint32 value
    assert int.from_bytes(data[value_at:value_at + 4], "little") == 4
    data[value_at:value_at + 4] = int(top_k).to_bytes(4, "little")
    model.write_bytes(bytes(data))
    one_line_error(runner.invoke(app, ["inspect", str(model)]), "glm5-next.attention.indexer.top_k", fragment)
    one_line_error(runner.invoke(app, ["sweep", str(model), "--dry-run", "--out", str(tmp_path / "r")]),
                   "glm5-next.attention.indexer.top_k")
    assert not (tmp_path / "r").exists()


def test_targets_end_before_the_window_the_model_reads_raw(shaped, tmp_path):
    """DeepSeek-V4-Flash reads its last 128 tokens raw: a task whose records run up to the query (pairs)
    keeps its targets before them; the default task's demonstrations already do, so its plans stay put."""
    from dataclasses import replace

    from kvphase.engines.llamacpp import Vocab
    from kvphase.sweep.contexts import build_contexts
    from kvphase.sweep.layout import Layout
    from kvphase.sweep.plan import make_plan
    from kvphase.sweep.tasks import load_task

    info = read_model_info(shaped["deepseek-v4-flash"])
    plan = make_plan(info, stride=None, modulus=None, context=2048, per_residue=64, padding="in-sequence", task="pairs",
                     seed=0, fit=False, targets_per_context="auto")
    assert plan.raw_window == 128
    vocab, task = Vocab.load(info.path), load_task("pairs")
    record_max = Layout.of(task, vocab, plan.context_settings).record_max

    def last_record_end(p):
        return max(t.position for c in build_contexts(task, vocab, p.context_settings) for t in c.targets) + record_max

    assert last_record_end(plan) <= 2048 - 128
    assert last_record_end(replace(plan, raw_window=0)) > 2048 - 128  # without it, targets sit in the window
    assert make_plan(info, stride=None, modulus=None, context=2048, per_residue=8, padding="in-sequence",
                     task="records", seed=0, fit=False).raw_window == 0


def test_a_window_as_long_as_the_context_gets_one_line(shaped, tmp_path):
    result = runner.invoke(app, ["sweep", str(shaped["deepseek-v4-flash"]), "--context", "128", "--task", "pairs",
                                 "--dry-run", "--out", str(tmp_path / "r")])
    one_line_error(result, "deepseek4.attention.sliding_window", "--context 128")
    assert not (tmp_path / "r").exists()


def test_the_dry_run_says_where_targets_end(shaped, tmp_path):
    result = runner.invoke(app, ["sweep", str(shaped["deepseek-v4-flash"]), "--context", "1024", "--task", "pairs",
                                 "--per-residue", "8", "--dry-run", "--out", str(tmp_path / "r")], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert "every target ends before the last 128 tokens (sliding window)" in " ".join(result.output.split())
