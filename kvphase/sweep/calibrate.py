"""`kvphase sweep --calibrate`: a short pilot that chooses how hard the task is for this model.

A weak spot shows where accuracy sits in the middle: a sweep at 100% (or 0%) has no power,
and how hard a task is depends on the model. The pilot scores a few targets at the starting
setting (the task and context given, or the defaults), then walks one way: while accuracy
is above the band's middle half, to harder settings -- the context doubling up to the
longest the model supports, then the task's harder variants (`harder` in its TOML file) at
that context -- and while it is below, to easier ones (the context halving down to
SHORTEST_CONTEXT). It stops at the first step that reaches the middle half (or passes it),
and the sweep takes the step nearest the band's centre. Each step scores 1/PILOT_FRACTION of the sweep's targets
(whole contexts) on contexts built from another seed than the sweep's, so no pilot context
is a measured one; a step runs only when the pilot's tokens so far plus its own stay within PILOT_BUDGET
of the sweep at that step's setting: the pilot costs at most that fraction of the sweep it
chooses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, ContextManager, NamedTuple, Sequence

import numpy as np

from kvphase.backends.base import Backend
from kvphase.errors import PlanError
from kvphase.runfolder import CONFIG_FILE
from kvphase.sweep.contexts import build_contexts
from kvphase.sweep.estimate import evaluated_tokens
from kvphase.sweep.layout import Context
from kvphase.sweep.plan import SweepPlan, fit_padding, sized
from kvphase.sweep.run import load_plan
from kvphase.sweep.tasks import difficulty_chain, load_task

# the pilot's tokens, at most this fraction of the sweep's: a step needs one whole context of its length, and
# a dense sweep has as few as 8 contexts (MIN_CONTEXTS), so a walk doubling the context from 1K to 16K, which
# costs about two contexts of the last length, is a quarter of the sweep it chooses
PILOT_BUDGET = 0.3
PILOT_FRACTION = 16  # a step scores this fraction of the sweep's targets: 2 steps and a half fit the budget
SHORTEST_CONTEXT = 256  # tokens: the easiest context the pilot tries
PILOT_SEED_OFFSET = 1 << 30  # pilot contexts come from seed + this, the sweep's from seed
DEFAULT_BAND = "40-80"


class Band(NamedTuple):
    """The mean accuracy a calibrated sweep aims at, in percent."""

    low: float
    high: float

    @classmethod
    def parse(cls, text: str) -> "Band":
        """'40-80' -> Band(40, 80); PlanError unless 0 <= LOW < HIGH <= 100."""
        low, sep, high = text.strip().partition("-")
        try:
            band = cls(float(low), float(high))
        except ValueError:
            band = None
        if not sep or band is None or not 0 <= band.low < band.high <= 100:
            raise PlanError(f"--target-accuracy must be LOW-HIGH in percent with 0 <= LOW < HIGH <= 100, got {text!r}")
        return band

    def distance(self, accuracy: float) -> float:
        """Points outside the band (0 inside)."""
        return max(self.low - accuracy, accuracy - self.high, 0.0)

    @property
    def centre(self) -> float:
        return (self.low + self.high) / 2

    @property
    def middle(self) -> tuple[float, float]:
        """The band's middle half: a pilot step of ~16 targets read there is likely in the band
        itself (its standard error is up to 12 points)."""
        quarter = (self.high - self.low) / 4
        return self.low + quarter, self.high - quarter

    def __str__(self) -> str:
        return f"{self.low:g}-{self.high:g}%"


class Level(NamedTuple):
    """One setting the pilot may try."""

    task: str
    context: int


@dataclass(frozen=True)
class PilotStep:
    """What the pilot measured at one level."""

    task: str
    context: int
    padding: str
    targets: int
    correct: int
    tokens: int  # the pilot evaluated these for this step
    sweep_tokens: int  # the sweep would evaluate these at this setting

    @property
    def accuracy(self) -> float:
        return 100 * self.correct / self.targets


@dataclass(frozen=True)
class Calibration:
    """The pilot's steps, the one chosen and why the walk stopped."""

    band: Band
    steps: tuple[PilotStep, ...]
    chosen: int  # index into steps
    stopped: str  # "in the band", "after crossing the band", "at the settings' end" or "at the budget"

    @property
    def choice(self) -> PilotStep:
        return self.steps[self.chosen]

    @property
    def pilot_tokens(self) -> int:
        return sum(step.tokens for step in self.steps)

    def to_json(self) -> dict:
        return {"band": list(self.band), "steps": [asdict(s) for s in self.steps], "chosen": self.chosen,
                "stopped": self.stopped, "pilot_tokens": self.pilot_tokens, "budget": PILOT_BUDGET}

    @classmethod
    def from_json(cls, raw: dict) -> "Calibration":
        """The calibration a config.json holds; PlanError naming what is wrong when damaged."""
        try:
            steps = tuple(PilotStep(**step) for step in raw["steps"])
            calibration = cls(Band(*map(float, raw["band"])), steps, int(raw["chosen"]), str(raw["stopped"]))
            calibration.choice
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise PlanError(f"calibration is damaged ({type(exc).__name__}: {exc})") from None
        return calibration

    def describe(self) -> str:
        """One paragraph for the report: what was chosen, from what, at what cost."""
        choice = self.choice
        tried = "; ".join(f"{s.task} at {s.context} tokens {s.accuracy:.1f}% ({s.correct}/{s.targets})"
                          for s in self.steps)
        share = 100 * self.pilot_tokens / choice.sweep_tokens
        return (f"Difficulty chosen by `--calibrate` for a mean accuracy in {self.band}: task `{choice.task}` at "
                f"{choice.context} tokens (the walk stopped {self.stopped}). Pilot, on contexts of another seed "
                f"than the sweep's: {tried}. It evaluated {self.pilot_tokens} tokens, {share:.1f}% of this "
                f"sweep's {choice.sweep_tokens} (bound: {100 * PILOT_BUDGET:g}%).")


