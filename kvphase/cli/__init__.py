"""The `kvphase` command line: parses options, calls the library, prints.

Each command group lives in its own module and registers itself on `app` when imported.
The library raises `KvphaseError`; `main` turns it into one line on stderr and exit 1.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager


def _interrupted_while_starting(signum, frame) -> None:
    """Ctrl-C or SIGTERM while the command modules import (pandas, llama.cpp...): one line, no traceback."""
    sys.stderr.write("Interrupted while starting; nothing was written.\n")
    os._exit(128 + signum)


_signals_received: list[int] = []
_command_over = [False]
_INTERRUPTED = "finished results are kept; run the same command again to resume."
# What a command that does not resume keeps when a signal stops it (the others: _INTERRUPTED)
KEPT_ON_INTERRUPT = {
    "inspect": "nothing was written.",
    "header": "nothing was written (the header-only file is written whole or not at all).",
    "conform": "nothing was written (conform writes its folder once every model has run); run the same command again.",
}
_kept = [_INTERRUPTED]  # the running command's line


def _interrupted(signum, frame) -> None:
    """SIGINT or SIGTERM during a command: an Interrupted the command may catch (training
    saves its checkpoint) and `invoke` reports, with the shell's exit code for the signal."""
    from kvphase.errors import Interrupted

    if _command_over[0]:  # its results are written and its exit status decided: a signal now changes nothing
        return
    _signals_received.append(signum)
    raise Interrupted(_kept[0], signum)


def raise_if_interrupted() -> None:
    """Stops the command if a signal came whose Interrupted was swallowed: a handler that
    runs inside a C callback (llama.cpp's log callback, while a model loads) raises into
    ctypes, which prints nothing and carries on."""
    from kvphase.errors import Interrupted

    if _signals_received:
        raise Interrupted(_kept[0], _signals_received[0])


def _quiet_about_a_swallowed_signal(unraisable) -> None:
    """A signal's Interrupted raised inside a callback whose exceptions Python swallows (a garbage
    collector callback, a ctypes callback) is recorded in `_signals_received` and reported once the
    command returns, in one line; any other unraisable exception is printed as Python would."""
    from kvphase.errors import Interrupted

    if not isinstance(unraisable.exc_value, Interrupted):
        sys.__unraisablehook__(unraisable)


def _on_signals(handler) -> None:
    if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, handler)


_on_signals(_interrupted_while_starting)

from kvphase.errors import KvphaseError, out_of_memory  # noqa: E402

OUT_OF_MEMORY = ("out of memory; use a shorter --context, a smaller model or a machine with more memory (finished "
                 "results are kept: run the same command again to resume)")


@contextmanager
def _starting():
    """An import that finds no memory while the command line starts (a library the loader cannot
    map under `ulimit -v`): one line and exit 1, as any command's failure."""
    try:
        yield
    except (ImportError, MemoryError) as exc:
        if not out_of_memory(exc):
            raise
        sys.stderr.write(f"Error: {OUT_OF_MEMORY}\n")
        sys.exit(1)


with _starting():
    import typer  # noqa: E402
    from typer.core import TyperGroup  # noqa: E402

    from kvphase.cli.text import plain  # noqa: E402


