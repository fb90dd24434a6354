"""The idealized model of why gradient flow makes components specialize by phase (`kvphase theory`).

`model.py` holds the model (K softmax gates over S phases, a retrieval loss), `flow.py` its
gradient flow integrated by RK4, `closed_form.py` what can be derived (the uniform gate's
eigenvalues and stability threshold, the time to specialize, the symmetric fixed points),
`study.py` runs the cases and checks and writes a run folder, `report.py` its page, `config.py`
the options (no numpy).
Numpy only; stands on `kvphase.runfolder` and `kvphase.errors`. Derivations: docs/theory.md.
"""

from importlib import import_module

_EXPORTS = {"UniformPoint": "closed_form", "balanced_split": "closed_form", "symmetric_point": "closed_form",
            "uniform_point": "closed_form", "Trajectory": "flow", "integrate": "flow", "IdealModel": "model",
            "TheoryConfig": "config", "rerun_study": "study", "run_study": "study"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """PEP 562: each name imported from its module when first asked for, so that the command line's
    start (which reads `theory.config`'s defaults) loads no numpy model."""
    if name in _EXPORTS:
        return getattr(import_module(f"kvphase.theory.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'kvphase.theory' has no attribute {name!r}")