def calibration_knobs(task_name: str, context_given: bool, task_given: bool) -> tuple[str, ...]:
    """The knobs the task lets calibration turn, less the ones the user set."""
    knobs = set(load_task(task_name).calibrate)
    knobs -= {"context"} if context_given else set()
    knobs -= {"harder"} if task_given else set()
    if not knobs:
        raise PlanError(f"--calibrate has nothing to turn: task {task_name} lets it change "
                        f"{', '.join(load_task(task_name).calibrate) or 'nothing'}, and the options given fix the rest")
    return tuple(sorted(knobs))


def harder_levels(plan: SweepPlan, knobs: Sequence[str], longest: int) -> list[Level]:
    """The settings harder than the start, easiest first."""
    tasks = _harder_tasks(plan.task) if "harder" in knobs else [plan.task]
    contexts = [plan.context]
    if "context" in knobs:
        contexts += [c for c in (plan.context << i for i in range(1, 32)) if c < longest]
        contexts += [longest] if longest > plan.context else []
    return [Level(tasks[0], c) for c in contexts[1:]] + [Level(task, contexts[-1]) for task in tasks[1:]]


def easier_levels(plan: SweepPlan, knobs: Sequence[str], shortest: int = SHORTEST_CONTEXT) -> list[Level]:
    """The settings easier than the start, hardest first, none shorter than `shortest` tokens."""
    if "context" not in knobs:
        return []
    return [Level(plan.task, c) for c in (plan.context >> i for i in range(1, 32)) if c >= max(shortest, SHORTEST_CONTEXT)]


def _harder_tasks(name: str) -> list[str]:
    """The task and its harder variants, up to the first that lets calibration go no further."""
    chain = difficulty_chain(name)
    for i, task in enumerate(chain):
        if "harder" not in load_task(task).calibrate:
            return chain[:i + 1]
    return chain


