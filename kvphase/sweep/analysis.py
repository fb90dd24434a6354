"""A run's summary and verdicts, read with the methods of `kvphase.statistics`: per-residue accuracy
with Wilson intervals, gap with its interval over contexts, periodicity, context-stratified tests
of "the outcome does not depend on the residue" on accuracy and on the answer log-probability, the
smallest dip the run could have detected, and how alike a context's targets were (their
intra-context correlation and design effect). Prints nothing."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace

import numpy as np
import pandas as pd

from kvphase.statistics.intervals import (basic_interval, bootstrap_gaps, design_effect, gap_interval,
                                         intra_context_correlation, mean_coverage, mean_intervals, wilson_interval)
from kvphase.statistics.power import POWER, Detectable, detectable, per_residue_for_dip
from kvphase.statistics.stratified import (ALPHA, Stratification, StratifiedTest, format_p, holm, interaction_test,
                                          p_text, stratified_test, unavailable_test)
from kvphase.statistics.printed import fixed

DEGENERATE_SHARE = 0.9  # one answer given to this share of targets or more: the answers ignore the query
NARROW_ANSWERS = 2.0  # or this few answers in effect (the exponential of their entropy)...
SPREAD_TRUTH = 4.0  # ...where the right answers spread over at least this many in effect (else the task is narrow)


@dataclass(frozen=True)
class AnswerSpread:
    """How the model's answers spread over the targets, against how the right answers do."""

    commonest: str  # the answer given most often ("" for an empty answer)
    commonest_share: float  # of targets, 0-1
    effective: float  # the answers' effective number: exp(entropy)
    truth_effective: float  # the right answers' effective number

    @property
    def degenerate(self) -> bool:
        """The answers do not depend on the query: one answer nearly always, or next to no spread of
        answers where the right ones spread."""
        return self.truth_effective >= SPREAD_TRUTH and (
            self.commonest_share >= DEGENERATE_SHARE or self.effective <= NARROW_ANSWERS)


def answer_spread(predicted: pd.Series, truth: pd.Series) -> AnswerSpread:
    """`predicted` and `truth` (one per target) as text; a missing answer counts as the empty one."""
    given = predicted.astype(object).fillna("").astype(str)
    shares = given.value_counts(normalize=True)  # commonest first
    return AnswerSpread(str(shares.index[0]), float(shares.iloc[0]), _effective(shares),
                        _effective(truth.astype(object).fillna("").astype(str).value_counts(normalize=True)))


def _effective(shares: pd.Series) -> float:
    p = shares.to_numpy(dtype=float)  # (K,)
    return float(np.exp(-(p * np.log(p)).sum()))


def exact_accuracies(per_residue: list[dict]) -> dict[str, float]:
    """The mean, worst, best and gap (%, points) from each residue's counts (a summary's `per_residue` rows),
    unrounded: the two-decimal fields rounded again to one decimal would round twice."""
    accuracy = [100 * row["correct"] / row["n"] for row in per_residue]
    return {"mean": sum(accuracy) / len(accuracy), "worst": min(accuracy), "best": max(accuracy),
            "gap": max(accuracy) - min(accuracy)}


AT_THE_FLOOR = "uninformative at the floor"  # no dip that fits above chance would be detected
TOO_FEW_TARGETS = "uninformative, too few targets"  # the accuracy has room for a dip, the sample does not
SILENT = ("degenerate", AT_THE_FLOOR, TOO_FEW_TARGETS)  # the verdicts that read no phase and run no test
# every class a report can print (`Summary.verdict`), in the order it decides them: the glossary and
# docs/statistics.md define these (tests/project/test_claims.py counts them there)
VERDICTS = ("compressor inactive", *SILENT, "effect", "inconclusive", "no effect at this power")
PLANNED_DIP = 20.0  # points above chance a run needs to be sized for more targets, and the dip it is sized for


@functools.lru_cache(maxsize=None)
def targets_for_dip(points: float, modulus: int) -> int:
    """Targets per residue that detect a one-residue dip of `points` at any accuracy: the planner's own rule."""
    return per_residue_for_dip(points / 100, modulus)


