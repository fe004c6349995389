"""After training: how well does a served matcher agree with the teacher on held-out personas?

Three matchers are asked every validation prompt exactly as PrefMatcher is asked, each answer parsed
with the same parser the benchmark uses: the base before training, the trained LoRA adapter on that
base, and the merged export (what PrefMatcher users serve). They come from two server starts of the
project's serving lifecycle: the base with the adapter as a LoRA module (vLLM `--enable-lora`: the
base answers under its name, the adapter under its own), then the export. The servers are serve
profiles built from the config's `agreement.serve`, started tied to this process (a killed
`cupid train` leaves none behind) and stopped, their whole process group, before the check returns.
Given a vLLM server already running the base model with run-time LoRA loading on (`running`; the test
suite's session server), the check asks the base there and loads the adapter into it for its answers
(`/v1/load_lora_adapter`, unloaded after): one start fewer, the export's.

An answer that does not parse is a failure with its reason, never a label: agreement (accuracy,
Krippendorff's alpha over the label scores 0/0.5/1) is computed on the answers that parsed, and the
report says how many those were.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from cupid.common.config import ConfigError
from cupid.common.errors import ServeError
from cupid.common.processes import group_left
from cupid.common.tls import http_get
from cupid.eval.results.meta import LABELS, Labelled, agree, canonical_label
from cupid.matcher import parse
from cupid.serving.client import Client, RequestFailed
from cupid.serving.endpoint import Endpoint, bearer
from cupid.serving.fleet.placement import Placed
from cupid.serving.fleet.run_servers import RunServers
from cupid.serving.servers import state
from cupid.serving.servers.engines import get_engine
from cupid.serving.servers.profiles import Profile
from cupid.training.base_model import resolve_base
from cupid.training.config import TrainConfig
from cupid.training.examples import MatchExample, read_examples
from cupid.training.traindir import TrainDir

MODELS = ("base", "adapter", "trained")  # the report's blocks, in the order of the table


class AgreementReport(BaseModel):
    """`<out>/agreement.json`, key for key: each measured model's agreement with the teacher and the servers asked."""

    # a NaN (a diverged loss) is written NaN, as json.dumps of the dict wrote it, also inside free-form fields
    model_config = ConfigDict(ser_json_inf_nan="constants")

    validation: str
    teacher_prompt: str
    servers: list[dict[str, Any]]  # per server: name, engine, model, adapters, asked, listed, timings, ...
    # Per model measured (`agreement()`'s figures, with model, served_as, server); a model not measured has no key.
    base: dict[str, Any] | None = Field(default=None, exclude_if=lambda v: v is None)
    adapter: dict[str, Any] | None = Field(default=None, exclude_if=lambda v: v is None)
    trained: dict[str, Any] | None = Field(default=None, exclude_if=lambda v: v is None)

    def block(self, which: str) -> dict[str, Any] | None:
        """The figures of `which` (one of MODELS), None where it was not measured."""
        return getattr(self, which) if which in MODELS else None


async def _answers(endpoint: Endpoint, examples: list[MatchExample]) -> list[dict[str, Any]]:
    client = Client({"matcher": endpoint})

    async def one(example: MatchExample) -> dict[str, Any]:
        row: dict[str, Any] = {"id": example.id, "teacher": [m.label for m in example.teacher_labels]}
        try:
            answer = await client.chat("matcher", [m.model_dump() for m in example.prompt])
        except RequestFailed as e:
            return {**row, "labels": None, "error": {"reason": e.reason, "detail": e.detail}, "raw": None}
        row["raw"] = answer.content
        try:
            row["labels"] = [m.label for m in parse.matches(answer.content, example.items)]
            row["error"] = None
        except parse.ParseError as e:
            row["labels"], row["error"] = None, {"reason": "parse_error", "detail": e.message}
        return row

    try:
        return await asyncio.gather(*(one(e) for e in examples))
    finally:
        await client.aclose()


