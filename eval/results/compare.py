"""`cupid compare RUN_A RUN_B` and `cupid.compare(a, b)`: B against A on the units both runs ran.

Two runs of the same benchmark share their units, so the difference is taken unit by unit: a persona drawn
in a resample brings both runs' units, and the noise the runs share (which personas the data happens to
hold, how hard each is) cancels. Every figure is recomputed as the summary computes it (ratios of sums over
the drawn personas' units), so a difference is exactly B - A of the figures on the compared units.

A run's own figures leave failed units out (the reference's figures); a comparison cannot, or a candidate that stops
answering would pass. The candidate's own failures (no response, no preference in its answer) are scored as no answer,
in a way no figure can gain from (`TaskSpec.no_answer`: inference misses every checklist item and predicts as many items
as the other run's answer did, none matched; generation gets the judge's lowest score, 1). Beyond that, a candidate that
leaves more than `MAX_MORE_UNANSWERED` percent more of a task's headline units unanswered than A is a regression of its
own (`unanswered_allowed`: 7 of a full run's 756 pass, the 8th fails). A unit a judge failed on in either run says
nothing of the candidate: it is left out and counted, and beyond `MAX_LEFT_OUT` of a task's headline units the
comparison has no verdict.

A verdict is given only on the same evaluation: runs with records, the same tasks, the same headline units, and
the same data, judges and prompts (`differences`). Anything else has no verdict and says why, unless accepted by
name (`allow_partial`: the verdict covers the units both ran; `allow_differs`: the difference is not the
candidate's alone); what was accepted is stated with the verdict.

One test per task decides REGRESSION, on the task's first headline figure (inference: micro F1; generation: the
mean judge score) in the headline setting (standard, unless named) over all instance types: each persona's figure on
its own units, in both runs, mapped to [0, 1] by the figure's range (`TaskSpec.persona_figures`); the test asks
whether the personas' mean change dropped below -`margin`, by a betting e-value (`evalues`: its level holds for any
law of bounded changes, sparse ones included), p = 1/e adjusted by Holm across the tasks, flagged at p_holm <
`GATE_ALPHA` with at least `GATE_PERSONAS` personas. What it tests is thus the persona-averaged figure (for micro F1,
each persona's micro F1 averaged over personas; the row shows the published micro F1's change beside it). Where a
task's headline cannot be tested (too few personas, the setting missing from a run, judges failing beyond the
threshold) the comparison says why and has no verdict: a gate on it fails closed (`EXIT_NO_VERDICT`). Every other
row's `p_holm` is adjusted by Holm across those rows. `detectable` is the smallest difference the row's test finds at
80% power in its family: a "no significant change" is read beside it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
from pydantic import BaseModel, Field, PrivateAttr

from cupid.common.errors import EXIT_NO_VERDICT, EXIT_REGRESSION
from cupid.eval.benchmark import evalues, stats
from cupid.eval.benchmark.data import INSTANCE_TYPES
from cupid.eval.benchmark.grid import cell_name, figure_name
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.rundir import Run, RunDir
from cupid.eval.benchmark.settings import SETTINGS
from cupid.eval.benchmark.stats import CONFIDENCE, GATE_ALPHA, GATE_PERSONAS, POWER, Difference, holm
from cupid.eval.benchmark.tasks import TASKS
from cupid.eval.benchmark.taskspec import TaskSpec
from cupid.eval.results.pages import default_out

HEADLINE_SETTING = "standard"
MAX_LEFT_OUT = 0.02  # of a task's headline units, a judge may fail on this share before there is no verdict
MAX_MORE_UNANSWERED = 1  # percent of a task's headline units that B may leave unanswered beyond A's
SMALL_MARGIN = 0.1  # points: a margin under it was likely meant as a fraction
N_LARGEST = 10
NO_ANSWER = (
    "no answer (inference: every checklist item missed, as many items predicted as the other run's answer, none "
    "matched; generation: score 1)"
)


class Row(Difference):
    """One figure of one task, setting and instance type (None: all) in both runs, and B - A."""

    task: str
    setting: str
    instance_type: str | None
    metric: str
    p_holm: float | None = None
    alpha: float = GATE_ALPHA  # the family-wise level its family is held at (a gate's headline: flagged under it)
    headline: bool = False
    # the gate's test, on a headline row: the personas' mean change of the figure (its units: what is tested), and
    # the e-value against a drop below `null` (-margin); the row's `p_value` is then 1/e, `detectable` the test's own
    persona_change: float | None = None
    e_value: float | None = None
    _changes: np.ndarray | None = PrivateAttr(default=None)  # each persona's change in [-1, 1], for `detectable`

    @property
    def regression(self) -> bool:
        """A headline figure whose personas' mean change dropped below -margin at the gate's level (Holm across the
        headline tests), on enough personas for a verdict."""
        return (
            self.headline
            and self.gated
            and self.e_value is not None
            and self.p_holm is not None
            and self.p_holm < self.alpha
        )

    @property
    def name(self) -> str:
        """`<task>/<setting>[/<type>]/<metric>`, as the tracker and the nightly name figures."""
        return figure_name(self.task, self.setting, self.instance_type, self.metric)


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
    matched: int  # units compared: both runs ran them and no judge failed on them
    only_a: int  # units only A ran
    only_b: int
    failed: dict[str, int] = Field(default_factory=dict)  # of the units both ran: failed in `a_only`, `b_only`, `both`
    no_answer: dict[str, int] = Field(default_factory=dict)  # `a`, `b`: the candidate's failures, scored as no answer
    left_out: dict[str, int] = Field(default_factory=dict)  # `<task>/<setting>`: units a judge failed on, in either run
    personas: int  # of the compared units
    headline_setting: str = HEADLINE_SETTING
    margin: float = 0.0  # the drop the gate tolerates, in each headline's shown units (`margin_units`)
    margin_units: dict[str, str] = Field(default_factory=dict)  # task -> the margin's unit there
    unanswered_allowed: dict[str, int] = Field(default_factory=dict)  # task -> units B may leave unanswered beyond A
    differs: list[str] = Field(
        default_factory=list
    )  # what differs besides the candidate: the difference is not its alone
    partial: list[str] = Field(default_factory=list)  # tasks or headline units one run has and the other lacks
    accepted: list[str] = Field(default_factory=list)  # what `allow_partial` / `allow_differs` let through
    unanswered: list[str] = Field(default_factory=list)  # tasks where B left too many more units unanswered
    rows: list[Row] = Field(default_factory=list)
    no_verdict: list[str] = Field(default_factory=list)  # why there is no verdict
    per_unit: dict[str, dict[str, int]] = Field(default_factory=dict)  # task -> better / worse / tied units
    units: list[UnitChange] = Field(default_factory=list)  # each task's largest changes
    view: str = ""  # the command that writes the page `units` point into

    @property
    def regressions(self) -> list[Row]:
        return [row for row in self.rows if row.regression]

    @property
    def same_run(self) -> bool:
        """A and B name one directory: nothing was compared."""
        return Path(self.a).resolve() == Path(self.b).resolve()

    @property
    def regressed(self) -> bool:
        """A headline figure dropped, or the candidate left too many more units unanswered."""
        return bool(self.regressions or self.unanswered)

    @property
    def exit_code(self) -> int:
        """What `--fail-if-regression` exits with: a regression, else no verdict, else 0."""
        return EXIT_REGRESSION if self.regressed else EXIT_NO_VERDICT if self.no_verdict else 0

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


def task_rows(
    spec: TaskSpec,
    setting: str,
    personas: Sequence[str],
    instance_types: Sequence[str],
    a: np.ndarray,
    b: np.ndarray,
    headline: bool = False,
    margin: float = 0.0,
) -> list[Row]:
    """B - A of a task's figures in one setting, over all units and by instance type: row i of `a` and `b` holds
    one unit's columns (`TaskSpec.columns`) in each run. `headline`: this is the task's headline setting, whose
    headline figure gets the gate's test (against a drop of `margin` in shown units)."""
    rows = []
    names, types = np.asarray(personas), np.asarray(instance_types)
    for group in (None, *INSTANCE_TYPES):
        chosen = np.ones(len(names), dtype=bool) if group is None else types == group
        for metric, d in stats.paired(names[chosen], a[chosen], b[chosen], spec.statistic).items():
            row = Row(task=spec.name, setting=setting, instance_type=group, metric=metric, **d.model_dump())
            if headline and group is None and metric == spec.headline[0]:
                gate(row, spec, names, a, b, margin)
            rows.append(row)
    return rows


