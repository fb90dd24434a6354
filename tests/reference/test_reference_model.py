"""The numpy reference transformer against llama.cpp, and its attention policies.

llama.cpp on a Q4_1 file rounds activations to 8 bits before every matmul and keeps an
F16 KV cache. On SmolLM2-135M those roundings move the logits by ~0.15 on average, and
any change to them moves ~4% of the top-1 tokens: llama.cpp with flash attention, or
with an F32 KV cache, agrees with its own default run on 95-96% of them (see
reports/reference-agreement.md). So the exactness check runs llama.cpp on an F32 export of
the very weights the reference dequantizes; the Q4_1 file itself is checked against
llama.cpp's own spread, and must agree wherever llama.cpp's choice is no near-tie.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvphase.backends.base import Query, score_from_logits
from kvphase.designs import CompressedKV, attend
from kvphase.errors import PlanError
from kvphase.reference.agreement import (
    CLEAR_LEAD, GGML_TYPE_F32, agreement, lead, llamacpp_logits, natural_text,
)
from kvphase.gguf.writer import export_f32
from kvphase.reference.model import Transformer
from kvphase.reference.policy import CompressedAttention, make_policy, masked_attention
from kvphase.gguf.tiny import DENSE_TINY_ARCHS, TINY_VOCAB, write_tiny_model

pytestmark = pytest.mark.slow

N_TOKENS = 512  # the thresholds are shares and maxima, not counts; scripts/reference_agreement.py measures 1024 tokens


@pytest.fixture(scope="module")
def backend(default_model):
    from kvphase.backends.reference import ReferenceBackend

    b = ReferenceBackend(default_model)
    yield b
    b.close()


@pytest.fixture(scope="module")
def text_tokens(backend):
    tokens = backend.tokenize(natural_text())
    assert len(tokens) >= N_TOKENS, f"the test text has only {len(tokens)} tokens"
    return tokens[:N_TOKENS]


@pytest.fixture(scope="module")
def reference_logits(backend, text_tokens):
    backend.policy = make_policy("dense")
    return backend.logits(text_tokens)  # (n_tokens, n_vocab)


def test_matches_llamacpp_on_the_same_weights(default_model, text_tokens, reference_logits, tmp_path_factory):
    f32 = tmp_path_factory.mktemp("f32") / "model-f32.gguf"
    export_f32(default_model, f32)
    expected = llamacpp_logits(f32, text_tokens, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    f32.unlink()
    got = agreement(reference_logits, expected)
    print(f"reference vs llama.cpp on the F32 export, {len(text_tokens)} tokens: {got}")
    assert got.top1 >= 0.99, str(got)
    assert got.max_diff < 1e-2, str(got)


# llama.cpp settings that are all correct and differ only in rounding: each is compared
# with the default run (F16 KV cache, no flash attention) to measure llama.cpp's own spread
LLAMACPP_VARIANTS = {
    "flash attention": {"flash_attn": True},
    "F32 KV cache": {"type_k": GGML_TYPE_F32, "type_v": GGML_TYPE_F32},
}


def test_quantized_file_within_llamacpp_own_spread(default_model, text_tokens, reference_logits):
    default = llamacpp_logits(default_model, text_tokens)
    own = {name: agreement(llamacpp_logits(default_model, text_tokens, **params), default)
           for name, params in LLAMACPP_VARIANTS.items()}
    got = agreement(reference_logits, default)
    report = f"reference vs llama.cpp on the Q4_1 file: {got}; llama.cpp with " + "; with ".join(
        f"{name}: {a}" for name, a in own.items())
    clear = lead(default) > CLEAR_LEAD  # (n_tokens,) no near-tie for llama.cpp
    on_clear = agreement(reference_logits[clear], default[clear])
    report += f"; where llama.cpp leads by more than {CLEAR_LEAD} ({clear.mean():.0%} of tokens): {on_clear}"
    print(report)
    assert got.top1 >= min(a.top1 for a in own.values()) - 0.01, report
    assert got.mean_diff <= 1.5 * max(a.mean_diff for a in own.values()), report
    assert clear.mean() > 0.3 and on_clear.top1 >= 0.99, report


@pytest.mark.parametrize("arch", sorted(DENSE_TINY_ARCHS))
def test_each_layout_matches_llamacpp(arch, tmp_path):
    """llama: tied output, RoPE frequency divisors; qwen2: NEOX RoPE, Q/K/V biases, linear
    RoPE scaling; qwen3: per-head Q/K norms, head width != n_embd / n_head. All: grouped-query
    attention, norm weights that are not ones."""
    path = write_tiny_model(arch, tmp_path / f"{arch}.gguf")
    tokens = np.random.default_rng(0).integers(0, TINY_VOCAB, 100).tolist()
    expected = llamacpp_logits(path, tokens, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    model = Transformer.from_gguf(path)
    c = model.config
    features = (c.tied_output, model.w.rope_freqs is not None, c.qkv_bias, c.rope_scale != 1.0, c.qk_norm, c.rope_neox)
    assert features == {
        "llama": (True, True, False, False, False, False),
        "qwen2": (False, False, True, True, False, True),
        "qwen3": (False, False, False, False, True, True),
    }[arch] and c.n_group == 2
    got = agreement(model.forward(tokens, model.new_cache()), expected)
    assert got.top1 == 1.0 and got.max_diff < 1e-4, f"{arch}: {got}"
    wrong_rope = Transformer(dataclasses.replace(c, rope_neox=not c.rope_neox), model.w)
    missed = agreement(wrong_rope.forward(tokens, wrong_rope.new_cache()), expected)
    assert missed.max_diff > 1.0, f"{arch} with the other RoPE pairing should miss: {missed}"


def test_tokens_match_llamacpp(backend, default_model):
    import llama_cpp

    llm = llama_cpp.Llama(str(default_model), vocab_only=True, verbose=False)
    text = "Elswick's harbor, 1867: rope & herring!"
    assert backend.tokenize(text) == llm.tokenize(text.encode(), add_bos=False)
    assert backend.detokenize(backend.tokenize(text)) == text


QUERIES = [
    Query(prompt=(28,), answer=(3575, 282)),
    Query(prompt=(378, 3575, 282), answer=(7476, 314, 7042)),
    Query(prompt=(30,), answer=(198,)),
]


# the cache and policy logic is the point of the next tests, not SmolLM2's weights: the tiny llama (tiny_backend)
@pytest.mark.parametrize(
    "design, options",
    [("dense", {}), ("meanpool", {"window": 4, "stride": 4, "local_window": 8, "stagger": "layer"})],
)
def test_shared_context_equals_separate_prompts(tiny_backend, text_tokens, design, options):
    tiny_backend.policy = make_policy(design, **options)
    context = text_tokens[:100]
    shared = tiny_backend.score(context, QUERIES)
    for query, got in zip(QUERIES, shared):
        full = list(context) + list(query.prompt) + list(query.answer)
        logits = tiny_backend.logits(full)  # (n_full, n_vocab)
        first = len(context) + len(query.prompt) - 1
        alone = score_from_logits(logits[first : first + len(query.answer)], query.answer)
        assert got.predicted == alone.predicted
        assert got.logprob == pytest.approx(alone.logprob, abs=1e-3)
    tiny_backend.policy = make_policy("dense")


def test_switching_policy_evaluates_the_context_again(tiny_backend, text_tokens):
    context, query = list(text_tokens[:80]), QUERIES[1]
    tiny_backend.policy = make_policy("dense")
    tiny_backend.score(context, [query])
    tiny_backend.policy = make_policy("meanpool", window=4, stride=4)
    got = tiny_backend.score(context, [query])[0]
    logits = tiny_backend.logits(context + list(query.prompt) + list(query.answer))  # (n_full, n_vocab)
    tiny_backend.policy = make_policy("dense")
    first = len(context) + len(query.prompt) - 1
    alone = score_from_logits(logits[first : first + len(query.answer)], query.answer)
    assert got.logprob == pytest.approx(alone.logprob, abs=1e-3)


def test_meanpool_of_single_tokens_is_dense(backend, text_tokens, reference_logits):
    backend.policy = make_policy("meanpool", window=1, stride=1)
    got = backend.logits(text_tokens[:96])
    backend.policy = make_policy("dense")
    diff = np.abs(got - reference_logits[:96])
    assert diff.max() < 1e-3, f"max |diff| {diff.max():.3g}, mean {diff.mean():.3g}"


def test_staggered_offsets_differ_per_layer_and_head():
    by_layer = make_policy("meanpool", window=4, stride=4, stagger="layer")
    assert [by_layer.start(layer, 0, 3) for layer in range(6)] == [0, 1, 2, 3, 0, 1]
    assert {by_layer.start(2, h, 3) for h in range(3)} == {2}
    by_head = make_policy("blocktopk", block_size=8, top_k=2, stagger="head", stagger_step=3, start=1)
    assert [by_head.start(5, h, 3) for h in range(3)] == [1, 4, 7]
    both = make_policy("kpool", kpool=4, top_k=8, stagger="layer_head")
    assert [both.start(1, h, 3) for h in range(3)] == [3, 0, 1]
    fixed = make_policy("meanpool", window=4, stride=4, start=2)
    assert {fixed.start(layer, h, 3) for layer in range(4) for h in range(3)} == {2}


def test_randomized_offsets_are_seeded_per_context():
    policy = make_policy("meanpool", window=8, stride=8, randomize=True, seed=7)
    key_a = policy.begin([1, 2, 3])
    starts_a = [policy.start(layer, h, 3) for layer in range(10) for h in range(3)]
    assert len(set(starts_a)) > 3 and all(0 <= s < 8 for s in starts_a)
    key_b = policy.begin([1, 2, 4])
    assert key_b != key_a
    assert [policy.start(layer, h, 3) for layer in range(10) for h in range(3)] != starts_a
    policy.begin([1, 2, 3])
    assert [policy.start(layer, h, 3) for layer in range(10) for h in range(3)] == starts_a
    other_seed = make_policy("meanpool", window=8, stride=8, randomize=True, seed=8)
    other_seed.begin([1, 2, 3])
    assert [other_seed.start(layer, h, 3) for layer in range(10) for h in range(3)] != starts_a


def test_staggering_changes_the_model_output(tiny_backend, text_tokens):
    context = text_tokens[:100]
    results = {}
    for stagger in ("none", "layer"):
        tiny_backend.policy = make_policy("meanpool", window=4, stride=4, local_window=4, stagger=stagger)
        results[stagger] = tiny_backend.score(context, QUERIES[:1])[0].logprob
    tiny_backend.policy = make_policy("dense")
    assert results["none"] != pytest.approx(results["layer"], abs=1e-4)


@pytest.mark.parametrize(
    "design, options",
    [
        ("meanpool", {"window": 8, "stride": 4, "local_window": 16}),
        ("meanpool", {"window": 4, "stride": 4, "randomize": True, "seed": 3}),
        ("blocktopk", {"block_size": 8, "top_k": 4, "local_window": 8, "stagger": "head"}),
        ("kpool", {"kpool": 4, "top_k": 32, "stagger": "layer_head"}),
        ("kpool", {"kpool": 4, "top_k": 16, "select_tail": False, "layers": [0, 10, 20]}),
    ],
)
def test_sweep_smoke_each_design(backend, text_tokens, design, options):
    backend.policy = make_policy(design, **options)
    scores = backend.score(text_tokens[:100], QUERIES)
    backend.policy = make_policy("dense")
    assert len(scores) == len(QUERIES)
    for query, score in zip(QUERIES, scores):
        assert np.isfinite(score.logprob) and score.logprob <= 0
        assert len(score.predicted) == len(query.answer)


def test_make_policy_rejects_bad_requests():
    with pytest.raises(PlanError, match="runs designs"):
        make_policy("nosuch")
    with pytest.raises(PlanError, match="weights"):
        make_policy("dsv4")
    with pytest.raises(PlanError, match="unknown"):
        make_policy("meanpool", window=4, stride=4, colour="red")
    with pytest.raises(PlanError, match="stride"):
        make_policy("meanpool", window=4, stride=0)
    with pytest.raises(PlanError, match="stagger"):
        make_policy("meanpool", window=4, stride=4, stagger="diagonal")
    with pytest.raises(PlanError, match="no options"):
        make_policy("dense", window=4)


def test_masked_attention_equals_designs_attend():
    rng = np.random.default_rng(0)
    n_query, n_group, n_entries, head_dim = 5, 3, 11, 8
    q = rng.standard_normal((n_group, n_query, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_entries, head_dim)).astype(np.float32)
    v = rng.standard_normal((n_entries, head_dim)).astype(np.float32)
    visible = rng.random((n_query, n_entries)) < 0.5
    visible[0] = False  # a query that sees nothing gets zeros in both
    cache = CompressedKV(k[:, None], v[:, None], visible, np.arange(n_entries), np.arange(n_entries))
    expected = attend(q.transpose(1, 0, 2), cache, scale=0.3)  # (n_query, n_group, head_dim)
    got = masked_attention(q, k, v, visible, 0.3).transpose(1, 0, 2)  # (n_query, n_group, head_dim)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_compressed_attention_wraps_only_chosen_layers(tiny_backend, text_tokens):
    policy = make_policy("meanpool", window=4, stride=4, layers=[])
    assert isinstance(policy, CompressedAttention)
    tiny_backend.policy = policy
    got = tiny_backend.logits(text_tokens[:64])
    tiny_backend.policy = make_policy("dense")
    np.testing.assert_allclose(got, tiny_backend.logits(text_tokens[:64]), atol=1e-4)


@pytest.fixture(scope="module")
def tiny_backend(tiny_llama):
    """The cache logic, not the model, is the point."""
    from kvphase.backends.reference import ReferenceBackend

    b = ReferenceBackend(tiny_llama)
    yield b
    b.close()


@pytest.mark.parametrize("options", [dict(design="dense"),
                                     dict(design="meanpool", window=4, stride=4, stagger="layer"),
                                     dict(design="meanpool", window=4, stride=4, randomize=True, seed=3)],
                         ids=["dense", "staggered", "randomized"])
def test_contexts_scored_in_turn_equal_each_scored_afresh(tiny_backend, options):
    """The backend keeps the prefix one context shares with the previous one: contexts that share
    40, 60 (a longer one), 30 (a shorter one) or 0 tokens with the one before, or repeat it, score
    as each does alone; under randomized offsets no prefix is shared (each context draws its own)."""
    tiny_backend.policy = make_policy(**options)
    text = np.random.default_rng(0).integers(100, 40_000, 300).tolist()
    contexts = [text[:60], text[:40] + text[200:230], text[:40] + text[200:230] + text[100:120], text[:30],
                text[:30], text[250:290]]
    queries = [Query(prompt=(28, 30), answer=(3575, 282)), Query(prompt=(378,), answer=(7476,))]
    in_turn = [tiny_backend.score(c, queries) for c in contexts]
    for context, got in zip(contexts, in_turn):
        for query, score in zip(queries, got):
            full = context + list(query.prompt) + list(query.answer)
            if hasattr(tiny_backend.policy, "begin"):
                tiny_backend.policy.begin(context)  # this context's own offsets, as score() draws them
            logits = tiny_backend.logits(full)  # (n_full, n_vocab), from an empty cache
            first = len(context) + len(query.prompt) - 1
            alone = score_from_logits(logits[first: first + len(query.answer)], query.answer)
            assert score.logprob == pytest.approx(alone.logprob, abs=1e-5), (len(context), score, alone)
    tiny_backend.policy = make_policy("dense")