@dataclass(frozen=True)
class Summary:
    """What a report says, as numbers (accuracies in percent), each at full precision: printed, it is rounded
    once (`statistics.printed.fixed`)."""

    n_targets: int
    n_contexts: int
    balanced: bool  # every context holds the same number of targets of each residue it serves
    control: bool  # the model declares no compression: the stride is the user's
    mean_accuracy: float  # mean over residues
    mean_ci: tuple[float, float]  # 95% interval of the mean (contexts the sampled units, widened for few contexts)
    worst_accuracy: float
    worst_residue: int
    best_accuracy: float
    best_residue: int
    gap: float  # best - worst, points; biased upward at small n
    gap_ci: tuple[float, float]  # 95% simultaneous interval of the gap; its lower end as computed (<= 0: no gap excluded)
    periodicity: float | None  # mean over r < S of |A(r) - A(r + S)|, when M = 2S
    detectable_dip: float | None  # points: a one-residue dip the accuracy test finds with 80% power; None: none fits
    test: StratifiedTest  # accuracy
    logprob_test: StratifiedTest  # answer log-probability
    per_residue: list[dict]
    per_phase: list[dict]
    # the fields below have defaults so that a summary.json without them still loads
    targets_per_context: float | None = None  # mean over contexts; None only as a default, filled in below
    icc: float | None = None  # intra-context correlation of correctness; None when it cannot be measured
    design_effect: float | None = None  # 1 + (targets_per_context - 1) icc
    largest_dip: float | None = None  # points: the most a dip can take (the mean's interval's lower end)
    power_at_floor: float | None = None  # how often a dip that large at the hardest residue would be found (0-1)
    answers: dict | None = None  # AnswerSpread's fields; None when the results hold no answers
    mean_coverage: float | None = None  # share of runs simulated like this one whose mean interval held the mean
    compressor_inactive: str | None = None  # why no part of the model's compressor touched a target, in words
    chance: float = 0.0  # percent: the accuracy of a guess among the task's values (0: unknown)
    knobs: list[str] | None = None  # what `--calibrate` can turn on this run's task ([] none; None: not recorded)
    calibrated: bool = False  # `--calibrate` chose the run's setting
    # where the answer's phase was planned (answer_phases): the same numbers by the answer's residue
    # (answer_pos mod M), the target x answer interaction, and the three tests' Holm-adjusted p-values
    answer_axis: "Summary | None" = None
    interaction: StratifiedTest | None = None

    def __post_init__(self) -> None:
        if self.targets_per_context is None:  # a summary.json without it: it follows from the counts
            object.__setattr__(self, "targets_per_context", self.n_targets / self.n_contexts)

    @classmethod
    def from_json(cls, data: dict) -> "Summary":
        """The summary a summary.json holds (its words, headline and verdict, are recomputed)."""
        fields = {k: v for k, v in data.items() if k not in ("headline", "verdict", "holm_adjusted")}
        for name in ("test", "logprob_test", "interaction"):
            if isinstance(fields.get(name), dict):
                fields[name] = StratifiedTest(**fields[name])
        if isinstance(fields.get("answer_axis"), dict):
            fields["answer_axis"] = cls.from_json(fields["answer_axis"])
        return cls(**{**fields, "gap_ci": tuple(fields["gap_ci"]), "mean_ci": tuple(fields.get("mean_ci", (0.0, 0.0)))})

    @property
    def adjusted(self) -> dict[str, float] | None:
        """Holm-adjusted p of the target's, the answer's and the interaction's accuracy tests (None
        where the answer's phase was not planned)."""
        if self.answer_axis is None or self.interaction is None:
            return None
        tests = {"target": self.test.p_value, "answer": self.answer_axis.test.p_value,
                 "interaction": self.interaction.p_value}
        return dict(zip(tests, holm(list(tests.values()))))

    def _axes_with_effect(self) -> list[str]:
        adjusted = self.adjusted or {}
        return [axis for axis, p in adjusted.items() if p < ALPHA]

    @property
    def exact(self) -> dict[str, float]:
        """`exact_accuracies` of this run: what a headline prints, rounded once."""
        return exact_accuracies(self.per_residue)

    @property
    def spread(self) -> AnswerSpread | None:
        return None if self.answers is None else AnswerSpread(**self.answers)

    @property
    def verdict(self) -> str:
        """The report's class, decided first from the rows and only then from the tests:
        "degenerate" (the answers do not depend on the query); when no one-residue dip that fits
        between the accuracy and chance would be detected with 80% power, "uninformative at the floor"
        (the accuracy leaves less than a PLANNED_DIP above chance) or "uninformative, too few targets"
        (it leaves room, the sample does not); then "effect" (the accuracy test rejects at alpha),
        "inconclusive" (it does not, but the gap's interval excludes 0 or the log-probability test
        rejects: a larger sample decides), or "no effect at this power" (nothing larger than the
        detectable dip). Before all of them, "compressor inactive": at this length the
        compressor read every target exactly, so the run measured the model without it."""
        if self.compressor_inactive:
            return "compressor inactive"
        if self.spread is not None and self.spread.degenerate:
            return "degenerate"
        if self.detectable_dip is None:
            return TOO_FEW_TARGETS if self.mean_accuracy - self.chance >= PLANNED_DIP else AT_THE_FLOOR
        if self.adjusted is not None:
            if self._axes_with_effect():
                return "effect"
            return "inconclusive" if self._disagreements() or self.answer_axis._disagreements() else (
                "no effect at this power")
        if self.test.p_value < ALPHA:
            return "effect"
        if self._disagreements():
            return "inconclusive"
        return "no effect at this power"

    def _disagreements(self) -> list[str]:
        """What points to a phase effect the accuracy test did not reject."""
        said = []
        if self.gap_ci[0] > 0:
            said.append(f"the gap's 95% interval excludes 0 ({fixed(self.gap_ci[0])} to {fixed(self.gap_ci[1])})")
        if self.logprob_test.p_value < ALPHA:
            said.append(f"the answer's log-probability depends on the phase (p {p_text(self.logprob_test)})")
        return said

    def gap_interval_text(self) -> str:
        low, high = self.gap_ci
        return f"95% CI {fixed(low)} to {fixed(high)}" + ("" if low > 0 else ", which allows no gap")

    def headline(self) -> str:
        """One plain sentence on what the numbers say."""
        verdict = self.verdict
        if verdict == "compressor inactive":
            without = replace(self, compressor_inactive=None).headline()
            return (f"Compressor inactive: {self.compressor_inactive}, so every target was read exactly and this run "
                    f"measured the model without its compressor; it says nothing about the compressor's phases. Read as "
                    f"that model: {without}")
        if verdict in SILENT:
            return self._silent_headline(verdict) + self._unread_axes_sentence()
        if self.adjusted is not None:
            return self._two_axes_headline(verdict) + self._axes_sentence()
        exact = self.exact
        numbers = (f"gap {fixed(exact['gap'])} points, {self.gap_interval_text()}; p {p_text(self.test)}, "
                   f"log-probability p {p_text(self.logprob_test)}")
        claim = (f"residue {self.worst_residue} reaches {fixed(exact['worst'])}% against "
                 f"{fixed(exact['best'])}% at residue {self.best_residue} ({numbers})")
        if verdict == "inconclusive":
            return (f"Inconclusive: the accuracy test finds no phase effect (p {p_text(self.test)}), but "
                    f"{' and '.join(self._disagreements())}; {claim}; a larger sample decides "
                    f"(--per-residue auto --detect {fixed(self._dip_to_plan(exact['gap']), 0)}).")
        if verdict == "effect":
            if self.control:
                return (f"Control run: the model declares no KV-cache compression, yet accuracy varies with the "
                        f"residue: {claim}. Chance alone gives a p this small in {fixed(100 * self.test.p_value)}% "
                        f"of runs of a model without any phase effect, so one run is no evidence of one.")
            return f"Accuracy depends on the token phase: {claim}."
        return (f"No phase effect larger than {fixed(self.detectable_dip)} points at this sample size (a one-residue "
                f"dip of that size would be detected {POWER:.0%} of the time; {numbers}).")

    def _claim(self, where: str) -> str:
        """'WHERE r reaches X% against Y% at residue b (gap, interval; p)' of this axis's numbers."""
        exact = self.exact
        return (f"{where} {self.worst_residue} reach {exact['worst']:.1f}% against {exact['best']:.1f}% at residue "
                f"{self.best_residue} (gap {exact['gap']:.1f} points, {self.gap_interval_text()}; p {p_text(self.test)})")

    def _two_axes_headline(self, verdict: str) -> str:
        """The headline of a run whose answer's phase was planned: which axis carries the effect, by the
        Holm-adjusted p of the three tests."""
        answer = self.answer_axis
        said = {"answer": f"Accuracy depends on where generation starts: {answer._claim('answers starting at residue')}",
                "target": f"Accuracy depends on the target's token phase: {self._claim('targets at residue')}",
                "interaction": "Accuracy depends on the target's and the answer's phase together (interaction p "
                               f"{p_text(self.interaction)})"}
        if verdict == "effect":
            found = "; ".join(said[axis] for axis in ("answer", "target", "interaction")
                              if axis in self._axes_with_effect())
            control = (" This is a control run (the model declares no KV-cache compression): an effect here is the "
                       "engine's or the model's own, not a compressor's." if self.control else "")
            return f"{found}.{control}"
        if verdict == "inconclusive":
            doubts = [f"at the target's phase {d}" for d in self._disagreements()] + [
                f"at the answer's phase {d}" for d in answer._disagreements()]
            return (f"Inconclusive: no test rejects after Holm's adjustment, but {' and '.join(doubts)}; "
                    f"{self._claim('targets at residue')}; {answer._claim('answers starting at residue')}; a larger "
                    f"sample decides (--per-residue auto --detect {max(self.exact['gap'], answer.exact['gap'], 1.0):.0f}).")
        dip = "none fits" if answer.detectable_dip is None else f"{answer.detectable_dip:.1f} points"
        return (f"No phase effect larger than {self.detectable_dip:.1f} points at the target's phase, nor than {dip} "
                f"at the answer's (where generation starts), at this sample size (a one-residue dip of that size would "
                f"be detected {POWER:.0%} of the time; target gap {self.exact['gap']:.1f} points, "
                f"{self.gap_interval_text()}; answer gap {answer.exact['gap']:.1f} points, "
                f"{answer.gap_interval_text()}).")

    def _unread_axes_sentence(self) -> str:
        """What a run that cannot speak says of its answer's phase ('' where it was not planned)."""
        if self.adjusted is None:
            return ""
        return (f" Its answers started at every residue mod {len(self.per_residue)} (the answer's phase was planned), "
                "and that axis cannot be read either.")

    def _axes_sentence(self) -> str:
        """' Read together (Holm over the three accuracy tests at alpha 0.05): ...', or '' where the answer's
        phase was not planned."""
        adjusted = self.adjusted
        if adjusted is None:
            return ""
        raw = {"target": self.test.p_value, "answer": self.answer_axis.test.p_value,
               "interaction": self.interaction.p_value}
        names = {"target": "target phase", "answer": "answer phase", "interaction": "their interaction"}
        parts = ", ".join(f"{names[k]} p {format_p(raw[k])} (adjusted {format_p(adjusted[k])})" for k in raw)
        return f" Read together (Holm's rule over the three accuracy tests at alpha {ALPHA:g}): {parts}."

    def _silent_headline(self, verdict: str) -> str:
        """The headline of a run whose data cannot speak of the phase: what the model did, why the run
        cannot speak, and what can change that cause (`_easier`, `_more_targets`)."""
        if verdict == "degenerate":
            spread = self.spread
            answer = f'answers "{spread.commonest}"' if spread.commonest else "gives an empty answer"
            return (f"Degenerate: the model {answer} to {fixed(100 * spread.commonest_share)}% of the "
                    f"{self.n_targets} targets ({fixed(spread.effective)} distinct answers in effect, where the right ones "
                    f"spread over {fixed(spread.truth_effective)}): its answers do not depend on the query, so no phase "
                    f"can be read from this run (mean accuracy {fixed(self.exact['mean'])}%); {self._easier()}.")
        contexts = f"{self.n_contexts} context" + ("" if self.n_contexts == 1 else "s")
        accuracy = (f"at a mean accuracy of {fixed(self.exact['mean'])}% (95% interval {fixed(self.mean_ci[0])} to "
                    f"{fixed(self.mean_ci[1])}%, from {contexts}; chance {self.chance:.2g}%)")
        power = "" if not self.power_at_floor or not self.largest_dip else (
            f": the largest, one residue losing {fixed(self.largest_dip)} points (down to chance from the lower end of "
            f"the mean's 95% interval), would be detected only {fixed(100 * self.power_at_floor, 0)}% of the time "
            f"({POWER:.0%} needed)")
        if verdict == AT_THE_FLOOR:
            more = self._more_targets()
            more = f"; or {more}" if more else ""
            return (f"Uninformative at the floor: {accuracy} no one-residue dip that fits above chance would be "
                    f"detected{power}, so no phase can be read from this run; {self._easier()}{more}.")
        more = self._more_targets() or self._more_contexts()
        return (f"Uninformative, too few targets: {accuracy} the accuracy leaves a dip room, but this sample "
                f"({self.n_targets} targets, {fixed(self.n_targets / len(self.per_residue), 0)} per residue) would detect "
                f"none that fits{power}; {more}.")

    def _more_contexts(self) -> str:
        """Too few targets where the mean's interval, not the accuracy, leaves a dip no room (few contexts): more
        contexts narrow it, and a run sized for a PLANNED_DIP holds them; "" when a run could not hold that many."""
        from kvphase.sweep.context_settings import MAX_TARGETS

        needed = targets_for_dip(PLANNED_DIP, len(self.per_residue))
        if needed * len(self.per_residue) > MAX_TARGETS:
            return "no number of targets a run can hold would detect a dip that fits"
        return (f"the mean's interval is what leaves a dip no room, and more contexts narrow it: {needed} targets per "
                f"residue, in more than {'one context' if self.n_contexts == 1 else f'{self.n_contexts} contexts'}, would detect a "
                f"{fixed(PLANNED_DIP, 0)}-point dip (`--per-residue auto --detect {fixed(PLANNED_DIP, 0)}`)")

    def _dip_to_plan(self, points: float) -> float:
        """A dip to size a larger sample for: `points`, at least 1 and no larger than the largest that fits."""
        return max(1.0, min(points, self.largest_dip or points))

    def _easier(self) -> str:
        """What can raise a run off its floor or out of a degenerate answer: `--calibrate` only where the task has a
        difficulty it can turn (`knobs`), else another task or a model that retrieves."""
        if (self.knobs is None or self.knobs) and not self.calibrated:  # None: a summary from before knobs were kept
            return ("an easier setting (`kvphase sweep --calibrate` chooses one), another task, or a model that "
                    "retrieves is needed before a phase can be read")
        why = "; `--calibrate` chose this setting" if self.calibrated else "; this task has no difficulty `--calibrate` can turn"
        return ("another task or a model that retrieves (one that learned this task, for a trained model) is needed "
                "before a phase can be read" + why)

    def _more_targets(self) -> str:
        """The targets per residue that would detect the largest dip that fits, capped at PLANNED_DIP, with the option
        that plans them; "" when no dip fits, a run could not hold them, or this run held as many."""
        from kvphase.sweep.context_settings import MAX_TARGETS

        dip = float(int(min(PLANNED_DIP, self.largest_dip or 0)))  # whole points, at most the largest that fits
        if dip < 1:
            return ""
        needed = targets_for_dip(dip, len(self.per_residue))
        if needed * len(self.per_residue) > MAX_TARGETS or needed * len(self.per_residue) <= self.n_targets:
            return ""
        more_contexts = "" if self.n_contexts > 1 else ", in more than one context"
        largest = "" if dip == PLANNED_DIP else ", the largest whole-point dip that fits"
        return (f"{needed} targets per residue{more_contexts} would detect a {fixed(dip, 0)}-point dip{largest} "
                f"(`--per-residue auto --detect {fixed(dip, 0)}`)")

    def to_json(self) -> dict:
        out = asdict(self)
        if out["compressor_inactive"] is None:  # summaries of runs whose compressor acted read as they always did
            del out["compressor_inactive"]
        if self.answer_axis is None:  # and those whose answer's phase was not planned
            del out["answer_axis"], out["interaction"]
        else:
            out["answer_axis"] = self.answer_axis.to_json()
            out["holm_adjusted"] = self.adjusted
        out["verdict"], out["headline"] = self.verdict, self.headline()
        return out