def gate(row: Row, spec: TaskSpec, personas: np.ndarray, a: np.ndarray, b: np.ndarray, margin: float) -> None:
    """Make `row` the task's headline test: each persona's figure in both runs (`TaskSpec.persona_figures`), their
    mean change, and the e-value against a drop below -`margin` (shown units); its p-value is 1/e."""
    low, high = spec.bounds
    changes = spec.persona_figures(personas, b) - spec.persona_figures(personas, a)
    bounded_margin = margin / spec.scale / (high - low)
    row.headline, row.persona_change = True, float(changes.mean()) * (high - low)
    if row.gated:  # under `GATE_PERSONAS` the row describes, as the others do
        row.null, row.e_value = -margin / spec.scale, evalues.e_value(changes, bounded_margin)
        row.p_value = evalues.p_value(row.e_value)
        row._changes = changes


def holm_family(rows: list[Row], alpha: float = GATE_ALPHA) -> None:
    """Holm across the rows that have a p-value (one family): each one's `p_holm`, and its `detectable` for a family
    of that size at its test's level (a gate's headline at `alpha`, the family's: its own test's,
    `evalues.detectable`; a described row at 1 - `CONFIDENCE`)."""
    tested = [row for row in rows if row.p_value is not None]
    for row, p in zip(tested, holm([row.p_value for row in tested if row.p_value is not None]), strict=True):
        row.p_holm, row.alpha = p, alpha
        if row.e_value is not None and row._changes is not None:
            low, high = TASKS[row.task].bounds  # the figure's units per unit of the [-1, 1] changes: high - low
            drop = evalues.detectable(row._changes, -row.null / (high - low), alpha / len(tested), POWER)
            row.detectable = None if drop is None else drop * (high - low)  # beyond the margin, as the t rows'
        else:
            row.detectable = stats.detectable(row.se, row.personas, len(tested), CONFIDENCE)


