"""Typed, range-checked reads of a GGUF header's metadata, for everything that reads a model's settings."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from kvphase.errors import GGUFError

if TYPE_CHECKING:
    from kvphase.gguf.header import GGUFHeader


class Metadata:
    """Typed, range-checked reads of a header's metadata: a GGUFError that names the key and
    what was expected, never a ValueError from int("many") or a NaN where a count belongs."""

    def __init__(self, header: GGUFHeader):
        self.fields, self.file = header.fields, header.path.name

    def get(self, key: str, default: Any = None, expected: str = "a value") -> Any:
        value = self.fields.get(key, default)
        if value is None:
            raise GGUFError(f"{self.file}: metadata lacks {key}, expected {expected}")
        return value

    def bad(self, key: str, value: Any, expected: str) -> GGUFError:
        shown = f"a list of {len(value)}" if isinstance(value, list) and len(value) > 8 else repr(value)
        return GGUFError(f"{self.file}: metadata {key} is {shown[:80]}, expected {expected}")

    def integer(self, key: str, default: int | None = None, low: int = 0, high: int | None = None) -> int:
        """An integer in [low, high]; `default` when absent (None: required)."""
        expected = f"an integer from {low}" + (f" to {high}" if high is not None else " up")
        value = self.get(key, default, expected)
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            raise self.bad(key, value, expected)
        return value

    def integers(self, key: str, default: list[int] | None = None, low: int = 0, high: int | None = None) -> list[int]:
        """One integer or a per-layer list of them, each in [low, high]."""
        value = self.get(key, default, "an integer or a list of integers")
        values = value if isinstance(value, list) else [value]
        expected = f"integers from {low}" + (f" to {high}" if high is not None else " up")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or v < low or (high is not None and v > high):
                raise self.bad(key, value, expected)
        return values

    def number(self, key: str, default: float | None = None) -> float:
        """A finite number (integer or float)."""
        value = self.get(key, default, "a number")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.bad(key, value, "a finite number")
        return float(value)

    def text(self, key: str, default: str | None = None) -> str:
        value = self.get(key, default, "a string")
        if not isinstance(value, str):
            raise self.bad(key, value, "a string")
        return value

    def flag(self, key: str, default: bool | None = None) -> bool:
        value = self.get(key, default, "a bool")
        if not isinstance(value, bool):
            raise self.bad(key, value, "a bool")
        return value
