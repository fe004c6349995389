"""One evaluation run: every (instance, task, setting) unit in flight at once, records appended to
`instances.jsonl` as they finish, and a summary at the end. Re-running into the same directory
resumes: scored units are kept, failed and missing ones are run again (through the cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cupid.common.aio import blocking
from cupid.common.config import ConfigError, Tracker
from cupid.common.files import DiskFull, disk_full, hold
from cupid.common.verbosity import quiet, verbose
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.figures import Table
from cupid.eval.benchmark.history import History
from cupid.eval.benchmark.inference import INFERENCE, matcher_dialect
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.rundir import RunDir, RunIdentity, UnitPlan
from cupid.eval.benchmark.settings import Setting, built_from_answers, extra_prompts, extra_roles
from cupid.eval.benchmark.stages import Roles
from cupid.eval.benchmark.summary import Requests, Summary, summarize, tables
from cupid.eval.benchmark.tasks import TASKS, Task, TaskName, candidate_constrained
from cupid.matcher import prompts
from cupid.serving.cache import DEFAULT as DEFAULT_CACHE
from cupid.serving.cache import cache_path, open_cache, renamed_no_cache
from cupid.serving.client import Client
from cupid.serving.endpoint import Endpoint
from cupid.serving.executors import Executor, open_client
from cupid.serving.fleet.on_demand import ServedModel
from cupid.serving.fleet.run_servers import RunServers, plan_servers, profile_fingerprints
from cupid.serving.registry import DEFAULT_FILE as ENDPOINTS_FILE
from cupid.serving.registry import EndpointDown, down_message, lookup, missing_keys, unreachable
from cupid.serving.servers.lifecycle import first_notice, live_endpoints
from cupid.serving.servers.profiles import DEFAULT_DIR as PROFILES_DIR
from cupid.serving.servers.profiles import start_hint

InstanceType = Literal["consistent", "contrastive", "changing"]


class RunConfig(BaseModel):
    """A run, as a YAML file (`configs/eval/*.yaml`) or command-line options."""

    model_config = ConfigDict(extra="forbid")

    data: str = Field(
        default="sample",
        description="'sample', a local .jsonl/.json/.parquet file or directory, or a Hub id (kixlab/CUPID)",
    )
    endpoints: str = Field(default=ENDPOINTS_FILE, description="endpoints YAML")
    candidate: str | ServedModel = Field(
        description="endpoint name, or a model this run serves: {name, model, profile, adapter}"
    )
    profiles: str = Field(
        default=str(PROFILES_DIR),
        description="directory of the serve profiles that `serve:`, served candidates and the offline executors name",
    )
    serve: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="serve profiles this run starts on first need (its judges) and stops at the end: "
        "name -> field overrides",
    )
    decomposer: str | None = Field(
        default=None, description="inference: turns the inferred preference into a checklist"
    )
    matcher: str | None = Field(default=None, description="inference: labels checklist items against preferences")
    judge: str | None = Field(default=None, description="generation: scores the response 1-10")
    summarizer: str | None = Field(default=None, description="summary setting: summarizes each prior session")
    reference: str | None = Field(
        default=None, description="endpoint that re-scores the same answers (decomposer, matcher, judge)"
    )
    tasks: list[TaskName] = Field(
        default_factory=lambda: [INFERENCE.name], min_length=1, description="inference, generation or both"
    )
    settings: list[Setting] = Field(
        default_factory=lambda: ["standard"],  # type: ignore[arg-type]
        min_length=1,
        description="standard, oracle, oracle-preference (generation) or summary",
    )
    types: list[InstanceType] = Field(default_factory=list, description="only these instance types")
    limit: int | None = Field(default=None, ge=1, description="only the first N instances")
    concurrency: int | None = Field(
        default=None, ge=1, description="requests in flight per endpoint (overrides every endpoint's max_concurrency)"
    )
    executor: Executor = Field(
        default="http",
        description="http: running servers; vllm-offline (vLLM's CUDA or CPU build) or transformers-offline: "
        "the model inside this process, no server",
    )
    out: str | None = Field(default="runs/latest", description="run directory (resumable); none: nothing is written")
    cache: str | None = Field(
        default=DEFAULT_CACHE,
        description="the request cache: a SQLite file, `default` (<CUPID_HOME>/cache.sqlite), or null (none)",
    )
    refresh: bool = Field(default=False, description="send every request again and overwrite the cache")
    track: Tracker | None = Field(
        default=None,
        description="log the finished run to an experiment tracker: "
        "mlflow (MLFLOW_TRACKING_URI, else a local store) or wandb",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        return renamed_no_cache(data, "run config")

    @field_validator("serve", mode="before")
    @classmethod
    def _serve_list(cls, value: Any) -> Any:
        """`serve: [a, b]` is `serve: {a: {}, b: {}}`."""
        return {name: {} for name in value} if isinstance(value, list) else value

    @model_validator(mode="after")
    def _roles_for_tasks(self) -> RunConfig:
        needed = {role for task in self.tasks for role in TASKS[task].roles} | set(extra_roles(self.settings))
        if missing := [f.name for f in fields(Roles) if f.name in needed and getattr(self, f.name) is None]:
            raise ValueError(f"this run needs endpoints for {', '.join(missing)} (options --{' --'.join(missing)})")
        if not any(self.units_of(task) for task in TASKS):
            runs_in = "; ".join(f"{t} in {', '.join(TASKS[t].settings)}" for t in self.tasks)
            raise ValueError(f"no task runs in these settings ({runs_in})")
        return self

    def units_of(self, task: str) -> list[str]:
        """The run's settings the task runs in (`TaskSpec.settings`)."""
        if task not in self.tasks:
            return []
        return [s for s in self.settings if s in TASKS[task].settings]

    @property
    def candidate_name(self) -> str:
        return self.candidate.name if isinstance(self.candidate, ServedModel) else self.candidate

    @property
    def served_candidates(self) -> list[ServedModel]:
        return [self.candidate] if isinstance(self.candidate, ServedModel) else []

    def roles(self) -> Roles:
        return Roles(self.candidate_name, self.decomposer, self.matcher, self.judge, self.summarizer)


