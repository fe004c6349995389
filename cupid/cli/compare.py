"""`cupid` commands over `cupid.eval.results.compare`: what it computes, as a command line."""

from __future__ import annotations

import typer
from rich.console import Console

from cupid.eval.benchmark.records import RecordError
from cupid.eval.results.compare import EXIT_NO_VERDICT, EXIT_REGRESSION, HEADLINE_SETTING, compare, print_comparison
from cupid.serving.config import ConfigError


def main(
    run_a: str = typer.Argument(..., help="the run compared against (e.g. last week's, the baseline model)"),
    run_b: str = typer.Argument(..., help="the run compared (B - A is reported)"),
    as_json: bool = typer.Option(False, "--json", help="print the comparison as one JSON object on stdout"),
    fail_if_regression: bool = typer.Option(
        False,
        "--fail-if-regression",
        help=f"exit {EXIT_REGRESSION} when a headline figure dropped significantly, "
        f"{EXIT_NO_VERDICT} when a headline could not be tested (no verdict is not a pass)",
    ),
    headline_setting: str = typer.Option(
        HEADLINE_SETTING, "--headline-setting", help="the setting whose headline figures the gate tests"
    ),
) -> None:
    """B against A on the units both runs ran (the candidate's own failures as empty answers): each figure's
    difference with a paired 95% interval over personas, p-values (Holm-adjusted), the power to detect a change,
    and the units that changed most."""
    try:
        comparison = compare(run_a, run_b, headline_setting)
    except (ConfigError, RecordError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    if as_json:
        typer.echo(comparison.model_dump_json(indent=2))
    else:
        print_comparison(comparison, Console(width=max(Console().width, 120)))
    if fail_if_regression and comparison.exit_code:
        raise typer.Exit(comparison.exit_code)
