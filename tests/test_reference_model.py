"""The numpy reference transformer against llama.cpp, and its attention policies.

llama.cpp on a Q4_1 file quantizes activations to 8 bits before every matmul and keeps
an F16 KV cache; on SmolLM2-135M those roundings move the logits by ~0.15 on average,
and llama.cpp disagrees with itself (flash attention on vs off) on ~4% of top-1
tokens. So the exactness check runs llama.cpp on an F32 export of the very weights the
reference dequantizes (F32 KV cache); the Q4_1 file itself is checked against
llama.cpp's own run-to-run noise.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvphase.backends.base import Query, score_from_logits
from kvphase.designs import CompressedKV, attend
from kvphase.errors import PlanError
from kvphase.reference.policy import CompressedAttention, make_policy, masked_attention

pytestmark = pytest.mark.slow

TEXT = """The harbor town of Elswick sits where a slow river meets a cold grey sea. For most of its history it was known for two things: herring and rope. Every morning before dawn the fishing boats slipped out past the breakwater, their lamps swinging in the dark, and every evening they came back low in the water, trailed by gulls that screamed over the gutting tables on the quay. Behind the harbor, in long brick sheds that ran up the hill, the ropemakers twisted hemp into lines thick enough to moor a steamship.

The town grew the way such towns do. First there was a chapel, then a school, then a second chapel built by people who disagreed with the first one about something that nobody now remembers. A railway arrived in the eighteen-sixties and brought visitors from the inland cities, who walked along the promenade in their best clothes and complained about the wind. A small hotel opened, and then a larger one, and for a few decades Elswick had the faintly surprised air of a working port that had accidentally become a resort.

Nothing lasts forever, and the herring left first. Nobody agreed on why. The old fishermen blamed the new steam trawlers from the south, which dragged their nets along the bottom and took everything. The scientists who came up from the university blamed the water temperature, which had risen by a degree or so, and the plankton, which had moved north. The priests, naturally, had their own ideas. Whatever the reason, the catches shrank year after year until the boats no longer paid for their fuel, and one by one they were sold, or scrapped, or left to rot on the mud at the top of the harbor.

The ropeworks held on longer. During the war the sheds ran day and night, making lines for the navy, and the town was busier than it had ever been. Women who had never worked outside their homes learned to feed the spinning machines and splice the heavy cables, and many of them kept working when the war was over. But after the war came nylon, which was lighter and stronger and did not rot, and the hemp lines of Elswick were suddenly old-fashioned. The last shed closed on a wet Friday in November. The workers were given a week's wages and a small clock each, and the machines were sold for scrap metal to a dealer from the coast.

For a while it looked as though the town itself might simply fade away. Young people left for the cities, where there was work, and did not come back. Shops on the high street closed and stayed closed, their windows whitewashed over. The larger hotel became a home for the elderly, and then it became nothing at all, and its windows were boarded up against the gulls. Visitors still came in the summer, but fewer of them, and they stayed for an afternoon rather than a fortnight.

What saved Elswick, in the end, was an accident. A painter from the capital, a restless woman named Margaret Hale, missed her train one evening and had to spend the night in the only guest house that was still open. In the morning she walked down to the harbor and saw the light. Anyone who has been there will know what she meant. Because the town faces east across a wide shallow bay, the early sun comes in low over the water and turns everything it touches, the wet stones, the old sheds, the hulls of the abandoned boats, a strange pale gold. Margaret Hale stayed for a week, and then for a summer, and then for the rest of her life.

She bought one of the empty rope sheds for almost nothing and turned it into a studio. Her friends came to visit, and some of them stayed too. Within ten years there were a dozen painters working in the old sheds, and a potter, and a man who built violins, and a small gallery on the quay that sold their work to the visitors who had begun, slowly, to return. The visitors were different now. They did not promenade in their best clothes; they wore walking boots and carried sketchbooks, and they wanted to know the history of every building in the town.

The people of Elswick were not sure what to make of it at first. The painters kept strange hours and did not go to either chapel. They paid good money for things that the townspeople considered worthless, such as broken lobster pots and the figureheads of wrecked ships. But they also bought bread and fish and beer, and they rented rooms, and they hired local builders to fix their leaking roofs. Gradually the whitewash came off the shop windows. A bakery opened, and then a bookshop, and then a restaurant that served the same fish the town had always eaten, but at three times the price and with a sauce.