def _prompt_names(cfg: RunConfig) -> list[str]:
    names = [n for task in cfg.tasks for n in TASKS[task].prompts]
    return names + extra_prompts(cfg.settings)


def _constrained_tasks(cfg: RunConfig, endpoints: dict[str, Endpoint]) -> list[str]:
    """The tasks whose candidate answers are held to the task's format: never mistaken for free answers."""
    return [t for t in cfg.tasks if candidate_constrained(endpoints[cfg.candidate_name], t)]


def _identity(cfg: RunConfig, endpoints: dict[str, Endpoint]) -> RunIdentity:
    roles = {role: endpoints[name].identity for role, name in cfg.roles().bound().items()}
    if constrained := _constrained_tasks(cfg, endpoints):  # a constrained run is another run
        roles["candidate"] += f" [answer format constrained: {', '.join(constrained)}]"
    if cfg.reference:
        roles["reference"] = endpoints[cfg.reference].identity
    return RunIdentity(data=cupid_data.named(cfg.data), roles=roles, prompts=prompts.versions(*_prompt_names(cfg)))


def build_tasks(cfg: RunConfig, client: Any) -> dict[str, Task]:
    """The tasks of a run, each with its scorer and, with `reference`, the reference scorer (the reference
    endpoint in every judge role)."""
    history = History(client, cfg.summarizer)
    tasks = {}
    for name in cfg.tasks:
        spec = TASKS[name]
        main = spec.scorer(client, cfg.roles().bound())
        reference = spec.scorer(client, dict.fromkeys(spec.roles, cfg.reference)) if cfg.reference else None
        tasks[name] = Task(spec, client, cfg.candidate_name, history, main, reference)
    return tasks


