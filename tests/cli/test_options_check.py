"""Wrong types and values (issue 65 item 3), checked in one place (`kvphase.options_check`): every
API function refuses a wrong type with PlanError before anything is read or written, and a command
and its API function refuse the same value with the same line (sweep, and conform where it takes
the option)."""

from __future__ import annotations

from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import kvphase
from tests.helpers.cli_checks import one_line_error
from kvphase.cli import app
from kvphase.conform.check import EngineChoice
from kvphase.errors import PlanError
from kvphase.sweep.options import SweepOptions

runner = CliRunner()
URL = "http://127.0.0.1:9"  # nothing listens: a value that got past the checks would fail here, later

API_CASES = {  # what is wrong -> (the call, given the model's path; the line)
    "context='x'": (lambda m: kvphase.sweep(m, context="x"), "--context expects a whole number or None, got 'x'"),
    "seed=1.5": (lambda m: kvphase.sweep(m, seed=1.5), "--seed expects a whole number, got 1.5"),
    "threads=True": (lambda m: kvphase.sweep(m, threads=True), "--threads expects a whole number or None, got True"),
    "model as an int": (lambda m: kvphase.sweep(5), "model expects a path, got 5"),
    "out as an int": (lambda m: kvphase.sweep(m, out=5), "--out expects a path or None, got 5"),
    "a NUL in out": (lambda m: kvphase.sweep(m, out="run\0x"), "--out expects a path or None, got 'run\\x00x'"),
    "url=5": (lambda m: kvphase.sweep(m, backend="server", url=5),
              "--url expects a string or a list of strings, got 5"),
    "progress=5": (lambda m: kvphase.sweep(m, progress=5), "progress expects a function or None, got 5"),
    "on_notice='x'": (lambda m: kvphase.sweep(m, on_notice="x"), "on_notice expects a function or None, got 'x'"),
    "detect=nan": (lambda m: kvphase.sweep(m, per_residue="auto", detect=float("nan")),
                   "--detect expects a finite number, got nan"),
    "dry_run context='x'": (lambda m: kvphase.dry_run(m, context="x"),
                            "--context expects a whole number or None, got 'x'"),
    "sweep_strides on_run=5": (lambda m: kvphase.sweep_strides(m, on_run=5), "on_run expects a function or None, got 5"),
    "inspect(5)": (lambda m: kvphase.inspect(5), "model expects a path, got 5"),
    "inspect partial='yes'": (lambda m: kvphase.inspect(m, partial="yes"), "partial expects True or False, got 'yes'"),
    "load_run(5)": (lambda m: kvphase.load_run(5), "path expects a path, got 5"),
    "report(5)": (lambda m: kvphase.report(5), "path expects a path, got 5"),
    "compare('path')": (lambda m: kvphase.compare("path"), "runs expects a list of runs or run folders, got 'path'"),
    "compare([5])": (lambda m: kvphase.compare([5]), "each of runs expects a path, got 5"),
    "compare out=5": (lambda m: kvphase.compare([], out=5), "out expects a path, got 5"),
}


@pytest.mark.parametrize("case", API_CASES)
def test_the_api_refuses_a_wrong_type_with_plan_error_writing_nothing(case, tiny_llama, tmp_path, monkeypatch):
    call, line = API_CASES[case]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PlanError) as error:
        call(str(tiny_llama))
    assert str(error.value) == line
    assert not list(tmp_path.iterdir())


SERVER = ["--backend", "server", "--url", URL]
VALUE_CASES = [  # (option, value, the line, the commands that take it)
    *[("--request-timeout", value, f"--request-timeout expects a number of seconds above 0, got {value}",
       ("sweep", "conform")) for value in ("0", "-1", "nan", "inf")],
    *[("--deadline", value, f"--deadline expects a number of seconds above 0, got {value}", ("sweep",))
      for value in ("0", "nan", "inf")],
    ("--threads", "0", "--threads must be from 1 to 512 (llama.cpp's limit), got 0", ("sweep", "conform")),
    ("--margin", "nan", "--margin must be above 0, got nan", ("conform",)),
    ("--margin", "inf", "--margin expects a finite number, got inf", ("conform",)),
    ("--margin", "0", "--margin must be above 0, got 0", ("conform",)),
    ("--logprob-tolerance", "nan", "--logprob-tolerance must be at least 0, got nan", ("conform",)),
]


@pytest.mark.parametrize("option, value, line, takers", VALUE_CASES)
def test_a_command_and_its_api_function_refuse_a_value_with_the_same_line(option, value, line, takers, tiny_llama,
                                                                          tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = {"sweep": ["sweep", str(tiny_llama), *SERVER], "conform": ["conform", *SERVER, "--model", "csa-disjoint"]}
    for command in takers:
        one_line_error(runner.invoke(app, [*argv[command], option, value, "--out", "run"]), f"Error: {line}")
    if "sweep" in takers:
        keyword = option.lstrip("-").replace("-", "_")
        with pytest.raises(PlanError) as error:
            kvphase.sweep(str(tiny_llama), backend="server", url=URL, **{keyword: type_of(keyword)(value)})
        assert str(error.value) == line
    assert not list(tmp_path.iterdir())


def type_of(keyword: str):
    return int if keyword == "threads" else float


ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                      st.text(max_size=6), st.binary(max_size=3), st.lists(st.integers(0, 9), max_size=2),
                      st.dictionaries(st.text(max_size=2), st.integers(), max_size=1), st.just(print))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_values_make_an_options_record_or_a_plan_error(data):
    """SweepOptions and conform's EngineChoice, given anything in any field: a record or PlanError,
    never Python's own error."""
    for record in (SweepOptions, EngineChoice):
        names = [f.name for f in fields(record) if f.name != "backend" or record is SweepOptions]
        given = data.draw(st.dictionaries(st.sampled_from(names), ANY_VALUE, max_size=3))
        try:
            record(**given) if record is SweepOptions else record("server", **given)
        except PlanError:
            pass
