"""`cupid import-inspect LOG... --out RUN_DIR`: inspect-ai logs of the `cupid/*` tasks as a run directory.

Each score's metadata is the unit's record (`cupid.eval.integrations.inspect_tasks.to_score`), and the log's task
metadata says what the run was: its data, judges and prompt versions. From those, the importer writes the
run directory `cupid eval run` writes, so `cupid view`, `cupid report`, the nightly's comparison and
`cupid track` read it. Several logs (one per task) make one run: the data must agree. A sample that
inspect itself errored has no score: it becomes a failed unit with inspect's error, counted like any
other failure.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from cupid.common.config import ConfigError
from cupid.common.files import write_atomic
from cupid.common.install import pip_install
from cupid.eval.benchmark.data import named
from cupid.eval.benchmark.records import StageError, UnitRecord
from cupid.eval.benchmark.rundir import RunDir, RunIdentity, UnitPlan
from cupid.eval.benchmark.summary import Summary, summarize
from cupid.eval.benchmark.tasks import TASKS

SCORER = "cupid_scorer"


def import_logs(logs: list[str | Path], out: str | Path) -> Summary:
    """The logs' records into the run directory `out` (new, or the same run's); returns the summary."""
    runs = _finished_cupid_logs(logs)
    if len({named(meta["data"]) for _, _, meta in runs}) > 1 or len({log.eval.model for _, log, _ in runs}) > 1:
        raise ConfigError(
            "these logs are not one run: " + "; ".join(f"{p}: {log.eval.model} on {m['data']}" for p, log, m in runs)
        )
    _, first, meta = runs[0]
    roles = {"candidate": f"{first.eval.model} (inspect-ai)"} | {
        r: v for _, _, m in runs for r, v in m["roles"].items()
    }
    models = {"candidate": first.eval.model} | {r: v for _, _, m in runs for r, v in m["models"].items()}
    plan = {TASKS[m["task"]]: [m["setting"]] for _, _, m in runs}
    if len(plan) < len(runs):
        raise ConfigError("two logs of the same task: import one log per task")
    prompts = {k: v for _, _, m in runs for k, v in m["prompts"].items()}
    records = [record for path, log, _ in runs for record in _records(path, log)]

    run = RunDir(out)
    planned = UnitPlan(n_instances=meta["n_instances"], settings={t.name: s for t, s in plan.items()})
    # a log written before the task recorded its data by name holds the rows' path (`source` now): named here
    run.claim(RunIdentity(data=named(meta["data"]), roles=models, prompts=prompts, plan=planned))
    write_atomic(run.records_file, "".join(r.to_json() + "\n" for r in records))
    started = min(datetime.fromisoformat(log.stats.started_at) for _, log, _ in runs)
    finished = max(datetime.fromisoformat(log.stats.completed_at) for _, log, _ in runs)
    summary = summarize(
        records,
        plan,
        meta["n_instances"],
        {
            "data": meta.get("source", meta["data"]),
            "roles": roles,
            "matcher_prompt": next((m["matcher_prompt"] for _, _, m in runs if m.get("matcher_prompt")), None),
            "candidate_constrained": [t for _, _, m in runs for t in m["candidate_constrained"]],
            "prompts": prompts,
            "n_invalid_rows": len(meta["invalid_rows"]),
            "invalid_rows": meta["invalid_rows"],
            "wall_s": round((finished - started).total_seconds(), 2),
            "inspect_logs": [str(p) for p, _, _ in runs],
        },
    )
    run.write_summary(summary)
    return summary


def _finished_cupid_logs(logs: list[str | Path]) -> list[tuple[str | Path, Any, dict[str, Any]]]:
    """Each log read, with its cupid metadata: refused by name when it is not inspect-ai's, not of a cupid/* task, or
    not finished, before anything is written, so that a run directory never holds half an import."""
    try:
        from inspect_ai.log import read_eval_log
    except ImportError:
        raise ConfigError(f"reading inspect-ai logs needs the inspect extra: {pip_install('inspect')}") from None

    runs = []
    for path in logs:
        try:
            log = read_eval_log(str(path))
        except Exception as e:  # noqa: BLE001 (inspect raises whatever its reader met)
            raise ConfigError(f"{path}: not an inspect-ai log ({type(e).__name__}: {e})") from None
        meta = (log.eval.metadata or {}).get("cupid")
        if not meta or meta.get("task") not in TASKS:
            raise ConfigError(
                f"{path}: not a log of a cupid/* task (task {log.eval.task!r}); "
                "run `inspect eval cupid/inference` or `cupid/generation`"
            )
        if log.samples is None or log.status != "success":
            raise ConfigError(
                f"{path}: the eval did not finish (status {log.status}); run it to the end (inspect eval-retry) first"
            )
        runs.append((path, log, meta))
    return runs


def _records(path: str | Path, log: Any) -> list[UnitRecord]:
    task = TASKS[log.eval.metadata["cupid"]["task"]]
    records = []
    for sample in log.samples:
        score = (sample.scores or {}).get(SCORER)
        if score is not None and score.metadata:
            records.append(UnitRecord.model_validate(score.metadata))
            continue
        unit = sample.metadata or {}
        why = sample.error.message if sample.error else "the sample has no score"
        if "key" not in unit:
            raise ConfigError(f"{path}: sample {sample.id!r} has neither a score nor its unit's metadata")
        error = StageError(stage=task.candidate_stage, reason="inspect_error", detail=why)
        records.append(
            UnitRecord(
                **{k: unit[k] for k in ("key", "persona_id", "instance_type", "setting")}, task=task.name, error=error
            )
        )
    return records
