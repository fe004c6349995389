"""What a night's finished runs say, read from their files: each candidate's headline metrics and failures, the
night before, and the changes since it and since the candidate's baseline night, paired on the units both scored,
with the night's REGRESSION decisions as one Holm family. The nightly (`eval.workflows.nightly`) runs the night; this
reads it."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from cupid.common.config import ConfigError
from cupid.eval.benchmark.evalues import statement
from cupid.eval.benchmark.grid import cells, figure_name
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.rundir import Run, RunDir
from cupid.eval.benchmark.stats import GATE_ALPHA, Interval
from cupid.eval.benchmark.summary import failure_counts
from cupid.eval.benchmark.tasks import TASKS
from cupid.eval.results.compare import HEADLINE_SETTING, Comparison, Row, compare_runs, holm_family
from cupid.eval.results.leaderboard import FIRST_NIGHT, Entry, Leaderboard, run_dir_of

NIGHT_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def metrics(records: list[UnitRecord]) -> dict[str, Interval]:
    """`<task>/<setting>/<name>` for each task's headline estimates (inference: `micro_f1`, `macro_f1`;
    generation: `mean_score`), each with its bootstrap interval over the scored instances; a metric with no
    scored instance is absent."""
    result: dict[str, Interval] = {}
    for task, setting, _, chosen in cells([r for r in records if r.task in TASKS], by_type=False):
        intervals = TASKS[task].intervals(chosen)
        result |= {figure_name(task, setting, None, n): intervals[n] for n in TASKS[task].headline if n in intervals}
    return result


def failures_by_setting(records: list[UnitRecord]) -> dict[str, int]:
    """Failed records by `task/setting stage: reason` (from the records, so a run cut short still counts)."""
    return dict(sorted((f"{f.task}/{f.setting} {f.stage}: {f.reason}", n) for f, n in failure_counts(records).items()))


def previous_night(root: Path, night: str) -> Path | None:
    """The latest earlier dated directory that holds the leaderboard of a night that ran (one that did not start
    has nothing to compare with)."""
    earlier = (
        [d for d in root.iterdir() if d.is_dir() and NIGHT_DATE.match(d.name) and d.name < night and _ran(d)]
        if root.exists()
        else []
    )
    return max(earlier, key=lambda d: d.name, default=None)


def latest_entries(root: Path, night: str, models: list[str]) -> dict[str, Entry]:
    """Each candidate's entry in the newest earlier night (of those that ran) that records a baseline for it: a
    candidate that skipped a night, or several, keeps its baseline. A candidate with none has never run."""
    nights = (
        sorted((d for d in root.iterdir() if d.is_dir() and NIGHT_DATE.match(d.name) and d.name < night), reverse=True)
        if root.exists()
        else []
    )
    found: dict[str, Entry] = {}
    for night_dir in nights:
        if len(found) == len(models):
            break
        try:
            board = Leaderboard.read(night_dir / "leaderboard.json") if _ran(night_dir) else None
        except ConfigError:  # a file this version cannot read: an older night says no more of it
            continue
        for entry in board.models if board else []:
            if entry.model in models and entry.model not in found and entry.baseline is not None:
                found[entry.model] = entry
    return found


def _ran(night_dir: Path) -> bool:
    try:
        return not json.loads((night_dir / "leaderboard.json").read_text()).get("error")
    except (OSError, ValueError):
        return False


def _comparison(before: str | None, after: Run | None, headline_setting: str, margin: float) -> Comparison | None:
    """An earlier night's run of a candidate (read from its directory) against tonight's (as the night read it),
    where both have records."""
    if not (before and after and after.records and RunDir(before).has_records):
        return None
    return compare_runs(RunDir(before).load(), after, headline_setting, margin=margin)


def _changes(figures: Collection[str], comparison: Comparison) -> dict[str, Row]:
    return {row.name: row for row in comparison.rows if row.instance_type is None and row.name in figures}


@dataclass(frozen=True)
class Changes:
    """What tonight's comparisons of a candidate say, before the night's family decides on them (`flag_regressions`):
    the entry fields they settle alone (`entry_fields`), and what the decision needs besides (its baseline so far,
    and why tonight would become the baseline)."""

    previous: dict[str, Interval] | None = None  # last night's metrics
    no_previous: str | None = None  # why there is no test since last night (the candidate skipped it)
    change: dict[str, Row] = field(default_factory=dict)
    setup_changed: list[str] = field(default_factory=list)
    no_verdict: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)
    baseline: str | None = None  # the night compared with besides the last one
    baseline_change: dict[str, Row] = field(default_factory=dict)
    baseline_no_verdict: list[str] = field(default_factory=list)
    pending: str | None = None  # why tonight becomes the baseline, if the night's decision lets it

    def entry_fields(self) -> dict[str, Any]:
        """The entry's fields these settle; its baseline's are the night's decision (`Decision.entry_fields`)."""
        decided = {"baseline", "baseline_no_verdict", "pending"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in decided}


