"""Token-level probes: contexts whose target records start at exact positions.

Every segment is tokenized on its own and the ids are joined, so a position is known
exactly and never shifts by re-tokenizing joined text. Target positions are planned
first (`plan_slots`): for each residue `r` (mod M) the same number of positions with
the same mean and standard deviation, so a residue effect is never a depth effect
(PROTOCOL.md). Contexts are then laid out around those positions, in one of the two
padding modes:

- prefix: records sit back to back; a prefix of `p` filler tokens shifts them all,
  so distractors move in lockstep with the target.
- in-sequence: random gaps of 0..M-1 filler tokens between records, so distractor
  phases are independent of the target's.

All contexts have exactly `context_length` tokens, so every query starts at the same
position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol, Sequence

import itertools
import math

import numpy as np

from kvphase.backends.base import Query
from kvphase.errors import PlanError
from kvphase.sweep.tasks import Task

PADDING_MODES = ("prefix", "in-sequence")
MEAN_TOLERANCE = 0.5  # tokens: largest distance of a residue group's mean position from the common mean
EXHAUSTIVE_CHOICES = 20_000  # up to this many ways to pick the moved anchors, try them all
SD_TOLERANCE = 0.02  # relative: largest spread of the groups' position standard deviations
MAX_CONTEXT = 1 << 22  # tokens; beyond every model's context, and a plan of that size fits in memory


class Tokenizer(Protocol):
    def tokenize(self, text: str) -> list[int]: ...

    @property
    def prefix_ids(self) -> list[int]:
        """Tokens every sequence starts with (BOS where the model adds one)."""
        ...


@dataclass(frozen=True)
class ProbeSettings:
    """What the probes must satisfy."""

    context_length: int  # tokens in every context; queries start here
    stride: int  # S: tokens per compressed entry
    modulus: int  # M: residues are position mod M
    per_residue: int  # targets in each residue group
    padding: str  # "prefix" or "in-sequence"
    seed: int

    def __post_init__(self) -> None:
        if self.context_length < 1:
            raise PlanError(f"--context must be a positive number of tokens, got {self.context_length}")
        if self.stride < 2:
            raise PlanError(f"--stride must be at least 2, got {self.stride}")
        if self.modulus < 2 or self.modulus % self.stride:
            raise PlanError(f"--modulus must be a multiple of the stride {self.stride}, got {self.modulus}")
        if self.context_length > MAX_CONTEXT:
            raise PlanError(f"--context must be at most {MAX_CONTEXT} tokens, got {self.context_length}")
        if self.per_residue < 1:
            raise PlanError(f"--per-residue must be at least 1, got {self.per_residue}")
        if self.per_residue > self.context_length // self.modulus:  # checked before any planning, however large
            raise PlanError(f"--per-residue {self.per_residue} is more than a {self.context_length}-token context "
                            f"holds: {self.context_length // self.modulus} positions of each residue mod {self.modulus}")
        if self.padding not in PADDING_MODES:
            raise PlanError(f"unknown padding {self.padding!r}; expected one of {', '.join(PADDING_MODES)}")
        if self.seed < 0:
            raise PlanError(f"--seed must be a non-negative integer, got {self.seed}")


class Record(NamedTuple):
    """One key -> value record in token space."""

    key: str
    value: str
    ids: tuple[int, ...]
    query: Query


class Target(NamedTuple):
    """A record whose value is asked for, at a planned position."""

    target_id: int
    context_index: int
    position: int  # first token of the target record (the key, for records)
    residue: int  # position mod M
    phase: int  # position mod S (sequences start at position 0)
    key: str
    answer: str
    query: Query


class ProbeContext(NamedTuple):
    index: int
    tokens: tuple[int, ...]
    targets: tuple[Target, ...]


def build_probes(task: Task, tokenizer: Tokenizer, settings: ProbeSettings) -> list[ProbeContext]:
    """Plan target positions and lay out contexts around them; deterministic in the seed."""
    records = RecordMaker(task, tokenizer)
    layout = Layout.of(task, tokenizer, settings, records)
    slots = plan_slots(layout.lowest_slot, layout.highest_slot, settings.modulus, settings.per_residue)
    order = np.random.default_rng(settings.seed).permutation(len(slots))
    pending = [int(slots[i]) for i in order]
    contexts: list[ProbeContext] = []
    n_targets = 0
    while pending:
        rng = np.random.default_rng([settings.seed, len(contexts)])
        context = layout.build(len(contexts), pending, rng, first_target_id=n_targets)
        if not context.targets:
            raise PlanError("could not place any target in a new context; try a longer --context")
        pending = _remove_once(pending, [t.position for t in context.targets])
        n_targets += len(context.targets)
        contexts.append(context)
    check_matched_moments([t for c in contexts for t in c.targets], settings.modulus)
    return contexts


def plan_slots(lowest: int, highest: int, modulus: int, per_residue: int) -> np.ndarray:
    """Target positions: `per_residue` for each residue, equal mean and near-equal SD.

    Residue r takes anchors B_j + r (B_j multiples of M spread over the range) and moves
    k = round(n r / M) of them down by M: the sum then loses about n r, which cancels the
    offset r, so every group has the anchors' mean (within M / 2n). Which anchors move is
    chosen to keep the standard deviation (`_spread_keeping_choice`).
    """
    first = -(-(lowest + modulus) // modulus) * modulus
    last = (highest - modulus + 1) // modulus * modulus
    if last < first:
        raise PlanError(
            f"the context leaves no room for targets (needs at least {3 * modulus} tokens "
            f"between {lowest} and {highest}); use a longer --context"
        )
    n = per_residue
    anchors = first + modulus * np.round(np.linspace(0, (last - first) // modulus, n)).astype(int)  # (n,)
    slots = []
    for r in range(modulus):
        shifted = np.zeros(n, dtype=int)  # (n,)
        shifted[_spread_keeping_choice(anchors, int(round(n * r / modulus)), modulus)] = 1
        slots.append(anchors + r - modulus * shifted)  # (n,)
    return np.concatenate(slots)  # (M * n,)


def _spread_keeping_choice(anchors: np.ndarray, k: int, modulus: int) -> list[int]:
    """Indices of k anchors to move down by M so the variance stays that of the anchors.

    Var(B - M s) = Var(B) when the moved anchors' deviations from the mean sum to
    M k (n - k) / 2n. Small groups search every choice; large ones take the anchors just
    above the middle, where the spread barely moves anyway.
    """
    n = len(anchors)
    deviations = anchors - anchors.mean()  # (n,)
    wanted = modulus * k * (n - k) / (2 * n)
    if k == 0:
        return []
    if math.comb(n, k) <= EXHAUSTIVE_CHOICES:
        best = min(itertools.combinations(range(n), k), key=lambda c: abs(deviations[list(c)].sum() - wanted))
        return list(best)
    return list(np.argsort(np.abs(deviations - modulus / 2), kind="stable")[:k])


def check_matched_moments(targets: Sequence[Target], modulus: int) -> None:
    """Raise PlanError unless every residue group's mean position is within 0.5 token of the
    common mean and the groups' SDs agree within 2%.

    Positions of residue r sum to n*r mod M, so with n < M per group the means cannot all
    agree within 0.5; there the bound is M / 2n, the best any choice of positions reaches.
    """
    positions = [np.array([t.position for t in targets if t.residue == r]) for r in range(modulus)]
    means = np.array([p.mean() for p in positions])  # (M,)
    sds = np.array([p.std() for p in positions])  # (M,)
    bound = max(MEAN_TOLERANCE, modulus / (2 * min(len(p) for p in positions)))
    if np.abs(means - means.mean()).max() > bound + 1e-9:
        raise PlanError(f"target position means {np.round(means, 2).tolist()} differ by more than {bound} tokens")
    if sds.max() > 0 and np.ptp(sds) / sds.max() > SD_TOLERANCE:
        raise PlanError(f"target position SDs {np.round(sds, 2).tolist()} differ by more than {SD_TOLERANCE:.0%}; "
                        f"use a larger --per-residue or a longer --context")


class RecordMaker:
    """Tokenizes records segment by segment, keeping only words that tokenize the same
    alone as inside a record (so no word merges across a segment boundary)."""

    def __init__(self, task: Task, tokenizer: Tokenizer):
        self.task = task
        self._tokenize_cached: dict[str, tuple[int, ...]] = {}
        self._tokenizer = tokenizer
        probe_value = task.values[0] if task.values else "1" * task.value_digits
        keys = [k for k in task.keys if self._joins_cleanly(k, probe_value)]
        self.values = tuple(v for v in task.values if self._joins_cleanly(keys[0] if keys else "", v))
        self.single_keys = tuple(keys)
        self.compound_keys = tuple(f"{m} {k}" for m in task.key_modifiers for k in keys)
        if task.keys and not keys:
            raise PlanError(f"task {task.name}: no key tokenizes cleanly inside a record")
        if task.values and not self.values:
            raise PlanError(f"task {task.name}: no value tokenizes cleanly inside a record")

    def ids(self, text: str) -> tuple[int, ...]:
        if text not in self._tokenize_cached:
            self._tokenize_cached[text] = tuple(self._tokenizer.tokenize(text))
        return self._tokenize_cached[text]

    def segments(self, segments: Sequence[str], key: str, value: str) -> tuple[int, ...]:
        return tuple(t for s in segments for t in self.ids(s.format(key=key, value=value)))

    def make(self, key: str, value: str) -> Record:
        task = self.task
        query = Query(self.segments(task.query, key, value), self.segments(task.answer, key, value))
        return Record(key, value, self.segments(task.record, key, value), query)

    def random_value(self, rng: np.random.Generator) -> str:
        if self.values:
            return self.values[rng.integers(len(self.values))]
        while True:
            digits = self.task.value_digits
            value = str(rng.integers(10 ** (digits - 1), 10**digits))
            if self._joins_cleanly("", value):
                return value

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
        return sum(len(self.ids(s.format(key="", value=""))) + 1 for s in self.task.record) + key_len + value_len

    def _joins_cleanly(self, key: str, value: str) -> bool:
        text = "".join(s.format(key=key, value=value) for s in self.task.record)
        return tuple(self._tokenizer.tokenize(text)) == self.segments(self.task.record, key, value)


@dataclass
class Layout:
    """Where things go in a context of `settings.context_length` tokens."""

    task: Task
    settings: ProbeSettings
    records: RecordMaker
    head: tuple[int, ...]  # prefix ids + header
    footer: tuple[int, ...]
    filler: tuple[int, ...]
    keys: tuple[str, ...]
    record_max: int  # upper bound on one record's tokens
    records_end: int  # records stay below this position

    @classmethod
    def of(cls, task: Task, tokenizer: Tokenizer, settings: ProbeSettings, records: RecordMaker) -> "Layout":
        head = tuple(tokenizer.prefix_ids) + records.ids(task.header)
        footer = records.ids(task.footer) if task.footer else ()
        filler = records.ids(task.filler.strip() + " ")
        typical = len(records.make(task.keys[0] if task.keys else "", records.random_value(np.random.default_rng(0))).ids)
        keys = records.keys_for((settings.context_length - len(head)) // typical if task.distractors else 1)
        record_max = records.longest(keys)
        records_end = settings.context_length - len(footer) - task.demonstrations * record_max
        return cls(task, settings, records, head, footer, filler, keys, record_max, records_end)

    @property
    def pad_max(self) -> int:
        return max(self.settings.modulus, self.record_max)

    @property
    def lowest_slot(self) -> int:
        return len(self.head) + self.pad_max

    @property
    def highest_slot(self) -> int:
        return self.records_end - self.pad_max - self.record_max

    def build(self, index: int, pending: list[int], rng: np.random.Generator, first_target_id: int) -> ProbeContext:
        if self.task.distractors and self.settings.padding == "prefix":
            items, chosen = self._prefix_items(pending, rng)
        else:
            chosen = self._spaced_slots(pending)
            items = self._in_sequence_items(chosen, rng)
        return self._assemble(index, items, chosen, rng, first_target_id)

    def _spaced_slots(self, pending: list[int]) -> list[int]:
        """Up to targets_per_context pending slots, far enough apart for a record each."""
        chosen: list[int] = []
        gap = 2 * self.record_max + self.settings.modulus
        for slot in pending:
            if all(abs(slot - c) >= gap for c in chosen):
                chosen.append(slot)
                if len(chosen) == self.task.targets_per_context:
                    break
        return sorted(chosen)

    def _prefix_items(self, pending: list[int], rng: np.random.Generator):
        """Records back to back, shifted by a prefix pad chosen to hit the first pending slot."""
        start = len(self.head)
        base = self._records_run(self.records_end - self.pad_max - start, rng)
        offsets = np.cumsum([0] + [len(r.ids) for r in base])[:-1]  # (n_records,)
        lead = pending[0] - start
        reachable = [int(o) for o in offsets if 0 <= lead - o < self.pad_max]
        if not reachable:
            raise PlanError(f"no record can reach position {pending[0]}; use a longer --context")
        pad = lead - reachable[int(rng.integers(len(reachable)))]
        starts = {start + pad + int(o): i for i, o in enumerate(offsets)}
        chosen = []
        for slot in pending:
            if slot in starts and slot not in chosen:
                chosen.append(slot)
                if len(chosen) == self.task.targets_per_context:
                    break
        items = [self._filler(pad, rng)] + [("target" if start + pad + int(o) in chosen else "distractor", r)
                                            for o, r in zip(offsets, base)]
        return items, sorted(chosen)

    def _in_sequence_items(self, chosen: list[int], rng: np.random.Generator):
        """Random gaps between records; each target record starts exactly at its slot."""
        items: list = []
        used = set()
        cursor = len(self.head)
        for boundary in chosen + [self.records_end]:
            while self.task.distractors and len(used) < len(self.keys):
                gap = int(rng.integers(self.settings.modulus))
                record = self._new_record(used, rng)
                if cursor + gap + len(record.ids) > boundary:
                    used.discard(record.key)
                    break
                items += [self._filler(gap, rng), ("distractor", record)]
                cursor += gap + len(record.ids)
            if boundary == self.records_end:
                break
            target = self._new_record(used, rng)
            items += [self._filler(boundary - cursor, rng), ("target", target)]
            cursor = boundary + len(target.ids)
        return items

    def _records_run(self, length: int, rng: np.random.Generator) -> list[Record]:
        run, used, total = [], set(), 0
        while len(used) < max(1, len(self.keys)):
            record = self._new_record(used, rng)
            if total + len(record.ids) > length:
                break
            run.append(record)
            total += len(record.ids)
        return run

    def _new_record(self, used: set, rng: np.random.Generator) -> Record:
        """A record with a key not yet in `used` (rejection sampling while most keys are free)."""
        key = ""
        if self.keys:
            key = self.keys[int(rng.integers(len(self.keys)))]
            if key in used:
                free = [k for k in self.keys if k not in used]
                key = free[int(rng.integers(len(free)))]
            used.add(key)
        return self.records.make(key, self.records.random_value(rng))

    def _filler(self, n: int, rng: np.random.Generator):
        start = int(rng.integers(len(self.filler)))
        stream = self.filler * (2 + n // len(self.filler))
        return ("filler", stream[start:start + n])

    def _assemble(self, index, items, chosen, rng, first_target_id) -> ProbeContext:
        body: list[int] = list(self.head)
        targets, distractors = [], []
        for kind, item in items:
            if kind == "filler":
                body += item
                continue
            if kind == "target":
                targets.append((len(body), item))
            else:
                distractors.append(item)
            body += item.ids
        demos = self._demonstrations(distractors, rng)
        footer = list(self.footer) + [t for d in demos for t in d.ids]
        body += self._filler(self.settings.context_length - len(footer) - len(body), rng)[1]
        tokens = tuple(body + footer)
        if len(tokens) != self.settings.context_length or [p for p, _ in targets] != chosen:
            raise AssertionError("probe layout broke its own invariants")  # a bug, not a user error
        m, s = self.settings.modulus, self.settings.stride
        return ProbeContext(index, tokens, tuple(
            Target(first_target_id + i, index, p, p % m, p % s, r.key, r.value, r.query)
            for i, (p, r) in enumerate(targets)
        ))

    def _demonstrations(self, distractors: list[Record], rng: np.random.Generator) -> list[Record]:
        n = min(self.task.demonstrations, len(distractors))
        picks = rng.choice(len(distractors), size=n, replace=False) if n else []
        return [distractors[int(i)] for i in picks]


def _remove_once(values: list[int], taken: list[int]) -> list[int]:
    left = list(values)
    for t in taken:
        left.remove(t)
    return left
