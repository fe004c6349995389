"""Runs into the lab's experiment tracker: MLflow (the default, a local store unless `MLFLOW_TRACKING_URI`
says otherwise) or W&B (its usual environment: `WANDB_PROJECT`, `WANDB_MODE=offline`, ...).

One tracker run per evaluation run (per candidate, for a night): its params (roles, data, tasks and
settings, prompt versions, project version), every figure of `summary.json` named
`<task>/<setting>[/<type>]/<figure>` with its bootstrap interval bounds (`..._low`, `..._high`), the
per-unit table, the run's pages (summary, report, viewer) and, for a night, its date and each candidate's
leaderboard flag as tags. Everything is read from the run's files after the run has written them: the
tracker is never on the path of a request, and a tracker that fails is a warning naming it, never a
failed run. The run directory keeps the tracker's run id (`tracker.json`), so logging it again updates
that tracker run instead of adding a second.

This module runs nothing: a run's tracked form (`eval.workflows.logged_run`) and the nightly log through it once
their files are written, and it imports neither of them nor the runner.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cupid.common.config import ConfigError, Tracker
from cupid.common.files import read_json, write_atomic
from cupid.common.install import DISTRIBUTION, pip_install
from cupid.eval.benchmark.grid import cells, figure_name
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.rundir import Run, RunDir, RunIdentity
from cupid.eval.benchmark.summary import Summary, summary_metrics
from cupid.eval.benchmark.tasks import TASKS
from cupid.eval.results import report, view
from cupid.eval.results.compare import Row
from cupid.eval.results.leaderboard import Leaderboard, flag, flags_text, run_dir_of

TRACKERS: tuple[Tracker, ...] = ("mlflow", "wandb")
IDS_FILE = "tracker.json"
TABLE = "units.json"  # the per-unit table's artifact name
PROJECT = "cupid"  # the experiment (MLflow) or project (W&B) when the environment names none
Say = Callable[[str], None]


def require(tracker: str) -> None:
    """Refuse a tracker whose package is not installed, before anything runs."""
    if tracker not in TRACKERS:
        raise ConfigError(f"unknown tracker {tracker!r}: choose {' or '.join(TRACKERS)}")
    try:
        found = importlib.util.find_spec(tracker) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules (blocked)
        found = False
    if not found:
        raise ConfigError(
            f"--track {tracker}: the {tracker} package is not installed; install the tracker extra: "
            f"{pip_install('track')}"
        )


# ---------------------------------------------------------------- what one tracker run holds


@dataclass
class TrackedRun:
    """One tracker run's content; `home` is the directory that keeps its tracker run ids (None: a run with no
    directory, logged once)."""

    name: str
    home: Path | None
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    units: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[Path] = field(default_factory=list)


def interval_metrics(records: list[UnitRecord], reference: bool = False) -> dict[str, float]:
    """`<figure>_low` and `<figure>_high` for each estimate the tasks declare, per setting and instance type,
    from the records (personas resampled, as the report and the nightly do)."""
    metrics: dict[str, float] = {}
    prefix = "reference" if reference else ""
    for task, setting, instance_type, chosen in cells([r for r in records if r.task in TASKS]):
        for name, iv in TASKS[task].intervals(chosen, reference).items():
            if iv.low is not None and iv.high is not None:  # under the minimum of personas: no bounds
                at = figure_name(task, setting, instance_type, name, prefix)
                metrics[f"{at}_low"], metrics[f"{at}_high"] = iv.low, iv.high
    return metrics


def comparison_metrics(change: dict[str, Row], prefix: str = "compare") -> dict[str, float]:
    """A night's paired changes since the previous night (or, `prefix` `baseline`, since the baseline):
    `compare/<task>/<setting>/<metric>/difference`, `..._low`, `..._high`, `..._p` (Holm-adjusted as the night
    adjusts it); no bound or p-value under the minimum of personas."""
    out = {}
    for row in change.values():
        at = f"{prefix}/{row.name}/difference"
        values = {at: row.difference, f"{at}_low": row.low, f"{at}_high": row.high, f"{at}_p": row.p_holm}
        out.update({k: v for k, v in values.items() if v is not None})
    return out


def unit_rows(records: list[UnitRecord]) -> list[dict[str, Any]]:
    """One row per unit: what `instances.jsonl` says of it, without the texts."""
    rows = []
    for r in records:
        scores = r.scores.as_dict() if r.scores is not None else {}
        rows.append(
            {
                "key": r.key,
                "instance_type": r.instance_type,
                "task": r.task,
                "setting": r.setting,
                "status": r.status,
                "failed_stage": r.error.stage if r.error else None,
                "failed_reason": r.error.reason if r.error else None,
                "precision": scores.get("precision"),
                "recall": scores.get("recall"),
                "f1": scores.get("f1"),
                "score": r.score,
            }
        )
    return rows


def _params(summary: Summary | None, identity: RunIdentity) -> dict[str, str]:
    roles = (summary.roles if summary else None) or identity.roles
    params = {f"role.{role}": str(name) for role, name in roles.items()}
    if "candidate" in roles:
        params["candidate"] = str(roles["candidate"])
    data = (summary.data if summary else None) or identity.data
    if data is not None:
        params["data"] = str(data)
    if summary is not None:
        params["n_instances"] = str(summary.n_instances)
    planned = identity.plan.settings if identity.plan else {}
    tasks = [t for t in TASKS if summary is not None and t in summary.tasks] or list(planned)
    params["tasks"] = ",".join(tasks)
    for task in tasks:
        settings = (
            list(summary.tasks[task].settings)
            if summary is not None and task in summary.tasks
            else planned.get(task, [])
        )
        params[f"settings.{task}"] = ",".join(settings)
    for name, version in ((summary.prompts if summary else None) or identity.prompts).items():
        params[f"prompt.{name}"] = str(version)
    if summary is not None and summary.matcher_prompt:
        params["matcher_prompt"] = str(summary.matcher_prompt)
    if summary is not None and summary.candidate_constrained:
        params["candidate_constrained"] = ",".join(summary.candidate_constrained)
    params.update({f"serve.{name}": fp for name, fp in ((summary.serve_profiles if summary else None) or {}).items()})
    params["cupid_version"] = importlib.metadata.version(DISTRIBUTION)
    return params


def pages(run_dir: Path, read: Run | None = None) -> list[Path]:
    """The run's summary, report and viewer pages, made beside each other in `<run>/report/` where missing or
    older than the run's records (each is derived from them); from `read` where the caller read the run already."""
    run = RunDir(run_dir)
    found = [run.tables_file] if run.tables_file.exists() else []
    if not run.has_records:
        return found
    newest = run.last_written() or 0.0
    for name, build in (("report.html", report.build), ("view.html", view.build)):
        page = run_dir / "report" / name
        if not page.exists() or page.stat().st_mtime < newest:
            build([read or run_dir], run_dir / "report")
        found.append(page)
    return found


