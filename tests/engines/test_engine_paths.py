"""Every engine path kvphase scores on gives the answer the whole text gives as one prompt in one
batch (issue 62), on tiny random-weight models of each compressed architecture through llama.cpp.

The paths (`kvphase.conform.paths`): kvphase's branch (a first query on a copy of the context's
sequence, removed, then the query checked) after a context ending at every residue mod 4 and, for
deepseek4, at 127/128/129 and 255/256/257 around its 128-token HCA blocks; the answer decoded one
token per decode; the query cut into two decodes inside a block. Tolerance: 0.01 nats per answer
token. Random weights leave nothing but the path to change the numbers, so only rounding separates
them: flash attention's F16 products and kernels chosen by batch shape (the largest measured here,
1e-3, is minimax-m3's under flash attention), while a path that loses or re-pools a block moves an
answer by tenths of a nat (the planted defects below).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvphase.backends.base import Query
from kvphase.conform.paths import AROUND_HCA, PATHS, PathCheck, answer_rows, check_paths
from kvphase.conform.ties import IndexerTie, first_tie, recorded, tapped
from kvphase.gguf.tiny import TINY_VOCAB, write_tiny_model

WORDS = " the grass is green and the sky is blue while a river runs past seven old houses"
SETTINGS = {"deepseek4": AROUND_HCA, "glm5-next": (), "minimax-m3": ()}  # tiny.py: glm5-next's k-pool keeps 2 of its pools


@pytest.fixture(scope="module")
def tiny_backends(tmp_path_factory):
    from kvphase.backends.llamacpp import LlamaCppBackend

    folder = tmp_path_factory.mktemp("paths")
    backends = {arch: LlamaCppBackend(write_tiny_model(arch, folder / f"{arch}.gguf"), n_ctx=1024, n_threads=1)
                for arch in SETTINGS}
    yield backends
    for backend in backends.values():
        backend.close()


def _failures(checks) -> str:
    return "\n".join(c.line() for c in checks if c.status != "PASS")


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(SETTINGS))
def test_every_path_gives_the_one_prompt_answer(tiny_backends, arch):
    checks = check_paths(tiny_backends[arch], TINY_VOCAB, 4, SETTINGS[arch])
    assert [c.path for c in checks] == list(PATHS)
    assert all(c.tried == 4 + len(SETTINGS[arch]) for c in checks)
    assert all(c.status == "PASS" for c in checks), _failures(checks)


@pytest.mark.slow
def test_minimax_m3_is_scored_with_its_sparse_attention(tiny_backends):
    """llama.cpp runs minimax-m3's block-sparse attention only under flash attention with one KV
    stream per sequence, and dense attention otherwise; the backend must score what a hand-made
    context of the sparse setting gives, and the dense one must be far from it (else this test
    could not tell them apart)."""
    from kvphase.engines import llamacpp as engine

    backend = tiny_backends["minimax-m3"]
    tokens = np.random.default_rng(1).integers(0, TINY_VOCAB, 200).tolist()
    context, prompt, answer = tokens[:192], tuple(tokens[192:196]), tuple(tokens[196:])
    ours = backend.answer_logprobs(context, [Query(prompt, answer)])[0][np.arange(4), list(answer)]
    sparse, dense = (_one_batch(backend._model, tokens, flash) for flash in (True, False))
    near, far = np.abs(ours - sparse), np.abs(dense - sparse)
    assert near.max() <= 0.01, f"against the sparse path: max {near.max():.3g}, mean {near.mean():.3g} nats"
    assert far.max() > 0.1, f"dense and sparse attention agree: max {far.max():.3g}, mean {far.mean():.3g} nats"


def _one_batch(model, tokens: list[int], flash_attn: bool) -> np.ndarray:
    """The last 4 tokens' log-probabilities, the text decoded in one batch in a one-sequence context."""
    import llama_cpp

    from kvphase.backends.base import log_softmax_rows
    from kvphase.engines import llamacpp as engine

    ctx = engine.new_context(model, n_ctx=512, n_batch=len(tokens), n_threads=1, flash_attn=flash_attn)
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    rows = [(t, i, 0, i >= len(tokens) - 5) for i, t in enumerate(tokens[:-1])]
    try:
        assert engine.decode(ctx, batch, rows) == 0
        logprobs = log_softmax_rows(engine.logits(ctx, rows, TINY_VOCAB))  # (4, n_vocab)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    return logprobs[np.arange(4), tokens[-4:]]


