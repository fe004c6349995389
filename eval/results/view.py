"""`cupid view RUN_DIR [RUN_DIR ...]`: one self-contained HTML page to look inside runs, unit by unit.

The page lists every unit (instance x task x setting) with filters and a URL each (`#unit=...`), and opens a
unit to show what led to its score: the prior sessions (relevant ones marked), the request, the ground truth,
the candidate's answer, the inferred preference and checklist, both match directions with their labels, and
the scores, or the stage where it failed and the raw answer. Two or more runs on the same data are compared
unit by unit (each run's score and the difference), and a unit shows the runs side by side.

Why the page is built the way it is (a full run is 756 instances x every setting x both tasks, each history
~8k tokens, so a page is tens of MB):
- histories come from the run's data source (`run.json`'s `data`) and are stored once per instance, not per unit;
- the list's data is one small JSON block read at start; each instance and each unit's records sit in their
  own `<script type="application/json">` block, parsed only when that unit is opened;
- the list renders only the rows in view (plain JS, no framework, no network: it opens from file://).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from cupid.common.config import ConfigError
from cupid.common.files import write_atomic
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.rundir import Run, RunDir, RunIdentity
from cupid.eval.benchmark.settings import SETTINGS
from cupid.eval.benchmark.summary import Summary
from cupid.eval.benchmark.tasks import TASKS

TASKS_ORDER = tuple(TASKS)
RECENT_S = 120  # a run whose records changed this recently is "in progress"; older, it stopped before the end
UNIT_FIELDS_IN_DATA = {
    "key",
    "persona_id",
    "instance_type",
    "task",
    "setting",
    "n_sessions",
    "relevant_sessions",
    "gt_preference",
    "gt_checklist",
}


@dataclass
class RunState:
    """Whether a run finished, and how far it got: `done` units with a record out of `total` planned."""

    finished: bool
    done: int
    total: int | None
    scored: int
    failed: int
    note: str

    def line(self) -> str:
        of = f" of {self.total}" if self.total is not None else ""
        return f"{self.note}: {self.done}{of} units have a record ({self.scored} scored, {self.failed} failed)"


@dataclass
class LoadedRun(Run):
    """A run as the viewer shows it: the run, and how far it got."""

    state: RunState | None = None


def _planned(identity: RunIdentity, summary: Summary | None) -> int | None:
    """Units the run set out to score: run.json's plan (instances x settings per task), else the summary's."""
    if identity.plan is not None:
        return identity.plan.n_units
    if summary is not None:
        return summary.n_instances * sum(len(block.settings) for block in summary.tasks.values())
    return None


def run_state(run: LoadedRun, now: float | None = None) -> RunState:
    """Finished: summary.json exists, covers every unit in instances.jsonl, and is not older than it.
    Otherwise the run is in progress (records written in the last minutes) or stopped before the end."""
    run_dir = RunDir(run.path)
    scored = sum(r.scored for r in run.records)
    done = len(run.records)
    total = _planned(run.identity, run.summary)
    if total is not None:
        total = max(total, done)
    finished = run.summary is not None and run.summary.n_runs >= done
    if finished and run_dir.summary_stale():
        finished = False  # records appended after the summary: the directory is being re-run
    if finished:
        note = "finished"
    else:
        age = (now or time.time()) - run_dir.records_file.stat().st_mtime
        note = "in progress" if age < RECENT_S else f"stopped before the end (last record {age / 60:.0f} min ago)"
        if run.summary is not None:
            note += ", records written after its summary.json"
    return RunState(finished, done, total, scored, done - scored, note)


def load_run(path: str | Path | Run) -> LoadedRun:
    """A run for the page: read from its directory, or taken as a caller already read it."""
    if not isinstance(path, Run):
        if not Path(path).is_dir():
            raise ConfigError(f"{path}: no such run directory")
        path = RunDir(path).load()
    run = LoadedRun(**vars(path))
    run.state = run_state(run)
    return run


def _labels(runs: list[LoadedRun]) -> None:
    """A run's label: its candidate, or its directory where candidates repeat."""
    names = [r.roles.get("candidate") or r.path.name for r in runs]
    for run, name in zip(runs, names, strict=True):
        run.label = name if names.count(name) == 1 else f"{name} ({run.path})"


# ---------------------------------------------------------------- page data


def _instance_view(instance: cupid_data.Instance) -> dict[str, Any]:
    return {
        "persona": instance.persona_id,
        "type": instance.instance_type,
        "request": instance.current_request,
        "factor": instance.current_context_factor,
        "preference": instance.current_contextual_preference,
        "checklist": list(instance.current_checklist),
        "sessions": [
            {
                "factor": s.context_factor,
                "preference": s.contextual_preference,
                "relevant": s.contextual_preference == instance.current_contextual_preference,
                "dialogue": [[m.role, m.content] for m in s.dialogue],
            }
            for s in instance.prior_interactions
        ],
    }


def _stub_instance(record: UnitRecord) -> dict[str, Any]:
    """What the records alone tell of an instance the data source did not give."""
    relevant = set(record.relevant_sessions or [])
    return {
        "persona": record.persona_id,
        "type": record.instance_type,
        "request": None,
        "preference": record.gt_preference,
        "checklist": record.gt_checklist,
        "sessions": [{"relevant": i in relevant} for i in range(record.n_sessions or 0)],
    }


def _score(record: UnitRecord) -> float | None:
    """The list's score: the task's own figure for one unit (`TaskSpec.unit_score`)."""
    return TASKS[record.task].unit_score(record) if record.scored else None


