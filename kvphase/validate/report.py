"""What `kvphase validate` measures: per-quantity differences and a verdict per layer, judged by
`options.Tolerances`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvphase.validate.options import Tolerances


@dataclass
class Diff:
    """Running max and mean of |llama.cpp - reference| over many values."""

    max: float = 0.0
    total: float = 0.0
    count: int = 0

    def add(self, ours: np.ndarray, theirs: np.ndarray) -> None:
        d = np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64)).ravel()
        if d.size:
            self.max = max(self.max, float(d.max()))
            self.total += float(d.sum())
            self.count += d.size

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def excess(self, what: str, limit: float, tolerance: str) -> list[str]:
        """The failure line when the largest difference is over `limit`, else nothing."""
        if not self.count or self.max <= limit:
            return []
        return [f"{what} differ by up to {self.max:.3g} (mean {self.mean:.3g}), tolerance {tolerance}"]


@dataclass
class LayerCheck:
    """Everything compared on one layer, summed over splits and ubatches."""

    layer: int
    keys: Diff = field(default_factory=Diff)  # compressed keys
    gates: Diff = field(default_factory=Diff)  # per-token gate logits incl. the per-phase bias (deepseek4)
    scores: Diff = field(default_factory=Diff)  # finite indexer / block scores
    score_scale: float = 0.0  # largest |finite score| llama.cpp produced
    mask_mismatch: int = 0  # scores finite in one and -inf in the other
    attention: Diff = field(default_factory=Diff)  # attention output from llama.cpp's q, keys and mask (deepseek4)
    attention_scale: float = 0.0  # largest |attention output| llama.cpp produced
    rows: int = 0  # selections compared (query x head)
    exact: int = 0  # identical selected sets
    ties: int = 0  # sets that differ only among exactly tied scores
    notes: list[str] = field(default_factory=list)  # the first few mismatches, for the user
    uncompared: list[str] = field(default_factory=list)  # what this layer should have compared but could not

    @property
    def mismatched(self) -> int:
        return self.rows - self.exact - self.ties

    def note(self, text: str) -> None:
        if len(self.notes) < 5:
            self.notes.append(text)

    def not_compared(self, text: str) -> None:
        """Record, once, something this layer should have compared but could not (a FAIL)."""
        if text not in self.uncompared:
            self.uncompared.append(text)

    def count(self, verdict: str, tokens_equal: bool, mismatch: str, tie_needs_equal_tokens: bool = False,
              differ: str = ", selected tokens differ") -> None:
        """Tally one compared selection: exact, an exact tie, or a mismatch noted for the user.

        A tie usually exposes other tokens than the reference's choice; where the check reads
        llama.cpp's own choice back (deepseek4's block mask), a tie must agree on tokens too.
        """
        self.rows += 1
        if verdict == "exact" and tokens_equal:
            self.exact += 1
        elif verdict == "tie" and (tokens_equal or not tie_needs_equal_tokens):
            self.ties += 1
        else:
            self.note(mismatch + ("" if tokens_equal else differ))

    def failures(self, tol: Tolerances) -> list[str]:
        """Why this layer fails; empty when it passes."""
        out = [f"not compared: {text}" for text in self.uncompared]
        out += self.gates.excess("gate logits", tol.keys_abs, f"{tol.keys_abs:g}")
        out += self.keys.excess("keys", tol.keys_abs, f"{tol.keys_abs:g}")
        out += self.scores.excess("scores", tol.scores_rel * max(self.score_scale, 1e-30),
                                  f"{tol.scores_rel:g} x largest score {self.score_scale:.3g}")
        if self.mask_mismatch:
            out.append(f"{self.mask_mismatch} scores are masked in one and not the other")
        out += self.attention.excess("attention outputs", tol.attention_rel * max(self.attention_scale, 1e-30),
                                     f"{tol.attention_rel:g} x largest output {self.attention_scale:.3g}")
        if self.mismatched:
            out.append(f"{self.mismatched} of {self.rows} selected sets differ beyond ties")
        if not self.rows and not self.keys.count:
            out.append("nothing was compared")
        return out


@dataclass
class ValidationReport:
    """The result of `validate_model`: one check per compressed layer."""

    model: Path
    architecture: str
    family: str
    n_tokens: int
    splits: list[list[int]]
    tolerances: Tolerances
    layers: list[LayerCheck]

    @property
    def passed(self) -> bool:
        return bool(self.layers) and all(not layer.failures(self.tolerances) for layer in self.layers)
