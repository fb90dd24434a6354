"""Checks shared by several commands' options, run while the options are parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from kvphase.errors import PlanError


def given(value, default):
    """An option's value, or the default when the option was not given (0 is a given value)."""
    return default if value is None else value


def own_folder(value: Optional[Path]) -> Optional[Path]:
    """--out / OUT must name a folder of the run's own: "" and "." (the current folder) would mix
    the run's files with whatever is there."""
    if value is not None and Path(value) == Path("."):
        raise PlanError(f"the run folder {str(value)!r} is the current folder; name a folder for the run (e.g. --out run1)")
    return value
