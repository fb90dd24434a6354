"""Harder tasks as data (issue 21): near-duplicate keys, multi-token values, two values per
key, dense records; and the difficulty chain from `records` that a calibration walks
(`harder`, `calibrate` in every task file)."""

from __future__ import annotations

import re
import signal
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace

import pytest

from tests.helpers.fakes import CharBackend
from kvphase.errors import PlanError, RecordLayoutError
from kvphase.sweep import tasks
from kvphase.sweep.contexts import build_contexts
from kvphase.sweep.context_settings import ContextSettings, PADDINGS
from kvphase.sweep.records import RecordMaker
from kvphase.sweep.tasks import CALIBRATION_KNOBS, available_tasks, difficulty_chain, load_task

NEW_TASKS = ["records-similar", "records-digits", "records-two-values", "records-dense", "records-hardest"]


def _settings(padding: str, context: int = 1024) -> ContextSettings:
    return ContextSettings(context, 4, 8, 8, padding, 0)


def _build(name: str, backend, padding: str):
    """The contexts a sweep would build: where prefix padding cannot lay out this tokenizer's
    records (every record as long as the next, say), in-sequence padding, as `kvphase sweep`
    falls back to by itself."""
    try:
        return build_contexts(load_task(name), backend, _settings(padding))
    except RecordLayoutError:
        return build_contexts(load_task(name), backend, _settings("in-sequence"))


# --- the task files and their chain -------------------------------------------------------


@pytest.mark.parametrize("name", available_tasks())
def test_every_task_file_loads_with_known_knobs(name):
    task = load_task(name)
    assert set(task.calibrate) <= set(CALIBRATION_KNOBS)
    assert task.harder == "" or task.harder in available_tasks()


def test_the_chain_from_records_passes_every_new_task_once_and_ends():
    chain = difficulty_chain("records")
    assert chain[0] == "records" and len(set(chain)) == len(chain)
    assert set(NEW_TASKS) <= set(chain)
    assert load_task(chain[-1]).harder == ""
    assert all("harder" in load_task(name).calibrate for name in chain[:-1])  # each link may be walked


def test_trained_models_task_has_a_fixed_context_and_passkey_the_default():
    assert load_task("pairs").calibrate == ()
    assert load_task("passkey").calibrate == ("context",)


# --- bad task files: one line naming the problem ------------------------------------------

MINIMAL = """
description = "test task"
values = "names.txt"
record = [" {{value}}"]
query = ["?"]
answer = [" {{value}}"]
filler = "filler.txt"
{extra}
"""


@pytest.fixture
def prompts(tmp_path, monkeypatch):
    """A prompts folder of our own: write(name, extra TOML lines) adds a task file."""
    for word_list in ("names.txt", "filler.txt"):
        (tmp_path / word_list).write_text((tasks.PROMPTS_DIR / word_list).read_text())
    monkeypatch.setattr(tasks, "PROMPTS_DIR", tmp_path)

    def write(name: str, extra: str = "") -> None:
        (tmp_path / f"{name}.toml").write_text(MINIMAL.format(extra=extra))

    return write


def _one_line_error(name: str) -> str:
    with pytest.raises(PlanError) as failed:
        load_task(name)
    message = str(failed.value)
    assert "\n" not in message, message
    return message


def test_a_task_without_the_new_fields_gets_the_defaults(prompts):
    prompts("plain")
    task = load_task("plain")
    assert task.calibrate == ("context",) and task.harder == ""


def test_an_unknown_knob_names_the_task_the_knob_and_the_known_ones(prompts):
    prompts("bad", 'calibrate = ["context", "temperature"]')
    message = _one_line_error("bad")
    assert "task bad" in message and "'temperature'" in message and "context, harder" in message


def test_knobs_must_be_a_list_of_names(prompts):
    prompts("loose", 'calibrate = "context"')
    assert "calibrate must be a list of knob names" in _one_line_error("loose")


def test_an_unknown_harder_task_names_the_task_and_the_missing_one(prompts):
    prompts("easy", 'harder = "nonexistent"')
    message = _one_line_error("easy")
    assert "task easy" in message and "harder task 'nonexistent' does not exist" in message


def test_harder_as_a_knob_needs_a_harder_task(prompts):
    prompts("last", 'calibrate = ["harder"]')
    assert "names no harder task" in _one_line_error("last")