def calibrate(plan: SweepPlan, backend: Backend, band: Band, knobs: Sequence[str], longest: int,
              fit: str | None = "prefix", progress: Callable[[PilotStep], None] = lambda step: None,
              shortest: int = SHORTEST_CONTEXT) -> Calibration:
    """Score the start, then walk towards the band on `backend` until a step enters or crosses
    it, or the budget or the settings end; choose the step nearest the band among those the
    budget allows. `fit`: the padding each setting starts from when the padding was not the
    user's (each may then take the one its tokenizer can lay out); None keeps the plan's.
    `shortest`: no easier context than this (the shortest at which the model's compressor acts)."""
    first = _measure(plan, Level(plan.task, plan.context), backend, fit, spent=0)
    if first is None:
        raise PlanError(f"--calibrate could not afford a pilot within {100 * PILOT_BUDGET:g}% of the sweep at the "
                        "starting setting; a larger --per-residue gives the pilot more room")
    steps = [first]
    progress(first)
    low, high = band.middle
    stopped = "in the band"
    if not low <= first.accuracy <= high:
        above = first.accuracy > high
        onward = harder_levels(plan, knobs, longest) if above else easier_levels(plan, knobs, shortest)
        stopped = _walk(plan, onward, backend, band, fit, steps, progress, above)
        if stopped == "at the settings' end" and not above and shortest > SHORTEST_CONTEXT:
            stopped = f"at {shortest:,} tokens, the shortest context at which the model's compressor acts"
    return Calibration(band, tuple(steps), _nearest_affordable(steps, band), stopped)


def _walk(plan: SweepPlan, levels: list[Level], backend: Backend, band: Band, fit: str | None, steps: list[PilotStep],
          progress: Callable[[PilotStep], None], above: bool) -> str:
    """Score `levels` in turn, appending to `steps`, until one reaches the band's middle half
    from the side the walk started on (`above` it or below); returns why the walk stopped."""
    low, high = band.middle
    for level in levels:
        try:
            step = _measure(plan, level, backend, fit, spent=sum(s.tokens for s in steps))
        except PlanError:  # this task cannot be laid out at this context: the next setting may be
            continue
        if step is None:
            return "at the budget"
        steps.append(step)
        progress(step)
        if step.accuracy <= high if above else step.accuracy >= low:
            return "in the band" if band.distance(step.accuracy) == 0 else "after crossing the band"
    return "at the settings' end"


def _measure(plan: SweepPlan, level: Level, backend: Backend, fit: str | None, spent: int) -> PilotStep | None:
    """The pilot's step at `level`, None when it would take the pilot past its budget of the
    sweep at that setting; PlanError when the task cannot be laid out there."""
    setting = _plan_at(plan, level, backend, fit)
    pilot, sweep_tokens = _pilot_contexts(setting, backend), tokens_of(_sweep_contexts(setting, backend))
    if spent + tokens_of(pilot) > PILOT_BUDGET * sweep_tokens:
        return None
    return _score(setting, pilot, backend, sweep_tokens)


def calibrated_plan(plan: SweepPlan, calibration: Calibration, requested: dict, tokenizer,
                    fit: str | None = "prefix") -> SweepPlan:
    """The sweep's plan at the chosen setting (laid out as the pilot laid it out), with the
    calibration and the options it started from (`requested`), so that a re-run of the same
    command finds the folder and resumes it."""
    choice = calibration.choice
    return replace(_plan_at(plan, Level(choice.task, choice.context), tokenizer, fit),
                   calibration={**calibration.to_json(), "requested": requested})


def _plan_at(plan: SweepPlan, level: Level, tokenizer, fit: str | None) -> SweepPlan:
    """The plan at a level (PlanError when it cannot be one), its sample size re-sized for the
    level's context where the run is sized by its contexts (`sized`). With `fit`, each level starts
    from that padding and takes the one this tokenizer can lay out (`fit_padding`)."""
    if fit is None:
        return sized(replace(plan, task=level.task, context=level.context), tokenizer)
    at = replace(plan, task=level.task, context=level.context, padding=fit, adjusted="")
    return sized(fit_padding(at, lambda: tokenizer), tokenizer)


