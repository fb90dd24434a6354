"""Retrieval tasks as data: `prompts/<task>.toml` plus its word lists.

A task says what a record looks like (segments, each tokenized on its own), what the
query and the answer are, and which words fill them. It knows nothing of positions.

Tasks also form a difficulty chain: each names the next harder task (`harder`), so a
calibration that finds a model answering everything can move along the chain
(`difficulty_chain`), and says which knobs a calibration may turn on it (`calibrate`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass

from kvphase.defaults import prompts_dir
from kvphase.errors import PlanError

PROMPTS_DIR = prompts_dir()
CALIBRATION_KNOBS = ("context", "harder")  # the context length; the next task of the chain
DEFAULT_CALIBRATION = ("context",)  # a task file that says nothing lets calibration turn only the length


@dataclass(frozen=True)
class Task:
    """One retrieval task, as read from its TOML file."""

    name: str
    description: str
    header: str  # text before the records
    record: tuple[str, ...]  # segments with {key} / {value} placeholders
    footer: str  # text after the records, before the demonstrations
    demonstrations: int  # context records restated after the footer
    query: tuple[str, ...]  # segments asked after the context
    answer: tuple[str, ...]  # segments the model must produce
    targets_per_context: int  # targets scored against one evaluated context
    distractors: bool  # whether non-target records fill the context
    keys: tuple[str, ...]  # empty when records have no key
    key_modifiers: tuple[str, ...]  # prefixes that multiply the keys when a context needs more
    values: tuple[str, ...]  # empty when values are generated (see value_digits)
    value_digits: int  # > 0: values are random numbers with this many digits
    filler: str  # text whose tokens pad and separate records
    distractors_per_context: int = 0  # > 0: that many distractor records at random places instead of filling
    calibrate: tuple[str, ...] = DEFAULT_CALIBRATION  # knobs a calibration may turn (CALIBRATION_KNOBS)
    harder: str = ""  # the next harder task of the difficulty chain; "" at its end

    @property
    def chance(self) -> float:
        """The accuracy of a guess among the values (a fraction): a dip cannot take a residue below it."""
        return 1 / len(self.values) if self.values else 10.0 ** -self.value_digits

    @property
    def filler_text(self) -> str:
        """The filler as it is tokenized for padding: stripped, with the space that joins it to
        the next token (its tokens repeat without merging across the seam)."""
        return self.filler.strip() + " "

    def __post_init__(self) -> None:
        if self.distractors_per_context < 0 or (self.distractors_per_context and not self.distractors):
            raise PlanError(f"task {self.name}: distractors_per_context must be >= 0 and needs distractors = true, "
                            f"found {self.distractors_per_context}")
        if self.demonstrations < 0 or self.targets_per_context < 1:
            raise PlanError(
                f"task {self.name}: expected demonstrations >= 0 and targets_per_context >= 1, "
                f"found {self.demonstrations} and {self.targets_per_context}"
            )
        if not self.values and self.value_digits <= 0:
            raise PlanError(f"task {self.name}: expected a value word list or 'digits:N', found neither")
        if not self.filler.strip():
            raise PlanError(f"task {self.name}: the filler text is empty")
        unknown = [k for k in self.calibrate if k not in CALIBRATION_KNOBS]
        if unknown:
            raise PlanError(f"task {self.name}: unknown calibrate knob {unknown[0]!r}; "
                            f"known knobs: {', '.join(CALIBRATION_KNOBS)}")
        if "harder" in self.calibrate and not self.harder:
            raise PlanError(f"task {self.name}: calibrate lists 'harder' but the task names no harder task")


def available_tasks() -> list[str]:
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.toml"))


def load_task(name: str) -> Task:
    """Read `prompts/<name>.toml`; PlanError names the known tasks when `name` is not one,
    and the problem when its difficulty chain names a missing task or loops."""
    spec = _read_spec(name)
    difficulty_chain(name)  # a chain that loops would send a calibration round for ever
    values = str(spec.get("values", ""))
    digits = int(values.removeprefix("digits:")) if values.startswith("digits:") else 0
    return Task(
        name=name,
        description=str(spec.get("description", "")),
        header=str(spec.get("header", "")),
        record=tuple(spec["record"]),
        footer=str(spec.get("footer", "")),
        demonstrations=int(spec.get("demonstrations", 0)),
        query=tuple(spec["query"]),
        answer=tuple(spec["answer"]),
        targets_per_context=int(spec.get("targets_per_context", 1)),
        distractors=bool(spec.get("distractors", False)),
        keys=_word_list(spec.get("keys")),
        key_modifiers=_word_list(spec.get("key_modifiers")),
        values=() if digits else _word_list(values),
        value_digits=digits,
        filler=(PROMPTS_DIR / spec["filler"]).read_text(),
        distractors_per_context=int(spec.get("distractors_per_context", 0)),
        calibrate=_calibrate(name, spec),
        harder=_harder(name, spec),
    )


def difficulty_chain(name: str) -> list[str]:
    """[name, its harder task, that one's harder task, ...] up to a task that names none;
    PlanError when a link names no task or the chain comes back to a task it passed."""
    chain = [name]
    while harder := _harder(chain[-1], _read_spec(chain[-1])):
        if harder in chain:
            raise PlanError(f"task {name}: the harder chain loops: {' -> '.join(chain + [harder])}")
        chain.append(harder)
    return chain


def _read_spec(name: str) -> dict:
    """The parsed `prompts/<name>.toml`; PlanError names the known tasks when `name` is not one."""
    if name not in available_tasks():  # a name, never a path: "../x" or a NUL byte reaches no other file
        raise PlanError(f"unknown task {name!r}; known tasks: {', '.join(available_tasks())}")
    path = PROMPTS_DIR / f"{name}.toml"
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"task file {path} is not valid TOML: {exc}") from None


def _calibrate(name: str, spec: dict) -> tuple[str, ...]:
    knobs = spec.get("calibrate", list(DEFAULT_CALIBRATION))
    if not isinstance(knobs, list) or not all(isinstance(k, str) for k in knobs):
        raise PlanError(f"task {name}: calibrate must be a list of knob names "
                        f"({', '.join(CALIBRATION_KNOBS)}), found {knobs!r}")
    return tuple(knobs)


def _harder(name: str, spec: dict) -> str:
    """The task's `harder` field, checked to name an existing task (the whole chain is
    checked by `difficulty_chain`, which `load_task` calls)."""
    harder = spec.get("harder", "")
    if not isinstance(harder, str):
        raise PlanError(f"task {name}: harder must be a task name, found {harder!r}")
    if harder and harder not in available_tasks():
        raise PlanError(f"task {name}: harder task {harder!r} does not exist; "
                        f"known tasks: {', '.join(available_tasks())}")
    return harder


def _word_list(file_name: str | None) -> tuple[str, ...]:
    if not file_name:
        return ()
    path = PROMPTS_DIR / file_name
    if not path.is_file():
        raise PlanError(f"word list not found: {path}")
    words = [w.strip() for w in path.read_text().splitlines()]
    return tuple(dict.fromkeys(w for w in words if w and not w.startswith("#")))
