"""One context laid out token by token around its planned target positions (`Layout`): a `Context` of `Target`s.

Two padding modes:

- prefix: records sit back to back after a pad of filler, so distractors move in
  lockstep with the targets; the runs of records between targets are drawn to end
  exactly at the next target.
- in-sequence: random gaps of 0..M-1 filler tokens between records, so distractor
  phases are independent of the target's; or, for a task with `distractors_per_context`,
  that many distractor records at uniformly random free places (the sparse contexts
  `kvphase train` models learn on).

Every context has exactly `context_length` tokens, so every query starts at the same
position; with `query_phases` a context gets `query_phase(index, M)` more filler tokens before its
footer, so its query starts at that phase and its targets stay where they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import itertools

import numpy as np

from kvphase.backends.base import Query, Tokenizer
from kvphase.errors import PlanError, RecordLayoutError
from kvphase.sweep.positions import answer_residue, query_phase, slot_range
from kvphase.sweep.context_settings import AUTO_DENSITY, TASK_DENSITY, ContextSettings
from kvphase.sweep.records import Record, RecordLengths, RecordMaker
from kvphase.sweep.tasks import Task

EXACT_RUN_STEPS = 10_000  # records drawn (or taken back) for one exact run before giving up


class Target(NamedTuple):
    """A record whose value is asked for, at a planned position."""

    target_id: int
    context_index: int
    position: int  # first token of the target record (the key, for records)
    residue: int  # position mod M
    phase: int  # position mod S (sequences start at position 0)
    key: str
    answer: str
    query: Query  # under answer phases its prompt starts with `filler` filler tokens
    filler: int = 0  # filler tokens before the question (answer phases); the answer starts at len(context) + len(query.prompt)


class Context(NamedTuple):
    """One context's tokens and the targets planned in it."""

    index: int
    tokens: tuple[int, ...]
    targets: tuple[Target, ...]


