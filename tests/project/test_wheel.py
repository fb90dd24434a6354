"""The wheel is the product: built from the project, installed into a fresh virtual
environment, it runs a sweep from a folder outside the repository (so the task files must
ship inside it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from tests.helpers.paths import REPO

ROOT = REPO


@pytest.mark.slow
def test_an_installed_wheel_runs_a_sweep_outside_the_repository(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing from the checkout
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "-w", str(wheels), str(ROOT)], check=True, cwd=tmp_path)
    (wheel,) = wheels.glob("kvphase-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                    "--no-deps", str(wheel)], check=True, env=env)
    # the dependencies (llama-cpp-python takes minutes to build) come from this environment, as
    # a plain path: its .pth files, and so its editable kvphase, are not read
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = subprocess.run([venv / "bin" / "python", "-c", "import kvphase, kvphase.defaults as d; "
                            "print(kvphase.__file__); print(d.prompts_dir())"],
                           check=True, capture_output=True, text=True, cwd=outside, env=env).stdout.split()
    assert all(Path(p).is_relative_to(site) for p in where), where  # the wheel's copy, not the checkout
    run = subprocess.run([venv / "bin" / "kvphase", "sweep", "--context", "256", "--per-residue", "1", "--quiet",
                          "--threads", "1", "--out", "run"], capture_output=True, text=True, cwd=outside, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Report: run/report.md" in run.stdout
    summary = json.loads((outside / "run" / "summary.json").read_text())
    assert summary["n_targets"] == 8
