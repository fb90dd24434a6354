"""The backend protocol (`backends.base`): every backend has its members, each real backend has
the optional abilities it should and no others, and a backend lacking an ability a caller needs
is refused with the library's error."""

from __future__ import annotations

import pytest

from kvphase.backends.base import (AnswerLogprobs, Backend, Query, RunsPolicy, ScoresMany, ServerFleet,
                                   ShiftsWindows, TapsGraph, score_contexts)
from kvphase.errors import PlanError
from kvphase.reference.model import DenseAttention
from kvphase.reference.policy import begin_context, make_policy
from tests.helpers.fakes import CharBackend

from tests.helpers.fake_servers import ByteVocab, FakeServer

ABILITIES = (ScoresMany, AnswerLogprobs, ShiftsWindows, ServerFleet, TapsGraph, RunsPolicy)


def abilities(backend) -> set:
    return {ability.__name__ for ability in ABILITIES if isinstance(backend, ability)}


def assert_is_a_backend(backend) -> None:
    missing = [name for name in ("tokenize", "detokenize", "prefix_ids", "n_ctx_train", "score", "tokens_evaluated",
                                 "n_threads", "engine_info", "close") if not hasattr(backend, name)]
    assert not missing and isinstance(backend, Backend), f"lacks {missing}"
    assert isinstance(backend.engine_info()["engine"], str)


def test_the_fake_backend_is_a_backend_with_no_optional_ability():
    backend = CharBackend()
    assert_is_a_backend(backend)
    assert abilities(backend) == set()


@pytest.mark.slow
def test_llamacpp_scores_answer_rows_and_taps_its_graph(tiny_llama):
    from kvphase.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(tiny_llama, n_ctx=256, n_threads=1)
    try:
        assert_is_a_backend(backend)
        assert abilities(backend) == {"AnswerLogprobs", "TapsGraph"}
        assert backend.architecture == "llama" and backend.tap_point is None
    finally:
        backend.close()
        backend.close()  # a second close does nothing


@pytest.mark.slow
def test_the_reference_shifts_windows_and_runs_a_policy(tiny_llama):
    from kvphase.backends.reference import ReferenceBackend

    backend = ReferenceBackend(tiny_llama)
    try:
        assert_is_a_backend(backend)
        assert abilities(backend) == {"AnswerLogprobs", "ShiftsWindows", "RunsPolicy"}
        assert backend.n_threads is None and backend.engine_info() == {"engine": "ReferenceBackend"}
    finally:
        backend.close()


@pytest.mark.time_limit(60)  # a fake server that never answers fails here, not never
def test_the_server_backend_scores_many_on_a_fleet():
    from kvphase.backends.dialects import ENGINES
    from kvphase.backends.fleet import ServerBackend

    with FakeServer() as server:
        backend = ServerBackend([ENGINES[server.engine](server.url)], ByteVocab(), n_ctx_needed=512)
        assert_is_a_backend(backend)
        assert abilities(backend) == {"ScoresMany", "ServerFleet"}
        assert backend.n_threads is None
        backend.close()


def offset_scorer(backend, **plan):
    from kvphase.sweep.offsets import OffsetPlan, ShiftedScorer

    return ShiftedScorer(backend, OffsetPlan(**plan), filler=[7], seed=0, stride=4)


def selection_reader(backend):
    from kvphase.sweep.selection import SelectionReader

    return SelectionReader(backend)


def knockout_heads(backend):
    from kvphase.probes.knockout_hooks import model_heads

    return model_heads(backend)


@pytest.mark.parametrize("needs, match", [
    (lambda b: offset_scorer(b, shifts=(0, 2), shift_by="window", combine="mean"),
     "window shifts need the reference backend"),  # ShiftsWindows
    (lambda b: offset_scorer(b, shifts=(0, 2), combine="mean"),
     "--offsets needs a backend that returns answer log-probability rows"),  # AnswerLogprobs
    (selection_reader, "--selection needs the llama.cpp backend opened with a graph tap"),  # TapsGraph, RunsPolicy
    (knockout_heads, "knockouts need the numpy reference backend or llama.cpp opened with a head tap"),
], ids=["ShiftsWindows", "AnswerLogprobs", "selection", "knockout"])
def test_a_backend_without_the_ability_is_refused(needs, match):
    with pytest.raises(PlanError, match=match):
        needs(CharBackend())


def test_a_policy_without_window_designs_is_refused():
    from kvphase.probes.activations import reference_windows
    from kvphase.probes.gates import GateSource
    from kvphase.probes.knockout_hooks import _check_gated

    class DensePolicyBackend(CharBackend):
        policy = DenseAttention()

    with pytest.raises(PlanError, match="attention is dense here"):
        reference_windows(DensePolicyBackend(), [[1, 2, 3]], [GateSource(0, "trained-gated", "blk.0.gate", 4)])
    with pytest.raises(PlanError, match="--slots knocks out phase slots of a trained gate"):
        _check_gated(DenseAttention(), [0], 1)


class ReversedFleet(CharBackend):
    """Scores every job at once and hands them back last first, as a fleet may finish them."""

    def score_many(self, jobs):
        for index in reversed(range(len(jobs))):
            yield index, self.score(*jobs[index])


def test_contexts_go_through_score_many_where_a_backend_has_it():
    jobs = [((1, 2), [Query((3,), (4,))]), ((5, 6), [Query((7,), (9,))])]
    assert [index for index, _ in score_contexts(ReversedFleet(), jobs)] == [1, 0]
    plain = list(score_contexts(CharBackend(), jobs))
    assert [index for index, _ in plain] == [0, 1]
    assert [s.correct for _, scores in plain for s in scores] == [True, False]  # answer 4 even, 9 odd


def test_a_policy_told_each_context_keys_it_and_a_wrapper_passes_the_key_on():
    from kvphase.probes.knockout_hooks import HeadRecorder

    drawn = make_policy("meanpool", window=4, stride=4, randomize=True, seed=3)
    context = [5, 6, 7, 8]
    key = begin_context(drawn, context)
    assert key not in (None, 0) and key == begin_context(HeadRecorder(drawn), context)
    assert begin_context(DenseAttention(), context) is None
    assert begin_context(HeadRecorder(DenseAttention()), context) is None
    fixed = make_policy("meanpool", window=4, stride=4)
    assert begin_context(fixed, context) == 0