@dataclass
class Layout:
    """Where things go in a context of `settings.context_length` tokens."""

    task: Task
    settings: ContextSettings
    records: RecordMaker
    head: tuple[int, ...]  # prefix ids + header
    footer: tuple[int, ...]
    filler: tuple[int, ...]
    keys: tuple[str, ...]
    record_max: int  # upper bound on one record's tokens
    records_end: int  # records stay below this position

    @classmethod
    def of(cls, task: Task, tokenizer: Tokenizer, settings: ContextSettings,
           records: RecordMaker | None = None) -> "Layout":
        """The layout of `settings`' contexts; `records`: the task's RecordMaker, where the caller
        keeps one to build contexts with (made here otherwise)."""
        records = records or RecordMaker(task, tokenizer)
        head = tuple(tokenizer.prefix_ids) + records.ids(task.header)
        footer = records.ids(task.footer) if task.footer else ()
        filler = records.ids(task.filler_text)
        typical = len(records.make(task.keys[0] if task.keys else "", records.random_value(np.random.default_rng(0))).ids)
        most_records = (settings.context_length - len(head)) // typical if task.distractors else 1
        if task.distractors_per_context:  # the targets and that many distractors, not a context full of records
            most_records = min(most_records, task.targets_per_context + task.distractors_per_context)
        keys = records.keys_for(most_records)
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
        return min(self.records_top, self.settings.context_length - self.settings.raw_window) - self.record_max

    @property
    def records_top(self) -> int:
        """The first token no target record reaches, where the compressor reads no window raw."""
        return self.records_end - self.pad_max

    @property
    def min_separation(self) -> int:
        return self._separation(self.density)

    def _separation(self, density: str) -> int:
        """Tokens between two targets of one context: room for the first target and at least one
        distractor record between them, so that a target's neighbours sit at random phases, never
        at ones its residue decides. In-sequence: a record and its random gap of up to M - 1
        tokens. Prefix: a run of back-to-back records whatever the target's length (every run
        from `shortest` tokens on can be made exactly). TASK_DENSITY plans keep the in-sequence
        room under prefix padding too, so their plans stay the same."""
        longest = max(self._fill.lengths)  # the records these word lists make; record_max only bounds them
        gap = 2 * longest + self.settings.modulus
        if not self.prefix:
            return gap
        if self._fill.shortest is None:
            raise RecordLayoutError(f"task {self.task.name}: every record has the same length, so back-to-back records "
                            "cannot reach every residue; use --padding in-sequence")
        run = longest + max(1, self._fill.shortest)
        return max(gap, run) if density == TASK_DENSITY else run

    @property
    def density(self) -> str:
        """The settings' targets_per_context, but TASK_DENSITY where auto finds room for fewer than
        M targets a context: a context holding a few residues compares them only with each other,
        which costs the stratified test more than the shared context saves (measured on the
        trained controls at 64 tokens, 2 targets a context against 1: detectable dip 33 against 18
        points at 64 per residue), so such contexts keep the task's plan."""
        density = self.settings.targets_per_context
        if density == AUTO_DENSITY and self.most_lanes < self.settings.modulus:
            return TASK_DENSITY
        return density

    @property
    def lanes(self) -> int:
        """Targets one context holds. With TASK_DENSITY the task's targets_per_context, fewer when
        that many, spaced by `min_separation`, do not fit between the lowest and highest slot (by
        the rule the task-density plans of existing run folders were made with, so they stay put); otherwise as many as fit
        (`most_lanes`), at most --targets-per-context, PlanError when that many do not fit."""
        m = self.settings.modulus
        blocks = self._blocks
        if self.density == TASK_DENSITY:
            # adjacent lanes' anchors lie at least m * (blocks // t) apart, their slots up to 2m - 1 closer
            fitting = [t for t in range(2, self.task.targets_per_context + 1)
                       if m * (blocks // t) - 2 * m + 1 >= self.min_separation]
            return max(fitting, default=1)
        most = self.most_lanes
        asked = self.settings.most_per_context
        if asked is None:
            return most
        if asked > most:
            raise PlanError(f"--targets-per-context {asked} does not fit: a {self.settings.context_length}-token "
                            f"context of task {self.task.name} holds at most {most} targets at modulus {m}; use "
                            f"--targets-per-context {most} (or auto) or a longer --context")
        if asked > m and asked % m:
            raise PlanError(f"--targets-per-context {asked} must be a multiple of the modulus {m}, so that every "
                            f"context holds each residue equally, or at most {m}; use {asked // m * m}")
        return asked

    @property
    def most_lanes(self) -> int:
        """The most targets a context holds: lanes whose closest slots, m - 1 closer than their
        anchors (residue 0 never moves down, `residue_slots`), stay `min_separation` apart; a
        multiple of M once that is at least M; at most the targets and distractors a sparse task's
        context has, and one where records have no key (nothing says which)."""
        m = self.settings.modulus
        anchor_blocks = -(-(self._separation(AUTO_DENSITY) + m - 1) // m)  # blocks between adjacent anchors
        most = max(1, self._blocks // anchor_blocks)
        if not self.task.keys:
            most = min(most, self.task.targets_per_context)
        if self.task.distractors_per_context:
            most = min(most, self.task.targets_per_context + self.task.distractors_per_context)
        return most // m * m if most >= m else most

    @property
    def _blocks(self) -> int:
        """Periods of M between the first and the last anchor; PlanError naming the smallest
        --context with room for one when there is none."""
        m, context = self.settings.modulus, self.settings.context_length
        try:
            first, last = slot_range(self.lowest_slot, self.highest_slot, m)
        except PlanError:
            raise PlanError(f"the context leaves no room for targets at modulus {m}: --context {context} is too "
                            f"short for task {self.task.name}; the smallest --context that fits is "
                            f"{self.smallest_context}") from None
        return (last - first) // m

    @property
    def smallest_context(self) -> int:
        """The shortest context whose slots hold one anchor (`slot_range`): everything below the highest
        slot but the context itself stays as long (at short contexts every key is a single word)."""
        m = self.settings.modulus
        first = -(-(self.lowest_slot + m) // m) * m
        below_highest = self.settings.context_length - self.highest_slot
        return first + m - 1 + below_highest

    @property
    def prefix(self) -> bool:
        return self.task.distractors and self.settings.padding == "prefix"

    def build(self, index: int, slots: list[int], rng: np.random.Generator, first_target_id: int) -> Context:
        """The context whose target records start exactly at `slots` (sorted)."""
        if self.task.distractors_per_context:
            items = self._scattered_items(slots, rng)
        else:
            items = self._prefix_items(slots, rng) if self.prefix else self._in_sequence_items(slots, rng)
        return self._assemble(index, items, slots, rng, first_target_id)

    def _prefix_items(self, slots: list[int], rng: np.random.Generator):
        """Records back to back after a pad of filler; the runs of distractor records between
        targets are drawn to end exactly where the next target starts."""
        start = len(self.head)
        pads = [p for p in range(self.pad_max) if self._fill.fillable(slots[0] - start - p)]
        if not pads:
            raise RecordLayoutError(f"no run of records reaches position {slots[0]}; use --padding in-sequence")
        pad = pads[int(rng.integers(len(pads)))]
        items: list = [self._filler(pad, rng)]
        used: set = set()
        cursor = start + pad
        for slot in slots:
            items += [("distractor", r) for r in self._exact_run(slot - cursor, used, rng)]
            target = self._new_record(used, rng)
            items.append(("target", target))
            cursor = slot + len(target.ids)
        return items + [("distractor", r) for r in self._records_run(self.records_end - cursor, rng, used)]

    def _exact_run(self, length: int, used: set, rng: np.random.Generator) -> list[Record]:
        """Random records whose lengths add up to exactly `length`. A record that would leave
        a remainder no records can make is redrawn at a length that leaves a makeable one;
        when no unused key gives such a record, the previous record is taken back."""
        run: list[Record] = []
        for _ in range(EXACT_RUN_STEPS):
            if not length:
                return run
            record = self._new_record(used, rng)
            if not self._fill.fillable(length - len(record.ids)):
                used.discard(record.key)
                record = self._record_leaving_fillable(length, used, rng)
            if record is None and run:
                record = run.pop()
                used.discard(record.key)
                length += len(record.ids)
                continue
            if record is None:
                break
            run.append(record)
            length -= len(record.ids)
        raise RecordLayoutError(f"task {self.task.name}: the keys left cannot make a run of records of exactly "
                        f"{length} tokens; use --padding in-sequence or a shorter --context")

    def _record_leaving_fillable(self, length: int, used: set, rng: np.random.Generator) -> Record | None:
        """A record with an unused key whose length leaves a makeable remainder of `length`."""
        fill = self._fill
        pairs = [(k, v) for k in fill.keys_by_length for v in fill.values_by_length
                 if fill.fillable(length - k - v)]
        for i in rng.permutation(len(pairs)):
            key_part, value_part = pairs[int(i)]
            keys = [k for k in fill.keys_by_length[key_part] if k not in used]
            if not keys:
                continue
            values = fill.values_by_length[value_part]
            record = self.records.make(keys[int(rng.integers(len(keys)))], values[int(rng.integers(len(values)))])
            if len(record.ids) == key_part + value_part:  # the lengths add up, as they do segment by segment
                used.add(record.key)
                return record
        return None

    @cached_property
    def _fill(self) -> "RecordLengths":
        return RecordLengths.of(self.records, self.keys, self.record_max)

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

    def _scattered_items(self, slots: list[int], rng: np.random.Generator):
        """The targets at their slots and `distractors_per_context` distractor records, each at
        a uniformly random place among the free stretches left, filler everywhere else."""
        used: set = set()
        placed = [(slot, "target", self._new_record(used, rng)) for slot in slots]
        bounds = [len(self.head)] + [x for slot, _, r in placed for x in (slot, slot + len(r.ids))] + [self.records_end]
        free = [(a, b) for a, b in zip(bounds[::2], bounds[1::2]) if b > a]  # stretches without a record
        for _ in range(self.task.distractors_per_context):
            record = self._new_record(used, rng)
            n = len(record.ids)
            room = np.array([max(0, b - a - n + 1) for a, b in free])  # (stretches,) starts that fit
            if not room.sum():
                raise PlanError(f"task {self.task.name}: {self.task.distractors_per_context} distractors do not fit "
                                f"a {self.settings.context_length}-token context; use a longer --context")
            i = int(rng.choice(len(free), p=room / room.sum()))
            a, b = free[i]
            start = a + int(rng.integers(room[i]))
            free[i:i + 1] = [(a, start), (start + n, b)]
            placed.append((start, "distractor", record))
        items, cursor = [], len(self.head)
        for start, kind, record in sorted(placed, key=lambda p: p[0]):
            items += [self._filler(start - cursor, rng), (kind, record)]
            cursor = start + len(record.ids)
        return items

    def _records_run(self, length: int, rng: np.random.Generator, used: set) -> list[Record]:
        """Random records back to back, as many as fit in `length` tokens."""
        run, total = [], 0
        while len(used) < max(1, len(self.keys)):
            record = self._new_record(used, rng)
            if total + len(record.ids) > length:
                used.discard(record.key)
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
                free = list(itertools.filterfalse(used.__contains__, self.keys))  # in C: a long context draws often
                if not free:  # prefix padding packs records closest; in-sequence's gaps need fewer
                    raise RecordLayoutError(f"task {self.task.name}: a context of {self.settings.context_length} "
                                            f"tokens needs more distinct keys than its word lists make "
                                            f"({len(self.keys)}); use a shorter --context")
                key = free[int(rng.integers(len(free)))]
            used.add(key)
        return self.records.make(key, self.records.random_value(rng))

    def _filler(self, n: int, rng: np.random.Generator):
        start = int(rng.integers(len(self.filler)))
        stream = self.filler * (2 + n // len(self.filler))
        return ("filler", stream[start:start + n])

    def _assemble(self, index, items, chosen, rng, first_target_id) -> Context:
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
        length = self.settings.context_length + self.query_shift(index)
        body += self._filler(length - len(footer) - len(body), rng)[1]
        tokens = tuple(body + footer)
        if len(tokens) != length or [p for p, _ in targets] != chosen:
            raise AssertionError("context layout broke its own invariants")  # a bug, not a user error
        m, s = self.settings.modulus, self.settings.stride
        return Context(index, tokens, tuple(
            self._with_answer_phase(Target(first_target_id + i, index, p, p % m, p % s, r.key, r.value, r.query), i,
                                    tokens)
            for i, (p, r) in enumerate(targets)
        ))

    def _with_answer_phase(self, target: Target, order: int, context: tuple[int, ...]) -> Target:
        """The target, under answer phases with the pad (0 to M - 1 tokens, `answer_pad`) before its
        question that starts its answer at `positions.answer_residue`."""
        if not self.settings.answer_phases:
            return target
        m = self.settings.modulus
        wanted = answer_residue(target.residue, target.context_index, order, m)
        length = (wanted - len(context) - len(target.query.prompt)) % m
        pad = self.answer_pad(length, context[-1])
        query = target.query._replace(prompt=pad + tuple(target.query.prompt), pad=length)
        return target._replace(query=query, filler=length)

    def answer_pad(self, length: int, last: int) -> tuple[int, ...]:
        """`length` tokens a question follows, chosen so that the model barely reads them: a space; or
        spaces ending in the context's `last` token, so that the question follows the token it follows
        without a pad (the flattest of the pads measured on SmolLM2: the task's filler, newlines, spaces,
        dashes or filler or spaces ending in a newline, the footer's last tokens). Without a one-token space in
        the vocabulary, the task's filler stream stands in for the spaces."""
        space = self.records.ids(" ")
        unit = space if len(space) == 1 else self.filler
        if length < 2:
            return tuple(unit[:length])
        return tuple((unit * length)[:length - 1]) + (last,)

    def query_shift(self, index: int) -> int:
        """Filler tokens context `index` adds before its footer: its query's phase (0 without query phases)."""
        return query_phase(index, self.settings.modulus) if self.settings.query_phases else 0

    def _demonstrations(self, distractors: list[Record], rng: np.random.Generator) -> list[Record]:
        n = min(self.task.demonstrations, len(distractors))
        picks = rng.choice(len(distractors), size=n, replace=False) if n else []
        return [distractors[int(i)] for i in picks]