def test_a_prefix_reuse_that_drops_the_incomplete_block_fails_the_branch_at_its_residues(monkeypatch):
    """The reference backend (deepseek4 trained model) with a planted path defect: rolling the cache
    back to a context also drops the context's incomplete block (llama.cpp #26063's class). Only the
    branch reuses a rolled-back context, and only contexts that end mid-block lose tokens."""
    from kvphase.backends.reference import ReferenceBackend
    from kvphase.reference.deepseek4 import TokenCache

    rolled_back = TokenCache.truncate
    monkeypatch.setattr(TokenCache, "truncate", lambda self, n: rolled_back(self, n - n % 4))
    backend = ReferenceBackend("tests/data/trained/csa-disjoint.gguf")
    branch, *others = check_paths(backend, 64, 4, base=48)  # the model holds 72 positions
    assert branch.status == "FAIL" and branch.about_residues, branch.line()
    assert sorted(length % 4 for length in branch.failed_lengths) == [1, 2, 3]
    assert "residue" in branch.line() and "FAIL" in branch.line()
    assert all(c.status == "PASS" for c in others), _failures(others)


def test_the_unplanted_reference_passes_every_path():
    from kvphase.backends.reference import ReferenceBackend

    checks = check_paths(ReferenceBackend("tests/data/trained/csa-disjoint.gguf"), 64, 4, base=48)
    assert all(c.status == "PASS" for c in checks), _failures(checks)


class _SpoilsWhereGenerationStarts:
    """A backend with a planted fault of where generation starts (vLLM #55927's class): when the
    prompt is decoded at once and the answer one token per decode (token by token), and the first
    answer token sits at `residue` mod `modulus`, every answer log-probability drops by 3 nats."""

    SPOIL = 3.0

    def __init__(self, backend, residue: int, modulus: int):
        self.backend, self.residue, self.modulus = backend, residue, modulus

    def answer_logprobs(self, context, queries, cuts=()):
        rows = self.backend.answer_logprobs(context, queries, cuts=cuts)
        generating = len(cuts) > 1 and all(b == a + 1 for a, b in zip(cuts, cuts[1:]))  # one token per decode
        if generating and (len(context) + cuts[0]) % self.modulus == self.residue:
            rows[-1] = rows[-1] - self.SPOIL
        return rows


@pytest.fixture(scope="module")
def csa_disjoint_reference():
    from kvphase.backends.reference import ReferenceBackend

    return ReferenceBackend("tests/data/trained/csa-disjoint.gguf")


@pytest.mark.parametrize("residue, modulus", [(3, 4), (6, 8)])
def test_answers_spoiled_where_generation_starts_fail_token_by_token_naming_the_answer_residue(
        csa_disjoint_reference, residue, modulus):
    """The contexts end at every residue mod `modulus`, so the answers start at every residue; only
    token by token starts generation after the prompt, and the line names the answer's residue (mod 8
    it differs from the context's: the query is 4 tokens), by the planted 3 nats."""
    spoiled = _SpoilsWhereGenerationStarts(csa_disjoint_reference, residue, modulus)
    branch, token_by_token, cut = check_paths(spoiled, 64, 4, base=48, modulus=modulus)  # 72 positions
    assert token_by_token.status == "FAIL" and token_by_token.tried == modulus, token_by_token.line()
    assert token_by_token.failed_residues == (residue,), token_by_token.line()
    assert token_by_token.failed_lengths == (48 + (residue - 4 - 48) % modulus,), token_by_token.line()
    assert f"token by token: FAIL: answers starting at residue {residue} mod {modulus} moved by up to 3 nats" \
        in token_by_token.line(), token_by_token.line()
    assert abs(token_by_token.max_difference - _SpoilsWhereGenerationStarts.SPOIL) < 1e-6
    assert all(c.status == "PASS" for c in (branch, cut)), _failures((branch, cut))
    assert f"PASS at every residue mod {modulus} (positions 52-{51 + modulus})" in branch.line(), branch.line()