def of_run(
    run_dir: Path | None,
    *,
    records: list[UnitRecord] | None = None,
    summary: Summary | None = None,
    name: str | None = None,
    tags: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    read: Run | None = None,
) -> TrackedRun:
    """What a run's tracker run holds: from its directory's files, or from what a run computed (`records`,
    `summary`) when it has no directory, or from the run as its caller read it (`read`: nothing read twice). A
    directory with no summary (a run cut short) gives its params, counts and table from what it recorded."""
    identity = RunIdentity()
    if read is not None:
        identity, summary, records = read.identity, read.summary, read.records
    elif run_dir is not None:
        identity = RunDir(run_dir).identity()
        if summary is None:
            summary = RunDir(run_dir).summary()
        if records is None:
            records = list(RunDir(run_dir).records().values())
    records = records or []
    metrics: dict[str, float] = (
        summary_metrics(summary)
        if summary
        else {"n_scored": sum(r.scored for r in records), "n_failed": sum(not r.scored for r in records)}
    )
    if summary:
        metrics.update(interval_metrics(records))
        if summary.reference is not None:
            metrics.update(interval_metrics(records, reference=True))
    roles = (summary.roles if summary else None) or identity.roles
    run_name = name or str(roles.get("candidate") or (run_dir.name if run_dir else "cupid run"))
    return TrackedRun(
        name=run_name,
        home=run_dir,
        params={**_params(summary, identity), **(params or {})},
        metrics=metrics,
        tags={"cupid.status": "finished" if summary else ("stopped" if records else "not run"), **(tags or {})},
        units=unit_rows(records),
        artifacts=pages(run_dir, read) if run_dir is not None and run_dir.exists() else [],
    )


