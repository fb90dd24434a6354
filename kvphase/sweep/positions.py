"""Target positions: where a plan's targets sit, context by context, and the check that their depths match.

Targets come in rounds of M contexts (`plan_contexts`): every residue `r` (mod M) gets the same
number of positions with the same mean and standard deviation (`residue_slots`), so a residue
effect is never a depth effect, and every context serves every residue equally (or, when a context
holds fewer than M targets, different residues once each), so a context that is hard as a whole
pulls every residue down alike (docs/protocol.md). With query phases each context's query starts
at its own phase (`query_phase`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from kvphase.errors import PlanError
from kvphase.sweep.context_settings import AUTO_DENSITY, MIN_CONTEXTS, ContextSettings

MEAN_TOLERANCE = 0.5  # tokens: largest distance of a residue group's mean position from the common mean
EXHAUSTIVE_CHOICES = 20_000  # up to this many ways to pick the moved anchors, try them all
SD_TOLERANCE = 0.02  # relative: largest spread of the groups' position standard deviations


def query_phase(index: int, modulus: int) -> int:
    """The filler tokens context `index` adds before its footer under `query_phases`: the query's
    phase moves one step per context and one more per round of M contexts (a Latin square), so every
    phase gets one context of every round, and contexts of one place in the round (the same residue
    in each lane) hold different phases from round to round: what the interaction test permutes."""
    return (index % modulus + index // modulus) % modulus


def answer_residue(target_residue: int, context_index: int, order: int, modulus: int) -> int:
    """The residue (mod M) at which the answer of a context's `order`-th target (by position) starts
    under `answer_phases`. Lane l of a round's context c holds target residue (l + c) mod M
    (`plan_contexts`), so each block of M consecutive targets holds every target residue once, and
    adding c and the block (order // M) gives every answer residue once per block too: balanced within
    every context. Over a round's M contexts each target residue meets each answer residue once per
    block (a Latin square); the round itself shifts the square, as `query_phase` does."""
    return (target_residue + context_index % modulus + context_index // modulus + order // modulus) % modulus


def check_query_phases_fit(settings: ContextSettings, lanes: int) -> None:
    """PlanError unless every context holds every residue equally (every round's lanes a multiple of
    M): a context holding some residues only would tie its residues to its query's phase (or, under
    answer phases, leave some answer residues out of it)."""
    sizes = round_sizes(settings.per_residue, settings.modulus, lanes)
    if not any(t % settings.modulus for t in sizes):
        return
    what, option = (("query phases", "--no-query-phases") if settings.query_phases else
                    ("answer phases", "--no-answer-phases"))
    raise PlanError(f"{what} need every context to hold every residue equally (targets per context a "
                    f"multiple of the modulus {settings.modulus}); this plan's contexts hold {min(sizes)}: "
                    "use a longer --context, a --per-residue that is a multiple of the targets per context, "
                    f"or {option}")


def lanes_for(density: str, settings: ContextSettings, most: int) -> int:
    """Lanes per round: at auto density as many as a context holds (`most`), but never so many
    that the run has fewer than MIN_CONTEXTS contexts (rounds of M contexts)."""
    if density != AUTO_DENSITY:
        return most
    rounds = -(-MIN_CONTEXTS // settings.modulus)
    return min(most, max(1, settings.per_residue // rounds))


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
    keep the unrefined choice, so existing run folders' plans stay put).
    """
    first, last = slot_range(lowest, highest, modulus)
    sizes = round_sizes(per_residue, modulus, lanes)
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


def slot_range(lowest: int, highest: int, modulus: int) -> tuple[int, int]:
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


def round_sizes(per_residue: int, modulus: int, lanes: int) -> list[int]:
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
    fingerprints (tests/sweep/test_reproducibility.py) fix every position, and the moments are
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


def check_matched_positions(all_positions: np.ndarray, modulus: int) -> None:
    """Raise PlanError unless every residue group's mean position (residue: position mod M) is within
    0.5 token of the common mean and the groups' SDs agree within 2%.

    Positions of residue r sum to n*r mod M, so with n < 2M per group the means cannot all
    agree within 0.5; there the bound is M / 2n, the best any choice of positions reaches,
    and M / 2 where only whole groups move (`residue_slots`): with n < M, or with every group
    at one depth (SD 0).
    """
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
