"""The repository's folders the tests read, wherever a test module sits below tests/."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
TRAINED = DATA / "trained"  # small trained models, each from a committed run under reports/trained
EXAMPLE = REPO / "reports" / "example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024"  # `make demo`'s committed run
