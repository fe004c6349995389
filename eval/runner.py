"""One evaluation run: every (instance, setting) chain in flight at once, records appended to
`instances.jsonl` as they finish, and a summary at the end. Re-running into the same directory
resumes: scored instances are kept, failed and missing ones are run again (through the cache).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from eval import data as cupid_data
from eval.inference import InferenceTask, Roles
from eval.summary import markdown, summarize
from matcher import prompts
from serving.cache import Cache
from serving.client import Client
from serving.config import ConfigError
from serving.endpoints import load_endpoints, missing_keys, require
from serving.lifecycle import state_dir

Setting = Literal["standard", "oracle"]
PROMPTS_USED = ("inference", "decomposer", "prefmatcher", "matcher_fewshot")


class RunConfig(BaseModel):
    """A run, as a YAML file (`configs/eval/*.yaml`) or command-line options."""

    model_config = ConfigDict(extra="forbid")

    data: str = "sample"
    endpoints: str = "configs/endpoints.yaml"
    candidate: str
    decomposer: str
    matcher: str
    settings: list[Setting] = Field(default_factory=lambda: ["standard"], min_length=1)
    types: list[Literal["consistent", "contrastive", "changing"]] = Field(default_factory=list)
    limit: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1, description="overrides every endpoint's max_concurrency")
    out: str = "runs/latest"
    cache: str | None = Field(default=None, description="SQLite cache file; default .cupid/cache.sqlite")
    no_cache: bool = False
    refresh: bool = False


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.records_file = self.path / "instances.jsonl"

    def records(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        """The latest record of each (instance, task, setting); a torn last line from a crash is ignored."""
        latest: dict[tuple[str, str, str], dict[str, Any]] = {}
        if not self.records_file.exists():
            return latest
        for line in self.records_file.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            latest[(record["key"], record["task"], record["setting"])] = record
        return latest

    def append(self):
        """The records file opened for appending, after closing any line torn by a crash."""
        self.path.mkdir(parents=True, exist_ok=True)
        sink = self.records_file.open("a+", encoding="utf-8")
        if sink.tell() > 0:
            sink.seek(sink.tell() - 1)
            if sink.read(1) != "\n":
                sink.write("\n")
        return sink

    def check_same_run(self, identity: dict[str, Any]) -> None:
        """Refuse to mix two different runs (other candidate, matcher, data...) in one directory."""
        run_file = self.path / "run.json"
        if run_file.exists():
            previous = json.loads(run_file.read_text())
            if previous != identity:
                diff = {k: (previous.get(k), identity.get(k)) for k in identity if previous.get(k) != identity.get(k)}
                raise ConfigError(f"{self.path} holds another run (differs in {diff}); choose another --out")
        self.path.mkdir(parents=True, exist_ok=True)
        run_file.write_text(json.dumps(identity, indent=2))


def _identity(cfg: RunConfig, endpoints: dict, roles: Roles) -> dict[str, Any]:
    return {
        "data": cfg.data,
        "roles": {role: endpoints[name].model for role, name in vars(roles).items()},
        "prompts": prompts.versions(*PROMPTS_USED),
    }


def write_dry_run(task: InferenceTask, units: list, path: str | Path) -> int:
    """The candidate requests as an OpenAI batch JSONL (for `vllm run-batch` or the Batch API)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for instance, setting in units:
            body = task.candidate_request(instance, setting).body()
            line = {"custom_id": f"{instance.key}/{setting}/inference", "method": "POST", "url": "/v1/chat/completions", "body": body}
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    return len(units)


def run(cfg: RunConfig, *, dry_run: str | None = None, console: Console | None = None) -> dict[str, Any]:
    console = console or Console(stderr=True)
    endpoints = load_endpoints(cfg.endpoints)
    roles = Roles(cfg.candidate, cfg.decomposer, cfg.matcher)
    for name in vars(roles).values():
        require(endpoints, name, cfg.endpoints)
    used = {name: endpoints[name] for name in vars(roles).values()}
    matcher_endpoint = endpoints[roles.matcher]
    dialect = matcher_endpoint.matcher_prompt or prompts.matcher_dialect_for(matcher_endpoint.model)

    dataset = cupid_data.load(cfg.data).filter(cfg.types, cfg.limit)
    units = [(instance, setting) for setting in cfg.settings for instance in dataset.instances]

    if dry_run:
        task = InferenceTask(Client(used), roles, dialect)
        n = write_dry_run(task, units, dry_run)
        console.print(f"wrote {n} candidate requests to {dry_run} (nothing sent)")
        return {"dry_run": dry_run, "n_requests": n}

    if missing := missing_keys(used):
        raise ConfigError(f"set {', '.join(missing)} in the environment: endpoints of this run need it (nothing was sent)")

    out = RunDir(cfg.out)
    out.check_same_run(_identity(cfg, endpoints, roles))
    done = {k: r for k, r in out.records().items() if r["status"] == "scored"}
    todo = [(i, s) for i, s in units if (i.key, "inference", s) not in done]

    cache = None if cfg.no_cache else Cache(cfg.cache or state_dir() / "cache.sqlite")
    client = Client(used, cache, refresh=cfg.refresh, concurrency=cfg.concurrency)
    task = InferenceTask(client, roles, dialect)
    started = time.monotonic()
    try:
        asyncio.run(_run_all(task, todo, out, console, already=len(units) - len(todo)))
    finally:
        if cache is not None:
            cache.close()

    latest = out.records()
    records = [latest[(i.key, "inference", s)] for i, s in units if (i.key, "inference", s) in latest]
    meta = {
        "data": dataset.source,
        "roles": {role: f"{name} ({endpoints[name].model})" for role, name in vars(roles).items()},
        "matcher_prompt": dialect,
        "prompts": prompts.versions(*PROMPTS_USED),
        "n_invalid_rows": len(dataset.bad_rows),
        "invalid_rows": [str(b) for b in dataset.bad_rows],
        "requests": {"sent": client.stats.sent, "cached": client.stats.cached, "failed": client.stats.failed},
        "wall_s": round(time.monotonic() - started, 2),
    }
    summary = summarize(records, list(cfg.settings), len(dataset.instances), meta)
    (out.path / "summary.json").write_text(json.dumps(summary, indent=2))
    (out.path / "summary.md").write_text(markdown(summary))
    return summary


async def _run_all(task: InferenceTask, todo: list, out: RunDir, console: Console, already: int) -> None:
    progress = Progress(
        TextColumn("[bold]inference"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[stats]}"),
        console=console,
        transient=False,
    )
    with progress, out.append() as sink:
        bar = progress.add_task("inference", total=len(todo) + already, completed=already, stats="")
        for finished in asyncio.as_completed([task.run(i, s) for i, s in todo]):
            record = await finished
            sink.write(json.dumps(record, ensure_ascii=False) + "\n")
            sink.flush()
            progress.update(bar, advance=1, stats=f"{task.client.stats.line()}")
    await task.client.aclose()
