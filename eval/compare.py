"""`cupid compare RUN_A RUN_B` and `cupid.compare(a, b)`: B against A on the units both runs scored.

Two runs of the same benchmark share their units, so the difference is taken unit by unit: a persona drawn
in a resample brings both runs' units, and the noise the runs share (which personas the data happens to
hold, how hard each is) cancels. Every figure is recomputed as the summary computes it (ratios of sums over
the drawn personas' units), so a difference is exactly B - A of the figures on the matched units.

One test per task decides REGRESSION: the task's first headline figure (inference: micro F1; generation: the
mean judge score) in the standard setting over all instance types, its p-values adjusted by Holm across the
tasks, flagged when the difference is negative at p_holm < 1 - confidence (that is, the paired interval
lies below 0 once adjusted) and at least `MIN_PERSONAS` personas were matched. Every other row's `p_holm` is
adjusted by Holm across those rows. `detectable` is the smallest difference this pair finds at 80% power:
a "no significant change" is read beside it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import typer
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from cupid.eval.data import INSTANCE_TYPES
from cupid.eval.history import SETTINGS
from cupid.eval.records import RecordError, UnitRecord
from cupid.eval.rundir import Run, RunDir
from cupid.eval.stats import CONFIDENCE, MIN_PERSONAS, Difference, holm
from cupid.eval.tasks import TASKS, TaskSpec
from cupid.eval.view import default_out
from cupid.serving.config import ConfigError

HEADLINE_SETTING = "standard"
EXIT_REGRESSION = 2
N_LARGEST = 10


class Row(Difference):
    """One figure of one task, setting and instance type (None: all) in both runs, and B - A."""

    task: str
    setting: str
    instance_type: str | None
    metric: str
    p_holm: float = 1.0
    headline: bool = False

    @property
    def regression(self) -> bool:
        """A headline figure that dropped significantly (Holm across the tasks' headlines)."""
        return self.headline and self.resolved and self.difference < 0 and self.p_holm < 1 - CONFIDENCE

    @property
    def name(self) -> str:
        """`<task>/<setting>[/<type>]/<metric>`, as the tracker and the nightly name figures."""
        return "/".join([self.task, self.setting, *([self.instance_type] if self.instance_type else []), self.metric])


class UnitChange(BaseModel):
    """One matched unit's own figure in both runs (inference: F1 in %, generation: the judge's score)."""

    task: str
    setting: str
    key: str
    instance_type: str
    a: float
    b: float
    change: float
    view: str  # the `cupid view A B` page's address of this unit, the runs side by side


class Comparison(BaseModel):
    """`cupid compare`'s result (`--json` prints it)."""

    a: str
    b: str
    matched: int  # units scored in both runs
    only_a: int  # units only A ran
    only_b: int
    failed: dict[str, int] = Field(default_factory=dict)  # of the units both ran: failed in `a_only`, `b_only`, `both`
    personas: int  # of the matched units
    differs: list[str] = Field(
        default_factory=list
    )  # what differs besides the candidate: the difference is not its alone
    rows: list[Row] = Field(default_factory=list)
    per_unit: dict[str, dict[str, int]] = Field(default_factory=dict)  # task -> better / worse / tied units
    units: list[UnitChange] = Field(default_factory=list)  # each task's largest changes
    view: str = ""  # the command that writes the page `units` point into

    @property
    def regressions(self) -> list[Row]:
        return [row for row in self.rows if row.regression]

    def headline(self, task: str) -> Row | None:
        return next((row for row in self.rows if row.headline and row.task == task), None)


def setup(run: Run) -> dict[str, Any]:
    """What must stay fixed for a difference to be the candidate's: the data, every judge (every role but the
    candidate), the prompts' versions and the matcher's prompt dialect."""
    roles = {f"judge {k}": v for k, v in run.identity.roles.items() if k != "candidate"}
    prompts = {f"prompt {k}": v for k, v in run.identity.prompts.items()}
    dialect = run.summary.matcher_prompt if run.summary else None
    return {"data": run.data, **roles, **prompts, **({"matcher prompt": dialect} if dialect else {})}


def differences(a: Run, b: Run) -> list[str]:
    """`what: A's -> B's` for each part of the setup both runs state and state differently."""
    old, new = setup(a), setup(b)
    return [f"{k}: {old[k]} -> {new[k]}" for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]


def _headline_setting(settings: list[str]) -> str:
    return HEADLINE_SETTING if HEADLINE_SETTING in settings else settings[0]


def _rows(spec: TaskSpec, pairs: list[tuple[UnitRecord, UnitRecord]]) -> list[Row]:
    settings = [s for s in SETTINGS if any(a.setting == s for a, _ in pairs)]
    headline_setting = _headline_setting(settings) if settings else None
    rows = []
    for setting in settings:
        in_setting = [(a, b) for a, b in pairs if a.setting == setting]
        for group in (None, *INSTANCE_TYPES):
            chosen = [(a, b) for a, b in in_setting if group is None or a.instance_type == group]
            for metric, d in spec.differences(chosen).items():
                headline = metric == spec.headline[0] and setting == headline_setting and group is None
                rows.append(
                    Row(
                        task=spec.name,
                        setting=setting,
                        instance_type=group,
                        metric=metric,
                        headline=headline,
                        **d.model_dump(),
                    )
                )
    return rows


def _adjust(rows: list[Row]) -> None:
    """Holm across the tasks' headlines, and apart across every other row."""
    for family in ([r for r in rows if r.headline], [r for r in rows if not r.headline]):
        for row, p in zip(family, holm([r.p_value for r in family])):
            row.p_holm = p


def compare_runs(a: Run, b: Run) -> Comparison:
    """B against A (runs read back with `RunDir.load`)."""
    records_a, records_b = {r.unit: r for r in a.records}, {r.unit: r for r in b.records}
    common = [u for u in records_a if u in records_b]
    pairs = [(records_a[u], records_b[u]) for u in common if records_a[u].scored and records_b[u].scored]
    failed: Counter[str] = Counter()
    for u in common:
        scored = (records_a[u].scored, records_b[u].scored)
        if scored != (True, True):
            failed[{(False, False): "both", (False, True): "a_only", (True, False): "b_only"}[scored]] += 1
    rows = [row for spec in TASKS.values() for row in _rows(spec, [(x, y) for x, y in pairs if x.task == spec.name])]
    _adjust(rows)
    paths = [str(a.path), str(b.path)]
    page = default_out(paths) / "view.html"
    per_unit: dict[str, dict[str, int]] = {}
    units = []
    for spec in TASKS.values():
        changes = []
        for x, y in pairs:
            if (
                x.task == spec.name
                and (sa := spec.unit_score(x)) is not None
                and (sb := spec.unit_score(y)) is not None
            ):
                view = f"{page}#unit={quote('|'.join(x.unit), safe='')}"
                changes.append(
                    UnitChange(
                        task=spec.name,
                        setting=x.setting,
                        key=x.key,
                        instance_type=x.instance_type,
                        a=sa,
                        b=sb,
                        change=sb - sa,
                        view=view,
                    )
                )
        if changes:
            per_unit[spec.name] = {
                "better": sum(c.change > 0 for c in changes),
                "worse": sum(c.change < 0 for c in changes),
                "tied": sum(c.change == 0 for c in changes),
            }
            units += sorted((c for c in changes if c.change), key=lambda c: -abs(c.change))[:N_LARGEST]
    return Comparison(
        a=str(a.path),
        b=str(b.path),
        matched=len(pairs),
        only_a=sum(u not in records_b for u in records_a),
        only_b=sum(u not in records_a for u in records_b),
        failed=dict(failed),
        personas=len({x.persona_id for x, _ in pairs}),
        differs=differences(a, b),
        rows=rows,
        per_unit=per_unit,
        units=units,
        view="cupid view " + " ".join(paths),
    )


def compare(a: str | Path, b: str | Path) -> Comparison:
    """B against A, from their run directories."""
    return compare_runs(RunDir(a).load(), RunDir(b).load())


# ---------------------------------------------------------------- the table


def _fmt(value: float, scale: float, sign: bool = False) -> str:
    digits = 1 if scale == 100 else 2
    return f"{scale * value:{'+' if sign else ''}.{digits}f}"


def print_comparison(comparison: Comparison, console: Console) -> None:
    """The comparison as people read it: what was matched, what differs, the rows, the verdict."""
    c = comparison
    console.print(f"A: {c.a}\nB: {c.b}", highlight=False)
    failed = ", ".join(
        f"{n} failed in {'both' if k == 'both' else k.replace('_only', '') + ' only'}"
        for k, n in sorted(c.failed.items())
    )
    console.print(
        f"{c.matched} units scored in both ({c.personas} personas); {c.only_a} only in A, {c.only_b} only in B"
        + (f"; {failed} (not in any difference)" if failed else ""),
        highlight=False,
    )
    for line in c.differs:
        console.print(
            f"[yellow]differs besides the candidate[/yellow] {line}: the difference is not the candidate's alone",
            highlight=False,
        )
    if c.personas < MIN_PERSONAS:
        console.print(
            f"{c.personas} personas (<{MIN_PERSONAS}): no intervals, p-values or verdicts, only the differences.",
            highlight=False,
        )
    table = Table(
        title="B - A, 95% interval from a paired bootstrap over personas (* the headline tested for REGRESSION)"
    )
    for header in ("figure", "A", "B", "B - A", "interval", "p", "p (Holm)", "detectable"):
        table.add_column(header, justify="left" if header == "figure" else "right", no_wrap=header == "figure")
    for row in c.rows:
        scale = TASKS[row.task].scale
        stats = (
            [
                f"[{_fmt(row.low, scale, True)}, {_fmt(row.high, scale, True)}]",
                f"{row.p_value:.3f}",
                f"{row.p_holm:.3f}",
                _fmt(row.detectable, scale),
            ]
            if row.resolved
            else ["-"] * 4
        )
        style = "bold red" if row.regression else "bold" if row.headline else None
        name = row.name + (" *" if row.headline else "")
        table.add_row(
            name, _fmt(row.a, scale), _fmt(row.b, scale), _fmt(row.difference, scale, True), *stats, style=style
        )
    console.print(table)
    for task, counts in c.per_unit.items():
        console.print(
            f"{task}: B better on {counts['better']} units, worse on {counts['worse']}, tied on {counts['tied']}",
            highlight=False,
        )
    if c.units:
        console.print(f"Largest changes (open with `{c.view}`):", highlight=False)
        for u in c.units:
            console.print(f"  {u.task}/{u.setting} {u.key}: {u.a:g} -> {u.b:g}  {u.view}", highlight=False)
    if c.regressions:
        drops = ", ".join(
            f"{r.name} {_fmt(r.difference, TASKS[r.task].scale, True)} (p Holm {r.p_holm:.3f})" for r in c.regressions
        )
        console.print(f"REGRESSION: {drops}", style="bold red", highlight=False)
        return
    resolution = [f"{r.name} {_fmt(r.detectable, TASKS[r.task].scale)}" for r in c.rows if r.headline and r.resolved]
    console.print(
        "No significant drop in a headline figure (*)"
        + (
            f"; at this resolution a change smaller than about {', '.join(resolution)} would likely go unseen"
            if resolution
            else ""
        ),
        highlight=False,
    )


def main(
    run_a: str = typer.Argument(..., help="the run compared against (e.g. last week's, the baseline model)"),
    run_b: str = typer.Argument(..., help="the run compared (B - A is reported)"),
    as_json: bool = typer.Option(False, "--json", help="print the comparison as one JSON object on stdout"),
    fail_if_regression: bool = typer.Option(
        False, "--fail-if-regression", help="exit 2 when a headline figure dropped significantly"
    ),
) -> None:
    """B against A on the units both runs scored: each figure's difference with a paired 95% interval over personas,
    p-values (Holm-adjusted), the power to detect a change, and the units that changed most."""
    try:
        comparison = compare(run_a, run_b)
    except (ConfigError, RecordError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    if as_json:
        typer.echo(comparison.model_dump_json(indent=2))
    else:
        print_comparison(comparison, Console(width=max(Console().width, 120)))
    if fail_if_regression and comparison.regressions:
        raise typer.Exit(EXIT_REGRESSION)