def per_group(results: pd.DataFrame, column: str) -> pd.DataFrame:
    """n, correct, accuracy (%), Wilson 95% interval (%), mean logprob, target position moments."""
    rows = []
    for value, group in results.groupby(column, sort=True):
        n, hits = len(group), int(group["correct"].sum())
        low, high = wilson_interval(hits, n)
        rows.append({
            column: int(value),
            "n": n,
            "correct": hits,
            "accuracy": 100 * hits / n,
            "ci_low": 100 * low,
            "ci_high": 100 * high,
            "mean_logprob": float(group["logprob"].mean()),
            "position_mean": float(group["target_pos"].mean()),
            "position_sd": float(group["target_pos"].std(ddof=0)),
        })
    return pd.DataFrame(rows)


def context_intervals(correct: np.ndarray, residues: np.ndarray, contexts: np.ndarray, seed: int = 0,
                      stratification: Stratification | None = None) -> tuple[tuple[float, float], tuple[float, float]]:
    """95% intervals (%) of the mean accuracy over residues (whole contexts the sampled units, widened
    for few contexts) and of the gap (points; simultaneous intervals of the residues' differences
    within contexts, its lower end as computed: 0 or below when the data allow no gap). `stratification`: the
    residues' and contexts' `Stratification`, when the caller has it."""
    stratification = Stratification.of(residues, contexts) if stratification is None else stratification
    gap_ci = tuple(float(v) for v in gap_interval(correct, stratification, seed=seed))
    (low, high), = mean_intervals(correct, stratification, contexts)
    return (float(low), float(high)), gap_ci


