"""Aggregation of finished unit records into `summary.json`, the tables people read and the names a tracker gives
its figures.

Only scored units enter the averages; failed ones are counted by task, stage and reason, and every
block states how many units it covers. Each task's block (its figures, its tables: `eval.benchmark.figures`) is its
declaration's (`TaskSpec.block`): the summary reads and shows any task's block without naming a task.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from cupid.eval.benchmark.data import INSTANCE_TYPES
from cupid.eval.benchmark.figures import Block, Figures, SettingBlock, Table, TaskBlock
from cupid.eval.benchmark.grid import cell_name
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.tasks import TASKS
from cupid.eval.benchmark.taskspec import TaskSpec

if TYPE_CHECKING:
    from cupid.serving.client import Stats


def blocks_by_task() -> dict[str, Block]:
    """Each task's block, as its declaration gives it, in the tasks' order."""
    return {name: spec.block for name, spec in TASKS.items()}


class Requests(BaseModel):
    """What a run asked its endpoints: sent, answered from the cache, failed (a night's: its runs' sum)."""

    sent: int = 0
    cached: int = 0
    failed: int = 0

    @classmethod
    def of(cls, stats: Stats) -> Requests:
        """A client's counts so far."""
        return cls(sent=stats.sent, cached=stats.cached, failed=stats.failed)

    def __add__(self, other: Requests) -> Requests:
        return Requests(
            sent=self.sent + other.sent, cached=self.cached + other.cached, failed=self.failed + other.failed
        )


class Summary(BaseModel):
    """`summary.json`: each task's block (at the top level, under the task's name), the reference scoring's, the
    counts of units and failures, and what identifies the run. `RunResult.summary` and `RunDir.load` give it."""

    model_config = ConfigDict(extra="allow")  # a run's further facts (e.g. an imported run's `inspect_logs`)

    tasks: dict[str, TaskBlock[Any]] = Field(default_factory=dict)
    reference: dict[str, TaskBlock[Any]] | None = None
    reference_failures: dict[str, int] | None = None
    n_instances: int
    n_runs: int
    n_scored: int
    n_failed: int
    failures: dict[str, int] = Field(default_factory=dict)  # `task/stage: reason` -> units
    data: str | None = None
    roles: dict[str, str] = Field(default_factory=dict)  # role -> "endpoint (model)"
    matcher_prompt: str | None = None
    candidate_constrained: list[str] = Field(default_factory=list)
    prompts: dict[str, str] = Field(default_factory=dict)  # prompt -> version
    n_invalid_rows: int = 0
    invalid_rows: list[str] = Field(default_factory=list)
    requests: Requests | None = None
    wall_s: float | None = None
    serve_profiles: dict[str, str] | None = None  # profile -> fingerprint of its fields and weights

    @model_validator(mode="before")
    @classmethod
    def _read(cls, data: Any) -> Any:
        """The task blocks are read with the figures their task declares (`blocks_by_task`: each task's `block`)."""
        if not isinstance(data, dict) or "tasks" in data:
            return data

        def blocks(where: dict[str, Any]) -> dict[str, TaskBlock[Any]]:
            return {
                name: TaskBlock[block.figures].model_validate(where[name])  # type: ignore[name-defined]
                for name, block in blocks_by_task().items()
                if name in where
            }

        data = dict(data)
        tasks = blocks(data)
        for name in tasks:
            del data[name]
        if isinstance(data.get("reference"), dict):
            data["reference"] = blocks(data["reference"])
        return {"tasks": tasks, **data}

    @model_serializer(mode="wrap")
    def _write(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        return {**data.pop("tasks", {}), **data}

    def to_json(self) -> str:
        """summary.json: the fields a run set (a reference scoring's only where it had one)."""
        return self.model_dump_json(indent=2, exclude_unset=True)


class Failure(NamedTuple):
    task: str
    setting: str
    stage: str
    reason: str


def failure_counts(records: Iterable[UnitRecord], reference: bool = False) -> Counter[Failure]:
    """Failed units by task, setting, stage and reason, of the run's own scoring or its reference's: the one count
    that every list of failures (summary, report, nightly) formats."""
    failed = ((r, r.scoring(reference)) for r in records)
    return Counter(
        Failure(r.task, r.setting, s.error.stage, s.error.reason)
        for r, s in failed
        if not s.scored and s.error is not None
    )


def task_block(
    task: TaskSpec, records: list[UnitRecord], settings: list[str], reference: bool = False
) -> TaskBlock[Any]:
    """The task's block per setting, overall and by instance type, of the run's own scoring or its reference's."""

    def figures(chosen: list[UnitRecord]) -> Figures:
        return task.figures(chosen, reference)

    by_setting = {}
    for setting in settings:
        chosen = [r for r in records if r.setting == setting]
        by_setting[setting] = SettingBlock(
            overall=figures(chosen),
            by_type={t: figures([r for r in chosen if r.instance_type == t]) for t in INSTANCE_TYPES},
        )
    return TaskBlock(setting=settings[0], settings=by_setting)


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
) -> Summary:
    """`plan` maps each task of the run to its settings; `meta` is what identifies the run (`Summary`'s fields)."""

    def blocks(reference: bool) -> dict[str, TaskBlock[Any]]:
        return {
            task.name: task_block(task, [r for r in records if r.task == task.name], settings, reference)
            for task, settings in plan.items()
        }

    n_failed = sum(not r.scored for r in records)
    scored_by_reference = (
        {"reference": blocks(True), "reference_failures": failures(records, reference=True)} if reference else {}
    )
    return Summary.model_validate(
        {
            "tasks": blocks(False),
            **scored_by_reference,
            "n_instances": n_instances,
            "n_runs": len(records),
            "n_scored": len(records) - n_failed,
            "n_failed": n_failed,
            "failures": failures(records),
            **meta,
        }
    )


