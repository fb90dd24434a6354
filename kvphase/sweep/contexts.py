"""A sweep's contexts: target positions planned first (`positions`), each context laid out around them (`layout`).

Every context is a `Context` of exactly `context_length` tokens whose target records
start at exact positions (`build_contexts`), deterministic in the seed; `plan_fingerprint`
names the result the same on every machine.
"""

from __future__ import annotations

from typing import Sequence

import hashlib
import json

import numpy as np

from kvphase.backends.base import Tokenizer
from kvphase.errors import PlanError
from kvphase.sweep.layout import Layout, Context, Target
from kvphase.sweep.positions import (check_matched_positions, check_query_phases_fit, lanes_for, plan_contexts,
                                     round_sizes)
from kvphase.sweep.context_settings import MIN_CONTEXTS, TASK_DENSITY, ContextSettings
from kvphase.sweep.records import RecordMaker
from kvphase.sweep.tasks import Task


def build_contexts(task: Task, tokenizer: Tokenizer, settings: ContextSettings,
                 rounds: int | None = None) -> list[Context]:
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
    contexts: list[Context] = []
    n_targets = 0
    for index, slots in enumerate(planned):
        rng = np.random.default_rng([settings.seed, index])
        context = layout.build(index, [int(s) for s in slots], rng, first_target_id=n_targets)
        n_targets += len(context.targets)
        contexts.append(context)
    if rounds is None:  # a part of the plan need not match its moments; the whole plan's slots did (`_planned_slots`)
        check_matched_moments([t for c in contexts for t in c.targets], settings.modulus)
    return contexts


def _planned_slots(layout: Layout, settings: ContextSettings, lanes: int) -> list[np.ndarray]:
    """`plan_contexts`'s slots; where they miss the matched moments (contexts of one or two targets
    can), planned again with the spread refined (`residue_slots`). Plans that meet them unrefined
    keep their slots, so the plans of existing run folders (their fingerprints) stay put."""
    def planned(refine: bool) -> list[np.ndarray]:
        return plan_contexts(layout.lowest_slot, layout.highest_slot, settings.modulus, settings.per_residue, lanes,
                             refine)

    first = planned(refine=False)
    try:
        check_matched_positions(np.concatenate(first), settings.modulus)
        return first
    except PlanError:
        return planned(refine=True)


def check_density(task: Task, tokenizer: Tokenizer, settings: ContextSettings) -> None:
    """PlanError when the plan's targets per context do not fit its context or leave fewer than
    MIN_CONTEXTS contexts: what `build_contexts` would find, found before a run writes anything."""
    checked_lanes(settings, Layout.of(task, tokenizer, settings))


def checked_lanes(settings: ContextSettings, layout: Layout) -> int:
    """The lanes a plan's rounds have (`lanes_for`), checked to fill MIN_CONTEXTS contexts at least
    (but for TASK_DENSITY's plans, which may fill fewer: the task file's density, which existing run
    folders were planned with)."""
    lanes = lanes_for(layout.density, settings, layout.lanes)
    if settings.query_phases or settings.answer_phases:
        check_query_phases_fit(settings, lanes)
    if layout.density == TASK_DENSITY:
        return lanes
    contexts = len(round_sizes(settings.per_residue, settings.modulus, lanes)) * settings.modulus
    if contexts < MIN_CONTEXTS:
        raise PlanError(f"--per-residue {settings.per_residue} at modulus {settings.modulus} fills only {contexts} "
                        f"contexts; the intervals resample contexts and need at least {MIN_CONTEXTS}: use a larger "
                        "--per-residue, fewer --targets-per-context, or auto")
    return lanes


def check_matched_moments(targets: Sequence[Target], modulus: int) -> None:
    """`positions.check_matched_positions` on the targets' positions: PlanError unless every residue
    group's mean position is within 0.5 token of the common mean and the groups' SDs agree within 2%."""
    check_matched_positions(np.array([t.position for t in targets]), modulus)


def plan_fingerprint(contexts: Sequence[Context]) -> str:
    """sha256 of every context's token ids and every target's id, position, key and answer (and the
    pad its query starts with, where it has one: plans without answer phases keep their sums).

    It depends on the tokenizer, the task files and the plan only, so it is the same on
    every machine: two runs with the same fingerprint scored the same targets.
    """
    digest = hashlib.sha256()
    for context in contexts:
        targets = [(t.target_id, t.position, t.key, t.answer) + ((list(t.query.prompt[:t.filler]),) if t.filler else ())
                   for t in context.targets]
        digest.update(json.dumps([context.index, list(context.tokens), targets]).encode())
    return digest.hexdigest()
