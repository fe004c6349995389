"""`cupid` commands over `cupid.eval.integrations.inspect_log`: what it computes, as a command line."""

from __future__ import annotations

import typer

from cupid.common.config import ConfigError
from cupid.common.errors import EXIT_USAGE
from cupid.eval.benchmark.summary import markdown
from cupid.eval.integrations.inspect_log import import_logs

LogsArgument = typer.Argument(..., help="inspect-ai logs of cupid/inference and/or cupid/generation (.eval or .json)")


def main(
    logs: list[str] = LogsArgument,
    out: str = typer.Option(..., "--out", help="run directory to write (new, or holding the same run)"),
) -> None:
    """Turn inspect-ai logs of the cupid/* tasks into a run directory (`cupid view`, `report`, `track`)."""
    try:
        summary = import_logs(list(logs), out)
    except ConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    typer.echo(markdown(summary))
    typer.echo(f"run directory: {out}")
