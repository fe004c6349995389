"""`cupid demo`: the demo from any directory (`cupid.eval.workflows.demo`), its tables, and where to look next."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from cupid.cli.eval import print_summary
from cupid.common.errors import NotInstalled, ServeError
from cupid.eval.workflows.demo import run_demo

err = Console(stderr=True, soft_wrap=True)


def main(
    out: str = typer.Option("runs/demo", "--out", help="the run's directory"),
    limit: int | None = typer.Option(None, "--limit", help="only the first N instances (the demo's config: 6)"),
    port: int | None = typer.Option(None, "--port", help="where the server it starts listens (default: 8011)"),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="check the demo's profile and run, write its requests to OUT/requests.jsonl; start nothing",
    ),
) -> None:
    """Serve the tiny model on CPU (vLLM's CPU build), run both tasks on the bundled sample, print the tables, stop
    the server it started. State goes under CUPID_HOME (else .cupid/ here), the run into --out."""
    try:
        demo = run_demo(out, limit=limit, port=port, dry_run=dry_run, console=err)
    except ServeError as e:  # the model not prepared, the port taken, a server that did not start: what to do
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)
        raise typer.Exit(2 if isinstance(e, NotInstalled) else 1) from None
    except KeyboardInterrupt:
        err.print(f"interrupted: the units done are kept in {out}; `cupid demo` resumes from them", highlight=False)
        raise typer.Exit(130) from None
    if demo.result is None:
        print(f"requests in {demo.requests}")
        return
    summary = demo.result.summary
    print_summary(summary)
    print(
        f"{summary.n_failed} failed, {summary.n_invalid_rows} invalid rows, "
        f"{summary.n_scored} scored of {summary.n_runs}; results in {demo.out}"
    )
    print(f"\nSee what it did:  cupid view {demo.out}     (each unit: answers, checklists, labels, failures)")
    print(f"                  cupid report {demo.out}   (the report: figures with their intervals)")
