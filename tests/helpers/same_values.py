"""Run-folder files compared as what they say, not as bytes: for a file the code writes from the same
inputs by the same arithmetic (a committed folder's summary.json or report.md, re-reported from its own
results.csv) on a machine that is not the one that wrote it.

Why not bytes: numpy's reductions (sums, dot products, matrix solves) take the CPU's vector width, so
the same arithmetic in another order rounds differently in the last bits; issue 71's AVX2 host wrote
the committed example's CMH statistic as 5.541510845175762 where the developers' host wrote ...764.

What is exact: every string (verdict words, test names, notes, paths), every boolean, every integer
(counts, residues, positions, degrees of freedom, plan fields), every key, every list's length. What is
not: a JSON float agrees to a relative `RELATIVE` (1e-9: rounding moves the 16th digit, a real change
moves far more); a number printed with decimals in report.md agrees to one unit of its last printed
digit (a value on a rounding boundary may print either way). A number printed without a decimal point or
an exponent is read as a count and compared exactly. Numbers that went through llama.cpp (results.csv's
logprobs) are not this helper's: they differ by kernel, within bounds measured in
tests/sweep/test_default_sweep.py.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

RELATIVE = 1e-9
# a value that is zero up to rounding (a statistic of identical groups) may come out as 1e-17 elsewhere
ABSOLUTE = 1e-12
# a number standing alone (not the tail of a word or of a version such as 0.3.36's ".36")
NUMBER = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def json_differences(ours, theirs, where: str = "") -> list[str]:
    """Where two parsed JSON values differ, one line each: keys, strings, booleans, integers and list
    lengths exactly, floats to a relative `RELATIVE`."""
    at = where or "top level"
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if ours.keys() != theirs.keys():
            return [f"{at}: keys {sorted(set(ours) ^ set(theirs))} are in one file only"]
        return [line for key in ours for line in json_differences(ours[key], theirs[key], f"{where}.{key}".lstrip("."))]
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return [f"{at}: {len(ours)} items against {len(theirs)}"]
        return [line for i, (a, b) in enumerate(zip(ours, theirs)) for line in json_differences(a, b, f"{where}[{i}]")]
    if type(ours) is float and type(theirs) is float:
        if math.isclose(ours, theirs, rel_tol=RELATIVE, abs_tol=ABSOLUTE) or (math.isnan(ours) and math.isnan(theirs)):
            return []
        return [f"{at}: {ours!r} against {theirs!r}, beyond a relative {RELATIVE:g}"]
    if type(ours) is not type(theirs) or ours != theirs:  # True == 1 in Python, not in a summary
        return [f"{at}: {ours!r} against {theirs!r}"]
    return []


def _unit(printed: str) -> float:
    """One unit of a printed number's last digit: 0.01 for "5.54", 1e-06 for "1.2e-05"."""
    mantissa, _, exponent = printed.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def _is_count(printed: str) -> bool:
    return not re.search(r"[.eE]", printed)


def _numbers_agree(ours: str, theirs: str) -> bool:
    if _is_count(ours) or _is_count(theirs):
        return ours == theirs
    # the float epsilon: 0.59 - 0.58 is 0.010000000000000009 in binary
    return abs(float(ours) - float(theirs)) <= max(_unit(ours), _unit(theirs)) * (1 + 1e-9)


def text_differences(ours: str, theirs: str) -> list[str]:
    """Where two printed pages (report.md) differ, one line each: line for line, the words between
    numbers exactly, each number to its printed precision (counts exactly)."""
    ours_lines, theirs_lines = ours.splitlines(), theirs.splitlines()
    if len(ours_lines) != len(theirs_lines):
        return [f"{len(ours_lines)} lines against {len(theirs_lines)}"]
    differences = []
    for number, (a, b) in enumerate(zip(ours_lines, theirs_lines), start=1):
        # re.split with one group: words at even places, numbers at odd ones
        a_parts, b_parts = NUMBER.split(a), NUMBER.split(b)
        same = len(a_parts) == len(b_parts) and all(
            (x == y) if i % 2 == 0 else _numbers_agree(x, y) for i, (x, y) in enumerate(zip(a_parts, b_parts)))
        if not same:
            differences.append(f"line {number}: {a!r} against {b!r}")
    return differences


def differences(ours: Path, theirs: Path) -> list[str]:
    """How file `ours` differs from `theirs` in what it says: JSON as parsed values, anything else
    as printed text."""
    if ours.suffix == ".json":
        return json_differences(json.loads(ours.read_text()), json.loads(theirs.read_text()))
    return text_differences(ours.read_text(), theirs.read_text())


def assert_same_values(ours: Path, theirs: Path, names=("summary.json", "report.md")) -> None:
    """Folder `ours` holds the files `names` of folder `theirs` with the same values (see the module's
    docstring for what "same" is for each kind of value); the assertion lists every difference."""
    found = [f"{name}: {line}" for name in names for line in differences(ours / name, theirs / name)]
    assert not found, f"{ours} against {theirs}:\n" + "\n".join(found)
