"""Text that comes from files (model names, paths, metadata, run folders) made safe to print.

A GGUF file or a run folder is data, not terminal input: control characters (ESC starts
the sequences that recolour, clear the screen or set the window title) and bidi overrides
are shown as escapes (`\\x1b`), overlong values are cut, and rich markup (`[red]`, `[/x]`)
is escaped so it prints as written instead of vanishing or raising.
"""

from __future__ import annotations

import re

from rich.markup import escape

MAX_SHOWN = 300  # characters of one value; a 20 MB general.name prints its head
# C0 and C1 controls, DEL, and the bidi marks and overrides that reorder what a line shows
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def plain(value: object, limit: int = MAX_SHOWN) -> str:
    """`value` as text with unsafe characters written as escapes, cut to `limit` characters."""
    text = str(value)
    if len(text) > 4 * limit:  # escaping can only lengthen it: never scan megabytes
        text = text[: 4 * limit]
    text = _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def markup(value: object, limit: int = MAX_SHOWN) -> str:
    """`plain(value)` with rich markup escaped, for a rich Console or Table."""
    return escape(plain(value, limit))
