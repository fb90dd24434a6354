"""Context layout on the real tokenizer: exact residues, one query position, matched moments."""

from __future__ import annotations

import numpy as np
import pytest

from kvphase.errors import PlanError
from kvphase.sweep.contexts import build_contexts, check_matched_moments
from kvphase.sweep.layout import Target
from kvphase.sweep.positions import plan_contexts, residue_slots
from kvphase.sweep.context_settings import ContextSettings
from kvphase.sweep.records import RecordMaker
from kvphase.sweep.tasks import load_task
from tests.helpers.fakes import CharBackend
from tests.helpers.paths import TRAINED

MODES = ["prefix", "in-sequence"]


def _settings(mode, context=1024, stride=4, modulus=8, per_residue=16, seed=0):
    return ContextSettings(context, stride, modulus, per_residue, mode, seed)


def _moments(contexts, modulus):
    positions = {r: [] for r in range(modulus)}
    for context in contexts:
        for target in context.targets:
            positions[target.residue].append(target.position)
    means = np.array([np.mean(p) for p in positions.values()])
    sds = np.array([np.std(p) for p in positions.values()])
    counts = np.array([len(p) for p in positions.values()])
    return means, sds, counts


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("task", ["records", "passkey"])
def test_targets_sit_at_their_residue_and_queries_share_one_position(llama_backend, mode, task):
    settings = _settings(mode)
    contexts = build_contexts(load_task(task), llama_backend, settings)
    maker = RecordMaker(load_task(task), llama_backend)
    assert {len(c.tokens) for c in contexts} == {settings.context_length}
    for context in contexts:
        for target in context.targets:
            assert target.position % settings.modulus == target.residue
            assert target.position % settings.stride == target.phase
            record = maker.make(target.key, target.answer)
            assert context.tokens[target.position:target.position + len(record.ids)] == record.ids


@pytest.mark.parametrize("mode", MODES)
def test_matched_position_moments(llama_backend, mode):
    """The planner's own check allows 2%; it achieves far better, and a drift of 1% would show."""
    contexts = build_contexts(load_task("records"), llama_backend, _settings(mode, per_residue=32))
    means, sds, counts = _moments(contexts, 8)
    assert set(counts) == {32}
    assert means.max() - means.min() == 0, f"per-residue means {means}"  # n a multiple of M: exact
    spread = (sds.max() - sds.min()) / sds.max()
    assert spread <= 0.001, f"per-residue SDs {sds}: relative spread {spread:.2e}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("context, per_residue", [(1024, 32), (768, 24)])
def test_every_context_serves_every_residue_equally(llama_backend, mode, context, per_residue):
    contexts = build_contexts(load_task("records"), llama_backend, _settings(mode, context=context,
                                                                          per_residue=per_residue))
    for c in contexts:
        counts = np.bincount([t.residue for t in c.targets], minlength=8)  # (8,)
        assert len(set(counts)) == 1, f"context {c.index} holds residues {counts.tolist()}"
    assert sum(len(c.targets) for c in contexts) == 8 * per_residue


def test_contexts_that_hold_fewer_targets_than_residues_rotate_them():
    # three lanes, M = 8: each context holds three different residues; over a round every
    # residue sits once in every lane, so every residue has the same depths
    contexts = plan_contexts(100, 900, 8, 3, lanes=3)
    assert len(contexts) == 8 and all(len(c) == 3 for c in contexts)
    assert all(len({p % 8 for p in c}) == 3 for c in contexts)
    by_residue = np.sort(np.concatenate(contexts).reshape(-1)).tolist()
    assert sorted({p % 8 for p in by_residue}) == list(range(8))


def test_query_asks_for_a_key_present_once_in_its_context(llama_backend):
    contexts = build_contexts(load_task("records"), llama_backend, _settings("in-sequence"))
    maker = RecordMaker(load_task("records"), llama_backend)
    for context in contexts[:5]:
        body = context.tokens
        for target in context.targets:
            key_ids = maker.ids(f" {target.key}") + maker.ids(":")
            starts = [i for i in range(len(body) - len(key_ids)) if body[i:i + len(key_ids)] == key_ids]
            # once in the records, and possibly once more among the demonstrations
            assert target.position in starts and len(starts) <= 2
            assert target.query.prompt == key_ids
            assert target.query.answer == maker.ids(f" {target.answer}")


