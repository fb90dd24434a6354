"""The `kvphase` command line: parses options, calls the library, prints.

Each command group lives in its own module and registers itself on `app` when imported.
The library raises `KvphaseError`; `main` turns it into one line on stderr and exit 1.
"""

from __future__ import annotations

import typer
from typer.core import TyperGroup

from kvphase.errors import KvphaseError


class KvphaseGroup(TyperGroup):
    """Turns the library's errors into one line on stderr and exit code 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KvphaseError as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            typer.echo("Interrupted: finished results are kept; run the same command again to resume.", err=True)
            raise typer.Exit(130) from None


app = typer.Typer(
    cls=KvphaseGroup,
    name="kvphase",
    help="Find the periodic weak spots that chunked KV-cache compression leaves in retrieval.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Command modules: importing one registers its commands on `app`.
from kvphase.cli import inspect_cmd  # noqa: E402,F401
from kvphase.cli import sweep_cmd  # noqa: E402,F401
from kvphase.cli import report_cmd  # noqa: E402,F401
from kvphase.cli import compare_cmd  # noqa: E402,F401
from kvphase.cli import tiny_cmd  # noqa: E402,F401
from kvphase.cli import validate_cmd  # noqa: E402,F401


def main() -> None:
    """Console-script entry point."""
    app()