def what_the_run_can_see(correct: np.ndarray, residues: np.ndarray, contexts: np.ndarray, seed: int = 0,
                         stratification: Stratification | None = None, chance: float = 0.0,
                         ) -> tuple[tuple[float, float], tuple[float, float], Detectable]:
    """The mean's and the gap's intervals, and the dip the run detects: a dip fits between the lower end
    of the mean's interval and `chance` (a fraction: what guessing scores), so a run at its floor whose
    accuracy came out high by chance does not print a dip the model cannot have."""
    stratification = Stratification.of(residues, contexts) if stratification is None else stratification
    mean_ci, gap_ci = context_intervals(correct, residues, contexts, seed, stratification)
    seen = detectable(correct, stratification, seed=seed, room=mean_ci[0] / 100 - chance)
    return mean_ci, gap_ci, seen


def logprob_test(logprobs: np.ndarray, stratification, seed: int):
    """The answer log-probability's test by residue; unavailable when a route left some missing (NaN:
    `--scoring generate` knows it only where the generation was the answer, and testing those
    alone would compare correct answers only)."""
    missing = int(np.isnan(logprobs).sum())
    if missing:
        return unavailable_test("answer log-probability by residue", f"{missing} of {len(logprobs)} targets have no "
                                "answer log-probability (the scoring route does not give it where the answer was "
                                "not generated)")
    return stratified_test(logprobs, stratification, binary=False, seed=seed)


