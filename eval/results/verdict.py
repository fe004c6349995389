"""The comparison as people read it: what was compared, what differs, the rows, and the verdict's line (`cupid
compare`, the nightly). `compare` computes the comparison; this writes it."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from cupid.eval.benchmark.evalues import statement
from cupid.eval.benchmark.stats import GATE_ALPHA, MIN_PERSONAS
from cupid.eval.benchmark.tasks import TASKS
from cupid.eval.results.compare import NO_ANSWER, Comparison, Row, margin_question


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}" if value >= 0.001 else "<0.001"


def print_comparison(comparison: Comparison, console: Console) -> None:
    """The comparison as people read it: what was compared, what differs, the rows, the verdict."""
    c = comparison
    for line in _caveats(c):
        console.print(line, highlight=False)
    console.print(_table(c))
    for task, counts in c.per_unit.items():
        console.print(
            f"{task}: B better on {counts['better']} units, worse on {counts['worse']}, tied on {counts['tied']}",
            highlight=False,
        )
    if c.units:
        console.print(f"Largest changes (open with `{c.view}`):", highlight=False)
        for u in c.units:
            console.print(f"  {u.task}/{u.setting} {u.key}: {u.a:g} -> {u.b:g}  {u.view}", highlight=False)
    if question := margin_question(c.margin):
        console.print(f"[yellow]did you mean a fraction?[/yellow] {question}", highlight=False)
    console.print(verdict_text(c), style="bold red" if c.exit_code else None, highlight=False)


def _caveats(c: Comparison) -> list[str]:
    """What was compared and what weakens it (same run, no answers, units left out, what differs besides the
    candidate, too few personas): said before the table, so that no figure is read without them."""
    lines = [f"A: {c.a}\nB: {c.b}"]
    if c.same_run:
        lines.append("[yellow]A and B are the same run[/yellow]: every difference is 0 by construction")
    lines.append(f"{c.matched} units compared ({c.personas} personas); {c.only_a} only in A, {c.only_b} only in B")
    if c.no_answer:
        where = ", ".join(f"{n} in {side.upper()}" for side, n in sorted(c.no_answer.items()))
        lines.append(f"[yellow]no answer from the candidate[/yellow] on {where}: each counted as {NO_ANSWER}")
    if c.left_out:
        settings = ", ".join(f"{k} {n}" for k, n in sorted(c.left_out.items()))
        lines.append(
            f"[yellow]left out[/yellow] {sum(c.left_out.values())} units a judge failed on (in either run): {settings}"
        )
    lines += [
        f"[yellow]differs besides the candidate[/yellow] {line}: the difference is not the candidate's alone"
        for line in c.differs
    ]
    lines += [f"[yellow]not in both runs[/yellow] {line}" for line in c.partial]
    if c.personas < MIN_PERSONAS:
        lines.append(f"{c.personas} personas (<{MIN_PERSONAS}): no intervals or p-values, only the differences.")
    return lines


def _table(c: Comparison) -> Table:
    """The rows: each figure in A and B, their difference, and where the personas support one its interval, p-values
    and the smallest difference the pair could detect; the gate's headlines marked."""
    table = Table(
        title="B - A, 95% t interval on a paired bootstrap over personas (* the headline tested for REGRESSION: "
        "its p is the gate's, 1/e of a betting e-value on the personas' mean change)"
    )
    for header in ("figure", "A", "B", "B - A", "interval", "p", "p (Holm)", "detectable"):
        table.add_column(header, justify="left" if header == "figure" else "right", no_wrap=header == "figure")
    for row in c.rows:
        show = TASKS[row.task].show
        stats_cells = (
            [f"[{show(row.low, True)}, {show(row.high, True)}]", _p(row.p_value), _p(row.p_holm), show(row.detectable)]
            if row.resolved
            else ["-"] * 4
        )
        style = "bold red" if row.regression else "bold" if row.headline else None
        name = row.name + (" *" if row.headline else "")
        table.add_row(name, show(row.a), show(row.b), show(row.difference, True), *stats_cells, style=style)
    return table


def margin_unit_words(c: Comparison) -> str:
    """The margin's unit for each task compared (`F1 points`, or `F1 points (inference), ... (generation)`): the
    verdict states the margin in the units each headline is shown in."""
    units = sorted(set(c.margin_units.values()))
    if len(units) <= 1:
        return units[0] if units else "points"
    return ", ".join(f"{unit} ({task})" for task, unit in c.margin_units.items())


def verdict_text(c: Comparison) -> str:
    """What the gate decided, what it tested, what it accepted, and what it could not see."""
    headlines = [r for r in c.rows if r.headline and r.gated]
    accepted = f"; accepted: {'; '.join(c.accepted)}" if c.accepted else ""
    level = _level(headlines)
    if c.regressed:
        drops = [f"{r.name} {TASKS[r.task].show(r.difference, True)} (p Holm {_p(r.p_holm)})" for r in c.regressions]
        return f"REGRESSION: {', '.join(drops + c.unanswered)}{accepted}{level}"
    margin = f"a drop beyond the margin {c.margin:g} {margin_unit_words(c)}" if c.margin else "a drop"
    allowed = "; ".join(f"{task} {n}" for task, n in c.unanswered_allowed.items())
    tested = (
        f"{', '.join(r.name for r in headlines)}: {margin} in the personas' mean, "
        + ", ".join(f"{r.name} {TASKS[r.task].show(r.persona_change, True)}" for r in headlines)
        + f", one-sided at family-wise level {GATE_ALPHA:.3f}, {c.personas} personas"
        + (f"; B may leave this many more headline units unanswered than A: {allowed}" if allowed else "")
    )
    if c.no_verdict:
        return (
            "NO VERDICT: "
            + "; ".join(c.no_verdict)
            + (f" (tested: {tested}, no significant drop){level}" if headlines else "")
        )
    resolution = [
        f"{r.name} {TASKS[r.task].show(r.detectable - r.null)}" for r in headlines if r.detectable is not None
    ]  # a drop is flagged beyond the margin (`null` is -margin): what goes unseen is the margin and the resolution
    return (
        f"No significant drop in a headline figure (*) ({tested})"
        + (f"; a change smaller than about {', '.join(resolution)} would likely go unseen" if resolution else "")
        + accepted
        + level
    )


def _level(headlines: list[Row]) -> str:
    """What the family tests and bounds, as `evalues.statement` says it (nothing where no headline was tested)."""
    return f". {statement(len(headlines), min(r.personas for r in headlines), GATE_ALPHA)}" if headlines else ""