def _order(values: Iterable[str], known: tuple[str, ...]) -> list[str]:
    values = set(values)
    return [v for v in known if v in values] + sorted(values - set(known))


def _shared_data(runs: list[LoadedRun]) -> tuple[str, dict[str, cupid_data.Instance], str | None]:
    """The data every run ran on, its instances by key, and a note where it cannot be loaded: the page then shows
    what the records hold instead of failing, since a run's records stand without their data."""
    sources = {r.data for r in runs}
    if len(sources) > 1:
        raise ConfigError(
            "runs on different data cannot be compared: " + ", ".join(f"{r.path}: {r.data}" for r in runs)
        )
    source = sources.pop()
    try:
        return source, {i.key: i for i in cupid_data.load(source).instances}, None
    except Exception as e:  # noqa: BLE001 (unreachable data: show what the records hold)
        note = f"the data {source!r} could not be loaded ({e}): prior sessions and requests are not shown"
        return source, {}, note


def page_data(runs: list[LoadedRun]) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(list data, instance key -> instance JSON, unit index -> records JSON per run)."""
    source, by_key, data_note = _shared_data(runs)
    units: dict[tuple[str, str, str], list[UnitRecord | None]] = {}
    for n, run in enumerate(runs):
        for record in run.records:
            units.setdefault(record.unit, [None] * len(runs))[n] = record
    data_order = {k: n for n, k in enumerate(by_key)}
    tasks = _order((u[1] for u in units), TASKS_ORDER)
    settings = _order((u[2] for u in units), SETTINGS)
    keys = sorted({u[0] for u in units}, key=lambda k: (data_order.get(k, len(data_order)), k))
    key_index = {k: n for n, k in enumerate(keys)}
    ordered = sorted(units, key=lambda u: (key_index[u[0]], tasks.index(u[1]), settings.index(u[2])))

    instances: dict[str, str] = {}
    rows, details, types = [], [], []
    for unit in ordered:
        key, task, setting = unit
        records = units[unit]
        first = next(r for r in records if r is not None)
        if key not in instances:
            view = _instance_view(by_key[key]) if key in by_key else _stub_instance(first)
            instances[key] = _json(view)
            types.append(first.instance_type)
        cells = []
        for r in records:
            cells.append(None if r is None else [r.status, r.error.stage if r.error else None, _score(r)])
        rows.append([key_index[key], tasks.index(task), settings.index(setting), cells])
        keep = UNIT_FIELDS_IN_DATA if key in by_key else UNIT_FIELDS_IN_DATA - {"gt_preference", "gt_checklist"}
        details.append(
            _json([None if r is None else r.model_dump(mode="json", exclude_none=True, exclude=keep) for r in records])
        )
    head = {
        "runs": [
            {
                "label": r.label,
                "path": str(r.path),
                "roles": r.roles,
                "state": vars(r.state),
                "state_line": r.state.line() if r.state else "",
                "has_reference": any(rec.reference is not None for rec in r.records),
            }
            for r in runs
        ],
        "data": source,
        "data_note": data_note,
        "keys": keys,
        "types": types,
        "tasks": tasks,
        "settings": settings,
        "units": rows,
    }
    return head, instances, details


def _json(value: Any) -> str:
    """JSON safe inside a <script> block: no '<' can close it (the escape is JSON, read back unchanged)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


REPORT_LINK = (
    '<a id="report" href="report.html" title="the aggregate report (cupid report), in this folder">'
    "report (tables, intervals, figures)</a>"
)
NO_REPORT = '<span id="report">no report here yet: <code>{command}</code> writes it, and this link</span>'


def render(runs: list[LoadedRun], report_command: str | None = None) -> str:
    """The page; `report_command` says how to make the report where none is beside the page (a link to a
    missing report would be a new user's first dead click)."""
    head, instances, details = page_data(runs)
    template = resources.files(__package__).joinpath("view.html").read_text(encoding="utf-8")
    blocks = [f'<script type="application/json" id="i{n}">{text}</script>' for n, text in enumerate(instances.values())]
    blocks += [f'<script type="application/json" id="u{n}">{text}</script>' for n, text in enumerate(details)]
    title = "CUPID view: " + " vs ".join(r.label for r in runs)
    return (
        template.replace("__TITLE__", _html_escape(title))
        .replace(
            "__REPORT__",
            REPORT_LINK if report_command is None else NO_REPORT.format(command=_html_escape(report_command)),
        )
        .replace("__HEAD__", _json(head))
        .replace("__BLOCKS__", "\n".join(blocks))
    )


def link_report(out: Path) -> None:
    """A `view.html` written before its report gets the report's link once the report is there (`cupid report`)."""
    page = out / "view.html"
    if page.exists() and (out / "report.html").exists():
        html = page.read_text(encoding="utf-8")
        write_atomic(page, re.sub(r'<span id="report">.*?</span>', REPORT_LINK, html, count=1))


def _html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def build(run_dirs: Iterable[str | Path | Run], out: str | Path) -> Path:
    """Write `view.html` into `out`; return its path. It links to the report in `out` where there is one. A run
    already read is taken as it is."""
    runs = [load_run(p) for p in run_dirs]
    run_dirs = [str(r.path) for r in runs]
    if not runs:
        raise ConfigError("give at least one run directory")
    _labels(runs)
    out = Path(out)
    make_report = (
        None
        if (out / "report.html").exists()
        else f"cupid report {' '.join(shlex.quote(str(d)) for d in run_dirs)} --out {shlex.quote(str(out))}"
    )
    html = render(runs, make_report)
    out.mkdir(parents=True, exist_ok=True)
    page = out / "view.html"
    page.write_text(html, encoding="utf-8")
    return page