async def _ask_all(endpoints: dict[str, Endpoint], examples: list[MatchExample]) -> dict[str, list[dict[str, Any]]]:
    """Every model of one server at once: the server batches base and adapter requests together."""
    results = await asyncio.gather(*(_answers(e, examples) for e in endpoints.values()))
    return dict(zip(endpoints, results, strict=True))


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy and Krippendorff's alpha (the meta-evaluation's `agree`, teacher against model) over the items of
    parsed answers; failures counted by reason."""
    parsed = [(n, r) for n, r in enumerate(rows) if r["labels"] is not None]
    pairs = [
        ((str(n), "validation", "teacher-model", i), t, m)
        for n, r in parsed
        for i, (t, m) in enumerate(zip(r["teacher"], r["labels"], strict=True))
    ]
    teacher = {key: Labelled(canonical_label(t)) for key, t, _ in pairs}
    model = {key: Labelled(canonical_label(m)) for key, _, m in pairs}
    out: dict[str, Any] = {
        "n_examples": len(rows),
        "n_parsed": len(parsed),
        "n_failed": len(rows) - len(parsed),
        "failures": dict(Counter(f"{r['error']['reason']}: {r['error']['detail']}" for r in rows if r["error"])),
        "n_items": sum(len(r["teacher"]) for r in rows),
        "n_items_compared": len(pairs),
    }
    by_level = {level: agree(teacher, model, level) for level in ("interval", "ordinal")}
    for level, agreed in by_level.items():
        out[f"alpha_{level}"] = None if agreed.alpha is None else round(agreed.alpha, 4)
    agreed = by_level["ordinal"]  # accuracy and confusion are the same at every level
    out["accuracy"] = None if agreed.accuracy is None else round(agreed.accuracy, 4)
    out["confusion"] = {
        f"{a} -> {b}": n
        for a, row in zip(LABELS, agreed.confusion, strict=True)
        for b, n in zip(LABELS, row, strict=True)
        if n
    }  # teacher -> model
    if pairs and agreed.alpha is None:
        out["alpha_undefined"] = "a single label value throughout: alpha is undefined"
    return out


@dataclass
class Served:
    """A serve profile the check serves, and which of its served models answer as which report block."""

    profile: Profile
    asks: dict[str, str]  # report block ("base", "adapter", "trained") -> served model name


def plan(cfg: TrainConfig, run: TrainDir) -> list[Served]:
    """The check's servers: the base with `run`'s adapter as a LoRA module (if either is measured), then its export."""
    a = cfg.agreement
    names = served_names(cfg)
    out = []
    on_base: dict[str, str] = {
        k: names[k] for k in ("base", "adapter") if (k == "base" and a.baseline) or (k == "adapter" and a.adapter)
    }
    if on_base:
        adapters = {names["adapter"]: str(run.adapter)} if a.adapter else None
        out.append(Served(a.profile(names["base"], resolve_base(cfg), names["base"], adapters), on_base))
    out.append(Served(a.profile(names["trained"], str(run.export), names["trained"]), {"trained": names["trained"]}))
    return out


def served_names(cfg: TrainConfig) -> dict[str, str]:
    return {"base": f"train-{cfg.name}-base", "adapter": f"train-{cfg.name}-adapter", "trained": f"train-{cfg.name}"}


def _listed(base_url: str, api_key: str | None) -> list[dict[str, Any]]:
    """What the server's /v1/models lists (vLLM: the base, then each LoRA module with its path and parent)."""
    data = http_get(base_url + "/models", headers=bearer(api_key), timeout=30).json().get("data", [])
    return [{"id": m.get("id"), "root": m.get("root"), "parent": m.get("parent")} for m in data]


def _endpoints(base_url: str, asks: dict[str, str], api_key_env: str | None, cfg: TrainConfig) -> dict[str, Endpoint]:
    a = cfg.agreement
    return {
        which: Endpoint.model_validate(
            {
                "base_url": base_url,
                "model": name,
                "api_key_env": api_key_env,
                "max_tokens": a.max_tokens,
                "max_concurrency": a.concurrency,
                "timeout_s": a.timeout_s,
                "max_retries": 1,
            }
        )
        for which, name in asks.items()
    }


