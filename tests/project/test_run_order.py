"""The suite's run order is measured, not hand-kept: `--store-durations` writes each module's seconds
into tests/durations.json, and tests/conftest.py runs the modules longest first by it, the ones it
has not measured last. And a phase that hangs (a fixture's setup, a test, a teardown) fails in its time
limit instead of eating the CI run's budget. Checked on a copy of the conftest in a folder of trivial
modules."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.helpers.paths import REPO

TRIVIAL = "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n"


def _suite(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the folder is pytest's root, as the repository is
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    for name in ("test_0.py", "test_a.py", "test_b.py"):
        (tmp_path / "tests" / name).write_text(TRIVIAL)
    return tmp_path / "tests" / "durations.json"


def _pytest(tmp_path, *args, env: dict | None = None, passes: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert (result.returncode == 0) == passes, result.stdout + result.stderr
    return result


def test_stored_durations_name_the_modules_run_and_keep_the_others_that_exist(tmp_path):
    durations = _suite(tmp_path)
    durations.write_text(json.dumps({"tests/test_0.py": 3.0, "tests/test_gone.py": 9.0}))
    _pytest(tmp_path, "-n", "2", "--dist", "loadfile", "--store-durations", "tests/test_a.py", "tests/test_b.py")
    stored = json.loads(durations.read_text())
    assert set(stored) == {"tests/test_0.py", "tests/test_a.py", "tests/test_b.py"}, stored  # test_gone.py is gone
    assert stored["tests/test_0.py"] == 3.0, stored  # not run: its measurement is kept
    assert all(isinstance(s, float) and s >= 0 for s in stored.values()), stored


def test_modules_run_longest_first_and_the_unmeasured_last(tmp_path):
    _suite(tmp_path).write_text(json.dumps({"tests/test_a.py": 1.0, "tests/test_b.py": 5.0}))
    listed = _pytest(tmp_path, "-p", "no:xdist", "--collect-only").stdout.splitlines()
    modules = [line.split("::")[0] for line in listed if "::" in line]
    assert modules == ["tests/test_b.py"] * 2 + ["tests/test_a.py"] * 2 + ["tests/test_0.py"] * 2, listed


HANGING = """import time

import pytest


@pytest.fixture
def {phase}_hangs():
    if "{phase}" == "setup":
        time.sleep(60)
    yield
    if "{phase}" == "teardown":
        time.sleep(60)


def test_hangs({phase}_hangs):
    if "{phase}" == "call":
        time.sleep(60)
"""


@pytest.mark.parametrize("phase", ["setup", "call", "teardown"])
def test_a_phase_that_hangs_fails_in_its_time_limit_naming_the_phase(tmp_path, phase):
    _suite(tmp_path)
    (tmp_path / "tests" / "test_hang.py").write_text(HANGING.format(phase=phase))
    started = time.monotonic()
    result = _pytest(tmp_path, "-p", "no:xdist", "tests/test_hang.py", env={"KVPHASE_TEST_TIME_LIMIT_S": "2"},
                     passes=False)
    assert f"{phase} over its time limit of 2 s" in result.stdout, result.stdout
    assert time.monotonic() - started < 45, "the phase ran its whole minute"


SLOW_SETUP = """import time

import pytest

pytestmark = pytest.mark.time_limit(1)


@pytest.fixture
def slow_start():
    time.sleep(3)


def test_quick_call(slow_start):
    pass
"""


def test_a_tight_call_limit_does_not_cut_its_fixtures_setup(tmp_path):
    _suite(tmp_path)
    (tmp_path / "tests" / "test_slow_setup.py").write_text(SLOW_SETUP)
    _pytest(tmp_path, "-p", "no:xdist", "tests/test_slow_setup.py", env={"KVPHASE_TEST_TIME_LIMIT_S": "20"})