@contextmanager
def _failing_after(seconds: int):
    """A loop that never ends fails the test instead of hanging it."""
    def stop(*_):
        raise TimeoutError(f"still walking the chain after {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_chain_that_loops_is_refused_with_the_loop(prompts):
    prompts("a", 'harder = "b"')
    prompts("b", 'harder = "c"')
    prompts("c", 'harder = "a"')
    prompts("self", 'harder = "self"')
    with _failing_after(5):
        assert "the harder chain loops: a -> b -> c -> a" in _one_line_error("a")
        assert "self -> self" in _one_line_error("self")


def test_the_chain_of_a_task_lists_every_link_in_order(prompts):
    prompts("a", 'harder = "b"')
    prompts("b")
    assert difficulty_chain("a") == ["a", "b"]


# --- the new tasks build exact contexts on a fake tokenizer -------------------------------


def _keys_in(backend: CharBackend, tokens) -> list[tuple[str, str]]:
    """The two-word keys of every record of a decoded context (CharBackend: one token per
    character; the filler has no colon, so each " first second: value" is a record)."""
    return re.findall(r" (\w+) (\w+): \w+\n", backend.detokenize(tokens))


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("name", NEW_TASKS)
def test_targets_sit_at_their_planned_positions_and_answer_what_their_record_says(name, padding):
    backend = CharBackend()
    maker = RecordMaker(load_task(name), backend)
    contexts = _build(name, backend, padding)
    assert {len(c.tokens) for c in contexts} == {1024}
    for context in contexts:
        for target in context.targets:
            record = maker.make(target.key, target.answer)
            assert context.tokens[target.position:target.position + len(record.ids)] == record.ids
            record_text = backend.detokenize(record.ids)
            assert record_text.startswith(f" {target.key}")
            assert backend.detokenize(target.query.prompt).startswith(f" {target.key}")  # asks for this key
            assert backend.detokenize(target.query.answer) == f" {target.answer}"
            assert f" {target.answer}" in record_text.removeprefix(f" {target.key}")


@pytest.mark.parametrize("padding", PADDINGS)
def test_two_values_ask_for_the_helper_never_the_keeper(padding):
    backend = CharBackend()
    for context in _build("records-two-values", backend, padding):
        for target in context.targets:
            line = backend.detokenize(context.tokens[target.position:]).split("\n")[0]
            keeper, helper = re.fullmatch(rf" {re.escape(target.key)}: keeper (\w+), helper (\w+)", line).groups()
            assert target.answer == helper != keeper
            assert backend.detokenize(target.query.prompt) == f" {target.key}: helper"
            assert backend.detokenize(target.query.answer) == f" {helper}"


def test_the_other_value_is_a_stable_choice_of_the_same_length():
    maker = RecordMaker(load_task("records-two-values"), CharBackend())
    for key, value in [("cat", "Anna"), ("red owl", "Bob"), ("fox", maker.values[-1])]:
        other = maker.other_value(key, value)
        assert other != value and other in maker.values and len(other) == len(value)
        assert maker.other_value(key, value) == other  # a function of (key, value): lengths are known


def test_the_other_value_is_the_same_on_every_machine():
    """Pinned: a salted hash (Python's `hash`) would change the records, and so the plan's
    fingerprint, from one process to the next."""
    names = RecordMaker(load_task("records-two-values"), CharBackend())
    assert [names.other_value(k, v) for k, v in [("cat", "Anna"), ("red owl", "Bob"), ("zebra", "Victoria")]] == \
        ["Tony", "Leo", "Caroline"]
    numbers = RecordMaker(load_task("records-hardest"), CharBackend())
    assert [numbers.other_value(k, v) for k, v in [("red cat", "482"), ("blue bat", "100")]] == ["880", "771"]


def test_other_numbers_never_equal_the_value():
    """Over every three-digit number under several keys: a pick that ignored the value would
    hit it about 1 time in 900, some 30 times here."""
    task = replace(load_task("records-digits"), value_digits=3, record=(" {key}", ": {value} or {other}"))
    maker = RecordMaker(task, CharBackend())
    for key in maker.single_keys[:30]:
        for value in map(str, range(100, 1000)):
            other = maker.other_value(key, value)
            assert other != value and len(other) == 3 and other.isdigit(), (key, value, other)


@pytest.mark.parametrize("padding", PADDINGS)
def test_near_duplicate_keys_share_first_words_and_differ_by_one_letter_in_one_context(padding):
    backend, sharing = CharBackend(), []
    for context in _build("records-similar", backend, padding):
        keys = _keys_in(backend, context.tokens)
        seconds = {second for _, second in keys}
        assert any(_one_letter_apart(a, b) for a in seconds for b in seconds), keys
        sharing.append(_keys_sharing_the_first_word(keys))
    # about 4 with the ten colours of similar-keys.txt in these small contexts (2 with twenty)
    assert sum(sharing) / len(sharing) > 3.5, sharing


def _keys_sharing_the_first_word(keys: list[tuple[str, str]]) -> float:
    """How many other keys of the context share a key's first word, on average over its keys."""
    first_words = Counter(first for first, _ in keys)
    return sum(first_words[first] - 1 for first, _ in keys) / len(keys)


def _one_letter_apart(a: str, b: str) -> bool:
    return len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1


@pytest.mark.parametrize("name", NEW_TASKS)
def test_the_tasks_also_build_at_the_longer_contexts_calibration_walks_to(name):
    """Calibration lengthens the context before it moves along the chain: 8192 tokens here
    need more keys than a 1024-token context (three-word keys for records-similar)."""
    backend = CharBackend()
    contexts = build_contexts(load_task(name), backend, ContextSettings(8192, 4, 8, 2, "in-sequence", 0))
    assert {len(c.tokens) for c in contexts} == {8192}
    if name == "records-similar":
        keys = [t.key for c in contexts for t in c.targets]
        assert all(len(key.split()) == 3 for key in keys), keys  # "big red cat": still near duplicates


def test_digit_values_take_several_tokens():
    contexts = _build("records-digits", CharBackend(), "prefix")
    answers = [t.query.answer for c in contexts for t in c.targets]
    assert all(len(answer) == 5 for answer in answers)  # " " and four digits, each its own token here


def test_dense_records_put_more_distractors_in_the_same_context():
    backend = CharBackend()

    def records_per_context(name: str, separator: str) -> float:
        contexts = build_contexts(load_task(name), backend, _settings("prefix"))
        return sum(backend.detokenize(c.tokens).count(separator) for c in contexts) / len(contexts)

    # one character less a record here; a token less (3 not 4) on a real tokenizer
    assert records_per_context("records-dense", ",") > 1.05 * records_per_context("records", ":")
