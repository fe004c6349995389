"""`cupid` commands over `cupid.eval.results.view`: what it computes, as a command line."""

from __future__ import annotations

import errno
import functools
import http.server
from pathlib import Path

import typer

from cupid.common.config import ConfigError
from cupid.common.errors import EXIT_USAGE
from cupid.eval.benchmark.records import RecordError
from cupid.eval.results.pages import default_out
from cupid.eval.results.view import build
from cupid.serving.servers.ports import taken


def serve(page: Path, port: int) -> None:
    """Serve the page's folder on localhost until Ctrl-C (the page itself needs no server)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(page.parent))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        typer.echo(f"error: {taken('127.0.0.1', port)} (0: any free port); the page is written: {page}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    with server:
        typer.echo(f"http://127.0.0.1:{server.server_address[1]}/{page.name}  (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


RunDirsArgument = typer.Argument(..., help="run directories (each with instances.jsonl); two or more are compared")


def main(
    run_dirs: list[str] = RunDirsArgument,
    out: str | None = typer.Option(
        None, "--out", help="output directory (default: beside the report, RUN_DIR/report or runs/report)"
    ),
    serve_it: bool = typer.Option(
        False, "--serve", help="serve the page on localhost instead of only printing its path"
    ),
    port: int = typer.Option(8765, "--port", help="port for --serve (0: any free port)"),
) -> None:
    """One self-contained HTML page to look inside runs: every unit, its history, answer, checklist labels and
    scores."""
    try:
        page = build(run_dirs, out or default_out(run_dirs))
    except (ConfigError, RecordError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    typer.echo(str(page))
    if serve_it:
        serve(page, port)
