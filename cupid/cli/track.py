"""`cupid` commands over `cupid.eval.results.track`: what it computes, as a command line."""

from __future__ import annotations

import typer

from cupid.common.config import ConfigError
from cupid.common.errors import EXIT_FAILED, EXIT_USAGE
from cupid.eval.benchmark.records import RecordError
from cupid.eval.results.track import log, read, require

PathsArgument = typer.Argument(..., help="run directories, or a night's directory (logs each of its candidates)")


def main(
    paths: list[str] = PathsArgument,
    to: str = typer.Option(
        "mlflow",
        "--to",
        help="mlflow (MLFLOW_TRACKING_URI, else a local store) or wandb (WANDB_PROJECT, WANDB_MODE, ...)",
    ),
) -> None:
    """Log finished runs to an experiment tracker from their files; a run logged before updates its tracker run."""
    try:
        require(to)
        runs = [run for path in paths for run in read(path)]
    except (ConfigError, RecordError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    ids = log(runs, to, lambda m: typer.echo(m, err=True))  # type: ignore[arg-type]
    for run, run_id in zip(runs, ids, strict=True):
        typer.echo(f"{run.name}: {to} run {run_id}" if run_id else f"{run.name}: not logged")
    if None in ids:
        raise typer.Exit(EXIT_FAILED)
