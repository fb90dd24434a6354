"""Sweeps: the plan, token-exact placement of records, tasks, the run folder, its analysis, report and comparison.

The package is also the Python API's `sweep` function: `kvphase.sweep(model, options, **overrides)` runs
`kvphase.sweep.api.sweep` (a module cannot be a function too, so this one is made callable;
every `kvphase.sweep.X` import and attribute works as for any package).
"""

import sys
from types import ModuleType


class _CallableSweepPackage(ModuleType):
    def __call__(self, model=None, options=None, **overrides):
        """`kvphase.sweep.api.sweep`: a sweep of `model` into its run folder; returns the `Run`."""
        from kvphase.sweep.api import sweep

        return sweep(model, options, **overrides)

    @property
    def __signature__(self):
        """The API function's, every option listed (`inspect.signature`, editors)."""
        from inspect import signature

        from kvphase.sweep.api import sweep

        return signature(sweep)


sys.modules[__name__].__class__ = _CallableSweepPackage
