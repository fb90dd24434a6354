"""What the commands and the Python API take, checked in one place: the type of every field of an
options record (`sweep.options.SweepOptions`, `conform.check.EngineChoice`) against its annotation,
the range of every option by its name (the same rule wherever `--threads` or `--request-timeout`
appears), and the arguments of the API's functions (paths, callbacks, lists of runs).

Each refusal is a PlanError naming the command line's option (`--context`; in Python the keyword of
the same name) and what it got, raised before anything is read or written.
"""

from __future__ import annotations

import math
import numbers
import os
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Optional

from kvphase.errors import PlanError


def option_name(field: str) -> str:
    return f"--{field.replace('_', '-')}"


def shown(value: Any) -> str:
    """A value as a message shows it: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_record(record) -> None:
    """Every field of the dataclass `record` of the type its annotation names, and in the range
    RANGES gives its name; PlanError for the first that is not."""
    hints = typing.get_type_hints(type(record))
    for field in fields(record):
        value = getattr(record, field.name)
        expected = _expected(hints[field.name])
        if not _fits(value, hints[field.name]):
            raise PlanError(f"{option_name(field.name)} expects {expected}, got {shown(value)}")
        if value is not None and field.name in RANGES:
            RANGES[field.name](option_name(field.name), value)
        if isinstance(value, float) and not math.isfinite(value):
            raise PlanError(f"{option_name(field.name)} expects a finite number, got {value}")


def _fits(value: Any, hint: Any) -> bool:
    """Whether `value` is of the type `hint` names (an int is a float; a bool is neither)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):
        kind = numbers.Integral if hint is int else numbers.Real
        return isinstance(value, kind) and not isinstance(value, bool)
    if hint is Path:
        return _is_path(value) and "\0" not in os.fspath(value)
    if origin is tuple:
        return isinstance(value, (tuple, list)) and all(_fits(item, args[0]) for item in value)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return isinstance(value, hint)


def _expected(hint: Any) -> str:
    """What a message says `hint` expects."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        named = [_expected(arg) for arg in args if arg is not type(None)]
        return " or ".join(named) + (" or None" if type(None) in args else "")
    if origin is tuple:
        return "a list of strings" if args[0] is str else f"a list, each {_expected(args[0])}"
    return {bool: "True or False", int: "a whole number", float: "a number", str: "a string", Path: "a path",
            dict: "a dict"}.get(hint, getattr(hint, "__name__", str(hint)))


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes)


def check_choices(record, choices: dict[str, tuple[str, ...]]) -> None:
    """Each field `choices` names None or one of its allowed values; PlanError for the first that is not."""
    for name, allowed in choices.items():
        value = getattr(record, name)
        if value is not None and value not in allowed:
            raise PlanError(f"{option_name(name)} must be one of {', '.join(allowed)}, got {value!r}")


def check_seconds(option: str, seconds: float) -> None:
    """A wait: a finite number of seconds above 0."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise PlanError(f"{option} expects a number of seconds above 0, got {seconds:g}")


def check_above_zero(option: str, value: float) -> None:
    if not value > 0:
        raise PlanError(f"{option} must be above 0, got {value:g}")


def check_at_least_zero(option: str, value: float) -> None:
    if not value >= 0:
        raise PlanError(f"{option} must be at least 0, got {value:g}")


def check_thread_count(option: str, threads: int) -> None:
    from kvphase.engines.llamacpp import check_threads  # llama.cpp's own limit

    check_threads(threads, option)


# The range of each option, by its name, for every options record that has it.
RANGES: dict[str, Callable[[str, Any], None]] = {
    "threads": check_thread_count, "request_timeout": check_seconds, "deadline": check_seconds,
    "margin": check_above_zero, "logprob_tolerance": check_at_least_zero, "contexts": check_at_least_zero,
}


def check_path(option: str, value: Any, optional: bool = False) -> Optional[Path]:
    """A path argument (a str or os.PathLike, no NUL byte) as a Path; None when optional and None."""
    if value is None and optional:
        return None
    if not _is_path(value):
        raise PlanError(f"{option} expects a path, got {shown(value)}")
    if "\0" in os.fspath(value):
        raise PlanError(f"{option} expects a path, got one with a NUL byte: {shown(value)}")
    return Path(value)


def check_callback(option: str, value: Any) -> None:
    """A callback argument: None or something callable."""
    if value is not None and not callable(value):
        raise PlanError(f"{option} expects a function or None, got {shown(value)}")


def check_run_list(option: str, runs: Any, is_run: Callable[[Any], bool]) -> list:
    """A list of runs (each a run or a path to its folder); a single string or path is refused, not
    walked one character at a time."""
    if _is_path(runs) or not isinstance(runs, (list, tuple)):
        raise PlanError(f"{option} expects a list of runs or run folders, got {shown(runs)}")
    for run in runs:
        if not is_run(run):
            check_path(f"each of {option}", run)
    return list(runs)