def _pilot_contexts(plan: SweepPlan, tokenizer) -> list[Context]:
    """The first contexts, holding at least 1/PILOT_FRACTION of the sweep's targets, of the plan
    the sweep would make from another seed. Not balanced over residues as a whole sweep is (that
    takes M contexts at least): the pilot asks how often the model answers, not at which phase."""
    wanted = plan.per_residue * plan.modulus / PILOT_FRACTION
    settings = replace(plan.context_settings, seed=plan.seed + PILOT_SEED_OFFSET)
    contexts = build_contexts(load_task(plan.task), tokenizer, settings)
    counts = np.cumsum([len(c.targets) for c in contexts])  # (n_contexts,)
    return contexts[:int(np.searchsorted(counts, wanted)) + 1]


def _sweep_contexts(plan: SweepPlan, tokenizer) -> list[Context]:
    return build_contexts(load_task(plan.task), tokenizer, plan.context_settings)


def tokens_of(contexts: Sequence[Context]) -> int:
    """Tokens a backend evaluates to score every target of these contexts."""
    return sum(evaluated_tokens(c.tokens, c.targets) for c in contexts)


def _score(plan: SweepPlan, contexts: list[Context], backend: Backend, sweep_tokens: int) -> PilotStep:
    correct = sum(score.correct for c in contexts for score in backend.score(c.tokens, [t.query for t in c.targets]))
    return PilotStep(plan.task, plan.context, plan.padding, sum(len(c.targets) for c in contexts), int(correct),
                     tokens_of(contexts), sweep_tokens)


def _nearest_affordable(steps: list[PilotStep], band: Band) -> int:
    """The step nearest the band's centre (the later one on a tie) among those whose sweep
    keeps the whole pilot within budget."""
    spent = sum(s.tokens for s in steps)
    affordable = [i for i, s in enumerate(steps) if spent <= PILOT_BUDGET * s.sweep_tokens] or [len(steps) - 1]
    return min(affordable, key=lambda i: (abs(steps[i].accuracy - band.centre), -i))


def plan_for_folder(plan: SweepPlan, run_dir: Path, band: Band, knobs: Sequence[str], longest: int,
                    open_pilot: Callable[[int], ContextManager[Backend]], fit: str | None = "prefix",
                    progress: Callable[[PilotStep], None] = lambda step: None,
                    shortest: int = SHORTEST_CONTEXT) -> tuple[SweepPlan, bool]:
    """(the calibrated plan, whether it came from the folder): a folder that holds a calibration
    started from these same options is resumed at its setting with no new pilot (the pilot's
    numbers are machine-bound, so a second one could choose another setting); otherwise the
    pilot runs on the backend `open_pilot(longest)` opens and closes, and chooses. The caller then
    checks the folder."""
    held = held_calibration(run_dir, plan, band, knobs)
    if held is not None:
        return held, True
    with open_pilot(longest) as backend:
        calibration = calibrate(plan, backend, band, knobs, longest, fit, progress, shortest)
        return calibrated_plan(plan, calibration, _request(plan, band, knobs), backend, fit), False


def held_calibration(run_dir: Path, plan: SweepPlan, band: Band, knobs: Sequence[str]) -> SweepPlan | None:
    """The plan `run_dir` holds when it is a calibration started from `plan`, `band` and `knobs`."""
    if not (run_dir / CONFIG_FILE).is_file():
        return None
    held = load_plan(run_dir)
    return held if held.calibration.get("requested") == _request(plan, band, knobs) else None


def _request(plan: SweepPlan, band: Band, knobs: Sequence[str]) -> dict:
    """What a calibration started from: the plan before it, the band and the knobs."""
    return {**plan.comparable(), "band": list(band), "knobs": sorted(knobs)}


def calibrated_run_dir(default: Path, plan: SweepPlan, band: Band) -> Path:
    """The default folder of a calibrated sweep: named by where calibration starts, not by the
    context it will choose, so that the same command finds it again."""
    suffix = "" if band == Band.parse(DEFAULT_BAND) else f"-{band.low:g}-{band.high:g}"
    return default.with_name(default.name.replace(f"-L{plan.context}", f"-calibrated{suffix}", 1))
