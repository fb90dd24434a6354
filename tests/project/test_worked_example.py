"""docs/development.md's worked example (adding a backend) runs as written: the backend it registers
is the one the run records and scores with, and a backend that knows nothing reads as degenerate."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO

PAGE = REPO / "docs" / "development.md"
EXAMPLE = re.compile(r"^<!-- worked example -->\n```python\n(?P<code>.*?)^```", re.M | re.S)


@pytest.mark.slow
def test_the_worked_example_adds_a_backend_that_a_sweep_runs(tmp_path):
    found = EXAMPLE.search(PAGE.read_text())
    assert found, f"{PAGE.name} holds no python block after '<!-- worked example -->'"
    (tmp_path / "example.py").write_text(found["code"])
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-800:]
    assert json.loads((tmp_path / "chance-run" / "config.json").read_text())["backend"] == "chance"
    assert done.stdout.startswith("Degenerate:"), done.stdout