def adjust(rows: list[Row]) -> None:
    """Holm across the headline tests the gate decides on, and apart across every other row; each row's
    `detectable` for its family."""
    holm_family([r for r in rows if r.headline and r.gated])
    holm_family([r for r in rows if not (r.headline and r.gated)])


def _columns(
    spec: TaskSpec, pairs: list[tuple[UnitRecord, UnitRecord]]
) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    kept = [
        (x, y, cx, cy) for x, y in pairs if (cx := spec.columns(x)) is not None and (cy := spec.columns(y)) is not None
    ]
    return (
        [x.persona_id for x, _, _, _ in kept],
        [x.instance_type for x, _, _, _ in kept],
        np.array([cx for _, _, cx, _ in kept], dtype=float),
        np.array([cy for _, _, _, cy in kept], dtype=float),
    )


def compare_runs(
    a: Run,
    b: Run,
    headline_setting: str = HEADLINE_SETTING,
    *,
    margin: float = 0.0,
    allow_partial: bool = False,
    allow_differs: bool = False,
) -> Comparison:
    """B against A (runs read back with `RunDir.load`); `headline_setting`: where each task's headline is tested;
    `margin`: the drop the gate tolerates (each headline's shown units); `allow_partial`, `allow_differs`: accept a
    comparison that is not the same evaluation (see the module's docstring)."""
    records_a, records_b = {r.unit: r for r in a.records}, {r.unit: r for r in b.records}
    common = [u for u in records_a if u in records_b and u[1] in TASKS]
    pairs, failed, no_answer, left_out = _pairs(records_a, records_b, common)
    rows, partial, untestable, unanswered, units_allowed = _tasks_compared(
        records_a, records_b, pairs, common, left_out, headline_setting, margin
    )
    adjust(rows)
    no_verdict = _empty(a, b, headline_setting) + untestable
    differs, accepted = differences(a, b), []
    for allowed, option, reasons in (
        (allow_partial, "--allow-partial", partial),
        (allow_differs, "--allow-differs", [f"differs: {line}" for line in differs]),
    ):
        if reasons and allowed:
            accepted += [f"{reason} (accepted: {option})" for reason in reasons]
        elif reasons:
            no_verdict += [f"not the same evaluation: {reason} ({option} accepts it)" for reason in reasons]
    paths = [str(a.path), str(b.path)]
    per_unit, units = _unit_changes([(x, y) for x, y, _ in pairs], default_out(paths) / "view.html")
    return Comparison(
        a=str(a.path),
        b=str(b.path),
        matched=len(pairs),
        only_a=sum(u not in records_b for u in records_a),
        only_b=sum(u not in records_a for u in records_b),
        failed=dict(failed),
        no_answer=dict(no_answer),
        left_out=dict(left_out),
        personas=len({x.persona_id for x, _, _ in pairs}),
        headline_setting=headline_setting,
        margin=margin,
        margin_units={task: TASKS[task].points for task in units_allowed},
        unanswered_allowed=units_allowed,
        differs=differs,
        partial=partial,
        accepted=accepted,
        unanswered=unanswered,
        rows=rows,
        no_verdict=no_verdict,
        per_unit=per_unit,
        units=units,
        view="cupid view " + " ".join(paths),
    )