def test_model_paths_start_answers_at_every_residue_and_around_the_large_blocks():
    """csa-top4's sweep groups mod 8 and its model holds 136 positions: answers at 8 residues, and
    contexts ending, and answers starting, just before, on and after the 128-token HCA boundary
    that fits (the 256 one does not)."""
    from kvphase.conform.paths import around_blocks

    assert around_blocks((128,), 128) == [123, 124, 125, 127, 128]
    assert around_blocks((256,), 600) == [251, 252, 253, 255, 256, 257, 507, 508, 509, 511, 512, 513]
    assert around_blocks((), 1000) == []


def test_a_failure_at_every_context_names_no_residue():
    everywhere = PathCheck("token by token", 65, 4, 0.8, 0.4, 0.01, failed_lengths=(64, 65, 66, 67), tried=4)
    some = PathCheck("branch", 65, 4, 0.8, 0.4, 0.01, failed_lengths=(65,), tried=4)
    assert "residue" not in everywhere.line() and "after every context tried" in everywhere.line()
    assert "answers starting at residue 1 mod 4" in some.line()  # the 65-token context's answer starts at 69


def test_a_server_of_minimax_m3_is_warned_of_the_settings_its_props_hide():
    from types import SimpleNamespace

    from kvphase.backends.dialects import ServerInfo
    from kvphase.backends.server_paths import path_warnings

    def server(slots):
        return ServerInfo("http://h:1", "llama-server", "m.gguf", 64, 2048, slots, "b1")

    def warned(architecture, slots, workers=None):
        vocab = SimpleNamespace(architecture=architecture) if architecture else SimpleNamespace()
        return path_warnings(SimpleNamespace(vocab=vocab, servers=[server(slots)], slots=workers))

    [one] = warned("minimax-m3", 1)
    assert one.startswith("http://h:1: ") and "-fa on" in one and "dense" in one and "-np auto" not in one
    [auto] = warned("minimax-m3", 4)
    assert "its 4 slots are what -np auto gives" in auto
    assert warned("deepseek4", 4) == [] and warned("", 1) == []  # a test's vocabulary names no architecture
    [glm] = warned("glm5-next", 2)
    assert "2 of its slots score at once" in glm and "--slots 1" in glm
    assert warned("glm5-next", 2, workers=1) == [] and warned("glm5-next", 1) == []


@pytest.mark.slow
@pytest.mark.time_limit(180)
def test_llama_server_paths_give_the_fresh_answer_on_minimax_m3_with_two_slots():
    """kvphase's launcher (-fa on for minimax-m3, -np 2: one cache stream per slot): the answer after
    a prefix-cache hit at every residue, and with two slots decoding at once, equals the text
    evaluated with nothing cached (the same tolerance as in process)."""
    from kvphase.backends.dialects import LlamaServer
    from kvphase.conform.paths import SERVER_PATHS, server_paths
    from kvphase.engines.llama_server import find_llama_server, llama_server

    model = "tests/data/conform/minimax-m3-random.gguf"
    with llama_server(Path(model), binary=find_llama_server(), threads=1, slots=2, n_ctx_per_slot=512) as server:
        engine = LlamaServer(server.url)
        info = engine.info()
        checks = server_paths(engine, 4, engine.tokenize(WORDS)[1:], info.n_ctx, info.slots)
    assert [c.path for c in checks] == list(SERVER_PATHS)
    assert all(c.status == "PASS" for c in checks), _failures(checks)
    # one prompt: every text's answer generated from its 4 answer positions (64-67 on: 7 starts)
    assert [c.tried for c in checks] == [7, 4, 4], [c.line() for c in checks]


class _NoPrefixCache:
    """A llama-server stand-in that evaluates every prompt whole (no prefix-cache hit), one slot."""

    kind = "llama-server"

    def __init__(self):
        self.http = self

    def post(self, path, body):
        return {}

    def _forced(self, slot, prompt, answer):
        return {"completion_probabilities": [{"logprob": -1.0} for _ in answer], "timings": {"prompt_n": len(prompt)}}


