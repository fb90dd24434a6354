"""The idealized model of why gradient flow makes components specialize by phase (`kvphase theory`).

`model.py` holds the model (K softmax gates over S phases, a retrieval loss), `flow.py` its
gradient flow integrated by RK4, `closed_form.py` what can be derived (the uniform gate's
eigenvalues and stability threshold, the time to specialize, the symmetric fixed points),
`study.py` runs the cases and checks and writes a run folder, `report.py` its page.
Numpy only; stands on `kvphase.runfolder` and `kvphase.errors`. Derivations: docs/theory.md.
"""

from kvphase.theory.closed_form import UniformPoint, balanced_split, symmetric_point, uniform_point
from kvphase.theory.flow import Trajectory, integrate
from kvphase.theory.model import IdealModel, TheoryConfig
from kvphase.theory.study import rerun_study, run_study

__all__ = ["IdealModel", "TheoryConfig", "Trajectory", "UniformPoint", "balanced_split", "integrate", "rerun_study",
           "run_study", "symmetric_point", "uniform_point"]