def measure(
    served: Served, examples: list[MatchExample], cfg: TrainConfig, console: Console
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Start one server (tied to this process), ask every example of each of its models at once, stop it
    (also on failure)."""
    profile = served.profile
    adapters = profile.adapter_paths()
    what = ", ".join(f"'{name}' ({which})" for which, name in served.asks.items())
    device = f" {profile.device_chosen}" if profile.device_chosen else ""
    console.print(
        f"[bold]check[/bold]: serving {profile.model}"
        + (f" + LoRA {', '.join(adapters.values())}" if adapters else "")
        + f" ({profile.engine}{device}): {what}, {len(examples)} validation prompts each",
        highlight=False,
    )
    servers = RunServers(say=lambda message: console.print(message, highlight=False))
    server = servers.add(Placed(profile))
    started = time.monotonic()
    info: dict[str, Any] = {
        "name": server.name,
        "engine": profile.engine,
        "model": profile.model,
        "adapters": adapters,
        "asked": served.asks,
    }
    try:
        server.ensure()
        info["start_s"] = round(time.monotonic() - started, 2)
        record = state.find(server.name)  # None: a server already answering as it was used as it is
        if record is not None:
            info.update(record.model_dump(include={"pid", "tied_to", "command", "env"}))
            info["device"] = profile.engine_can.device_of(profile.device)
        info["listed"] = _listed(server.base_url, server.profile.api_key())
        missing = sorted(set(served.asks.values()) - {m["id"] for m in info["listed"]})
        if missing and get_engine(profile.engine).lists_served_model:
            raise ServeError(
                f"'{server.name}' started but /v1/models does not list {', '.join(missing)} "
                f"(it lists {[m['id'] for m in info['listed']]})"
            )
        asked = time.monotonic()
        rows = asyncio.run(_ask_all(_endpoints(server.base_url, served.asks, profile.api_key_env, cfg), examples))
        info["ask_s"] = round(time.monotonic() - asked, 2)
    finally:
        servers.stop_all()  # waits for the whole process group, killing what outstays its grace
        if "pid" in info:
            info["left_running"] = group_left(info["pid"])
    return info, rows


def measure_on_running(
    running: Endpoint,
    blocks: list[str],
    examples: list[MatchExample],
    cfg: TrainConfig,
    run: TrainDir,
    console: Console,
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Base and/or adapter (`blocks`) on a vLLM server already serving the base model (`running`), started with a
    `runtime_lora_rank`: the adapter is loaded into it as a night loads a LoRA candidate into a judge's server, and
    unloaded after (also on failure). Refused when the server serves another model than the config's base."""
    names = served_names(cfg)
    base_url, base_name, api_key = running.url, running.model, running.api_key()
    root = ({m["id"]: m for m in _listed(base_url, api_key)}.get(base_name) or {}).get("root")
    if root is None or Path(root).resolve() != Path(resolve_base(cfg)).resolve():
        raise ServeError(f"{base_url}: serves {base_name!r} from {root}, not the base model {resolve_base(cfg)}")
    address = urlsplit(base_url)
    host = cfg.agreement.profile("running-base", str(root), base_name, port=address.port).model_copy(
        update={"host": address.hostname or "127.0.0.1", "api_key_env": running.api_key_env}
    )
    adapter = str(run.adapter.resolve())
    asks = {k: v for k, v in {"base": base_name, "adapter": names["adapter"]}.items() if k in blocks}
    adapters = {names["adapter"]: adapter} if "adapter" in asks else {}
    console.print(
        f"[bold]check[/bold]: loading LoRA {adapter} into the server at {base_url} ({base_name}): "
        f"{', '.join(asks.values())}, {len(examples)} validation prompts each",
        highlight=False,
    )
    servers = RunServers(say=lambda message: console.print(message, highlight=False))
    server = servers.add(Placed(host))
    info: dict[str, Any] = {
        "name": base_url,
        "engine": "vllm",
        "model": str(root),
        "adapters": adapters,
        "asked": asks,
        "loaded_at_run_time": True,
    }
    started = time.monotonic()
    try:
        server.ensure()  # answers already: used as it is, never stopped here
        for name, path in adapters.items():
            servers.load(name, server, name, path).ensure()
        info["load_s"] = round(time.monotonic() - started, 2)
        info["listed"] = _listed(base_url, api_key)
        asked = time.monotonic()
        rows = asyncio.run(_ask_all(_endpoints(base_url, asks, running.api_key_env, cfg), examples))
        info["ask_s"] = round(time.monotonic() - asked, 2)
    finally:
        servers.stop_all()  # unloads the adapters; the server goes on
        info["listed_after"] = _listed(base_url, api_key)
    return info, rows


def check(
    cfg: TrainConfig, run: TrainDir, console: Console | None = None, running: Endpoint | None = None
) -> AgreementReport:
    """Agreement of the base (before), `run`'s adapter and export (after) with the teacher, written into `run`.
    `running`: a vLLM server of the base model that loads adapters at run time (see `measure_on_running`)."""
    console = console or Console(stderr=True)
    examples = read_examples(run.split("validation"))
    if cfg.agreement.limit:
        examples = examples[: cfg.agreement.limit]
    if not run.has_export():
        raise ConfigError(f"{run.export}: no exported model here; run `cupid train export --config {cfg.source}` first")
    servers = plan(cfg, run)
    for server in servers:  # missing adapter, rank above max_lora_rank: refused before a server starts
        server.profile.check_local_files(f"{cfg.source}: agreement")
    servers_asked: list[dict[str, Any]] = []
    blocks: dict[str, dict[str, Any]] = {}
    answers: dict[str, list[dict[str, Any]]] = {}
    measured = []
    if (
        running is not None and len(servers) == 2
    ):  # the base and its adapter on the running server; the export is started
        measured.append(measure_on_running(running, list(servers.pop(0).asks), examples, cfg, run, console))
    measured += [measure(server, examples, cfg, console) for server in servers]
    for info, rows in measured:
        servers_asked.append(info)
        for which, served in info["asked"].items():
            answers[which] = rows[which]
            blocks[which] = {
                **agreement(rows[which]),
                "model": info["adapters"].get(served, info["model"]),
                "served_as": served,
                "server": info["name"],
            }
    with run.agreement_answers.open("w", encoding="utf-8") as sink:
        for which in MODELS:
            for row in answers.get(which, []):
                sink.write(json.dumps({"model": which, **row}, ensure_ascii=False) + "\n")
    report = AgreementReport(
        validation=str(run.split("validation")),
        teacher_prompt=examples[0].teacher_prompt,
        servers=servers_asked,
        base=blocks.get("base"),
        adapter=blocks.get("adapter"),
        trained=blocks.get("trained"),
    )
    run.write_report("check", report)
    return report


def table(report: AgreementReport) -> list[tuple[str, ...]]:
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    rows: list[tuple[str, ...]] = []
    for which in MODELS:
        if (r := report.block(which)) is not None:
            rows.append(
                (
                    which,
                    f"{r['n_parsed']}/{r['n_examples']}",
                    fmt(r["accuracy"]),
                    fmt(r["alpha_interval"]),
                    fmt(r["alpha_ordinal"]),
                    str(r["n_failed"]),
                )
            )
    return rows
