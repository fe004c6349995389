"""`cupid` commands over `cupid.eval.workflows.nightly`: what it computes, as a command line."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import typer

from cupid.common.config import ConfigError
from cupid.common.errors import EXIT_USAGE
from cupid.eval.results.leaderboard import leaderboard_markdown
from cupid.eval.workflows.nightly import run_nightly
from cupid.serving.fleet.gpu_memory import Gpu


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(
    config: str = typer.Option("configs/eval/nightly.yaml", "--config", help="nightly suite: models and run setup"),
    date: str | None = typer.Option(None, "--date", help="the night's name, YYYY-MM-DD (default: today)"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="print and check the plan (servers, GPUs, ports); start nothing"
    ),
    gpus: int | None = typer.Option(
        None, "--gpus", help="with --dry-run: plan for this many 80 GiB GPUs instead of the visible ones"
    ),
    track: str | None = typer.Option(
        None, "--track", help="log each candidate's run to mlflow or wandb (overrides the file's track:)"
    ),
) -> None:
    """Run the nightly suite; leaderboard with change since the previous night; exit the sum of the night's outcomes:
    1 failures, 4 a regression, 8 no verdict (2: a usage or configuration error)."""
    if gpus is not None and not dry_run:
        typer.echo("error: --gpus plans for GPUs that are not here: use it with --dry-run", err=True)
        raise typer.Exit(EXIT_USAGE)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the night's servers as Ctrl-C does
    assumed = [Gpu(i, "assumed GPU", 81920, 0) for i in range(gpus)] if gpus is not None else None
    try:  # run_nightly checks the tracker (`--track`, else the file's), once, before anything runs
        board, code = run_nightly(config, date, dry_run=dry_run, gpus=assumed, track=track)  # type: ignore[arg-type]
    except ConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    if dry_run:
        return
    typer.echo(leaderboard_markdown(board))
    typer.echo(
        f"nightly {board.date}: {len(board.models)} models, {len(board.regressions)} regression(s), "
        f"{len(board.with_failures)} with failures -> {Path(board.dir) / 'leaderboard.md'}"
    )
    raise typer.Exit(code)