def of_night(board: Leaderboard, read: dict[str, Run] | None = None) -> list[TrackedRun]:
    """A night's candidates, each with the night's date and its leaderboard flag as tags; one that did not run
    gets its tracker run too, with its reason, so a chart of nights shows the gap. `read`: runs the night already
    read (by candidate), taken as they are; the others are read from their directories."""
    runs = []
    for entry in board.models:
        run_dir = Path(entry.run_dir or run_dir_of(Path(board.dir), entry.model))
        tags = {
            "cupid.night": board.date,
            "cupid.candidate": entry.model,
            "cupid.flag": flag(entry),
            "cupid.leaderboard": flags_text(entry).replace("**", ""),
        }
        if entry.error:
            tags["cupid.reason"] = entry.error
        if entry.regressions:
            tags["cupid.regressions"] = ", ".join(entry.regressions)
        params = {"night.config": board.config, **({"served": entry.served} if entry.served else {})}
        name = f"{entry.model} {board.date}"
        try:
            known = (read or {}).get(entry.model)
            runs.append(of_run(run_dir, name=name, tags=tags, params=params, read=known))
            runs[-1].metrics.update(comparison_metrics(entry.change))
            runs[-1].metrics.update(comparison_metrics(entry.baseline_change, "baseline"))
        except Exception as e:  # noqa: BLE001 (its files do not read, whatever the fault: its flag still counts)
            # a torn summary, a record of another version, ...
            runs.append(
                TrackedRun(name, run_dir, params, tags={**tags, "cupid.unreadable": f"{type(e).__name__}: {e}"})
            )
    return runs


def read(path: str | Path) -> list[TrackedRun]:
    """`cupid track PATH`: a run directory, or a night's (one holding `leaderboard.json`)."""
    path = Path(path)
    if (path / "leaderboard.json").exists():
        return of_night(Leaderboard.read(path / "leaderboard.json"))
    if not RunDir(path).has_records:
        name = RunDir(path).records_file.name
        raise ConfigError(f"{path}: neither a run directory (no {name}) nor a night's (no leaderboard.json)")
    return [of_run(path)]


# ---------------------------------------------------------------- logging


def log_after(make: Callable[[], list[TrackedRun]], tracker: Tracker, say: Say) -> list[str | None]:
    """What a finished run or night logs, made and logged; any fault on the way is a warning, never the run's."""
    try:
        runs = make()
    except Exception as e:  # noqa: BLE001 (any fault on the way is a warning, never the run's)
        say(
            f"warning: {tracker}: nothing logged, the run's files did not read ({type(e).__name__}: {e}); "
            "they are as the run wrote them"
        )
        return []
    return log(runs, tracker, say)


def log(runs: list[TrackedRun], tracker: Tracker, say: Say) -> list[str | None]:
    """Each run into the tracker; its tracker run id, or None where the tracker failed (said as a warning that
    names the tracker and where it writes). Never raises for the tracker's faults: the run's files stand."""
    require(tracker)
    logger = _mlflow if tracker == "mlflow" else _wandb
    ids: list[str | None] = []
    for run in runs:
        try:
            ids.append(logger(run, say))
        except Exception as e:  # noqa: BLE001 (whatever the tracker's fault, it is not the run's)
            # an unreachable server, a bad URI, a full disk, ...
            say(
                f"warning: {tracker} ({_where(tracker)}) did not log {run.name}: {type(e).__name__}: {e}. "
                "The run's own files are complete; `cupid track RUN_DIR` logs it later"
            )
            ids.append(None)
    return ids


