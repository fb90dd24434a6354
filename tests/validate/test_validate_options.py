"""`kvphase validate --cache-type`: the name `sweep` gives the KV cache type, and the former
`--cache` still works with one deprecation line on stderr. The plumbing is checked by recording
what the command hands to validate_model (the comparison itself is tests/validate/test_validate.py's)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from tests.helpers.fakes import validate_without_a_model_file

DEPRECATION = "--cache is deprecated, use --cache-type"


class Stop(Exception):
    """Raised by the recording stand-in so no model is opened."""


@pytest.fixture
def handed(monkeypatch):
    """The cache type each run of the command handed to validate_model."""
    seen: list[str] = []

    def record(model, tokens, seed, splits, tolerances, settings, perturb, cache, on_split=None):
        seen.append(cache)
        raise Stop

    monkeypatch.setattr("kvphase.validate.run.validate_model", record)  # the command imports it when it runs
    validate_without_a_model_file(monkeypatch)
    return seen


def run(args: list[str]):
    return CliRunner().invoke(app, ["validate", "model.gguf", *args])


@pytest.mark.parametrize("args, cache", [([], "f32"), (["--cache-type", "f16"], "f16"), (["--cache", "f16"], "f16"),
                                         (["--cache", "f16", "--cache-type", "f16"], "f16")])
def test_either_name_sets_the_cache_type(handed, args, cache):
    result = run(args)
    assert isinstance(result.exception, Stop), result.output
    assert handed == [cache]
    assert (DEPRECATION in result.stderr) == ("--cache" in args), result.stderr
    assert DEPRECATION not in result.stdout


def test_the_deprecation_is_one_line(handed):
    lines = [line for line in run(["--cache", "f16"]).stderr.splitlines() if line.strip()]
    assert lines == ["kvphase validate: --cache is deprecated, use --cache-type (the name sweep uses)"]


def test_the_two_names_with_different_values_are_refused_in_one_line(handed):
    result = run(["--cache", "f16", "--cache-type", "f32"])  # f32 is the default: cannot tell it was given
    assert handed == ["f16"]
    refused = run(["--cache", "f32", "--cache-type", "f16"])
    assert refused.exit_code == 1 and handed == ["f16"]
    assert "--cache f32 and --cache-type f16 disagree" in refused.output
    assert "Traceback" not in refused.output
    assert isinstance(result.exception, Stop)


def test_the_help_shows_the_new_name_only():
    shown = CliRunner().invoke(app, ["validate", "--help"]).output
    assert "--cache-type" in shown and "--cache " not in shown.replace("--cache-type", "")