def test_prefix_padding_moves_distractors_with_the_target(llama_backend):
    """Back-to-back records: the distance from the target to its neighbour is one record."""
    contexts = build_contexts(load_task("records"), llama_backend, _settings("prefix"))
    maker = RecordMaker(load_task("records"), llama_backend)
    context = contexts[0]
    target = context.targets[0]
    after = target.position + len(maker.make(target.key, target.answer).ids)
    assert maker.ids("\n")[0] == context.tokens[after - 1]


def test_in_sequence_gaps_vary(llama_backend):
    """Distractor phases are independent of the target: gaps between records differ."""
    contexts = build_contexts(load_task("records"), llama_backend, _settings("in-sequence"))
    newline = llama_backend.tokenize("\n")[0]
    colon = llama_backend.tokenize(":")[0]
    tokens = contexts[0].tokens
    colons = [i for i, t in enumerate(tokens) if t == colon]
    newlines = [i for i, t in enumerate(tokens) if t == newline]
    gaps = {c - max(n for n in newlines if n < c) for c in colons[5:40]}
    assert len(gaps) > 3


def test_in_sequence_gaps_before_distractors_are_uniform_over_0_to_m_minus_1():
    """PROTOCOL: gaps of 0..M-1 filler tokens, drawn uniformly, so a distractor's phase is
    independent of the targets'. Over 80 contexts (about 2,200 distractor records, one token a
    character) every gap length and every start residue mod M appears 1/M of the time, within
    25% (about 4 standard deviations)."""
    task, backend, m = load_task("records"), CharBackend(), 8
    gaps, residues = [], []
    for context in build_contexts(task, backend, _settings("in-sequence", context=1024, modulus=m, per_residue=64)):
        text = backend.detokenize(context.tokens)
        body = text[: text.index(task.footer)]  # the demonstrations after it restate records
        targets, end = {t.position for t in context.targets}, len(task.header)
        for colon in [i for i, ch in enumerate(body) if ch == ":"]:
            start = colon - len(body[:colon].split(" ")[-1]) - 1  # the space before the key
            if start not in targets:
                gaps.append(start - end)
                residues.append(start % m)
            end = body.index("\n", colon) + 1
    for name, values in (("gap", gaps), ("start residue", residues)):
        counts = np.bincount(values)
        assert len(counts) == m and np.all(np.abs(counts / (len(values) / m) - 1) < 0.25), f"{name} counts {counts}"


def test_long_context_uses_multi_token_keys(llama_backend):
    task = load_task("records")
    contexts = build_contexts(task, llama_backend, _settings("prefix", context=2048, per_residue=8))
    keys = [t.key for c in contexts for t in c.targets]
    assert all(" " in k for k in keys)  # "modifier animal": more keys than single words give
    for context in contexts:
        assert len({t.key for t in context.targets}) == len(context.targets)


def test_bos_is_placed_first_and_counted():
    backend = CharBackend(prefix_ids=[1])
    contexts = build_contexts(load_task("records"), backend, _settings("prefix", context=1200, per_residue=4))
    assert all(c.tokens[0] == 1 for c in contexts)
    for context in contexts:
        for target in context.targets:
            assert backend.detokenize(context.tokens[target.position:]).startswith(f" {target.key}:")


def test_words_that_merge_across_a_segment_boundary_are_dropped():
    class MergingTokenizer(CharBackend):
        """Merges 'ox:' into one token, as a BPE might."""

        def tokenize(self, text):
            ids = super().tokenize(text.replace("ox:", "\x01"))
            return ids

    maker = RecordMaker(load_task("records"), MergingTokenizer())
    assert "fox" not in maker.single_keys and "ox" not in maker.single_keys
    assert "cat" in maker.single_keys


def test_residue_slots_equalize_means_exactly_when_n_is_a_multiple_of_m():
    anchors = 104 + 8 * np.round(np.linspace(0, 99, 16)).astype(int)  # (16,) multiples of 8
    slots = residue_slots(anchors, 8)  # (8, 16)
    assert np.ptp(slots.mean(axis=1)) == 0
    assert all((slots[r] % 8 == r).all() for r in range(8))
    assert ((slots >= anchors - 8) & (slots < anchors + 8)).all()  # each slot stays next to its anchor


