"""CONTRIBUTING.md's recipe for a post-hoc design runs as written: the design its example registers in
`DESIGNS` is one `kvphase sweep --backend reference --design NAME` runs and records, with the options its
`for_stride` gives it; before it is registered, the sweep refuses the name in one line."""

from __future__ import annotations

import importlib
import json
import re
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.designs import DESIGNS
from kvphase.reference.policy import make_policy
from tests.helpers.cli_checks import one_line_error
from tests.helpers.paths import REPO

PAGE = REPO / "CONTRIBUTING.md"
EXAMPLE = re.compile(r"^<!-- design example -->\n```python\n(?P<code>.*?)^```", re.M | re.S)
runner = CliRunner()


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """CONTRIBUTING.md's example, a module of its own imported as a contributor's would be; the registry
    as it was afterwards."""
    found = EXAMPLE.search(PAGE.read_text())
    assert found, f"{PAGE.name} holds no python block after '<!-- design example -->'"
    (tmp_path / "first_tokens.py").write_text(found["code"])
    monkeypatch.syspath_prepend(str(tmp_path))
    before = dict(DESIGNS)
    yield lambda: importlib.import_module("first_tokens")
    sys.modules.pop("first_tokens", None)
    DESIGNS.clear()
    DESIGNS.update(before)


def test_the_example_design_keeps_the_first_token_of_each_window(registered):
    """By hand: stride 4, start 1, no local window; the query at position 9 reads position 0 (before
    start), the firsts 1 and 5, and 9 (its own window's first)."""
    example = registered()
    design = make_policy("firsttokens", stride=4, start=1).design
    assert isinstance(design, example.FirstTokens)
    keys = np.zeros((10, 1, 2), np.float32)
    cache = design.compress(np.zeros((1, 1, 2), np.float32), keys, keys, np.array([9]))
    assert np.flatnonzero(cache.visible[0]).tolist() == [0, 1, 5, 9]


@pytest.mark.slow
def test_a_design_registered_as_contributing_says_runs_in_a_sweep(registered, tiny_llama, tmp_path):
    args = ["sweep", str(tiny_llama), "--backend", "reference", "--design", "firsttokens", "--context", "320",
            "--per-residue", "2", "--quiet"]
    one_line_error(runner.invoke(app, [*args, "--out", str(tmp_path / "before")]), "the reference backend runs designs")
    registered()
    out = tmp_path / "run"
    result = runner.invoke(app, [*args, "-o", "local_window=8", "--out", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["backend_options"] == {"design": "firsttokens", "stride": config["stride"], "local_window": 8}
    assert json.loads((out / "summary.json").read_text())["n_targets"] == 16
    assert "reference (design=firsttokens" in (out / "report.md").read_text()