def summarize(results: pd.DataFrame, stride: int, modulus: int, seed: int = 0, control: bool = False,
              chance: float = 0.0, compressor_inactive: str | None = None, knobs: list[str] | None = None,
              calibrated: bool = False, answer_phases: bool = False) -> Summary:
    """The run's statistics from its results frame (one row per scored target); `chance`: the accuracy
    (a fraction) of a guess among the task's values; `compressor_inactive`: why the model's compressor
    touched no target at the run's length (`sweep.reach_check`), or None; `knobs`: what `--calibrate` can turn on
    the run's task (the headline's advice names it only where there is one); `calibrated`: it chose the setting;
    `answer_phases`: the answer's phase was planned, so the summary reads that axis too (`answer_pos` mod M) and
    their interaction."""
    if answer_phases:
        answer_residue = results["answer_pos"].astype(int) % modulus
        by_answer = results.assign(residue=answer_residue, phase=results["answer_pos"].astype(int) % stride)
        same = dict(seed=seed, control=control, chance=chance, compressor_inactive=compressor_inactive, knobs=knobs,
                    calibrated=calibrated)
        target = summarize(results, stride, modulus, **same)
        answer = summarize(by_answer, stride, modulus, **same)
        interaction = interaction_test(results["correct"].to_numpy(dtype=float), results["residue"].to_numpy(),
                                       answer_residue.to_numpy(), results["context"].to_numpy(), seed)
        return replace(target, answer_axis=answer, interaction=interaction)
    by_residue = per_group(results, "residue")
    by_phase = per_group(results, "phase")
    acc = 100 * results.groupby("residue")["correct"].mean()  # unrounded: the gap and mean are rounded once, at the end
    periodicity = None
    if modulus == 2 * stride and all(r in acc.index for r in range(modulus)):
        periodicity = float(np.mean([abs(acc[r] - acc[r + stride]) for r in range(stride)]))
    correct = results["correct"].to_numpy(dtype=float)  # (N,)
    stratification = Stratification.of(results["residue"].to_numpy(), results["context"].to_numpy())
    mean_ci, gap_ci, seen = what_the_run_can_see(correct, results["residue"].to_numpy(), results["context"].to_numpy(),
                                                 seed, stratification, chance)
    per_context = len(results) / results["context"].nunique()
    icc = intra_context_correlation(correct, results["context"].to_numpy())
    coverage = mean_coverage(correct, stratification, results["context"].to_numpy(), seed)
    return Summary(
        n_targets=len(results),
        n_contexts=int(results["context"].nunique()),
        balanced=stratification.balanced,
        control=control,
        mean_accuracy=float(acc.mean()),
        mean_ci=mean_ci,
        worst_accuracy=float(acc.min()),
        worst_residue=int(acc.idxmin()),
        best_accuracy=float(acc.max()),
        best_residue=int(acc.idxmax()),
        gap=float(acc.max() - acc.min()),
        gap_ci=gap_ci,
        periodicity=periodicity,
        detectable_dip=None if seen.dip is None else float(100 * seen.dip),
        test=stratified_test(correct, stratification, binary=True, seed=seed),
        logprob_test=logprob_test(results["logprob"].to_numpy(dtype=float), stratification, seed),
        per_residue=by_residue.to_dict("records"),
        per_phase=by_phase.to_dict("records"),
        targets_per_context=per_context,
        icc=None if icc is None else float(icc),
        design_effect=None if icc is None else design_effect(icc, per_context),
        largest_dip=float(100 * seen.largest),
        power_at_floor=float(seen.power_at_largest),
        answers=(asdict(answer_spread(results["predicted"], results["answer"]))
                 if {"predicted", "answer"} <= set(results.columns) else None),
        mean_coverage=None if coverage is None else float(coverage),
        compressor_inactive=compressor_inactive,
        chance=100 * chance,
        knobs=None if knobs is None else list(knobs),
        calibrated=calibrated,
    )