def _tasks_compared(
    records_a: dict[Any, UnitRecord],
    records_b: dict[Any, UnitRecord],
    pairs: list[tuple[UnitRecord, UnitRecord, tuple[bool, bool]]],
    common: list[Any],
    left_out: Counter[str],
    headline_setting: str,
    margin: float,
) -> tuple[list[Row], list[str], list[str], list[str], dict[str, int]]:
    """Each task both runs ran, on its own: its rows (before Holm, which runs over all of them), what one run holds
    and the other lacks, why its headline cannot be tested, whether B left more headline units unanswered than A
    beyond the allowance, and that allowance. Kept apart from the verdict that weighs them all, so that one task's
    account reads in one place."""
    rows: list[Row] = []
    partial: list[str] = []
    untestable: list[str] = []
    unanswered: list[str] = []
    units_allowed: dict[str, int] = {}
    for spec in TASKS.values():
        ran = {
            side: {r.setting for r in records.values() if r.task == spec.name}
            for side, records in (("a", records_a), ("b", records_b))
        }
        if not (ran["a"] and ran["b"]):
            if ran["a"] or ran["b"]:
                partial.append(f"task {spec.name} is in run {'A' if ran['a'] else 'B'} only")
            continue
        partial += _missing_units(spec.name, headline_setting, records_a, records_b)
        in_task = [(x, y, s) for x, y, s in pairs if x.task == spec.name]
        for setting in SETTINGS:
            if chosen := [(x, y) for x, y, _ in in_task if x.setting == setting]:
                rows += task_rows(
                    spec, setting, *_columns(spec, chosen), headline=setting == headline_setting, margin=margin
                )
        untestable += _untestable(spec, headline_setting, ran, rows, common, left_out)
        headline_units = [s for x, _, s in in_task if x.setting == headline_setting]
        unanswered += more_unanswered(spec.name, headline_units)
        units_allowed[spec.name] = unanswered_allowed(len(headline_units))
    return rows, partial, untestable, unanswered, units_allowed


def _pairs(
    records_a: dict[Any, UnitRecord], records_b: dict[Any, UnitRecord], common: list[Any]
) -> tuple[list[tuple[UnitRecord, UnitRecord, tuple[bool, bool]]], Counter[str], Counter[str], Counter[str]]:
    """The units both runs hold, as each task's verdict sees them (a unit the candidate failed is scored as no answer):
    the pairs, with which side was scored; the failures by side; the units each side left unanswered; and the units
    left out because a judge failed on them, by cell."""
    failed: Counter[str] = Counter()
    no_answer: Counter[str] = Counter()
    left_out: Counter[str] = Counter()
    pairs = []
    for u in common:
        x, y = records_a[u], records_b[u]
        scored = (x.scored, y.scored)
        if scored != (True, True):
            failed[{(False, False): "both", (False, True): "a_only", (True, False): "b_only"}[scored]] += 1
        spec = TASKS[x.task]
        vx, vy = spec.for_verdict(x, y), spec.for_verdict(y, x)
        if vx is None or vy is None:
            left_out[cell_name(x.task, x.setting, None)] += 1
            continue
        no_answer.update(side for side, r in (("a", x), ("b", y)) if not r.scored)
        pairs.append((vx, vy, (x.scored, y.scored)))
    return pairs, failed, no_answer, left_out


def _empty(a: Run, b: Run, setting: str) -> list[str]:
    """A run with nothing to judge: no verdict, whatever is accepted."""
    for side, run in (("A", a), ("B", b)):
        if not run.records:
            return [f"run {side} has no records (cut short before its first unit?): nothing to compare"]
        if not any(r.setting == setting and r.task in TASKS for r in run.records):
            return [f"run {side} has no unit in the headline setting {setting!r}: nothing to compare"]
    return []


