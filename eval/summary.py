"""Aggregation of finished unit records into `summary.json` and the tables people read.

Only scored units enter the averages; failed ones are counted by task, stage and reason, and every
block states how many units it covers.
"""

from __future__ import annotations

from collections import Counter
from statistics import fmean
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple

from cupid.eval.data import INSTANCE_TYPES
from cupid.eval.records import Scoring, UnitRecord
from cupid.eval.stats import Interval, mean_interval, prf_intervals
from cupid.matcher.scores import PRF, macro, micro

if TYPE_CHECKING:  # the task declarations name this module's blocks
    from cupid.eval.tasks import TaskSpec

GROUPS = ("all", *INSTANCE_TYPES)


def _prf(value: PRF | None) -> dict[str, float] | None:
    return value.as_dict() if value is not None else None


def _counts(scorings: list[Scoring]) -> dict[str, Any]:
    scored = sum(s.scored for s in scorings)
    stages = Counter(s.error.stage for s in scorings if not s.scored and s.error is not None)
    return {"n_scored": scored, "n_failed": len(scorings) - scored, "failed_by_stage": dict(stages)}


def prf(scorings: Iterable[Scoring]) -> dict[str, PRF] | None:
    """Micro and macro P/R/F1 over the scored inference scorings (None: none scored): every point figure's one
    computation (`inference_intervals` gives the same with bootstrap intervals)."""
    counts = [s.match_counts() for s in scorings if s.scored]
    return {"micro": micro(counts), "macro": macro(counts)} if counts else None  # type: ignore[dict-item]


class Failure(NamedTuple):
    task: str
    setting: str
    stage: str
    reason: str


def failure_counts(records: Iterable[UnitRecord], reference: bool = False) -> Counter[Failure]:
    """Failed units by task, setting, stage and reason, of the run's own scoring or its reference's: the one count
    that every list of failures (summary, report, nightly) formats."""
    failed = ((r, r.scoring(reference)) for r in records)
    return Counter(Failure(r.task, r.setting, s.error.stage, s.error.reason) for r, s in failed if not s.scored and s.error is not None)


def inference_block(scorings: list[Scoring]) -> dict[str, Any]:
    points = prf(scorings) or {}
    return {"micro": _prf(points.get("micro")), "macro": _prf(points.get("macro")), **_counts(scorings)}


def generation_block(scorings: list[Scoring]) -> dict[str, Any]:
    scores = [s.score for s in scorings if s.scored and s.score is not None]
    return {"mean_score": round(fmean(scores), 4) if scores else None, **_counts(scorings)}


def inference_intervals(scorings: list[Scoring]) -> dict[str, Interval]:
    """The block's P/R/F1 figures (`micro_f1`, ...), each with its bootstrap interval over the scored instances."""
    intervals = prf_intervals([s.match_counts() for s in scorings if s.scored]) or {}
    return {f"{aggregate}_{name}": iv for aggregate, named in intervals.items() for name, iv in named.items()}


def generation_intervals(scorings: list[Scoring]) -> dict[str, Interval]:
    interval = mean_interval([s.score for s in scorings if s.scored and s.score is not None])
    return {"mean_score": interval} if interval is not None else {}


def task_block(task: TaskSpec, records: list[UnitRecord], settings: list[str], reference: bool = False) -> dict[str, Any]:
    """The task's block per setting, overall and by instance type, of the run's own scoring or its
    reference's; the top-level figures are the first setting's."""
    block = task.block
    by_setting = {}
    for setting in settings:
        chosen = [r for r in records if r.setting == setting]
        by_setting[setting] = {
            **block([r.scoring(reference) for r in chosen]),
            "by_type": {t: block([r.scoring(reference) for r in chosen if r.instance_type == t]) for t in INSTANCE_TYPES},
        }
    return {**by_setting[settings[0]], "setting": settings[0], "settings": by_setting}


def failures(records: Iterable[UnitRecord], reference: bool = False) -> dict[str, int]:
    """Failed units counted by `task/stage: reason` (all settings together)."""
    out: Counter[str] = Counter()
    for f, n in failure_counts(records, reference).items():
        out[f"{f.task}/{f.stage}: {f.reason}"] += n
    return dict(out)


def summarize(
    records: list[UnitRecord],
    plan: dict[TaskSpec, list[str]],
    n_instances: int,
    meta: dict[str, Any],
    reference: bool = False,
) -> dict[str, Any]:
    """`plan` maps each task of the run to its settings."""
    summary: dict[str, Any] = {}
    for task, settings in plan.items():
        summary[task.name] = task_block(task, [r for r in records if r.task == task.name], settings)
    if reference:
        summary["reference"] = {
            task.name: task_block(task, [r for r in records if r.task == task.name], settings, reference=True)
            for task, settings in plan.items()
        }
        summary["reference_failures"] = failures(records, reference=True)
    n_failed = sum(not r.scored for r in records)
    return {
        **summary,
        "n_instances": n_instances,
        "n_runs": len(records),
        "n_scored": len(records) - n_failed,
        "n_failed": n_failed,
        "failures": failures(records),
        **meta,
    }


