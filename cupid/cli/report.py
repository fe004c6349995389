"""`cupid` commands over `cupid.eval.results.report`: what it computes, as a command line."""

from __future__ import annotations

import typer

from cupid.common.config import ConfigError
from cupid.common.errors import EXIT_USAGE
from cupid.eval.results.pages import default_out
from cupid.eval.results.report import build

RunDirsArgument = typer.Argument(..., help="run directories (each with instances.jsonl)")


def main(
    run_dirs: list[str] = RunDirsArgument,
    out: str | None = typer.Option(
        None, "--out", help="output directory (default: RUN_DIR/report for one run, runs/report for several)"
    ),
) -> None:
    """One self-contained HTML report (tables with 95% intervals, failures, Fig. 3-5) plus the PNG plots."""
    target = out or str(default_out(run_dirs))
    try:
        page = build(run_dirs, target)
    except ConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except KeyboardInterrupt:
        typer.echo(f"interrupted: no report written in {target}", err=True)
        raise typer.Exit(130) from None
    typer.echo(str(page))
