"""What every `cupid` command shares about errors: a user's mistake that reaches the root group is one line on stderr
and exit 2 (`CupidGroup`); a traceback is for bugs, or asked for (`cupid --debug`, `CUPID_DEBUG=1`)."""

import errno
import os

import click
import typer
from typer.core import TyperGroup

from cupid.common.config import ConfigError
from cupid.eval.benchmark.data import DataError
from cupid.eval.benchmark.records import RecordError

EXIT_FAILED = 1  # the work failed: failed units, a server that did not start
EXIT_USAGE = 2  # typer's own code for a bad option; also a config or an input the user must fix
UserErrors = (ConfigError, RecordError, DataError, OSError)


def user_error_line(e: BaseException) -> str:
    """One line for a user's mistake: what and where, and what to do where the system says."""
    if isinstance(e, OSError) and not isinstance(e, ConfigError):
        where = f"{e.filename}: " if e.filename else ""
        what = e.strerror or str(e)
        hint = {
            errno.EADDRINUSE: ": the port is taken; pick another with --port",
            errno.EACCES: ": not writable here; choose another path",
            errno.ENOENT: "",
            errno.EROFS: ": a read-only place; choose another path",
        }.get(e.errno or 0, "")
        return f"{where}{what}{hint}"
    return str(e)


def debugging() -> bool:
    return os.environ.get("CUPID_DEBUG", "") not in ("", "0")


class CupidGroup(TyperGroup):
    """The root group: a user's mistake that reached it is one line and exit 2 (`--debug`: the traceback)."""

    def invoke(self, ctx: click.Context):  # type: ignore[no-untyped-def]
        try:
            return super().invoke(ctx)
        except UserErrors as e:
            if debugging():
                raise
            typer.echo(f"error: {user_error_line(e)}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