class Table(NamedTuple):
    title: str
    headers: list[str]
    rows: list[list[str]]


def _pct(value: dict[str, float] | None, name: str) -> str:
    return f"{100 * value[name]:.1f}" if value else "-"


def _n(block: dict[str, Any]) -> str:
    return f"{block['n_scored']}/{block['n_scored'] + block['n_failed']}"


def _groups(setting_block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [("all", setting_block)] + [(t, setting_block["by_type"][t]) for t in INSTANCE_TYPES]


def inference_tables(title: str, block: dict[str, Any]) -> list[Table]:
    return [_inference_table(title, block, average) for average in ("micro", "macro")]


def generation_tables(title: str, block: dict[str, Any]) -> list[Table]:
    return [_generation_table(title, block)]


def _inference_table(title: str, block: dict[str, Any], average: str) -> Table:
    settings = block["settings"]
    headers = ["instances"] + [f"{s} {m}" for s in settings for m in ("P", "R", "F1", "n")]
    rows = []
    for i, group in enumerate(GROUPS):
        cells = [group]
        for setting_block in settings.values():
            b = _groups(setting_block)[i][1]
            cells += [_pct(b[average], k) for k in ("precision", "recall", "f1")] + [_n(b)]
        rows.append(cells)
    return Table(f"{title}: preference match, {average} (%)", headers, rows)


def _generation_table(title: str, block: dict[str, Any]) -> Table:
    settings = block["settings"]
    headers = ["instances"] + [f"{s} {m}" for s in settings for m in ("score", "n")]
    rows = []
    for i, group in enumerate(GROUPS):
        cells = [group]
        for setting_block in settings.values():
            b = _groups(setting_block)[i][1]
            cells += ["-" if b["mean_score"] is None else f"{b['mean_score']:.2f}", _n(b)]
        rows.append(cells)
    return Table(f"{title}: preference alignment, judge score 1-10", headers, rows)


def tables(summary: dict[str, Any]) -> list[Table]:
    """The paper's layout: one table per task (and average), settings as column groups.
    `n` is scored/run: failed units are not in the averages."""
    out = []
    scorings = [("CUPID", summary)]
    if "reference" in summary:
        scorings.append((f"Reference ({summary.get('roles', {}).get('reference', '?')})", summary["reference"]))
    constrained = set(summary.get("candidate_constrained", []))

    def name(title: str, task: str) -> str:
        return f"{title} {task}" + (" (candidate answers constrained to the task's format)" if task in constrained else "")

    from cupid.eval.tasks import TASKS  # the tasks declare their blocks with this module's functions

    for title, scoring in scorings:
        for task in TASKS.values():
            if task.name in scoring:
                out += task.tables(name(title, task.name), scoring[task.name])
    return out


def markdown(summary: dict[str, Any]) -> str:
    roles = summary.get("roles", {})
    lines = [
        "# CUPID results",
        "",
        "Roles: " + "; ".join(f"{role} `{name}`" for role, name in roles.items()) + ".",
    ]
    if summary.get("matcher_prompt"):
        lines.append(f"Matcher prompt: {summary['matcher_prompt']}.")
    if summary.get("candidate_constrained"):
        lines.append(
            f"The candidate's answers were constrained to the task's answer format ({', '.join(summary['candidate_constrained'])}): "
            "not comparable with free answers, where following the format is part of what CUPID measures."
        )
    lines += [
        "Micro = sums over instances (reference code, published numbers); macro = mean of per-instance scores "
        "(paper text). `n` = scored/run: failed units are counted, never averaged in.",
    ]
    for table in tables(summary):
        lines += ["", f"## {table.title}", "", "| " + " | ".join(table.headers) + " |", "|" + "---|" * len(table.headers)]
        lines += ["| " + " | ".join(row) + " |" for row in table.rows]
    lines += ["", f"{summary['n_scored']} scored, {summary['n_failed']} failed of {summary['n_runs']} units."]
    if summary.get("n_invalid_rows"):
        lines.append(f"{summary['n_invalid_rows']} data rows were invalid and not run (see summary.json).")
    for what, n in summary["failures"].items():
        lines.append(f"- failed at {what}: {n}")
    for what, n in summary.get("reference_failures", {}).items():
        lines.append(f"- reference scoring failed at {what}: {n}")
    return "\n".join(lines) + "\n"