def test_a_server_without_prefix_reuse_or_a_second_slot_cannot_run_those_paths():
    from kvphase.conform.paths import server_paths

    one_prompt, hit, slots = server_paths(_NoPrefixCache(), 4, list(range(10, 60)), 512, 1)
    assert one_prompt.status == "PASS", one_prompt.line()
    assert hit.status == "cannot run" and "no prefix-cache hit" in hit.reason, hit.line()
    assert slots.status == "cannot run" and "1 slot" in slots.reason, slots.line()
    assert hit.line().startswith("prefix-cache hit: cannot run: the server evaluated")


# ----------------------------------------------------------------- indexer ties (issue 62's open FAIL)

GLM5_RANDOM = "tests/data/conform/glm5-next-random.gguf"


@pytest.fixture(scope="module")
def glm5_random():
    from kvphase.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(GLM5_RANDOM, n_ctx=1024, n_threads=1)
    yield backend
    backend.close()


@pytest.mark.slow
def test_glm5_next_random_branch_moves_only_after_an_indexer_tie(glm5_random):
    """The conform reference's branch after a 64-token context moved 0.53 nats on unpatched llama.cpp.
    At position 64 layer 0's k-pool scores tie at exactly 0 (ReLU) at the edge of the two pools it
    keeps, and the branch lays the query's pools out after the context's (slot 16 on, not 0), so
    libstdc++'s partial sort keeps another of the tied pools. UNDECIDED, not FAIL; the pin is
    `windows.partial_sort_sets`, libstdc++'s heap selection in numpy, on both slot layouts."""
    from kvphase.designs.windows import partial_sort_sets

    branch, *others = check_paths(glm5_random, glm5_random.n_vocab, 4)
    assert branch.status == "UNDECIDED" and branch.failed_lengths == (64,), branch.line()
    [(length, tie)] = branch.ties
    assert (length, tie.position, tie.layer, tie.margin) == (64, 64, 0, 0.0), branch.line()  # an exact tie
    assert tie.agreement < 1e-3 and tie.kept != tie.path_kept, branch.line()
    assert "UNDECIDED" in branch.line() and "an indexer tie explains every one" in branch.line()
    assert all(c.status == "PASS" for c in others), _failures(others)

    tokens = np.random.default_rng(0).integers(0, glm5_random.n_vocab, 72).tolist()  # check_paths' first text
    with tapped(glm5_random) as backend:
        _, one = recorded(backend, lambda b: answer_rows(b, tokens, 64, None))
    scores, kept = one[64, 0]  # (16,) the 16 pools that end before position 64
    rows = np.full((2, 64), -np.inf, np.float32)  # 64 slots: kpool_pad of 33 pools
    rows[0, :16], rows[1, 16:32] = scores, scores  # one prompt's pools from slot 0; the copy's after the context's 16
    one_prompt, on_copy = partial_sort_sets(rows, len(kept))
    assert (sorted(one_prompt), sorted(on_copy - 16)) == (list(tie.kept), list(tie.path_kept)), (one_prompt, on_copy)


@pytest.mark.slow
def test_a_branch_that_loses_its_copy_on_glm5_next_fails_and_is_no_tie(glm5_random, monkeypatch):
    """A real path defect on the same model (the query's sequence never gets the context: the copy
    dropped) must stay FAIL: the query sees other pools, no tie explains it."""
    monkeypatch.setattr(glm5_random._lc, "llama_memory_seq_cp", lambda *args: None)
    branch, *others = check_paths(glm5_random, glm5_random.n_vocab, 4)
    assert branch.status == "FAIL" and not branch.ties and len(branch.failed_lengths) == 4, branch.line()
    assert all(c.status == "PASS" for c in others), _failures(others)


def _selections(scores: list[list[float]], kept: list[list[int]]) -> dict:
    """(position, layer 0) -> (scores, kept units) for positions 10, 11, ..."""
    return {(10 + i, 0): (np.array(s, np.float32), np.array(k)) for i, (s, k) in enumerate(zip(scores, kept))}


