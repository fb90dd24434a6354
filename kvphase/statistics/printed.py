"""How a statistic is printed: rounded once, where it is printed, from the value as computed.

A run's summary.json keeps every statistic at full precision; report.md, `kvphase compare`'s table,
scripts/claims.py and every page a script writes print through `fixed`. Rounding a value already stored
at two decimals to one again rounds twice: -7.2514 stored as -7.25 prints -7.2, where once gives -7.3.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal


def fixed(value: float, digits: int = 1) -> str:
    """`value` with `digits` decimals, rounded once from the float it is (ties, which only a value exactly
    halfway in binary can make, away from zero); never "-0.0"."""
    text = f"{Decimal(float(value)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP):f}"
    return text.lstrip("-") if not text.strip("-0.") else text
