"""Records in token space: a task's key -> value records tokenized segment by segment.

Every segment is tokenized on its own and the ids are joined, so a record's length is known
from its key and value alone and a position never shifts by re-tokenizing joined text; only
words that tokenize the same alone as inside a record are kept (`RecordMaker`). `RecordLengths`
says which runs of back-to-back records can be made exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import hashlib

import numpy as np

from kvphase.backends.base import Query, Tokenizer
from kvphase.errors import PlanError
from kvphase.sweep.tasks import Task

MAX_NUMBER_DRAWS = 1_000  # random numbers drawn for one value before deciding none tokenizes cleanly


class Record(NamedTuple):
    """One key -> value record in token space."""

    key: str
    value: str
    ids: tuple[int, ...]
    query: Query


class RecordMaker:
    """Tokenizes records segment by segment, keeping only words that tokenize the same
    alone as inside a record (so no word merges across a segment boundary)."""

    def __init__(self, task: Task, tokenizer: Tokenizer):
        self.task = task
        self._tokenize_cached: dict[str, tuple[int, ...]] = {}
        self._tokenizer = tokenizer
        self._uses_other = any("{other}" in s for s in task.record + task.query + task.answer)
        sample_value = task.values[0] if task.values else "1" * task.value_digits
        # the value stands in for {other} too, so a kept value joins cleanly in either place
        keys = [k for k in task.keys if self._joins_cleanly(k, sample_value, other=sample_value)]
        key0 = keys[0] if keys else ""
        self.values = tuple(v for v in task.values if self._joins_cleanly(key0, v, other=v))
        self.single_keys = tuple(keys)
        self.compound_keys = tuple(f"{m} {k}" for m in task.key_modifiers for k in keys)
        if task.keys and not keys:
            raise PlanError(f"task {task.name}: no key tokenizes cleanly inside a record")
        if task.values and not self.values:
            raise PlanError(f"task {task.name}: no value tokenizes cleanly inside a record")
        if self._uses_other and task.values and len(self.values) < 2:
            raise PlanError(f"task {task.name}: {{other}} needs two values that tokenize cleanly, found "
                            f"{len(self.values)}")
        self._peers = self._values_of_equal_length(key0)

    def ids(self, text: str) -> tuple[int, ...]:
        if text not in self._tokenize_cached:
            self._tokenize_cached[text] = tuple(self._tokenizer.tokenize(text))
        return self._tokenize_cached[text]

    def segments(self, segments: Sequence[str], key: str, value: str, other: str = "") -> tuple[int, ...]:
        return tuple(t for s in segments for t in self.ids(s.format(key=key, value=value, other=other)))

    def make(self, key: str, value: str) -> Record:
        task = self.task
        other = self.other_value(key, value)
        query = Query(self.segments(task.query, key, value, other), self.segments(task.answer, key, value, other))
        return Record(key, value, self.segments(task.record, key, value, other), query)

    def other_value(self, key: str, value: str) -> str:
        """The record's second value, `{other}` ("" for tasks without one).

        Placement needs every record's exact length from (key, value) alone, so the other
        value is a function of them: a stable hash (not Python's salted `hash`) picks it.
        It is never the value itself, so the asked value stays the only right answer, and
        it has the value's token length (a word of the same length, a number of as many
        digits), so a record's length stays its key's share plus its value's
        (`RecordLengths`).
        """
        if not self._uses_other:
            return ""
        pick = int.from_bytes(hashlib.sha256(f"{key}\0{value}".encode()).digest()[:8], "big")
        if not self.task.values:
            low = 10 ** (self.task.value_digits - 1)
            span = 9 * low  # numbers of exactly value_digits digits
            return str(low + (int(value) - low + 1 + pick % (span - 1)) % span)  # any of them but value
        peers = [v for v in self._peers.get(value, self.values) if v != value]
        peers = peers or [v for v in self.values if v != value]  # a value alone at its length
        return peers[pick % len(peers)]

    def _values_of_equal_length(self, key: str) -> dict[str, tuple[str, ...]]:
        """value -> the values whose record (with that value in every value place) is as long."""
        if not self._uses_other:
            return {}
        by_length: dict[int, list[str]] = {}
        for value in self.values:
            by_length.setdefault(len(self.segments(self.task.record, key, value, value)), []).append(value)
        return {v: tuple(group) for group in by_length.values() for v in group}

    def random_value(self, rng: np.random.Generator) -> str:
        if self.values:
            return self.values[rng.integers(len(self.values))]
        key = self.single_keys[0] if self.single_keys else ""  # a key of the task: "" would merge with ":"
        for _ in range(MAX_NUMBER_DRAWS):
            digits = self.task.value_digits
            value = str(rng.integers(10 ** (digits - 1), 10**digits))
            if self._joins_cleanly(key, value):
                return value
        raise PlanError(f"task {self.task.name}: no {self.task.value_digits}-digit number tokenizes cleanly "
                        "inside a record")

    def keys_for(self, n_records: int) -> tuple[str, ...]:
        """Single keys when there are enough for a context, compound keys otherwise."""
        if not self.task.keys or n_records <= len(self.single_keys):
            return self.single_keys
        if n_records > len(self.compound_keys):
            raise PlanError(
                f"task {self.task.name}: a context needs {n_records} distinct keys, the word lists give "
                f"{len(self.compound_keys)}; use a shorter --context"
            )
        return self.compound_keys

    def longest(self, keys: Sequence[str]) -> int:
        """An upper bound on the tokens of one record built from these keys."""
        key_len = max((len(self.ids(f" {k}")) for k in keys), default=0) + 1
        value_len = max((len(self.ids(f" {v}")) for v in self.values), default=self.task.value_digits) + 1
        value_len *= 1 + sum("{other}" in s for s in self.task.record)  # {other} is as long as a value
        fixed = sum(len(self.ids(s.format(key="", value="", other=""))) + 1 for s in self.task.record)
        return fixed + key_len + value_len

    def _joins_cleanly(self, key: str, value: str, other: str | None = None) -> bool:
        other = self.other_value(key, value) if other is None else other
        text = "".join(s.format(key=key, value=value, other=other) for s in self.task.record)
        return tuple(self._tokenizer.tokenize(text)) == self.segments(self.task.record, key, value, other)


@dataclass(frozen=True)
class RecordLengths:
    """How long records are, and which runs of back-to-back records can be made exactly.

    A record's length is its key's share plus its value's share (each segment is
    tokenized on its own); `Layout._record_leaving_fillable` checks every record it draws anyway.
    """

    keys_by_length: dict[int, list[str]]  # tokens a key brings (with the record's fixed segments) -> keys
    values_by_length: dict[int, list[str]]  # extra tokens a value brings -> values
    lengths: tuple[int, ...]  # every record length the lists give
    reachable: np.ndarray  # (limit,) bool: a run of records can be exactly this long
    shortest: int | None  # every run length from here on can be made; None when not all can

    @classmethod
    def of(cls, records: RecordMaker, keys: Sequence[str], record_max: int) -> "RecordLengths":
        rng = np.random.default_rng(0)
        values = list(records.values) or sorted({records.random_value(rng) for _ in range(64)})
        key0 = keys[0] if keys else ""
        base = len(records.make(key0, values[0]).ids)
        keys_by_length: dict[int, list[str]] = {}
        for key in keys or [""]:
            keys_by_length.setdefault(len(records.make(key, values[0]).ids), []).append(key)
        values_by_length: dict[int, list[str]] = {}
        for value in values:
            values_by_length.setdefault(len(records.make(key0, value).ids) - base, []).append(value)
        lengths = tuple(sorted({k + v for k in keys_by_length for v in values_by_length}))
        limit = 4 * record_max * record_max
        reachable = np.zeros(limit, dtype=bool)  # (limit,)
        reachable[0] = True
        for total in range(1, limit):
            reachable[total] = any(reachable[total - n] for n in lengths if n <= total)
        gaps = np.flatnonzero(~reachable)  # (n_gaps,)
        shortest = None if gaps.size and gaps[-1] > limit - record_max else int(gaps[-1] + 1 if gaps.size else 0)
        return cls(keys_by_length, values_by_length, lengths, reachable, shortest)

    def fillable(self, length: int) -> bool:
        """Whether back-to-back records can make a run of exactly `length` tokens."""
        if length < 0:
            return False
        if length < len(self.reachable):
            return bool(self.reachable[length])
        return self.shortest is not None