ONE_PROMPT = _selections([[0.5, 0.0, 0.2], [0.0, 0.0, -0.1, 0.9]], [[0], [0, 3]])  # pools 0 and 1 tie at 11


@pytest.mark.parametrize("moved, margin", [(0.0, 0.0), (4e-4, 0.0), (4e-4, 5e-4)])
def test_a_tie_broken_the_other_way_is_found_where_selections_first_differ(moved, margin):
    """An exact tie, and a near one (pools 5e-4 apart) that rounding of 4e-4 swaps."""
    one = _selections([[0.5, 0.0, 0.2], [0.0, -margin, -0.1, 0.9]], [[0], [0, 3]])
    other = _selections([[0.5, 0.0, 0.2], [-moved, moved - margin, -0.1, 0.9]], [[0], [1, 3]])
    tie = first_tie(one, other)
    agreement = np.abs(other[11, 0][0] - one[11, 0][0]).max()
    assert tie == IndexerTie(0, 11, np.float32(margin), agreement, (0, 3), (1, 3)), tie
    assert tie.phrase().startswith("at position 11 in layer 0 the indexer kept pools [0, 3] as one prompt")


def test_a_trained_indexer_rounds_in_proportion_to_its_scores():
    """Scores in tens (the trained glm-kpool-top4's reach 40) round by more than random weights'."""
    one = _selections([[40.0, 0.0, 20.0], [0.0, 0.0, -1.0, 30.0]], [[0], [0, 3]])
    other = _selections([[40.05, 0.0, 20.0], [0.0, 0.0, -1.0, 30.0]], [[0], [1, 3]])
    tie = first_tie(one, other)
    assert tie is not None and (tie.position, tie.margin) == (11, 0.0), tie
    assert first_tie(one, _selections([[40.5, 0.0, 20.0], [0.0, 0.0, -1.0, 30.0]], [[0], [1, 3]])) is None


@pytest.mark.parametrize("case, scores, kept", [
    ("scores moved before the difference", [[0.6, 0.0, 0.2], [0.0, 0.0, -0.1, 0.9]], [[0], [1, 3]]),
    ("another number of pools", [[0.5, 0.0, 0.2], [0.0, 0.0, -0.1]], [[0], [1, 2]]),
    ("no selection differs", [[0.5, 0.0, 0.2], [0.0, 0.0, -0.1, 0.9]], [[0], [0, 3]]),
    ("a pool 0.1 below the edge swapped in", [[0.5, 0.0, 0.2], [0.0, 0.0, -0.1, 0.9]], [[0], [2, 3]]),
    ("a pool below a clear margin swapped in", [[0.5, 0.0, 0.2], [0.0, 0.0, -0.1, 0.9]], [[2], [0, 3]]),
])
def test_what_is_not_a_tie_is_not_called_one(case, scores, kept):
    assert first_tie(ONE_PROMPT, _selections(scores, kept)) is None, case


def test_an_undecided_path_does_not_fail_the_run_and_says_so():
    from kvphase.conform.check import ConformRun, Outcome

    tie = IndexerTie(0, 64, 0.0, 4.8e-4, (0, 10), (1, 10))
    undecided = PathCheck("branch", 64, 4, 0.53, 0.08, 0.01, failed_lengths=(64,), tried=4, ties=((64, tie),))
    failed = PathCheck("branch", 64, 4, 0.53, 0.08, 0.01, failed_lengths=(64, 65), tried=4, ties=((64, tie),))
    assert (undecided.status, failed.status) == ("UNDECIDED", "FAIL")
    assert "an indexer tie explains every one:" in undecided.line()
    assert "tie" not in undecided.line(with_tie=False)
    assert "FAIL" in failed.line() and "explains 1 of them" in failed.line()
    assert undecided.to_json()["ties"] == [{"length": 64, **tie.to_json()}]

    def run(path):
        return ConformRun("llama.cpp", [Outcome("m", "PASS", "", 1.0, paths=(path,))], Path("unused"))

    assert not run(undecided).failed and run(failed).failed