def with_shifts(results: pd.DataFrame, offsets: pd.DataFrame) -> pd.DataFrame:
    """One row per (target, shift) of offsets.csv, in results' shape: the target's residue, context and
    position, and its correct, logprob and predicted under that shift."""
    scored = offsets[["target_id", "shift", "correct", "logprob", "predicted"]]
    return results.drop(columns=["correct", "logprob", "predicted"]).merge(scored, on="target_id")


def summarize_shifts(results: pd.DataFrame, offsets: pd.DataFrame, stride: int, modulus: int,
                     seed: int = 0, chance: float = 0.0) -> dict[int, Summary]:
    """Each fixed shift's own summary (every target scored under it): what one shift alone gives."""
    shifted = with_shifts(results, offsets)
    return {int(d): summarize(frame.drop(columns="shift"), stride, modulus, seed, chance=chance)
            for d, frame in shifted.groupby("shift", sort=True)}


@dataclass(frozen=True)
class GapDifference:
    """One run's gap minus a baseline run's, with a 95% interval from bootstrapping each
    run's contexts independently."""

    difference: float  # points
    ci_low: float
    ci_high: float

    @property
    def differs(self) -> bool:
        """The interval excludes zero: the two gaps differ at the 5% level."""
        return self.ci_low > 0 or self.ci_high < 0


def gap_difference(baseline: pd.DataFrame, other: pd.DataFrame, seed: int = 0) -> GapDifference:
    """`other`'s gap minus `baseline`'s (e.g. a fix against the run it should improve)."""
    samples = [bootstrap_gaps(r["correct"].to_numpy(dtype=float), r["residue"].to_numpy(), r["context"].to_numpy(),
                              seed + i) for i, r in enumerate((baseline, other))]
    n = min(len(s) for s in samples)
    observed = [100 * np.ptp(r.groupby("residue")["correct"].mean().to_numpy()) for r in (baseline, other)]
    difference = float(observed[1] - observed[0])
    # a run none of whose resamples held every residue: the difference's interval is its whole range
    low, high = basic_interval(samples[1][:n] - samples[0][:n], difference) if n else (-100.0, 100.0)
    return GapDifference(difference, float(low), float(high))