Today Elswick is, by most measures, doing well. The harbor is full again, although the boats are yachts rather than trawlers, and the sheds on the hill are studios and workshops and, in one case, a small brewery. The old hotel has been restored and reopened. The school, which was nearly closed in the seventies, has more children than it can easily fit. There is a festival every August, when the whole town fills with music and the painters open their doors to the public.
"""

N_TOKENS = 1024


@pytest.fixture(scope="module")
def backend(default_model):
    from kvphase.backends.reference import ReferenceBackend

    b = ReferenceBackend(default_model)
    yield b
    b.close()


@pytest.fixture(scope="module")
def text_tokens(backend):
    tokens = backend.tokenize(TEXT)
    assert len(tokens) >= N_TOKENS, f"the test text has only {len(tokens)} tokens"
    return tokens[:N_TOKENS]


@pytest.fixture(scope="module")
def reference_logits(backend, text_tokens):
    backend.policy = make_policy("dense")
    return backend.logits(text_tokens)  # (n_tokens, n_vocab)


def llamacpp_logits(path, tokens, **params) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=2048, n_threads=2, verbose=False, **params)
    try:
        llm.eval(tokens)
        return np.array(llm.scores[: len(tokens)], dtype=np.float32)  # (n_tokens, n_vocab)
    finally:
        llm.close()


def export_f32(src, dst) -> None:
    """Write `src` again with every tensor dequantized to F32 by gguf (what the reference reads)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
    from gguf.quants import dequantize

    reader = GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if field.name == "general.file_type":
            writer.add_file_type(LlamaFileType.ALL_F32)
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind, sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, values.reshape([int(d) for d in tensor.shape[::-1]]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def agreement(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """Top-1 agreement, max and mean absolute logit difference."""
    diff = np.abs(a - b)
    return float(np.mean(a.argmax(1) == b.argmax(1))), float(diff.max()), float(diff.mean())


def test_matches_llamacpp_on_the_same_weights(default_model, text_tokens, reference_logits, tmp_path_factory):
    f32 = tmp_path_factory.mktemp("f32") / "model-f32.gguf"
    export_f32(default_model, f32)
    expected = llamacpp_logits(f32, text_tokens, type_k=0, type_v=0)  # GGML_TYPE_F32 KV cache
    f32.unlink()
    top1, max_diff, mean_diff = agreement(reference_logits, expected)
    report = f"{len(text_tokens)} tokens: top-1 agreement {top1:.2%}, max |diff| {max_diff:.3g}, mean {mean_diff:.3g}"
    print(report)
    assert top1 >= 0.99, report
    assert max_diff < 1e-2, report


def test_quantized_file_within_llamacpp_noise(default_model, text_tokens, reference_logits):
    plain = llamacpp_logits(default_model, text_tokens)
    flash = llamacpp_logits(default_model, text_tokens, flash_attn=True)
    own, own_max, own_mean = agreement(plain, flash)
    top1, max_diff, mean_diff = agreement(reference_logits, plain)
    report = (f"reference vs llama.cpp Q4_1: top-1 {top1:.2%}, max |diff| {max_diff:.3g}, mean {mean_diff:.3g}; "
              f"llama.cpp vs itself (flash attention on/off): top-1 {own:.2%}, max {own_max:.3g}, mean {own_mean:.3g}")
    print(report)
    assert top1 >= own - 0.03, report
    assert mean_diff <= 2 * own_mean + 0.05, report


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


@pytest.mark.parametrize(
    "design, options",
    [("dense", {}), ("meanpool", {"window": 4, "stride": 4, "local_window": 8, "stagger": "layer"})],
)
def test_shared_context_equals_separate_prompts(backend, text_tokens, design, options):
    backend.policy = make_policy(design, **options)
    context = text_tokens[:100]
    shared = backend.score(context, QUERIES)
    for query, got in zip(QUERIES, shared):
        full = list(context) + list(query.prompt) + list(query.answer)
        logits = backend.logits(full)  # (n_full, n_vocab)
        first = len(context) + len(query.prompt) - 1
        alone = score_from_logits(logits[first : first + len(query.answer)], query.answer)
        assert got.predicted == alone.predicted
        assert got.logprob == pytest.approx(alone.logprob, abs=1e-3)
    backend.policy = make_policy("dense")


def test_switching_policy_evaluates_the_context_again(backend, text_tokens):
    context, query = list(text_tokens[:80]), QUERIES[1]
    backend.policy = make_policy("dense")
    backend.score(context, [query])
    backend.policy = make_policy("meanpool", window=4, stride=4)
    got = backend.score(context, [query])[0]
    logits = backend.logits(context + list(query.prompt) + list(query.answer))  # (n_full, n_vocab)
    backend.policy = make_policy("dense")
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


def test_staggering_changes_the_model_output(backend, text_tokens):
    context = text_tokens[:100]
    results = {}
    for stagger in ("none", "layer"):
        backend.policy = make_policy("meanpool", window=4, stride=4, local_window=4, stagger=stagger)
        results[stagger] = backend.score(context, QUERIES[:1])[0].logprob
    backend.policy = make_policy("dense")
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


def test_compressed_attention_wraps_only_chosen_layers(backend, text_tokens):
    policy = make_policy("meanpool", window=4, stride=4, layers=[])
    assert isinstance(policy, CompressedAttention)
    backend.policy = policy
    got = backend.logits(text_tokens[:64])
    backend.policy = make_policy("dense")
    np.testing.assert_allclose(got, backend.logits(text_tokens[:64]), atol=1e-4)
