"""Shared fixtures: the real default model through llama.cpp, and a fake backend."""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # BLAS threads beside llama.cpp's would fight over 2 cores


def _pin_xdist_worker() -> None:
    """Under `pytest -n N` (N <= the CPUs we may use), worker k runs on CPU k alone, before JAX or
    llama.cpp size their thread pools: llama.cpp's threads spin at every barrier, so two workers'
    threads sharing CPUs would waste a time slice per barrier. `default_threads()` then gives 1."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not worker or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if count <= len(cpus):
        os.sched_setaffinity(0, {cpus[int(worker.removeprefix("gw")) % len(cpus)]})


_pin_xdist_worker()

import faulthandler  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from kvphase.defaults import default_model_path, default_threads  # noqa: E402


@pytest.fixture(scope="session")
def default_model():
    return default_model_path()


@pytest.fixture(scope="session")
def llama_backend(default_model):
    from kvphase.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(default_model, n_ctx=2048, n_threads=default_threads())
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def tiny_llama(default_model, tmp_path_factory):
    """A two-layer llama (1.6 M parameters, F32) with SmolLM2's tokenizer, for the tests where the
    model is not the point: its sweeps take seconds where SmolLM2's take minutes."""
    from kvphase.gguf.tiny import write_tiny_model

    return write_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama") / "tiny-llama.gguf",
                            tokenizer_from=default_model)


@pytest.fixture(scope="session")
def tiny_deepseek4(default_model, tmp_path_factory):
    """A tiny deepseek4 with SmolLM2's vocabulary: compress ratios 0, 4 and 128 on its three
    layers (kvphase.gguf.tiny), heads 64 wide (so q8_0 and q4_0 cache blocks of 32 fit)."""
    from kvphase.gguf.tiny import write_tiny_model

    return write_tiny_model("deepseek4", tmp_path_factory.mktemp("ds4") / "tiny-ds4.gguf", tokenizer_from=default_model)


@pytest.fixture(scope="session")
def tiny_compressed(default_model, tmp_path_factory):
    """A folder of `make-tiny ARCH --vocab-from MODEL` files, ARCH.gguf for glm5-next, deepseek4 and
    minimax-m3 (tests/helpers/tiny_models.py), made once for every module that sweeps or taps them.
    Copy a file before changing it."""
    from tests.helpers.tiny_models import made_by_make_tiny

    return made_by_make_tiny(tmp_path_factory.mktemp("tiny-compressed"), default_model)


@pytest.fixture(scope="session")
def default_sweep(tmp_path_factory):
    """`kvphase sweep` with no options, resuming the committed example (tests/helpers/default_sweep.py):
    one real model's full run folder for every module that needs one. Copy it before changing it."""
    from tests.helpers.default_sweep import sweep_resuming_the_example

    return sweep_resuming_the_example(tmp_path_factory.mktemp("default-sweep") / "demo")


# Modules longest first, as measured: under `pytest -n 2 --dist loadfile` each worker takes the next
# module when it runs dry, so the last ones to start are short and neither worker waits long for the
# other at the end. tests/durations.json holds each module's CPU seconds (user + system of the test
# process and of the commands it ran, over the setup, call and teardown of its tests) from a real run:
# on a worker pinned to one CPU that is its seconds on an idle machine, and unlike wall time it does not
# grow when the machine is shared. `--store-durations` writes it again (docs/development.md, "Tests").
DURATIONS = Path(__file__).parent / "durations.json"


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help=f"write each module's measured seconds into {DURATIONS.name}, for the run order")


def _module(item_or_report, root: Path) -> str:
    path = getattr(item_or_report, "path", None)
    return path.relative_to(root).as_posix() if path else item_or_report.nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    # stable: modules not measured yet come last, in the order they were collected
    items.sort(key=lambda item: -seconds.get(_module(item, config.rootpath), -1.0))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has waited for (the commands
    a test runs: `kvphase` subprocesses, llama-server)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_CPU_MARK = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_CPU_MARK] = cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries the CPU seconds it took (on the worker that ran it: xdist sends a
    report's user_properties to the controller)."""
    outcome = yield
    now = cpu_seconds()
    outcome.get_result().user_properties.append(("cpu_seconds", now - item.stash.get(_CPU_MARK, now)))
    item.stash[_CPU_MARK] = now


class _Durations:
    """Sums each module's CPU seconds as the reports arrive (from every xdist worker, on the controller)."""

    def __init__(self, root: Path):
        self.root, self.seconds = root, {}

    def pytest_runtest_logreport(self, report):
        module = _module(report, self.root)
        cpu = dict(report.user_properties).get("cpu_seconds", report.duration)
        self.seconds[module] = self.seconds.get(module, 0.0) + cpu

    def pytest_sessionfinish(self, session):
        if hasattr(session.config, "workerinput"):  # a worker: the controller writes
            return
        kept = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
        kept.update({module: round(s, 1) for module, s in self.seconds.items()})
        kept = {m: s for m, s in kept.items() if (self.root / m).is_file()}  # modules moved or removed go
        DURATIONS.write_text(json.dumps(dict(sorted(kept.items(), key=lambda kv: -kv[1])), indent=1) + "\n")


# A test that hangs fails instead (SIGALRM in pytest's main thread, where every test and fixture runs), in
# its setup (a module's server or sweep), its call and its teardown alike, each phase timed on its own: a
# hang anywhere would otherwise eat the CI run's whole budget and print nothing. The default is far above
# the slowest phase's minutes on a loaded machine (a module fixture's two server sweeps: 4 min here);
# `@pytest.mark.time_limit(S)` sets a test call's own, seconds for the ones that wait on servers (and
# its setup's and teardown's, where longer than the default);
# KVPHASE_TEST_TIME_LIMIT_S the default (tests/project/test_run_order.py plants a hang in each phase)
DEFAULT_TIME_LIMIT_S = float(os.environ.get("KVPHASE_TEST_TIME_LIMIT_S", "900"))


def pytest_configure(config):
    config.addinivalue_line("markers", "time_limit(seconds): fail the test when it runs longer than this")
    if config.getoption("store_durations"):
        config.pluginmanager.register(_Durations(config.rootpath), "kvphase-durations")


def _time_limited(item, phase: str):
    """Run one phase of `item` under its time limit (a generator for a hookwrapper)."""
    marker = item.get_closest_marker("time_limit")
    own = float(marker.args[0]) if marker else None
    # a call's own limit is tight on purpose; a fixture's setup (a vLLM server's start) may need as long as it
    seconds = own if own is not None and phase == "call" else max(own or 0.0, DEFAULT_TIME_LIMIT_S)

    def over(signum, frame):
        faulthandler.dump_traceback(all_threads=True)  # where it hung, every thread
        pytest.fail(f"{phase} over its time limit of {seconds:g} s", pytrace=False)

    previous = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _time_limited(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _time_limited(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield from _time_limited(item, "teardown")
