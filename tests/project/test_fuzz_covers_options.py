"""Every option of every command has a case in the hostile campaign (scripts/fuzz_campaign.py), as
CONTRIBUTING asks of new options: an option no case gives is one whose bad values nobody has thrown at."""

from __future__ import annotations

import re

import typer.main

from kvphase.cli import app
from tests.helpers.paths import REPO


def _options(command, path=()):
    """(command path, option) for every long option of every leaf command."""
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _options(sub, (*path, name))
        return
    for param in command.params:
        for option in (*param.opts, *param.secondary_opts):
            if option.startswith("--") and option != "--help":
                yield " ".join(path), option


def test_the_campaign_gives_every_option_of_every_command():
    campaign = (REPO / "scripts" / "fuzz_campaign.py").read_text()
    missing = sorted({(name, option) for name, option in _options(typer.main.get_command(app))
                      if not re.search(re.escape(f'"{option}"'), campaign)})
    assert not missing, f"options no case of scripts/fuzz_campaign.py gives: {missing}"