@dataclass(frozen=True)
class Decision:
    """The night's decision on one candidate: the headline figures flagged on each side, and its baseline (tonight,
    with why, or the one it had, with why not where tonight asked to be it)."""

    regressions: list[str] = field(default_factory=list)  # since last night
    baseline_regressions: list[str] = field(default_factory=list)
    baseline: str | None = None
    baseline_set: str | None = None  # why tonight became the baseline; None: it did not
    baseline_no_verdict: list[str] = field(default_factory=list)  # the comparison's reasons, and the decision's own

    def entry_fields(self) -> dict[str, Any]:
        """The entry's fields this settles."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def baseline_of(fixed: str | None, latest: Entry | None) -> str | None:
    """The night a candidate is compared with besides the previous one: the one its newest entry records (`latest`:
    its first night, or the night its setup last changed), unless `baseline:` names a later one."""
    recorded = latest.baseline if latest else None
    return fixed if fixed and (recorded is None or recorded < fixed) else recorded


def changes_of(
    model: str,
    figures: Collection[str],
    tonight: Run | None,
    before: Entry | None,
    baseline: str | None,
    night: str,
    root: Path,
    headline_setting: str = HEADLINE_SETTING,
    last_night: str | None = None,
    margin: float = 0.0,
    first: bool | None = None,
) -> Changes:
    """A candidate's changes since last night's run of it (`before`, of the night `last_night`) and since its
    baseline night's, paired on the units both scored with tonight's run (`tonight`, read once; `figures`: the
    metrics tonight's entry has); what changed besides the candidate, and why a comparison has no verdict. `first`:
    the candidate never ran before (default: it is not in last night's leaderboard). Regressions, and whether tonight
    becomes the baseline (`pending`), are decided for the whole night (`flag_regressions`)."""
    first = before is None if first is None else first
    no_previous = None
    if not first and (before is None or before.status == "error"):
        no_previous = f"{'not in' if before is None else 'did not run on'} {last_night}: no test since last night"
    since_last = Changes(
        previous=None if before is None else before.metrics, no_previous=no_previous, baseline=baseline
    )
    if before is not None and (comparison := _comparison(before.run_dir, tonight, headline_setting, margin)):
        since_last = replace(
            since_last,
            change=_changes(figures, comparison),
            setup_changed=comparison.differs,
            no_verdict=comparison.no_verdict,
            unanswered=[f"since {last_night}: {why}" for why in comparison.unanswered],
        )
    if baseline is None or first:
        return replace(since_last, pending=FIRST_NIGHT)
    if baseline == night or (baseline == last_night and before is not None):
        return since_last  # the baseline is tonight, or last night: one comparison serves both
    comparison = _comparison(str(run_dir_of(root / baseline, model)), tonight, headline_setting, margin)
    if comparison is None:
        return replace(since_last, baseline_no_verdict=[f"no run of {baseline}"], pending=f"no run of {baseline}")
    if comparison.differs:
        return replace(
            since_last,
            baseline_no_verdict=[f"its setup changed since {baseline}"],
            pending=f"its setup changed since {baseline}: " + "; ".join(comparison.differs),
        )
    return replace(
        since_last,
        baseline_change=_changes(figures, comparison),
        baseline_no_verdict=comparison.no_verdict,
        unanswered=[*since_last.unanswered, *(f"since the baseline ({baseline}): {w}" for w in comparison.unanswered)],
    )


def flag_regressions(changes: Sequence[Changes], night: str, horizon: int = 1) -> tuple[list[Decision], str]:
    """The night's REGRESSION decisions, one per candidate in `changes`' order: every headline test of every candidate,
    against its previous night and its baseline where that comparison has a verdict, one Holm family at `GATE_ALPHA` /
    `horizon` (so that `horizon` nights together stay within `GATE_ALPHA`; the rows' Holm fields are set in place, as
    `holm_family` sets them); with them, the sentence the family's level is read by (`evalues.statement`, which the
    leaderboard prints). Tonight becomes the baseline of each candidate that asked for one (`pending`), was
    not flagged and has a verdict since last night (unless its setup changed since, which is why it asked)."""
    tests = [
        (i, side, row)
        for i, c in enumerate(changes)
        for side, rows, no_verdict in (
            ("previous", c.change, c.no_verdict),
            ("baseline", c.baseline_change, c.baseline_no_verdict),
        )
        if not no_verdict
        for row in rows.values()
        if row.headline and row.gated
    ]
    holm_family([row for _, _, row in tests], GATE_ALPHA / horizon)
    level = statement(len(tests), min(row.personas for _, _, row in tests), GATE_ALPHA, horizon) if tests else ""

    def flagged(i: int, side: str) -> list[str]:
        return [row.name for j, s, row in tests if (j, s) == (i, side) and row.regression]

    return [_decide(c, flagged(i, "previous"), flagged(i, "baseline"), night) for i, c in enumerate(changes)], level


def _decide(changes: Changes, regressions: list[str], baseline_regressions: list[str], night: str) -> Decision:
    kept = Decision(
        regressions=regressions,
        baseline_regressions=baseline_regressions,
        baseline=changes.baseline,
        baseline_no_verdict=list(changes.baseline_no_verdict),
    )
    if changes.pending is None:
        return kept
    if regressions or baseline_regressions or changes.unanswered:
        why = "tonight was flagged: it does not become the baseline"
    elif changes.no_verdict and not changes.setup_changed:  # fail closed: a night no test could clear
        why = "no verdict since last night: tonight does not become the baseline"
    else:
        return replace(kept, baseline=night, baseline_set=changes.pending)
    return replace(kept, baseline_no_verdict=[*kept.baseline_no_verdict, why])
