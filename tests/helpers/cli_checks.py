"""What every command's bad input must look like to a user, checked on a CliRunner result."""

from __future__ import annotations


def one_line_error(result, *fragments: str) -> None:
    """Exit 1, one line on the output that starts "Error:" and holds every fragment, no traceback."""
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output
    for fragment in fragments:
        assert fragment in lines[0], result.output
    # CliRunner catches any exception, so a traceback never reaches result.output: an uncaught
    # exception shows up as result.exception instead (typer.Exit's is a SystemExit)
    assert isinstance(result.exception, SystemExit), repr(result.exception)


def last_line_error(result, *fragments: str) -> None:
    """`one_line_error` for a command of several runs, which reports each run it finished
    before the one that failed: exit 1, the last line the one "Error:" line, no traceback."""
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 1 and lines and lines[-1].startswith("Error:"), result.output
    assert sum(line.startswith("Error:") for line in lines) == 1, result.output
    for fragment in fragments:
        assert fragment in lines[-1], result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
