"""Retrieval tasks as data: `prompts/<task>.toml` plus its word lists.

A task says what a record looks like (segments, each tokenized on its own), what the
query and the answer are, and which words fill them. It knows nothing of positions.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass

from kvphase.defaults import prompts_dir
from kvphase.errors import PlanError

PROMPTS_DIR = prompts_dir()


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


def available_tasks() -> list[str]:
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.toml"))


def load_task(name: str) -> Task:
    """Read `prompts/<name>.toml`; PlanError names the known tasks when `name` is not one."""
    path = PROMPTS_DIR / f"{name}.toml"
    if name not in available_tasks():  # a name, never a path: "../x" or a NUL byte reaches no other file
        raise PlanError(f"unknown task {name!r}; known tasks: {', '.join(available_tasks())}")
    try:
        spec = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"task file {path} is not valid TOML: {exc}") from None
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
    )


def _word_list(file_name: str | None) -> tuple[str, ...]:
    if not file_name:
        return ()
    path = PROMPTS_DIR / file_name
    if not path.is_file():
        raise PlanError(f"word list not found: {path}")
    words = [w.strip() for w in path.read_text().splitlines()]
    return tuple(dict.fromkeys(w for w in words if w and not w.startswith("#")))
