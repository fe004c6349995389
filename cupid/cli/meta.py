"""`cupid` commands over `cupid.eval.results.meta`: what it computes, as a command line."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cupid.common.config import ConfigError
from cupid.common.errors import EXIT_USAGE
from cupid.eval.results.meta import LABELS, agree, correlate, f1_table, labels_from, read_table

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Meta-evaluation: matcher agreement and model-wise correlation."
)


def _fail(e: Exception) -> NoReturn:
    Console(stderr=True, soft_wrap=True).print(
        f"[red]error:[/red] {escape(str(e))}", highlight=False
    )  # paths and rows never wrapped
    raise typer.Exit(EXIT_USAGE)


@app.command("agree")
def agree_cmd(
    a: str = typer.Argument(..., help="run directory (its matcher's labels)"),
    b: str = typer.Argument(
        ...,
        help="another run directory, or a label file "
        "(.jsonl/.csv: key, direction, index, label[, setting, entry, preference])",
    ),
    a_reference: bool = typer.Option(False, "--a-reference", help="use A's reference scoring instead of its matcher"),
    b_reference: bool = typer.Option(False, "--b-reference", help="use B's reference scoring instead of its matcher"),
    level: str = typer.Option(
        "ordinal", help="Krippendorff level: ordinal (default: the labels are ordered), nominal or interval"
    ),
) -> None:
    """Agreement of two matchers (or a matcher and human labels) on the same checklist-preference pairs."""
    if level not in ("ordinal", "nominal", "interval"):
        _fail(ConfigError(f"--level {level!r}: choose ordinal, nominal or interval"))
    try:
        pair = labels_from(a, reference=a_reference), labels_from(b, reference=b_reference)
        result = agree(*pair, level)  # type: ignore[arg-type]
    except (ConfigError, ValueError) as e:
        _fail(e)
    console = Console()
    if result.n == 0:
        _fail(
            ConfigError(
                f"no pair is labelled on both sides ({result.only_a} only in A, {result.only_b} only in B, "
                f"{len(result.mismatched)} on different items)"
            )
        )
    table = Table(title="confusion (rows: A, columns: B)")
    table.add_column("A \\ B")
    for label in LABELS:
        table.add_column(label, justify="right")
    for label, row in zip(LABELS, result.confusion, strict=True):
        table.add_row(label, *map(str, row))
    console.print(table)
    print(f"pairs={result.n} only_a={result.only_a} only_b={result.only_b} different_items={len(result.mismatched)}")
    print(f"accuracy={result.accuracy:.3f}")
    alpha = "nan" if result.alpha is None else f"{result.alpha:.3f}"
    print(f"krippendorff_alpha={alpha}" + (" (undefined: one label only)" if result.alpha is None else f" ({level})"))


RunDirsArgument = typer.Argument(None, help="run directories: one F1 per (candidate, matcher)")


@app.command("correlate")
def correlate_cmd(
    run_dirs: list[str] = RunDirsArgument,
    table: str | None = typer.Option(
        None,
        "--table",
        help="CSV with a `model` column and one F1 column per matcher; `paper`: the paper's Tables 1 and 11 (shipped)",
    ),
    columns: tuple[str, str] | None = typer.Option(None, "--columns", help="the two columns (matchers) to correlate"),
    setting: str = typer.Option("standard", help="runs: the setting whose F1 is used"),
    aggregate: str = typer.Option("micro", help="runs: micro (published numbers) or macro F1"),
) -> None:
    """Pearson r between model-wise F1 under two matchers; the last line is `pearson_r=<value>`."""
    try:
        if bool(table) == bool(run_dirs):
            raise ConfigError("give either run directories or --table FILE")
        if aggregate not in ("micro", "macro"):
            raise ConfigError(f"--aggregate {aggregate!r}: choose micro or macro")
        f1s = read_table(table) if table else f1_table(run_dirs, setting, aggregate)
        if f1s.duplicates:
            raise ConfigError("two runs give the same model under the same matcher: " + "; ".join(f1s.duplicates))
        result = correlate(f1s, (columns[0], columns[1]) if columns else None)
    except ConfigError as e:
        _fail(e)
    out = Table(title=f"model-wise F1 ({'table' if table else aggregate + ', ' + setting})")
    out.add_column("model")
    out.add_column(result.columns[0], justify="right")
    out.add_column(result.columns[1], justify="right")
    digits = [1 if max(map(abs, values), default=0) > 1 else 3 for values in (result.x, result.y)]  # % or a share
    for model, x, y in zip(result.models, result.x, result.y, strict=True):
        out.add_row(model, f"{x:.{digits[0]}f}", f"{y:.{digits[1]}f}")  # one format per column
    Console().print(out)
    if result.left_out:
        print(f"left out (no value in both columns): {', '.join(result.left_out)}")
    print(f"n_models={len(result.models)} p_value={result.p:.3g}")
    print(f"pearson_r={result.r:.3f}")
