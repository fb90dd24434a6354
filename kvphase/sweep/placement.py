"""Token-level probes: contexts whose target records start at exact positions.

Every segment is tokenized on its own and the ids are joined, so a position is known
exactly and never shifts by re-tokenizing joined text. Target positions are planned
first, context by context (`plan_contexts`): every residue `r` (mod M) gets the same
number of positions with the same mean and standard deviation, so a residue effect is
never a depth effect, and every context serves every residue equally (or, when a context
holds fewer than M targets, different residues once each), so a context that is hard as a
whole pulls every residue down alike (docs/protocol.md). Contexts are then laid out around
those positions, in one of the two padding modes:

- prefix: records sit back to back after a pad of filler, so distractors move in
  lockstep with the targets; the runs of records between targets are drawn to end
  exactly at the next target.
- in-sequence: random gaps of 0..M-1 filler tokens between records, so distractor
  phases are independent of the target's; or, for a task with `distractors_per_context`,
  that many distractor records at uniformly random free places (the sparse contexts
  `kvphase train` models learn on).

All contexts have exactly `context_length` tokens, so every query starts at the same
position; with `query_phases` a context gets `query_phase(index, M)` more filler tokens before its
footer, so its query starts at that phase and its targets stay where they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple, Protocol, Sequence

import hashlib
import itertools
import json
import math

import numpy as np

from kvphase.backends.base import Query
from kvphase.errors import PlanError, RecordLayoutError
from kvphase.sweep.tasks import Task

PADDING_MODES = ("prefix", "in-sequence")
MEAN_TOLERANCE = 0.5  # tokens: largest distance of a residue group's mean position from the common mean
EXHAUSTIVE_CHOICES = 20_000  # up to this many ways to pick the moved anchors, try them all
SD_TOLERANCE = 0.02  # relative: largest spread of the groups' position standard deviations
MAX_TARGETS = 1 << 16  # targets in one run: about a minute of planning, and more than any test needs
MAX_CONTEXT = 1 << 22  # tokens; beyond every model's context, and a plan of that size fits in memory
EXACT_RUN_STEPS = 10_000  # records drawn (or taken back) for one exact run before giving up
MAX_NUMBER_DRAWS = 1_000  # random numbers drawn for one value before deciding none tokenizes cleanly
MIN_CONTEXTS = 8  # contexts a run needs at least (but for TASK_DENSITY's plans): the bootstrap resamples them
TASK_DENSITY = "task"  # at most the task file's targets_per_context: how every run before --targets-per-context planned
AUTO_DENSITY = "auto"  # as many targets as the context's records allow


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
    targets_per_context: str = TASK_DENSITY  # TASK_DENSITY, AUTO_DENSITY, or a whole number: the most one context holds
    query_phases: bool = False  # each context's query at its own phase (`query_phase`); False: all at context_length
    raw_window: int = 0  # the last tokens before the query that the compressor reads raw: targets end before them

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
        if self.modulus > self.context_length:
            raise PlanError(f"--context {self.context_length} is shorter than one period of the modulus {self.modulus}")
        if self.per_residue * self.modulus > MAX_TARGETS:  # checked before any planning, however large
            raise PlanError(f"--per-residue {self.per_residue} asks for {self.per_residue * self.modulus} targets "
                            f"(mod {self.modulus}); one run holds at most {MAX_TARGETS}: the largest --per-residue "
                            f"that fits is {MAX_TARGETS // self.modulus}")
        if self.padding not in PADDING_MODES:
            raise PlanError(f"unknown padding {self.padding!r}; expected one of {', '.join(PADDING_MODES)}")
        if self.seed < 0:
            raise PlanError(f"--seed must be a non-negative integer, got {self.seed}")
        if not 0 <= self.raw_window < self.context_length:
            raise PlanError(f"a {self.raw_window}-token raw window leaves no room for targets in a "
                            f"{self.context_length}-token context; use a longer --context")
        self.most_per_context  # a density that parses

    @property
    def most_per_context(self) -> int | None:
        """The --targets-per-context a user asked for as a number; None for auto and task."""
        density = self.targets_per_context
        if density in (TASK_DENSITY, AUTO_DENSITY):
            return None
        if not isinstance(density, str) or not density.isascii() or not density.isdigit() or not 1 <= int(density) <= MAX_TARGETS:
            raise PlanError(f"--targets-per-context must be 'auto', 'task' or a whole number from 1 to {MAX_TARGETS} "
                            f"(both included), got {str(density)[:40]!r}")
        return int(density)


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


def build_probes(task: Task, tokenizer: Tokenizer, settings: ProbeSettings,
                 rounds: int | None = None) -> list[ProbeContext]:
    """Plan target positions context by context and lay each context out around them;
    deterministic in the seed. `rounds`: only the contexts of the first that many rounds (M
    contexts each), which is what checking that a plan can be laid out needs: a round puts every
    residue in every lane. A long plan's layout costs minutes (10k contexts of 8K tokens: about
    7 minutes here), so a sweep lays out its whole plan once, to score it."""
    records = RecordMaker(task, tokenizer)
    layout = Layout.of(task, tokenizer, settings, records)
    lanes = checked_lanes(settings, layout)
    planned = _planned_slots(layout, settings, lanes)
    planned = planned if rounds is None else planned[:rounds * settings.modulus]
    contexts: list[ProbeContext] = []
    n_targets = 0
    for index, slots in enumerate(planned):
        rng = np.random.default_rng([settings.seed, index])
        context = layout.build(index, [int(s) for s in slots], rng, first_target_id=n_targets)
        n_targets += len(context.targets)
        contexts.append(context)
    if rounds is None:  # a part of the plan need not match its moments; the whole plan's slots did (`_planned_slots`)
        check_matched_moments([t for c in contexts for t in c.targets], settings.modulus)
    return contexts


def _planned_slots(layout: "Layout", settings: ProbeSettings, lanes: int) -> list[np.ndarray]:
    """`plan_contexts`'s slots; where they miss the matched moments (contexts of one or two targets
    can), planned again with the spread refined (`residue_slots`). Plans that meet them unrefined
    keep their slots, as every plan made before the refinement did (the others were refused)."""
    def planned(refine: bool) -> list[np.ndarray]:
        return plan_contexts(layout.lowest_slot, layout.highest_slot, settings.modulus, settings.per_residue, lanes,
                             refine)

    first = planned(refine=False)
    try:
        check_matched_positions(np.concatenate(first), settings.modulus)
        return first
    except PlanError:
        return planned(refine=True)


def check_density(task: Task, tokenizer: Tokenizer, settings: ProbeSettings) -> None:
    """PlanError when the plan's targets per context do not fit its context or leave fewer than
    MIN_CONTEXTS contexts: what `build_probes` would find, found before a run writes anything."""
    checked_lanes(settings, Layout.of(task, tokenizer, settings, RecordMaker(task, tokenizer)))


def checked_lanes(settings: ProbeSettings, layout: "Layout") -> int:
    """The lanes a plan's rounds have (`lanes_for`), checked to fill MIN_CONTEXTS contexts at least
    (but for TASK_DENSITY's plans, which every earlier run made)."""
    lanes = lanes_for(layout.density, settings, layout.lanes)
    if settings.query_phases:
        check_query_phases_fit(settings, lanes)
    if layout.density == TASK_DENSITY:
        return lanes
    contexts = len(_round_sizes(settings.per_residue, settings.modulus, lanes)) * settings.modulus
    if contexts < MIN_CONTEXTS:
        raise PlanError(f"--per-residue {settings.per_residue} at modulus {settings.modulus} fills only {contexts} "
                        f"contexts; the intervals resample contexts and need at least {MIN_CONTEXTS}: use a larger "
                        "--per-residue, fewer --targets-per-context, or auto")
    return lanes


def query_phase(index: int, modulus: int) -> int:
    """The filler tokens context `index` adds before its footer under `query_phases`: the query's
    phase moves one step per context and one more per round of M contexts (a Latin square), so every
    phase gets one context of every round, and contexts of one place in the round (the same residue
    in each lane) hold different phases from round to round: what the interaction test permutes."""
    return (index % modulus + index // modulus) % modulus


def check_query_phases_fit(settings: ProbeSettings, lanes: int) -> None:
    """PlanError unless every context holds every residue equally (every round's lanes a multiple of
    M): a context holding some residues only would tie its residues to its query's phase."""
    sizes = _round_sizes(settings.per_residue, settings.modulus, lanes)
    if any(t % settings.modulus for t in sizes):
        raise PlanError(f"query phases need every context to hold every residue equally (targets per context a "
                        f"multiple of the modulus {settings.modulus}); this plan's contexts hold {min(sizes)}: "
                        "use a longer --context, a --per-residue that is a multiple of the targets per context, "
                        "or --no-query-phases")


def lanes_for(density: str, settings: ProbeSettings, most: int) -> int:
    """Lanes per round: at auto density as many as a context holds (`most`), but never so many
    that the run has fewer than MIN_CONTEXTS contexts (rounds of M contexts)."""
    if density != AUTO_DENSITY:
        return most
    rounds = -(-MIN_CONTEXTS // settings.modulus)
    return min(most, max(1, settings.per_residue // rounds))


def plan_fingerprint(contexts: Sequence[ProbeContext]) -> str:
    """sha256 of every context's token ids and every target's id, position, key and answer.

    It depends on the tokenizer, the task files and the plan only, so it is the same on
    every machine: two runs with the same fingerprint scored the same targets.
    """
    digest = hashlib.sha256()
    for context in contexts:
        targets = [(t.target_id, t.position, t.key, t.answer) for t in context.targets]
        digest.update(json.dumps([context.index, list(context.tokens), targets]).encode())
    return digest.hexdigest()


def plan_contexts(lowest: int, highest: int, modulus: int, per_residue: int, lanes: int,
                  refine: bool = False) -> list[np.ndarray]:
    """Target positions, grouped into contexts that serve every residue equally.

    Targets come in rounds of M contexts. A round has t lanes (depths spread over the
    range); in its context c, lane l holds residue (l + c) mod M, so over the round every
    residue visits every lane once. With t a multiple of M each context holds t / M
    targets of every residue; with t < M (short contexts, one target per context, large
    moduli) each holds t different residues once each. Every residue thus sits at the same
    depths, and `residue_slots` moves some of its targets down by M so that the groups'
    means and SDs agree (`refine`: to the token, as `residue_slots` says; TASK_DENSITY's plans
    keep the choice every earlier run made).
    """
    first, last = _slot_range(lowest, highest, modulus)
    sizes = _round_sizes(per_residue, modulus, lanes)
    blocks = (last - first) // modulus
    anchors = np.concatenate([
        first + modulus * np.floor((np.arange(t) + (i + 0.5) / len(sizes)) * blocks / t).astype(int)
        for i, t in enumerate(sizes)])  # (n,) the lanes of every round, round after round
    slots = residue_slots(anchors, modulus, refine)  # (M, n)
    contexts, done = [], 0
    for t in sizes:
        lane = np.arange(t)  # (t,)
        for c in range(modulus):
            residue = (lane + c) % modulus  # (t,) which residue each lane holds in this context
            contexts.append(np.sort(slots[residue, done + lane]))  # (t,)
        done += t
    return contexts


def _slot_range(lowest: int, highest: int, modulus: int) -> tuple[int, int]:
    """The first and last anchor (multiples of M) whose slots, r - M .. r + M - 1 around
    them, stay within [lowest, highest]."""
    first = -(-(lowest + modulus) // modulus) * modulus
    last = (highest - modulus + 1) // modulus * modulus
    if last < first:
        raise PlanError(
            f"the context leaves no room for targets at modulus {modulus} (they need at least {3 * modulus} tokens "
            f"from position {lowest} on, and the last usable position is {highest}); use a longer --context"
        )
    return first, last


def _round_sizes(per_residue: int, modulus: int, lanes: int) -> list[int]:
    """Lanes per round: as many as a context holds, a multiple of M once that is at least M,
    so that every context holds the same number of each residue."""
    sizes, left = [], per_residue
    while left:
        t = min(lanes, left)
        t = t // modulus * modulus if t >= modulus else t
        sizes.append(t)
        left -= t
    return sizes


def residue_slots(anchors: np.ndarray, modulus: int, refine: bool = False) -> np.ndarray:
    """For each residue r, the positions anchors + r, some moved down by M: (M, n).

    Moving k = round(n r / M) anchors down by M takes about n r off the sum, which cancels
    the offset r, so every group has the anchors' mean (within M / 2n; exactly when M
    divides n). Which anchors move is chosen to keep the standard deviation
    (`_spread_keeping_choice`). With fewer anchors than residues no choice keeps it (two
    targets have one distance), nor when every anchor is the same depth (a context with room
    for one, as at M = 128 in a 1K context): there the residues from M / 2 on move as a
    whole: equal SDs, means within M / 2.
    """
    n = len(anchors)
    whole_groups = n < modulus or np.ptp(anchors) == 0
    slots = np.empty((modulus, n), dtype=int)
    for r in range(modulus):
        shifted = np.zeros(n, dtype=int)  # (n,)
        if whole_groups:
            shifted[:] = r >= modulus / 2
        else:
            shifted[_spread_keeping_choice(anchors, int(round(n * r / modulus)), modulus, refine)] = 1
        slots[r] = anchors + r - modulus * shifted  # (n,)
    return slots


def _spread_keeping_choice(anchors: np.ndarray, k: int, modulus: int, refine: bool = False) -> list[int]:
    """Indices of k anchors to move down by M so the variance stays that of the anchors.

    Var(B - M s) = Var(B) when the moved anchors' deviations from the mean sum to
    M k (n - k) / 2n. Small groups search every choice; large ones take the anchors just
    above the middle, where the spread barely moves anyway, and with `refine` then swap moved
    and unmoved anchors while that brings the sum nearer (few distinct depths, as in contexts
    of two targets, leave the first choice several percent off).

    "Just above the middle" is pinned by outcome, not by a test of its own: the plans'
    fingerprints (tests/test_reproducibility.py) fix every position, and the moments are
    checked on every plan. Anchors sit on the M grid, so their deviations from the mean come
    in pairs symmetric about it, and "nearest the middle" picks the same anchors: on both
    fingerprinted plans (7 large choices each) the two rules differ nowhere, which is why
    the planted alternative passed every test.
    """
    n = len(anchors)
    deviations = anchors - anchors.mean()  # (n,)
    wanted = modulus * k * (n - k) / (2 * n)
    if k == 0:
        return []
    if math.comb(n, k) <= EXHAUSTIVE_CHOICES:
        best = min(itertools.combinations(range(n), k), key=lambda c: abs(deviations[list(c)].sum() - wanted))
        return list(best)
    chosen = np.argsort(np.abs(deviations - modulus / 2), kind="stable")[:k]
    return list(_swapped_nearer(deviations, chosen, wanted)) if refine else list(chosen)


def _swapped_nearer(deviations: np.ndarray, chosen: np.ndarray, wanted: float) -> np.ndarray:
    """`chosen` after the best single swaps of a chosen index for an unchosen one, one at a time,
    while each brings the chosen deviations' sum nearer `wanted`."""
    chosen = chosen.copy()
    inside = np.zeros(len(deviations), dtype=bool)  # (n,)
    inside[chosen] = True
    for _ in range(len(deviations)):
        error = deviations[inside].sum() - wanted
        outs, ins = np.unique(deviations[inside]), np.unique(deviations[~inside])  # (a,), (b,)
        change = ins[None, :] - outs[:, None]  # (a, b): the sum's change of swapping an out-value for an in-value
        a, b = np.unravel_index(np.argmin(np.abs(error + change)), change.shape)
        if abs(error + change[a, b]) >= abs(error) - 1e-9:
            break
        leaving = np.flatnonzero(inside & (deviations == outs[a]))[0]
        joining = np.flatnonzero(~inside & (deviations == ins[b]))[0]
        inside[leaving], inside[joining] = False, True
    return np.flatnonzero(inside)


def check_matched_moments(targets: Sequence[Target], modulus: int) -> None:
    """Raise PlanError unless every residue group's mean position is within 0.5 token of the
    common mean and the groups' SDs agree within 2%.

    Positions of residue r sum to n*r mod M, so with n < 2M per group the means cannot all
    agree within 0.5; there the bound is M / 2n, the best any choice of positions reaches,
    and M / 2 where only whole groups move (`residue_slots`): with n < M, or with every group
    at one depth (SD 0).
    """
    check_matched_positions(np.array([t.position for t in targets]), modulus)


def check_matched_positions(all_positions: np.ndarray, modulus: int) -> None:
    """`check_matched_moments` on the target positions alone (their residue is position mod M)."""
    positions = [all_positions[all_positions % modulus == r] for r in range(modulus)]
    means = np.array([p.mean() for p in positions])  # (M,)
    sds = np.array([p.std() for p in positions])  # (M,)
    n = min(len(p) for p in positions)
    bound = modulus / 2 if n < modulus or sds.max() == 0 else max(MEAN_TOLERANCE, modulus / (2 * n))
    if np.abs(means - means.mean()).max() > bound + 1e-9:
        raise PlanError(f"the {modulus} residue groups' mean target positions ({_extremes(means)}) differ by more "
                        f"than {bound:g} tokens")
    if sds.max() > 0 and np.ptp(sds) / sds.max() > SD_TOLERANCE:
        raise PlanError(f"the {modulus} residue groups' target position SDs ({_extremes(sds)}) differ by more than "
                        f"{SD_TOLERANCE:.0%}; use a larger --per-residue or a longer --context")


def _extremes(values: np.ndarray) -> str:
    """'from LOW at residue r to HIGH at residue r'': one line however large the modulus."""
    low, high = int(np.argmin(values)), int(np.argmax(values))
    return f"from {values[low]:.2f} at residue {low} to {values[high]:.2f} at residue {high}"


class RecordMaker:
    """Tokenizes records segment by segment, keeping only words that tokenize the same
    alone as inside a record (so no word merges across a segment boundary)."""

    def __init__(self, task: Task, tokenizer: Tokenizer):
        self.task = task
        self._tokenize_cached: dict[str, tuple[int, ...]] = {}
        self._tokenizer = tokenizer
        self._uses_other = any("{other}" in s for s in task.record + task.query + task.answer)
        probe_value = task.values[0] if task.values else "1" * task.value_digits
        # the value stands in for {other} too, so a kept value joins cleanly in either place
        keys = [k for k in task.keys if self._joins_cleanly(k, probe_value, other=probe_value)]
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
        room under prefix padding too (as every earlier run did)."""
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
        the rule every earlier run planned with, so their plans stay put); otherwise as many as fit
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
            first, last = _slot_range(self.lowest_slot, self.highest_slot, m)
        except PlanError:
            raise PlanError(f"the context leaves no room for targets at modulus {m}: --context {context} is too "
                            f"short for task {self.task.name}; the smallest --context that fits is "
                            f"{self.smallest_context}") from None
        return (last - first) // m

    @property
    def smallest_context(self) -> int:
        """The shortest context whose slots hold one anchor (`_slot_range`): everything below the highest
        slot but the context itself stays as long (at short contexts every key is a single word)."""
        m = self.settings.modulus
        first = -(-(self.lowest_slot + m) // m) * m
        below_highest = self.settings.context_length - self.highest_slot
        return first + m - 1 + below_highest

    @property
    def prefix(self) -> bool:
        return self.task.distractors and self.settings.padding == "prefix"

    def build(self, index: int, slots: list[int], rng: np.random.Generator, first_target_id: int) -> ProbeContext:
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
        length = self.settings.context_length + self.query_shift(index)
        body += self._filler(length - len(footer) - len(body), rng)[1]
        tokens = tuple(body + footer)
        if len(tokens) != length or [p for p, _ in targets] != chosen:
            raise AssertionError("probe layout broke its own invariants")  # a bug, not a user error
        m, s = self.settings.modulus, self.settings.stride
        return ProbeContext(index, tokens, tuple(
            Target(first_target_id + i, index, p, p % m, p % s, r.key, r.value, r.query)
            for i, (p, r) in enumerate(targets)
        ))

    def query_shift(self, index: int) -> int:
        """Filler tokens context `index` adds before its footer: its query's phase (0 without query phases)."""
        return query_phase(index, self.settings.modulus) if self.settings.query_phases else 0

    def _demonstrations(self, distractors: list[Record], rng: np.random.Generator) -> list[Record]:
        n = min(self.task.demonstrations, len(distractors))
        picks = rng.choice(len(distractors), size=n, replace=False) if n else []
        return [distractors[int(i)] for i in picks]


@dataclass(frozen=True)
class RecordLengths:
    """How long records are, and which runs of back-to-back records can be made exactly.

    A record's length is its key's share plus its value's share (each segment is
    tokenized on its own); `_record_of_length` checks every record it draws anyway.
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
