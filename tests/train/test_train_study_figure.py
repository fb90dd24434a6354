"""scripts/train_study_figure.py: every configuration of the study gets its own line in the figure."""

from __future__ import annotations

import importlib.util
import json
from tests.helpers.paths import REPO

SCRIPT = REPO / "scripts" / "train_study_figure.py"


def _figure_module():
    spec = importlib.util.spec_from_file_location("train_study_figure", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_figure_keeps_every_configuration_beyond_one_palette(tmp_path):
    """25 configurations (more than tab10's and tab20's colours): all drawn, each in its own style."""
    names = [f"config{i:02d}" for i in range(25)]
    for name in names:
        folder = tmp_path / f"{name}-seed0"
        folder.mkdir()
        curve = [{"step": 100, "gap": 0.1, "accuracy": 0.5}, {"step": 200, "gap": 0.2, "accuracy": 0.6}]
        (folder / "summary.json").write_text(json.dumps({"curve": curve}))
    module = _figure_module()
    fig = module.plot(module.runs(tmp_path), tmp_path / "study.png")
    gap_axes, accuracy_axes = fig.axes
    for axes in (gap_axes, accuracy_axes):
        labels = axes.get_legend_handles_labels()[1]
        assert labels == names, f"drawn {len(labels)} of {len(names)} configurations"
        styles = {(line.get_color(), line.get_linestyle()) for line in axes.get_lines()}
        assert len(styles) == len(names), f"{len(styles)} distinct styles for {len(names)} configurations"
    assert (tmp_path / "study.png").is_file()
