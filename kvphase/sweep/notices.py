"""What the library tells a user while it plans and runs: `Notice` lines to a `say` callback,
which each front end prints its own way (the CLI on stderr, the Python API on the logger)."""

from __future__ import annotations

import logging
from typing import Callable, NamedTuple

_log = logging.getLogger("kvphase")


class Notice(NamedTuple):
    """One line for the user. kind: "note" (what a plan chose; a quiet front end drops it),
    "attention" (the same, worth a colour: a control run, a stride not swept) or "warning"
    (always shown: memory, a server lost, a sweep that died holding the folder)."""

    text: str
    kind: str = "note"


Say = Callable[[Notice], None]


def log_notice(notice: Notice) -> None:
    """The default `say` of the Python API: notes at INFO, warnings at WARNING, on the "kvphase"
    logger (so a notebook shows warnings, and notes only when asked with logging.basicConfig)."""
    _log.log(logging.WARNING if notice.kind == "warning" else logging.INFO, notice.text)
