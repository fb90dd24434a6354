"""Sweeps: the plan, token-exact placement of records, tasks, the run folder, its analysis, report and comparison.

The package is also the Python API's `sweep` function: `kvphase.sweep(model, **options)` runs
`kvphase.sweep.api.sweep` (a module cannot be a function too, so this one is made callable;
every `kvphase.sweep.X` import and attribute works as for any package).
"""

import sys
from types import ModuleType


class _CallableSweepPackage(ModuleType):
    def __call__(self, model=None, **options):
        """`kvphase.sweep.api.sweep`: a sweep of `model` into its run folder; returns the `Run`."""
        from kvphase.sweep.api import sweep

        return sweep(model, **options)


sys.modules[__name__].__class__ = _CallableSweepPackage
