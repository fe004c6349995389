"""What a night's finished runs say, read from their files: each candidate's headline metrics and failures, the
night before, and the changes since it and since the candidate's baseline night, paired on the units both scored,
with the night's REGRESSION decisions as one Holm family. The nightly (`eval.workflows.nightly`) runs the night; this
reads it."""

from __future__ import annotations

import json
import re
from pathlib import Path

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


def _changes(entry: Entry, comparison: Comparison) -> dict[str, Row]:
    return {row.name: row for row in comparison.rows if row.instance_type is None and row.name in entry.metrics}


def baseline_of(fixed: str | None, latest: Entry | None) -> str | None:
    """The night a candidate is compared with besides the previous one: the one its newest entry records (`latest`:
    its first night, or the night its setup last changed), unless `baseline:` names a later one."""
    recorded = latest.baseline if latest else None
    return fixed if fixed and (recorded is None or recorded < fixed) else recorded


def compare(
    entry: Entry,
    tonight: Run | None,
    before: Entry | None,
    baseline: str | None,
    night: str,
    root: Path,
    headline_setting: str = HEADLINE_SETTING,
    last_night: str | None = None,
    margin: float = 0.0,
    first: bool | None = None,
) -> None:
    """Fill an entry's changes since last night's run of the candidate (`before`, of the night `last_night`) and
    since its baseline night's, paired on the units both scored with tonight's run (`tonight`, read once); what
    changed besides the candidate, and why a comparison has no verdict. `first`: the candidate never ran before
    (default: it is not in last night's leaderboard). Regressions, and whether tonight becomes the baseline
    (`baseline_pending`), are decided for the whole night (`flag_regressions`)."""
    entry.previous, entry.change, entry.regressions, entry.setup_changed = None, {}, [], []
    entry.baseline, entry.baseline_set, entry.baseline_change, entry.baseline_regressions = baseline, None, {}, []
    entry.no_verdict, entry.baseline_no_verdict, entry.unanswered, entry.baseline_pending = [], [], [], None
    first = before is None if first is None else first
    entry.no_previous = None
    if not first and (before is None or before.status == "error"):
        entry.no_previous = f"{'not in' if before is None else 'did not run on'} {last_night}: no test since last night"
    if before is not None:
        entry.previous = before.metrics
        if comparison := _comparison(before.run_dir, tonight, headline_setting, margin):
            entry.change = _changes(entry, comparison)
            entry.setup_changed = comparison.differs
            entry.no_verdict = comparison.no_verdict
            entry.unanswered += [f"since {last_night}: {why}" for why in comparison.unanswered]
    if baseline is None or first:
        entry.baseline, entry.baseline_pending = baseline, FIRST_NIGHT
        return
    if baseline == night or (baseline == last_night and before is not None):
        return  # the baseline is tonight, or last night: one comparison serves both
    comparison = _comparison(str(run_dir_of(root / baseline, entry.model)), tonight, headline_setting, margin)
    if comparison is None:
        entry.baseline_no_verdict = [f"no run of {baseline}"]
        entry.baseline_pending = f"no run of {baseline}"
    elif comparison.differs:
        entry.baseline_no_verdict = [f"its setup changed since {baseline}"]
        entry.baseline_pending = f"its setup changed since {baseline}: " + "; ".join(comparison.differs)
    else:
        entry.baseline_change = _changes(entry, comparison)
        entry.baseline_no_verdict = comparison.no_verdict
        entry.unanswered += [f"since the baseline ({baseline}): {why}" for why in comparison.unanswered]


def flag_regressions(entries: list[Entry], night: str, horizon: int = 1) -> str:
    """The night's REGRESSION decisions: every headline test of every candidate, against its previous night and
    its baseline where that comparison has a verdict, one Holm family at `GATE_ALPHA` / `horizon` (so that `horizon`
    nights together stay within `GATE_ALPHA`); returned: the sentence its level is read by (`evalues.statement`,
    which the leaderboard prints). Then tonight becomes the
    baseline of each candidate that asked for one (`baseline_pending`), was not flagged and has a verdict since last
    night (unless its setup changed since, which is why it asked)."""
    tests = [
        (entry, side, row)
        for entry in entries
        for side, changes, no_verdict in (
            ("previous", entry.change, entry.no_verdict),
            ("baseline", entry.baseline_change, entry.baseline_no_verdict),
        )
        if not no_verdict
        for row in changes.values()
        if row.headline and row.gated
    ]
    holm_family([row for _, _, row in tests], GATE_ALPHA / horizon)
    level = statement(len(tests), min(row.personas for _, _, row in tests), GATE_ALPHA, horizon) if tests else ""
    for entry, side, row in tests:
        if row.regression:
            (entry.regressions if side == "previous" else entry.baseline_regressions).append(row.name)
    for entry in entries:
        if entry.baseline_pending is None:
            continue
        if entry.regressions or entry.baseline_regressions or entry.unanswered:
            entry.baseline_no_verdict.append("tonight was flagged: it does not become the baseline")
        elif entry.no_verdict and not entry.setup_changed:  # fail closed: a night no test could clear
            entry.baseline_no_verdict.append("no verdict since last night: tonight does not become the baseline")
        else:
            entry.baseline, entry.baseline_set = night, entry.baseline_pending
        entry.baseline_pending = None
    return level