def _missing_units(
    task: str,
    setting: str,
    records_a: dict[tuple[str, str, str], UnitRecord],
    records_b: dict[tuple[str, str, str], UnitRecord],
) -> list[str]:
    """The task's headline units one run has and the other lacks (a subset of personas, `--limit`, other data)."""
    out = []
    for side, mine, theirs in (("A", records_a, records_b), ("B", records_b, records_a)):
        headline = [u for u in mine if u[1:] == (task, setting)]
        if missing := sum(u not in theirs for u in headline):
            other = "B" if side == "A" else "A"
            out.append(f"{task}/{setting}: {missing} of run {side}'s {len(headline)} units are not in run {other}")
    return out


def unanswered_allowed(units: int) -> int:
    """How many more of `units` headline units B may leave unanswered than A: `MAX_MORE_UNANSWERED` percent, rounded
    down (756 units: 7)."""
    return units * MAX_MORE_UNANSWERED // 100


def more_unanswered(task: str, scored: list[tuple[bool, bool]]) -> list[str]:
    """B left more than `unanswered_allowed` more of the task's compared headline units unanswered than A."""
    a, b = sum(not x for x, _ in scored), sum(not y for _, y in scored)
    if b - a > (allowed := unanswered_allowed(len(scored))):
        more = f"more than the {allowed} more allowed, {MAX_MORE_UNANSWERED}%"
        return [f"{task}: B left {b} of {len(scored)} headline units unanswered, A {a} ({more})"]
    return []


def margin_question(margin: float) -> str | None:
    """A line asking whether a margin under `SMALL_MARGIN` points was meant as a fraction (0.02 for 2 points)."""
    if 0 < margin < SMALL_MARGIN:
        return (
            f"the margin {margin:g} is in points (F1 points, judge-score points), not a fraction: it tolerates a drop "
            f"of {margin:g} points; for {100 * margin:g} points give {100 * margin:g}"
        )
    return None


def _untestable(
    spec: TaskSpec,
    setting: str,
    ran: dict[str, set[str]],
    rows: list[Row],
    common: list[tuple[str, str, str]],
    left_out: Counter[str],
) -> list[str]:
    """Why a task both runs ran has no headline test in `setting` (nothing: it has one)."""
    if missing := [side.upper() for side in ("a", "b") if setting not in ran[side]]:
        settings = f"A: {', '.join(sorted(ran['a']))}; B: {', '.join(sorted(ran['b']))}"
        return [f"{spec.name}: setting {setting!r} is not in run {' or '.join(missing)} ({settings})"]
    units = sum(1 for _, task, s in common if (task, s) == (spec.name, setting))
    judged_out = left_out.get(cell_name(spec.name, setting, None), 0)
    if units and judged_out / units > MAX_LEFT_OUT:
        share = f"{judged_out / units:.1%} > {MAX_LEFT_OUT:.0%}"
        return [f"{spec.name}/{setting}: a judge failed on {judged_out} of {units} units ({share}): incomplete"]
    row = next((r for r in rows if r.headline and r.task == spec.name), None)
    if row is None:
        return [f"{spec.name}/{setting}: no unit compared"]
    if not row.gated:
        return [f"{spec.name}/{setting}: {row.personas} personas compared, fewer than {GATE_PERSONAS} for a verdict"]
    return []


def _unit_changes(
    pairs: list[tuple[UnitRecord, UnitRecord]], page: Path
) -> tuple[dict[str, dict[str, int]], list[UnitChange]]:
    """Each task's units B did better, worse and the same on, and its largest changes (a unit the candidate failed
    is scored as no answer, so it counts as the loss it is)."""
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
    return per_unit, units


def compare(
    a: str | Path,
    b: str | Path,
    headline_setting: str = HEADLINE_SETTING,
    *,
    margin: float = 0.0,
    allow_partial: bool = False,
    allow_differs: bool = False,
) -> Comparison:
    """B against A, from their run directories (`compare_runs` says what each option accepts)."""
    return compare_runs(
        RunDir(a).load(),
        RunDir(b).load(),
        headline_setting,
        margin=margin,
        allow_partial=allow_partial,
        allow_differs=allow_differs,
    )
