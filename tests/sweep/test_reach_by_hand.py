"""The compressor's reach against counts made by hand from the rules in docs/sweep.md (issue 76):
the raw window's part of the "compressor inactive" label, which layers `inspect` names for each
part of a deepseek4 file, and the query's own tokens in the label of a GLM-5.3-shaped run."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.gguf.modelinfo import read_model_info
from kvphase.gguf.reach import reach_of
from kvphase.gguf.tiny import write_tiny_model
from kvphase.sweep.reach_check import compressor_inactive, plan_inactive

DSV4_FLASH_WINDOW, DSV4_FLASH_KEEPS = 128, 512  # DeepSeek-V4-Flash's sliding_window and index_topk
GLM53_KPOOL, GLM53_KEEPS = 4, 2048 // 4  # GLM-5.3-Flash: pools of 4 tokens, top_k 2048 tokens = 512 pools


def _deepseek4_touches_a_position(tokens: int, strides=(4, 128), window=DSV4_FLASH_WINDOW,
                                  keeps=DSV4_FLASH_KEEPS) -> bool:
    """docs/sweep.md, counted position by position: the predicting token (position tokens - 1) reads its
    last `window` tokens raw; a position before them is read through the pooled entry of its block once
    that block is complete (floor(tokens / r) entries of r tokens); the lightning indexer drops an entry
    once more than `keeps` complete 4-token entries are visible."""
    before_window = range(max(0, tokens - window))  # positions the window does not read raw
    pooled = any(position < (tokens // r) * r for r in strides for position in before_window)
    return pooled or tokens // 4 > keeps


@pytest.fixture(scope="module")
def deepseek4_flash(tmp_path_factory):
    """Metadata is all the reach reads: no tokenizer needed."""
    return write_tiny_model("deepseek4", tmp_path_factory.mktemp("ds4") / "ds4-flash.gguf", shape="deepseek-v4-flash")


def test_deepseek4_flash_at_a_short_length_is_inactive_exactly_while_its_window_holds_every_position(deepseek4_flash):
    spec = read_model_info(deepseek4_flash).compression
    reach = reach_of(spec)
    lengths = [*range(1, 300), *range(2040, 2060)]
    wrong = [n for n in lengths if (reach.idle_at(n) is None) != _deepseek4_touches_a_position(n)]
    assert not wrong, f"idle_at disagrees with the hand count at {wrong[:8]} tokens"
    assert not _deepseek4_touches_a_position(128) and _deepseek4_touches_a_position(129)  # the count's own edge
    # the label of a run: `context` tokens and a query room of 16 more are predicted inside the window
    label = compressor_inactive(spec, 100, "llama.cpp", query_room=16)
    assert label.startswith("at 100 tokens the lightning indexer keeps every entry a query sees (at most 29;"), label
    assert label.endswith("; every target sits inside the 128-token sliding window"), label
    assert compressor_inactive(spec, 100, "llama.cpp", query_room=29) is None  # 129 tokens: position 0 is pooled


def _write_deepseek4(path, ratios: tuple[int, ...]):
    from kvphase.gguf.tiny import init_tensor
    from kvphase.gguf.tiny_archs import DSV4Layout, deepseek4_spec
    from kvphase.gguf.writer import write_gguf

    spec, rng = deepseek4_spec(DSV4Layout(ratios=ratios)), np.random.default_rng(0)
    write_gguf(path, "deepseek4", spec.keys, ((name, init_tensor(rng, ne, kind)) for name, ne, kind in spec.tensors))
    return path


def test_inspect_names_the_layers_that_carry_each_part_of_a_deepseek4_file(tmp_path):
    """Ratios 128, 4, 4, 0, 128, 4 on six layers: the ratio-4 (CSA) layers 1, 2 and 5 pool every 4 tokens and
    carry the lightning indexer; the ratio-128 (HCA) layers 0 and 4 pool every 128 tokens and have none."""
    model = _write_deepseek4(tmp_path / "mixed.gguf", (128, 4, 4, 0, 128, 4))
    result = CliRunner().invoke(app, ["inspect", str(model)], terminal_width=400)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "CSA entries pool every 4 tokens (layers 1-2, 5) from 4 tokens on" in said, said
    assert "HCA entries pool every 128 tokens (layers 0, 4) from 128 tokens on" in said, said
    assert "the lightning indexer (layers 1-2, 5) keeps 4 entries of 4 tokens" in said, said


def test_a_glm53_run_whose_answers_are_predicted_past_2052_tokens_is_not_labelled_inactive(default_model, tmp_path):
    """GLM-5.3-Flash keeps 512 pools of 4; a token with n tokens up to and including it sees floor(n / 4)
    complete pools, so the indexer drops one from n = 2,052 on. At --context 2048 the contexts are shorter than
    that, but the queries' own tokens (and each query phase's filler) carry their answers past it."""
    from kvphase.engines.llamacpp import Vocab
    from kvphase.sweep.contexts import build_contexts
    from kvphase.sweep.plan import make_plan
    from kvphase.sweep.tasks import load_task

    model = write_tiny_model("glm5-next", tmp_path / "glm53.gguf", tokenizer_from=default_model, shape="glm-5.3-flash")
    info = read_model_info(model)
    plan = make_plan(info, stride=None, modulus=None, context=2048, per_residue=8, padding="in-sequence",
                     task="records", seed=0, fit=False, targets_per_context="auto", query_phases=True)
    contexts = build_contexts(load_task(plan.task), Vocab.load(model), plan.context_settings)
    # tokens up to and including the one that predicts each answer's last token: context, query, answer but its last
    predicted_at = [len(c.tokens) + len(t.query.prompt) + len(t.query.answer) - 1 for c in contexts for t in c.targets]
    dropping = [n for n in predicted_at if n // GLM53_KPOOL > GLM53_KEEPS]
    assert dropping, f"no answer predicted past 2,051 tokens (longest at {max(predicted_at)}): the test would not bite"
    assert plan_inactive(info.compression, plan) is None, (
        f"labelled inactive, yet {len(dropping)} of {len(predicted_at)} answer tokens are predicted where the indexer "
        f"keeps 512 of up to {max(dropping) // GLM53_KPOOL} pools")
