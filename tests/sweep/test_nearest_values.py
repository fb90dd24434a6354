"""Errors that name what the user typed and, where a value fits, the nearest one that does (issue
56): each suggested value is checked to fit, and the one just past it not to."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.gguf.modelinfo import read_model_info
from kvphase.sweep.context_settings import MAX_TARGETS
from kvphase.sweep.plan import make_plan, per_residue_for_detect
from tests.helpers.cli_checks import one_line_error

runner = CliRunner()


def _sweep(model, tmp_path, *args):
    return runner.invoke(app, ["sweep", str(model), "--out", str(tmp_path / "run"), "-q", "--threads", "1", *args])


def _suggested(result, option: str) -> int | float:
    """The value the error line suggests for `option` ("the smallest --context that fits is 88")."""
    found = re.search(rf"the (?:smallest|largest) {option} that fits is ([\d.]+)", result.output)
    assert found, result.output
    return float(found.group(1)) if "." in found.group(1) else int(found.group(1))


def _plan(model, **kwargs):
    options = dict(stride=None, modulus=None, context=256, per_residue=None, padding="prefix", task="records", seed=0,
                   targets_per_context="auto")  # the CLI's default density
    return make_plan(read_model_info(model), **{**options, **kwargs})


def test_too_many_contexts_name_contexts_and_the_largest_that_fits(tiny_llama, tmp_path):
    result = _sweep(tiny_llama, tmp_path, "--contexts", "100000", "--context", "256")
    one_line_error(result, "--contexts 100000 of ", f"one run holds at most {MAX_TARGETS}")
    assert "--per-residue" not in result.output  # an option the user did not give
    largest = _suggested(result, "--contexts")
    # the count is what is checked (`sized`): fit=False skips fitting the padding, which would lay out
    # all 65,536 targets to learn whether prefix padding fits (it always does here, and may not change the count)
    plan = _plan(tiny_llama, contexts=largest, fit=False)
    assert plan.per_residue * plan.modulus <= MAX_TARGETS
    with pytest.raises(PlanError, match=f"--contexts {largest + plan.modulus} of "):
        _plan(tiny_llama, contexts=largest + plan.modulus)


def test_a_detect_too_fine_names_detect_and_the_smallest_that_fits(tiny_llama, tmp_path):
    result = _sweep(tiny_llama, tmp_path, "--per-residue", "auto", "--detect", "0.1")
    one_line_error(result, "--detect 0.1 needs ", f"one run holds at most {MAX_TARGETS}")
    assert "--per-residue 4" not in result.output
    smallest = _suggested(result, "--detect")
    assert per_residue_for_detect(smallest, 8) * 8 <= MAX_TARGETS
    with pytest.raises(PlanError, match="the smallest --detect that fits is"):
        per_residue_for_detect(round(smallest - 0.1, 1), 8)


def test_a_context_too_short_names_the_smallest_that_fits(tiny_llama, tmp_path):
    result = _sweep(tiny_llama, tmp_path, "--context", "100", "--per-residue", "1")
    one_line_error(result, "--context 100 is too short for task records")
    assert "position -" not in result.output and "last usable position" not in result.output
    smallest = _suggested(result, "--context")
    assert _plan(tiny_llama, context=smallest, per_residue=1).context == smallest
    with pytest.raises(PlanError, match=f"--context {smallest - 1} is too short .* fits is {smallest}$"):
        _plan(tiny_llama, context=smallest - 1, per_residue=1)


def test_too_many_per_residue_names_the_largest_that_fits(tiny_llama, tmp_path):
    result = _sweep(tiny_llama, tmp_path, "--per-residue", "100000")
    one_line_error(result, "--per-residue 100000 asks for 800000 targets")
    assert _suggested(result, "--per-residue") == MAX_TARGETS // 8


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "abc", "65537"])
def test_targets_per_context_states_every_accepted_value_and_its_bounds(tiny_llama, tmp_path, value):
    one_line_error(_sweep(tiny_llama, tmp_path, "--targets-per-context", value),
                   f"--targets-per-context must be 'auto', 'task' or a whole number from 1 to {MAX_TARGETS} "
                   f"(both included), got '{value}'")


@pytest.mark.parametrize("value", ["100", "0", "-3"])
def test_detect_says_its_bounds_are_excluded(tiny_llama, tmp_path, value):
    one_line_error(_sweep(tiny_llama, tmp_path, "--per-residue", "auto", "--detect", value),
                   f"a dip in points above 0 and below 100 (both excluded), got {float(value):g}")


@pytest.mark.parametrize("value", [str(2**31), str(2**40), "x", "-2", "1.5"])
def test_gpu_layers_out_of_range_is_one_line(tiny_llama, tmp_path, value):
    result = _sweep(tiny_llama, tmp_path, "--gpu-layers", value)
    one_line_error(result, f"--gpu-layers must be a count of layers from 0 to {2**31 - 1}, or -1 (or 'all') for "
                           f"every layer, got '{value}'")
    assert "Usage" not in result.output


@pytest.mark.parametrize("value", ["-1", "all"])
def test_gpu_layers_minus_one_is_every_layer(tiny_llama, tmp_path, value):
    """llama.cpp's -ngl -1: every layer (on this CPU wheel, nothing is offloaded and it says so)."""
    import json

    result = _sweep(tiny_llama, tmp_path, "--context", "256", "--per-residue", "1", "--gpu-layers", value)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "config.json").read_text())["backend_options"]["gpu_layers"] == -1