def tables(summary: Summary) -> list[Table]:
    """The paper's layout: one table per task (and average), settings as column groups.
    `n` is scored/run: failed units are not in the averages."""
    out = []
    scorings = [("CUPID", summary.tasks)]
    if summary.reference is not None:
        scorings.append((f"Reference ({summary.roles.get('reference', '?')})", summary.reference))
    constrained = set(summary.candidate_constrained)

    def name(title: str, task: str) -> str:
        return f"{title} {task}" + (
            " (candidate answers constrained to the task's format)" if task in constrained else ""
        )

    for title, blocks in scorings:
        for task, block in blocks_by_task().items():
            if task in blocks:
                out += block.tables(name(title, task), blocks[task])
    return out


def markdown(summary: Summary) -> str:
    lines = [
        "# CUPID results",
        "",
        "Roles: " + "; ".join(f"{role} `{name}`" for role, name in summary.roles.items()) + ".",
    ]
    if summary.matcher_prompt:
        lines.append(f"Matcher prompt: {summary.matcher_prompt}.")
    if summary.candidate_constrained:
        lines.append(
            "The candidate's answers were constrained to the task's answer format "
            f"({', '.join(summary.candidate_constrained)}): not comparable with free answers, "
            "where following the format is part of what CUPID measures."
        )
    lines += [
        (
            "Micro = sums over instances (reference code, published numbers); macro = mean of per-instance scores "
            "(paper text). `n` = scored/run: failed units are counted, never averaged in."
        ),
    ]
    for table in tables(summary):
        lines += [
            "",
            f"## {table.title}",
            "",
            "| " + " | ".join(table.headers) + " |",
            "|" + "---|" * len(table.headers),
        ]
        lines += ["| " + " | ".join(row) + " |" for row in table.rows]
    lines += ["", f"{summary.n_scored} scored, {summary.n_failed} failed of {summary.n_runs} units."]
    if summary.n_invalid_rows:
        lines.append(f"{summary.n_invalid_rows} data rows were invalid and not run (see summary.json).")
    for what, n in summary.failures.items():
        lines.append(f"- failed at {what}: {n}")
    for what, n in (summary.reference_failures or {}).items():
        lines.append(f"- reference scoring failed at {what}: {n}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the figures' names in a tracker


def summary_metrics(summary: Summary) -> dict[str, float]:
    """Every figure of a summary, named `[reference/]<task>/<setting>[/<type>]/<figure>`: P/R/F1 as
    `micro_f1`, ..., the mean judge score, the counts scored and failed (and failed by stage); then the run's
    counts and requests. A figure with no scored unit is absent, never a zero."""
    metrics: dict[str, float] = {}
    for prefix, blocks in (("", summary.tasks), ("reference", summary.reference or {})):
        for task, block in blocks.items():
            for setting, by_group in block.settings.items():
                cell = [(None, by_group.overall)] + [
                    (t, by_group.by_type[t]) for t in INSTANCE_TYPES if t in by_group.by_type
                ]
                for instance_type, figured in cell:
                    metrics.update(figures(cell_name(task, setting, instance_type, prefix), figured.model_dump()))
    for name in ("n_instances", "n_runs", "n_scored", "n_failed", "n_invalid_rows", "wall_s"):
        if isinstance(value := getattr(summary, name), (int, float)):
            metrics[name] = value
    if summary.requests is not None:
        metrics.update({f"requests_{k}": v for k, v in summary.requests.model_dump().items()})
    return metrics


def figures(prefix: str | None, block: dict[str, Any]) -> dict[str, float]:
    """A task block's figures named `<prefix>/<figure>` (`micro_f1`, `mean_score`, `n_failed/<stage>`): the
    tracker's names (`eval.results.track`), and inspect's (`cupid.eval.integrations.inspect_tasks`), whose overall
    figures have no prefix."""
    at = f"{prefix}/" if prefix else ""
    out: dict[str, float] = {}
    for name, value in block.items():
        if name == "failed_by_stage":
            out.update({f"{at}n_failed/{stage}": n for stage, n in value.items()})
        elif isinstance(value, dict) and name != "by_type":  # micro/macro: {precision, recall, f1}
            out.update({f"{at}{name}_{k}": v for k, v in value.items() if isinstance(v, (int, float))})
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{at}{name}"] = value
    return out