def _where(tracker: Tracker) -> str:
    if tracker == "mlflow":
        import mlflow

        return f"tracking URI {mlflow.get_tracking_uri()}"
    return f"project {os.environ.get('WANDB_PROJECT', PROJECT)}, mode {os.environ.get('WANDB_MODE', 'online')}"


def _known_id(run: TrackedRun, tracker: Tracker, where: str) -> str | None:
    return read_json(run.home / IDS_FILE).get(tracker, {}).get(where) if run.home is not None else None


def _keep_id(run: TrackedRun, tracker: Tracker, where: str, run_id: str) -> None:
    if run.home is None:
        return
    ids = read_json(run.home / IDS_FILE)
    ids.setdefault(tracker, {})[where] = run_id
    write_atomic(run.home / IDS_FILE, json.dumps(ids, indent=2))


def _mlflow(run: TrackedRun, say: Say) -> str:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow
    from mlflow.exceptions import MlflowException

    where = mlflow.get_tracking_uri()
    if not os.environ.get("MLFLOW_EXPERIMENT_ID"):
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT)
    client = mlflow.MlflowClient()
    run_id = _known_id(run, "mlflow", where)
    existing = None
    if run_id is not None:
        try:
            existing = client.get_run(run_id)
        except MlflowException:  # the store lost it (another store at the same URI, a deleted run): log anew
            run_id = None
    with mlflow.start_run(run_id=run_id, run_name=None if run_id else run.name) as active:
        _keep_id(run, "mlflow", where, active.info.run_id)
        before = existing.data.params if existing is not None else {}
        if changed := sorted(k for k, v in run.params.items() if k in before and before[k] != v):
            say(
                f"mlflow: run {active.info.run_id} keeps its first value of {', '.join(changed)} "
                "(MLflow params never change)"
            )
        mlflow.log_params({k: v for k, v in run.params.items() if k not in before})
        mlflow.set_tags(run.tags)
        if run.metrics:
            mlflow.log_metrics(run.metrics)
        if run.units:
            if existing is not None and any(a.path == TABLE for a in client.list_artifacts(active.info.run_id)):
                # log_table appends to a table that exists: replace it whole, in the file format log_table writes
                import pandas as pd

                mlflow.log_text(pd.DataFrame(run.units).to_json(orient="split", index=False, date_format="iso"), TABLE)
            else:
                mlflow.log_table({c: [u[c] for u in run.units] for c in run.units[0]}, artifact_file=TABLE)
        for path in run.artifacts:
            mlflow.log_artifact(str(path))
        return active.info.run_id


def _wandb(run: TrackedRun, say: Say) -> str:
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    project = os.environ.get("WANDB_PROJECT") or PROJECT
    where = f"{os.environ['WANDB_ENTITY']}/{project}" if os.environ.get("WANDB_ENTITY") else project
    active = wandb.init(
        project=project,
        id=_known_id(run, "wandb", where),
        resume="allow",
        name=run.name,
        job_type="cupid-eval",
        config=run.params,
        tags=[run.tags[k] for k in ("cupid.flag", "cupid.night") if k in run.tags] or None,
    )
    try:
        _keep_id(run, "wandb", where, active.id)
        active.config.update({"cupid_tags": run.tags}, allow_val_change=True)  # W&B's own tags are words, not pairs
        if run.units:
            columns = list(run.units[0])
            rows = [[u[c] for c in columns] for u in run.units]
            active.log({"units": wandb.Table(columns=columns, data=rows)}, commit=False)  # type: ignore[arg-type]
        active.log(run.metrics)
        if run.artifacts:
            artifact = wandb.Artifact(f"cupid-run-{active.id}", type="cupid-run")
            for path in run.artifacts:
                artifact.add_file(str(path), name=path.name)
            active.log_artifact(artifact)
        return active.id
    finally:
        active.finish()
