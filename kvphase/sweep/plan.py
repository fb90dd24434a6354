"""The plan of a sweep: everything that defines a run, as its `config.json` holds it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvphase.sweep.placement import ProbeSettings


@dataclass(frozen=True)
class SweepPlan:
    """Everything that defines a run; `config.json` holds exactly this."""

    model: str  # path to the GGUF file
    task: str
    stride: int
    modulus: int
    context: int  # tokens per context; every query starts at this position
    per_residue: int
    padding: str
    seed: int
    control: bool  # True when the model declares no compression and the stride is the user's
    backend: str = "llama.cpp"
    backend_options: dict = field(default_factory=dict)  # the reference backend's design and its options

    def describe_backend(self) -> str:
        """`backend` alone, or `backend (key=value, ...)` with the reference design's options."""
        if not self.backend_options:
            return self.backend
        options = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in self.backend_options.items())
        return f"{self.backend} ({options})"

    @property
    def probe_settings(self) -> ProbeSettings:
        return ProbeSettings(self.context, self.stride, self.modulus, self.per_residue, self.padding, self.seed)

    def comparable(self) -> dict:
        """The fields that must match for a folder to resume this plan."""
        out = asdict(self)
        out["model"] = Path(self.model).name
        return out
