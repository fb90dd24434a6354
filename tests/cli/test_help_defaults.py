"""Every command's defaults are the library's: an option's default (as the command parses it) equals the
field of the options record it fills, and a default a help text names ("default 300") is the library's
value. A default written again in the command line, and then changed on one side only, fails here."""

from __future__ import annotations

import dataclasses
import inspect
from enum import Enum

import pytest
import typer.main

from kvphase.backends.transport import Retry
from kvphase.cli import app
from kvphase.conform.check import EngineChoice
from kvphase.gguf.tiny import write_tiny_model
from kvphase.probes import setup as probes
from kvphase.sweep.options import COMPARISON_DIR, SweepOptions
from kvphase.sweep.plan import CONTROL_STRIDE, TRAINED_PER_RESIDUE, SweepDefaults
from kvphase.theory.config import DEFAULT_COMPONENTS, STAGGER_CHOICES, TheoryConfig
from kvphase.train.config import TrainConfig
from kvphase.validate.options import DEFAULT_TOKENS, Tolerances, deepseek4_tokens
from kvphase.validate.run import validate_model

COMMANDS = typer.main.get_command(app).commands


def parsed_defaults(command: str) -> dict:
    """Each option's default as the command parses it when the option is not given (None: none)."""
    cli = COMMANDS[command]
    ctx = cli.context_class(cli)
    out = {}
    for param in cli.params:
        value = param.get_default(ctx)
        value = None if value is None else param.process_value(ctx, value)
        out[param.name] = value.value if isinstance(value, Enum) else tuple(value) if isinstance(value, list) else value
    return out


def signature_defaults(function) -> dict:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if p.default is not inspect.Parameter.empty}


def record_defaults(record, names: dict = {}) -> dict:
    """The defaults of a dataclass's fields, by the command's option names (`names`: option -> field
    where they differ)."""
    defaults = {f.name: f.default for f in dataclasses.fields(record) if f.default is not dataclasses.MISSING}
    return {**defaults, **{option: defaults[field] for option, field in names.items() if field in defaults}}


def _given(defaults: dict) -> dict:
    """The options whose default the command states (None leaves it to the library)."""
    return {name: value for name, value in defaults.items() if value not in (None, ())}


# (command, the library's defaults by option name, options whose default means something else there)
RECORDS = [
    ("sweep", lambda: record_defaults(SweepOptions), ()),
    ("conform", lambda: record_defaults(EngineChoice, {"url": "urls", "engine": "server_engine"}), ()),
    ("theory", lambda: record_defaults(TheoryConfig), ("stagger", "components")),  # the study's cases, below
    ("validate", lambda: {**signature_defaults(validate_model), "cache_type": signature_defaults(validate_model)["cache"],
                          **record_defaults(Tolerances, {"keys_tol": "keys_abs", "scores_tol": "scores_rel",
                                                         "attention_tol": "attention_rel"})}, ()),
    ("gate-activations", lambda: {**record_defaults(probes.ProbeOptions),
                                  **signature_defaults(probes.probe_gate_activations)}, ()),
    ("flip", lambda: {**record_defaults(probes.ProbeOptions), **signature_defaults(probes.probe_flip)}, ()),
    ("cycle", lambda: record_defaults(probes.ProbeOptions), ()),
    ("knockout", lambda: record_defaults(probes.ProbeOptions), ()),
    ("train", lambda: record_defaults(TrainConfig), ()),
    ("make-tiny", lambda: signature_defaults(write_tiny_model), ()),
]


@pytest.mark.parametrize("command, library, elsewhere", RECORDS, ids=[r[0] for r in RECORDS])
def test_an_option_default_is_the_library_default(command, library, elsewhere):
    library = library()
    stated = {name: value for name, value in _given(parsed_defaults(command)).items()
              if name in library and name not in elsewhere}
    differ = {name: (value, library[name]) for name, value in stated.items() if value != library[name]}
    assert not differ, f"kvphase {command}: option default (command line, library): {differ}"
    assert stated, f"kvphase {command}: no option default compared"


def test_theory_study_defaults_are_the_library_study():
    assert parsed_defaults("theory")["stagger"] in STAGGER_CHOICES
    assert parsed_defaults("theory")["components"] is None  # the command runs DEFAULT_COMPONENTS: named below


def help_of(command: str, option: str) -> str:
    param = next(p for p in COMMANDS[command].params if p.name == option)
    return " ".join(param.help.split())


# (command, option, what its help must say): defaults the help names in words
NAMED_IN_HELP = [
    ("sweep", "context", f"Default {SweepDefaults.context}"),
    ("sweep", "stride", f"{CONTROL_STRIDE} for a control run"),
    ("sweep", "request_timeout", f"default {Retry.request_timeout:g}"),
    ("conform", "request_timeout", f"default {Retry.request_timeout:g}"),
    ("validate", "tokens", f"default: {DEFAULT_TOKENS}, deepseek4 {deepseek4_tokens([128])}"),
    ("theory", "components", f"default {', '.join(map(str, DEFAULT_COMPONENTS[:-1]))} and {DEFAULT_COMPONENTS[-1]}"),
    ("flip", "stride", f"{CONTROL_STRIDE} for a control run"),
    ("flip", "context", f"default {probes.PROBE_CONTEXT}"),
    ("cycle", "per_residue", f"default {probes.PROBE_PER_RESIDUE}, {TRAINED_PER_RESIDUE} for a trained model"),
    ("knockout", "per_residue", f"default {probes.PROBE_PER_RESIDUE}, {probes.TRAINED_PER_RESIDUE_KNOCKOUT}"),
    ("train", "stride", f"default {TrainConfig.stride}"),
    ("compare", "out", f"default {COMPARISON_DIR}"),
]


@pytest.mark.parametrize("command, option, said", NAMED_IN_HELP, ids=[f"{c}-{o}" for c, o, _ in NAMED_IN_HELP])
def test_a_default_named_in_help_is_the_library_default(command, option, said):
    assert said in help_of(command, option), f"kvphase {command} --{option}: {help_of(command, option)!r}"