class KvphaseGroup(TyperGroup):
    """Turns the library's errors into one line on stderr and exit code 1."""

    def resolve_command(self, ctx, args):
        """The command, and what it keeps when a signal stops it."""
        name, command, rest = super().resolve_command(ctx, args)
        _kept[0] = KEPT_ON_INTERRUPT.get(name, _INTERRUPTED)
        _refuse_both_ways(ctx, command, rest)
        return name, command, rest

    def invoke(self, ctx):
        _signals_received.clear()
        _command_over[0] = False
        _kept[0] = _INTERRUPTED
        previous_hook, sys.unraisablehook = sys.unraisablehook, _quiet_about_a_swallowed_signal
        _on_signals(_interrupted)  # from here a signal is an Interrupted the command or this method reports
        try:
            result = super().invoke(ctx)
            _command_over[0] = True  # its results are written and reported: a signal from here on changes nothing
            raise_if_interrupted()
            return result
        except KvphaseError as exc:
            typer.echo(f"Error: {plain(exc, limit=2000)}", err=True)
            raise typer.Exit(1) from None
        except BrokenPipeError:  # the reader went away (`kvphase report RUN | head -1`): nothing more to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's recipe: no second error at exit
            raise typer.Exit(1) from None
        except (MemoryError, ImportError, OSError) as exc:
            if out_of_memory(exc):
                typer.echo(f"Error: {OUT_OF_MEMORY}", err=True)
            elif isinstance(exc, OSError):  # the library names the file of each write it makes; this is any other
                typer.echo(f"Error: {plain(system_error(exc), limit=2000)}", err=True)
            else:
                raise
            raise typer.Exit(1) from None
        except KeyboardInterrupt as exc:
            said = str(exc) or _kept[0]
            typer.echo(f"Interrupted: {said}", err=True)
            raise typer.Exit(getattr(exc, "exit_code", 130)) from None
        finally:
            _command_over[0] = True
            sys.unraisablehook = previous_hook


def _refuse_both_ways(ctx, command, args: list[str]) -> None:
    """A usage error for an on/off flag given both ways (`--query-phases --no-query-phases`), which
    click would settle silently by the last one."""
    given = set(args[:args.index("--")] if "--" in args else args)
    for param in getattr(command, "params", ()):
        on, off = given & set(getattr(param, "opts", ())), given & set(getattr(param, "secondary_opts", ()) or ())
        if getattr(param, "is_flag", False) and on and off:
            raise typer.BadParameter(f"{min(on)} and {min(off)} are both given; give one of them", ctx, param)


def system_error(exc: OSError) -> str:
    """An operating-system error in one line: the file, when it names one, and the reason."""
    from kvphase.runfolder.files import system_reason

    return f"{exc.filename}: {system_reason(exc)}" if exc.filename else system_reason(exc)


app = typer.Typer(
    cls=KvphaseGroup,
    name="kvphase",
    help="Find the periodic weak spots that chunked KV-cache compression leaves in retrieval.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

def _print_version(asked: bool) -> None:
    if asked:
        from kvphase import __version__

        typer.echo(f"kvphase {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", help="Print kvphase's version and exit.", is_eager=True,
                                          callback=_print_version)) -> None:
    """Find the periodic weak spots that chunked KV-cache compression leaves in retrieval."""


# Command modules: importing one registers its commands on `app`.
with _starting():
    from kvphase.cli import inspect_cmd  # noqa: E402,F401
    from kvphase.cli import sweep_cmd  # noqa: E402,F401
    from kvphase.cli import report_cmd  # noqa: E402,F401
    from kvphase.cli import compare_cmd  # noqa: E402,F401
    from kvphase.cli import tiny_cmd  # noqa: E402,F401
    from kvphase.cli import validate_cmd  # noqa: E402,F401
    from kvphase.cli import probes_cmd  # noqa: E402,F401
    from kvphase.cli import train_cmd  # noqa: E402,F401
    from kvphase.cli import theory_cmd  # noqa: E402,F401
    from kvphase.cli import conform_cmd  # noqa: E402,F401
    from kvphase.cli import interop_cmd  # noqa: E402,F401
    from kvphase.cli import export_cmd  # noqa: E402,F401



def main() -> None:
    """Console-script entry point."""
    try:
        with _starting():  # typer parses the options with a library it imports then (pydantic)
            app()
    finally:
        # Python's teardown (JAX's and llama.cpp's threads: about a second) would otherwise meet a
        # signal with a traceback or, once it has reset the handlers, as a kill (exit -2): a
        # finished command's exit status stands
        _on_signals(signal.SIG_IGN)
