"""`cupid` commands over `cupid.eval.results.compare`: what it computes, as a command line."""

from __future__ import annotations

import typer
from rich.console import Console

from cupid.common.config import ConfigError
from cupid.common.errors import EXIT_NO_VERDICT, EXIT_REGRESSION, EXIT_USAGE
from cupid.eval.benchmark.records import RecordError
from cupid.eval.benchmark.settings import SETTINGS
from cupid.eval.results.compare import HEADLINE_SETTING, compare
from cupid.eval.results.verdict import print_comparison


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
    margin: float = typer.Option(
        0.0,
        "--margin",
        min=0.0,
        help="the drop the gate tolerates, in each headline's shown units (micro F1 points, judge-score points): "
        "only a drop significantly larger than it is a regression",
    ),
    allow_partial: bool = typer.Option(
        False,
        "--allow-partial",
        help="give a verdict on the units both runs ran when a task or headline units are in one run only",
    ),
    allow_differs: bool = typer.Option(
        False,
        "--allow-differs",
        help="give a verdict when the data, a judge or a prompt differs besides the candidate",
    ),
) -> None:
    """B against A on the units both runs ran (the candidate's own failures as no answer): each figure's
    difference with a paired 95% interval over personas, p-values (Holm-adjusted), the power to detect a change,
    and the units that changed most. A verdict only on the same evaluation (same tasks, units, data, judges and
    prompts), unless accepted by name."""
    if headline_setting not in SETTINGS:
        raise typer.BadParameter(
            f"{headline_setting!r} is no setting (one of: {', '.join(SETTINGS)})", param_hint="'--headline-setting'"
        )
    try:
        comparison = compare(
            run_a,
            run_b,
            headline_setting,
            margin=margin,
            allow_partial=allow_partial,
            allow_differs=allow_differs,
        )
    except (ConfigError, RecordError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    if as_json:
        typer.echo(comparison.model_dump_json(indent=2))
    else:
        print_comparison(comparison, Console(width=max(Console().width, 120)))
    if fail_if_regression and comparison.exit_code:
        raise typer.Exit(comparison.exit_code)