def test_a_context_with_room_for_one_depth_still_plans_m_or_more_targets_per_residue():
    """At M = 128 a 960-token context has one anchor depth (`--stride all --per-residue auto` on
    deepseek4's S = 128 asked for 128 per residue there): moving some of a residue's targets down
    by M cannot keep its SD, so whole groups move, and the means agree within M / 2."""
    for per_residue in (32, 40):  # n = M and n > M, one target per context
        contexts = plan_contexts(lowest=100, highest=230, modulus=32, per_residue=per_residue, lanes=1)
        slots = np.concatenate(contexts)  # (M n,)
        assert len(contexts) == 32 * per_residue and np.ptp([s % 32 for s in slots[:32]]) == 31
        by_residue = [slots[slots % 32 == r] for r in range(32)]
        assert all(np.ptp(group) == 0 for group in by_residue)  # every group at one depth
        means = np.array([group.mean() for group in by_residue])  # (M,)
        assert np.abs(means - means.mean()).max() <= 16
        check_matched_moments([Target(i, i, int(s), int(s) % 32, int(s) % 4, "k", "v", None)
                               for i, s in enumerate(slots)], 32)


def test_unmatched_moments_are_one_line_however_large_the_modulus():
    positions = [384 + r + 256 * (r == 5) for r in range(128)]  # residue 5 two periods deeper than the rest
    targets = [Target(i, i, p, p % 128, p % 128, "k", "v", None) for i, p in enumerate(positions)]
    with pytest.raises(PlanError) as error:
        check_matched_moments(targets, 128)
    message = str(error.value)
    assert "\n" not in message and len(message) < 200, message
    assert "mean target positions (from 384.00 at residue 0 to 645.00 at residue 5) differ by more than 64" in message


def test_impossible_settings_raise_plan_errors(llama_backend):
    with pytest.raises(PlanError, match="stride must be at least 2"):
        _settings("prefix", stride=1)
    with pytest.raises(PlanError, match="per-residue must be at least 1"):
        _settings("prefix", per_residue=0)
    with pytest.raises(PlanError, match="multiple of the stride"):
        _settings("prefix", modulus=6)
    with pytest.raises(PlanError, match="unknown padding"):
        _settings("sideways")
    with pytest.raises(PlanError, match="no room for targets"):
        build_contexts(load_task("records"), llama_backend, _settings("prefix", context=64, per_residue=4))


def test_scattered_distractors_sit_at_random_free_places():
    """pairs.toml asks for 3 distractor records per context at random places: every context holds its
    targets at their slots plus exactly 3 more records, none overlapping, at varying positions."""
    task = load_task("pairs")
    assert task.distractors_per_context == 3
    backend = CharBackend()
    contexts = build_contexts(task, backend, _settings("in-sequence", context=512, modulus=4, per_residue=8))
    keys, starts = set(task.keys), set()
    for context in contexts:
        words = backend.detokenize(context.tokens).split()
        found = [w for w in words if w in keys]
        assert len(found) == len(set(found)) == len(context.targets) + 3
        text = backend.detokenize(context.tokens)
        for target in context.targets:
            assert text[target.position:].startswith(f" {target.key} {target.answer}")
        starts |= {text.index(f" {k} ") for k in found if k not in {t.key for t in context.targets}}
    assert len(starts) > 20  # distractors are not parked at a few fixed places


def test_a_task_with_more_distractors_than_room_is_a_plan_error():
    import dataclasses

    task = dataclasses.replace(load_task("pairs"), distractors_per_context=40)
    with pytest.raises(PlanError, match="40 distractors do not fit"):
        build_contexts(task, CharBackend(), _settings("in-sequence", context=256, modulus=4, per_residue=4))


def test_a_trained_word_vocabulary_plans_long_contexts_with_scattered_distractors():
    """A `kvphase train` file's tokenizer knows single words only, so compound keys never join
    cleanly. At 256 tokens the planner asked it for keys enough to fill the context with records
    (127) although pairs.toml scatters 3 distractors per context: the sweep of every model
    trained at that length failed before its first context."""

    from kvphase.sweep.backend_setup import open_backend
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.sweep.plan import SweepDefaults, SweepPlan

    model = TRAINED / "gated.gguf"
    info = read_model_info(model)
    defaults = SweepDefaults.for_model(info)
    plan = SweepPlan(model=str(model), task=defaults.task, stride=4, modulus=4, context=defaults.context,
                     per_residue=8, padding=defaults.padding, seed=0, control=False, backend=defaults.backend,
                     backend_options={"design": defaults.design})
    task = load_task("pairs")
    with open_backend(plan, info, threads=1) as backend:
        contexts = build_contexts(task, backend, _settings("in-sequence", context=256, modulus=8, per_residue=8))
    assert sum(len(c.targets) for c in contexts) == 8 * 8
    assert all(len(c.tokens) == 256 for c in contexts)