def write_dry_run(tasks: dict[str, Task], units: list, path: str | Path) -> int:
    """The candidate requests as an OpenAI batch JSONL (for `vllm run-batch` or the Batch API)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for task, instance, setting in units:
            body = tasks[task].plain_request(instance, setting).body()
            line = {
                "custom_id": f"{instance.key}/{setting}/{task}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": body,
            }
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    return len(units)


def _finished(record: UnitRecord, reference: bool) -> bool:
    """A unit a resume keeps: scored, and re-scored by the reference when the run has one."""
    return record.scored and (not reference or record.scoring(reference=True).scored)


@dataclass(frozen=True)
class RunResult:
    """What a run computed: the latest record of each of its units (in data order), the summary
    (`summary.json`'s content) and, when it wrote one, its directory."""

    records: list[UnitRecord]
    summary: Summary
    out: Path | None

    @property
    def tables(self) -> list[Table]:
        """The tables of `summary.md`, as data (title, headers, rows)."""
        return tables(self.summary)


def run(
    cfg: RunConfig,
    *,
    console: Console | None = None,
    run_servers: RunServers | None = None,
    endpoints: dict[str, Endpoint] | None = None,
) -> RunResult:
    """`arun` from blocking code (the CLI, a night's slots)."""
    return blocking(lambda: arun(cfg, console=console, run_servers=run_servers, endpoints=endpoints))


def dry_run(
    cfg: RunConfig, path: str | Path, *, console: Console | None = None, endpoints: dict[str, Endpoint] | None = None
) -> int:
    """A run's candidate requests, written as an OpenAI batch JSONL (`vllm run-batch`, the Batch API) and
    counted: nothing is sent and no server starts."""
    if answered := built_from_answers(cfg.settings):
        raise ConfigError(
            f"--dry-run cannot write {', '.join(answered)}-setting requests: they are built from "
            f"{', '.join(extra_roles(answered))} answers"
        )
    used = _resolve(cfg, None, endpoints or {})
    dataset = cupid_data.load(cfg.data).filter(cfg.types, cfg.limit)
    units = [(t, i, s) for t in cfg.tasks for s in cfg.units_of(t) for i in dataset.instances]
    n = write_dry_run(build_tasks(cfg, Client(used)), units, path)
    (console or Console(stderr=True)).print(f"wrote {n} candidate requests to {path} (nothing sent)")
    return n


async def arun(
    cfg: RunConfig,
    *,
    console: Console | None = None,
    run_servers: RunServers | None = None,
    endpoints: dict[str, Endpoint] | None = None,
) -> RunResult:
    """One run. Servers it brings (`serve:`, a candidate that is a model) start on first need and stop at
    the end; a night passes its own `run_servers` instead, to serve the judges once for all its runs.
    `endpoints` binds names to endpoints over the endpoints file (the Python API's objects). Without
    `cfg.out` nothing is written: the records live in the result only."""
    console = console or Console(stderr=True)

    def say(m: str) -> None:
        console.print(m, highlight=False)

    _refuse_dead_endpoints(cfg, run_servers, endpoints or {})
    # one writer per run directory: a second run on it is refused before it starts anything
    with hold(cfg.out, say) if cfg.out else contextlib.nullcontext():
        own = None
        if run_servers is None and (cfg.serve or cfg.served_candidates):
            if cfg.executor != "http":
                raise ConfigError(
                    f"serve: and a served candidate start servers: they need executor http, not {cfg.executor}"
                )
            own = run_servers = plan_servers(cfg.serve, cfg.served_candidates, directory=cfg.profiles, say=say)
            for line in run_servers.lines():
                console.print(line, highlight=False)
        try:
            result = await _run(cfg, console, run_servers, endpoints or {})
        except Exception as e:
            if not disk_full(e):
                raise
            kept = len(RunDir(cfg.out).records()) if cfg.out else 0
            raise DiskFull(
                f"no space left on the device while writing the run in {cfg.out} or its request cache ({e}). "
                f"The {kept} record(s) written before are kept: free some space and run the same command again; "
                "it resumes from them"
            ) from e
        finally:
            if own is not None:
                own.stop_all()
        return result


def _refuse_dead_endpoints(cfg: RunConfig, run_servers: RunServers | None, given: dict[str, Endpoint]) -> None:
    """An endpoint that does not answer (or at a base URL without its API path, or without the model), refused before
    anything is written (no run directory, no cache file), where no answer can come from a cache: none is used, it is
    refreshed, or its file is not there yet. With a cache file the client asks before the first request it must send
    (a run answered from the cache asks nothing); a run that brings servers asks once they are planned."""
    if cfg.executor != "http" or run_servers is not None or cfg.serve or cfg.served_candidates:
        return
    path = cache_path(cfg.cache)
    if path is not None and path.exists() and not cfg.refresh:
        return
    used = _resolve(cfg, None, given)
    if down := unreachable(used):
        raise EndpointDown(down_message(down, used, cfg.roles().bound(), start_hint(cfg.profiles)))


def _resolve(
    cfg: RunConfig,
    run_servers: RunServers | None,
    given: dict[str, Endpoint],
    notes: list[tuple[str, str]] | None = None,
) -> dict[str, Endpoint]:
    """The endpoint of each role (and the reference), through the one resolver (`serving.registry.lookup`)."""
    if run_servers is not None:
        served = run_servers.endpoints
    else:  # a dry run: the requests name the model a run would serve
        served = {c.name: c.to_endpoint(c.to_profile(cfg.profiles)) for c in cfg.served_candidates}
    names = set(cfg.roles().bound().values()) | ({cfg.reference} if cfg.reference else set())
    used = lookup(names, cfg.endpoints, given=given, served=served, notes=notes, started=live_endpoints)
    if run_servers is not None and (
        clash := sorted(c.name for c in cfg.served_candidates if c.name in used and used[c.name] is not served[c.name])
    ):
        raise ConfigError(
            f"candidate '{clash[0]}' is served by this run and also an endpoint in {cfg.endpoints}: rename it"
        )
    return used


async def _run(
    cfg: RunConfig, console: Console, run_servers: RunServers | None, given: dict[str, Endpoint]
) -> RunResult:
    notes: list[tuple[str, str]] = []
    used = _resolve(cfg, run_servers, given, notes)
    for url, note in notes:
        if first_notice(url, note):
            console.print(note, highlight=False, markup=False, soft_wrap=True)
    dataset = cupid_data.load(cfg.data).filter(cfg.types, cfg.limit)
    units = [(t, i, s) for t in cfg.tasks for s in cfg.units_of(t) for i in dataset.instances]

    if missing := missing_keys(used):
        raise ConfigError(
            f"set {', '.join(missing)} in the environment: endpoints of this run need it (nothing was sent)"
        )

    cache = open_cache(cfg.cache)
    try:
        servers = run_servers.for_run(used, cfg.candidate_name) if run_servers else None
        client = open_client(
            cfg.executor,
            used,
            cache,
            refresh=cfg.refresh,
            concurrency=cfg.concurrency,
            profiles_dir=cfg.profiles,
            servers=servers,
            roles=cfg.roles().bound(),  # an endpoint that does not answer stops the run before it is sent to
        )
        out, latest = _claimed(cfg, used, len(dataset.instances), units)
        done = {k for k, r in latest.items() if _finished(r, bool(cfg.reference))}
        todo = [(t, i, s) for t, i, s in units if (i.key, t, s) not in done]
        tasks = build_tasks(cfg, client)
        started = time.monotonic()
        async for record in _run_all(tasks, todo, out, console, already=len(units) - len(todo)):
            latest[record.unit] = record
    finally:
        if cache is not None:
            cache.close()

    records = [latest[(i.key, t, s)] for t, i, s in units if (i.key, t, s) in latest]
    summary = _summary(cfg, used, dataset, records, Requests.of(client.stats), round(time.monotonic() - started, 2))
    if out is not None:
        out.compact()  # one line per unit, before summary.json (whose time the staleness rules compare with)
        out.write_summary(summary)
    return RunResult(records, summary, out.path if out is not None else None)


def _claimed(
    cfg: RunConfig, used: dict[str, Endpoint], n_instances: int, units: list[tuple[str, cupid_data.Instance, str]]
) -> tuple[RunDir | None, dict[tuple[str, str, str], UnitRecord]]:
    """The run directory, claimed for this run, and the latest record of each unit it holds (none without `out`).
    Refused when it holds units of this run's tasks and settings that the run would leave out (a smaller --limit,
    fewer --type): its summary would not count them where compare and report read them."""
    if not cfg.out:
        return None, {}
    out = RunDir(cfg.out)
    planned = UnitPlan(n_instances=n_instances, settings={t: cfg.units_of(t) for t in cfg.tasks})
    planned_cells = {(t, s) for t, _, s in units}
    latest = out.records()
    cut = {k for k in set(latest) - {(i.key, t, s) for t, i, s in units} if (k[1], k[2]) in planned_cells}
    if cut:
        raise ConfigError(
            f"{out.path} holds {len(cut)} unit(s) of instances this run leaves out (a smaller --limit or fewer "
            "--type than the run that wrote them): its summary would not count them where compare and report "
            "read them; run it with the same --limit and --type, or give another --out"
        )
    out.claim(_identity(cfg, used).model_copy(update={"plan": planned}))
    return out, latest


def _summary(
    cfg: RunConfig,
    used: dict[str, Endpoint],
    dataset: cupid_data.Dataset,
    records: list[UnitRecord],
    requests: Requests,
    wall_s: float,
) -> Summary:
    """The run's summary: its figures over the records, with what it ran on (data, roles, prompts, requests)."""
    roles = {role: f"{name} ({used[name].model})" for role, name in cfg.roles().bound().items()}
    if cfg.reference:
        roles["reference"] = f"{cfg.reference} ({used[cfg.reference].model})"
    meta = {
        "data": dataset.source,
        "roles": roles,
        "matcher_prompt": matcher_dialect(used[cfg.matcher]) if cfg.matcher else None,
        "candidate_constrained": _constrained_tasks(cfg, used),
        "prompts": prompts.versions(*_prompt_names(cfg)),
        "n_invalid_rows": len(dataset.bad_rows),
        "invalid_rows": [str(b) for b in dataset.bad_rows],
        "requests": requests,
        "wall_s": wall_s,
    }
    if cfg.serve or cfg.served_candidates:
        meta["serve_profiles"] = profile_fingerprints(cfg.serve, cfg.served_candidates, cfg.profiles)
    plan = {TASKS[task]: cfg.units_of(task) for task in cfg.tasks}
    return summarize(records, plan, len(dataset.instances), meta, reference=bool(cfg.reference))


async def _run_all(
    tasks: dict[str, Task], todo: list, out: RunDir | None, console: Console, already: int
) -> AsyncIterator[UnitRecord]:
    """Every unit in flight at once; each record, as it finishes, appended to the run directory (when there
    is one) before it is handed on."""
    client = next(iter(tasks.values())).client
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[stats]}"),
        console=console,
        transient=False,
        disable=quiet() or not console.is_terminal,  # a log gets `PlainProgress`'s lines instead of a bar's last frame
    )
    plain: PlainProgress | None = None
    running: list[asyncio.Future[UnitRecord]] = []
    if not quiet() and (verbose() or not console.is_terminal):
        plain = PlainProgress(console, "+".join(tasks), len(todo) + already, already)
    try:
        with progress, out.append() if out is not None else contextlib.nullcontext() as sink:
            bar = progress.add_task("+".join(tasks), total=len(todo) + already, completed=already, stats="")
            running = [asyncio.ensure_future(tasks[t].run(i, s)) for t, i, s in todo]
            for finished in asyncio.as_completed(running):
                record = await finished
                if sink is not None:
                    sink.write(record.to_json() + "\n")
                    sink.flush()
                progress.update(bar, advance=1, stats=client.stats.line())
                if plain is not None:
                    plain.advance(record.scored, client.stats.line())
                yield record
        if plain is not None:
            plain.say(client.stats.line())
    finally:  # interrupted too: no unit left running (nor its error unread), no connection left open
        for unit in running:
            unit.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await client.aclose()


