"""kvphase: find the periodic weak spots that chunked KV-cache compression leaves in retrieval.

The Python API (`kvphase.sweep.api`): `sweep`, `sweep_strides`, `dry_run`, `load_run`, `report`, `compare`,
`inspect`, and the `Run` they return; the library's errors are in `kvphase.errors`. Each is
imported on first use, so that `import kvphase` (and the command line's start) stays cheap.
"""

__version__ = "0.1.0"

_API = ("sweep", "sweep_strides", "dry_run", "load_run", "report", "compare", "inspect", "Run", "StrideSweep", "Notice",
        "SweepOptions", "DryRun")
_ERRORS = ("KvphaseError", "ModelFileError", "GGUFError", "PlanError", "RecordLayoutError", "BackendError",
           "RunFolderError", "Interrupted")
__all__ = ["__version__", *_API, *_ERRORS]


def __getattr__(name: str):
    """PEP 562: the API's names, imported when first asked for (pandas, llama.cpp, scipy behind them).
    `kvphase.sweep`, once the package `kvphase.sweep` is imported, is that package, callable as the
    API's `sweep` (kvphase/sweep/__init__.py)."""
    if name in _API:
        from kvphase.sweep import api

        return globals().get(name) or getattr(api, name)  # "sweep": the package the import above set
    if name in _ERRORS:
        from kvphase import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'kvphase' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