PROGRESS_EVERY_S = 10.0  # a plain progress line at most this often (CUPID_PROGRESS_S sets it; 0: every unit)
ETA_AFTER = 0.1  # the share of a run's units to do that must be done before its time left is said


class PlainProgress:
    """Progress where no one watches a terminal (CI, nohup, a pipe): a plain line at a steady interval, never a bar
    redrawn in place: units done of all, failures, requests, rate and time left.

    Every unit starts at once and each is a chain of requests, so the first ones finish late and then many finish
    together: a rate counted from the start says hours where minutes remain. Time left is the rate since the first
    unit finished, said only once `ETA_AFTER` of the units have."""

    def __init__(self, console: Console, what: str, total: int, done: int):
        self.console, self.what, self.total, self.done, self.failed = console, what, total, done, 0
        self.started = self.last = time.monotonic()
        self.first = done
        self.first_finished: float | None = None  # when the first unit of this run finished
        self.every = 0.0 if verbose() else float(os.environ.get("CUPID_PROGRESS_S", PROGRESS_EVERY_S))

    def advance(self, scored: bool, requests: str) -> None:
        self.done += 1
        self.failed += not scored
        if self.first_finished is None:
            self.first_finished = time.monotonic()
        if time.monotonic() - self.last >= self.every:
            self.say(requests)

    def time_left(self, now: float) -> str:
        if self.done >= self.total:
            return "done"
        finished = self.done - self.first
        if self.first_finished is None or finished < max(2, ETA_AFTER * (self.total - self.first)):
            return "time left: estimating"
        rate = (finished - 1) / max(now - self.first_finished, 1e-9)
        return f"{(self.total - self.done) / rate:.0f} s left" if rate > 0 else "time left: estimating"

    def say(self, requests: str) -> None:
        self.last = now = time.monotonic()
        rate = (self.done - self.first) / max(now - self.started, 1e-9)
        self.console.print(
            f"{self.what}: {self.done}/{self.total} units, {self.failed} failed; {requests}; "
            f"{rate:.1f} units/s; {self.time_left(now)}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
