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
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from cupid.matcher import parse
from cupid.eval.meta import canonical_label, krippendorff_alpha
from cupid.serving import lifecycle
from cupid.serving.client import Client, RequestFailed
from cupid.serving.endpoints import Endpoint
from cupid.serving.engines import ServeError, get_engine
from cupid.serving.profiles import Profile
from cupid.training.config import TrainConfig
from cupid.training.export import adapter_dir, export_dir
from cupid.training.matchdata import MatchExample, data_dir, read_examples

MODELS = ("base", "adapter", "trained")  # the report's blocks, in the order of the table


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
    return dict(zip(endpoints, results))


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy and Krippendorff's alpha over the items of parsed answers; failures counted by reason."""

    parsed = [r for r in rows if r["labels"] is not None]
    pairs = [(t, m) for r in parsed for t, m in zip(r["teacher"], r["labels"])]
    out: dict[str, Any] = {
        "n_examples": len(rows),
        "n_parsed": len(parsed),
        "n_failed": len(rows) - len(parsed),
        "failures": dict(Counter(f"{r['error']['reason']}: {r['error']['detail']}" for r in rows if r["error"])),
        "n_items": sum(len(r["teacher"]) for r in rows),
        "n_items_compared": len(pairs),
        "accuracy": round(sum(t == m for t, m in pairs) / len(pairs), 4) if pairs else None,
        "confusion": dict(Counter(f"{t} -> {m}" for t, m in pairs)),
    }
    teacher, model = [canonical_label(t) for t, _ in pairs], [canonical_label(m) for _, m in pairs]
    for level in ("interval", "ordinal"):
        alpha = krippendorff_alpha(teacher, model, level) if pairs else None
        out[f"alpha_{level}"] = None if alpha is None else round(alpha, 4)
        if pairs and alpha is None:
            out["alpha_undefined"] = "a single label value throughout: alpha is undefined"
    return out


@dataclass
class Server:
    """One server the check starts, and which of its served models answer as which report block."""

    profile: Profile
    asks: dict[str, str]  # report block ("base", "adapter", "trained") -> served model name


def plan(cfg: TrainConfig) -> list[Server]:
    """The check's servers: the base with the adapter as a LoRA module (if either is measured), then the export."""
    from cupid.training.sft import resolve_base

    a = cfg.agreement
    names = served_names(cfg)
    out = []
    on_base: dict[str, str] = {k: names[k] for k in ("base", "adapter") if (k == "base" and a.baseline) or (k == "adapter" and a.adapter)}
    if on_base:
        adapters = {names["adapter"]: str(adapter_dir(cfg))} if a.adapter else None
        out.append(Server(a.profile(names["base"], resolve_base(cfg), names["base"], adapters), on_base))
    out.append(Server(a.profile(names["trained"], str(export_dir(cfg)), names["trained"]), {"trained": names["trained"]}))
    return out


def served_names(cfg: TrainConfig) -> dict[str, str]:
    return {"base": f"train-{cfg.name}-base", "adapter": f"train-{cfg.name}-adapter", "trained": f"train-{cfg.name}"}


def _listed(base_url: str, api_key: str | None) -> list[dict[str, Any]]:
    """What the server's /v1/models lists (vLLM: the base, then each LoRA module with its path and parent)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    data = httpx.get(base_url + "/models", headers=headers, timeout=30).json().get("data", [])
    return [{"id": m.get("id"), "root": m.get("root"), "parent": m.get("parent")} for m in data]


def group_left(pgid: int) -> list[int]:
    """Processes of a server's process group that still run (zombies waiting to be reaped do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():  # no procfs: the group exists or it does not
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    left = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            left.append(int(entry.name))
    return sorted(left)


def measure(server: Server, examples: list[MatchExample], cfg: TrainConfig, console: Console) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Start one server (tied to this process), ask every example of each of its models at once, stop it (also on failure)."""
    a, profile = cfg.agreement, server.profile
    spec = profile.spec()
    adapters = profile.adapter_paths()
    what = ", ".join(f"'{name}' ({which})" for which, name in server.asks.items())
    device = f" {profile.device}" if profile.engine == "vllm" else ""
    console.print(f"[bold]check[/bold]: serving {spec.model}" + (f" + LoRA {', '.join(adapters.values())}" if adapters else "")
                  + f" ({profile.engine}{device}): {what}, {len(examples)} validation prompts each", highlight=False)  # fmt: skip
    started = time.monotonic()
    record = lifecycle.up(spec, tied=True)
    info: dict[str, Any] = {
        "name": spec.handle, "engine": spec.engine, "device": record["device"], "model": spec.model, "adapters": adapters,
        "asked": server.asks, "pid": record["pid"], "tied_to": record["tied_to"], "command": record["command"],
        "env": record["env"], "start_s": round(time.monotonic() - started, 2),
    }  # fmt: skip
    try:
        info["listed"] = _listed(record["base_url"], spec.api_key())
        missing = sorted(set(server.asks.values()) - {m["id"] for m in info["listed"]})
        if missing and get_engine(spec.engine).lists_served_model:
            raise ServeError(f"'{spec.handle}' started but /v1/models does not list {', '.join(missing)} (it lists {[m['id'] for m in info['listed']]})")
        endpoints = {
            which: Endpoint(base_url=record["base_url"], model=name, api_key_env=spec.api_key_env, max_tokens=a.max_tokens,
                            max_concurrency=a.concurrency, timeout_s=a.timeout_s, max_retries=1)
            for which, name in server.asks.items()
        }  # fmt: skip
        asked = time.monotonic()
        rows = asyncio.run(_ask_all(endpoints, examples))
        info["ask_s"] = round(time.monotonic() - asked, 2)
    finally:
        lifecycle.down(spec.handle)  # waits for the whole process group, killing what outstays its grace
        info["left_running"] = group_left(record["pid"])
    return info, rows


def measure_on_running(running: dict[str, Any], blocks: list[str], examples: list[MatchExample], cfg: TrainConfig, console: Console) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Base and/or adapter (`blocks`) on a vLLM server already serving the base model (`running`: its `base_url`, served `model`,
    optional `api_key_env`), started with a `runtime_lora_rank`: the adapter is loaded for the check and
    unloaded after (also on failure). Refused when the server serves another model than the config's base."""
    from cupid.training.sft import resolve_base

    a, names = cfg.agreement, served_names(cfg)
    base_url, base_name = running["base_url"], running["model"]
    api_key = os.environ.get(running["api_key_env"]) if running.get("api_key_env") else None
    served = {m["id"]: m for m in _listed(base_url, api_key)}
    root = (served.get(base_name) or {}).get("root")
    if root is None or Path(root).resolve() != Path(resolve_base(cfg)).resolve():
        raise ServeError(f"{base_url}: serves {base_name!r} from {root}, not the base model {resolve_base(cfg)}")
    adapter = str(adapter_dir(cfg).resolve())
    asks = {k: v for k, v in {"base": base_name, "adapter": names["adapter"]}.items() if k in blocks}
    adapters = {names["adapter"]: adapter} if "adapter" in asks else {}
    console.print(f"[bold]check[/bold]: loading LoRA {adapter} into the server at {base_url} ({base_name}): "
                  f"{', '.join(asks.values())}, {len(examples)} validation prompts each", highlight=False)  # fmt: skip
    started = time.monotonic()
    for name, path in adapters.items():
        lifecycle.load_lora(base_url, name, path, api_key)
    info: dict[str, Any] = {"name": base_url, "engine": "vllm", "model": str(root), "adapters": adapters,
                            "asked": asks, "loaded_at_run_time": True, "load_s": round(time.monotonic() - started, 2)}  # fmt: skip
    try:
        info["listed"] = _listed(base_url, api_key)
        endpoints = {
            which: Endpoint(base_url=base_url, model=name, api_key_env=running.get("api_key_env"), max_tokens=a.max_tokens,
                            max_concurrency=a.concurrency, timeout_s=a.timeout_s, max_retries=1)
            for which, name in asks.items()
        }  # fmt: skip
        asked = time.monotonic()
        rows = asyncio.run(_ask_all(endpoints, examples))
        info["ask_s"] = round(time.monotonic() - asked, 2)
    finally:
        for name in adapters:
            lifecycle.unload_lora(base_url, name, api_key)
        info["listed_after"] = _listed(base_url, api_key)
    return info, rows


def check(cfg: TrainConfig, console: Console | None = None, running: dict[str, Any] | None = None) -> dict[str, Any]:
    """Agreement of the base (before), the adapter and the export (after) with the teacher; `<out>/agreement.json`.
    `running`: a vLLM server of the base model that loads adapters at run time (see `measure_on_running`)."""
    from cupid.serving.config import ConfigError

    console = console or Console(stderr=True)
    examples = read_examples(data_dir(cfg) / "validation.jsonl")
    if cfg.agreement.limit:
        examples = examples[: cfg.agreement.limit]
    if not (export_dir(cfg) / "config.json").is_file():
        raise ConfigError(f"{export_dir(cfg)}: no exported model here; run `cupid train export --config {cfg.source}` first")
    servers = plan(cfg)
    for server in servers:  # missing adapter, rank above max_lora_rank: refused before a server starts
        server.profile.check_local_files(f"{cfg.source}: agreement")
    report: dict[str, Any] = {"validation": str(data_dir(cfg) / "validation.jsonl"), "teacher_prompt": examples[0].teacher_prompt, "servers": []}
    answers: dict[str, list[dict[str, Any]]] = {}
    measured = []
    if running is not None and len(servers) == 2:  # the base and its adapter on the running server; the export is started
        measured.append(measure_on_running(running, list(servers.pop(0).asks), examples, cfg, console))
    measured += [measure(server, examples, cfg, console) for server in servers]
    for info, rows in measured:
        report["servers"].append(info)
        for which, served in info["asked"].items():
            answers[which] = rows[which]
            report[which] = {**agreement(rows[which]), "model": info["adapters"].get(served, info["model"]), "served_as": served, "server": info["name"]}
    with (cfg.out_dir / "agreement_answers.jsonl").open("w", encoding="utf-8") as sink:
        for which in MODELS:
            for row in answers.get(which, []):
                sink.write(json.dumps({"model": which, **row}, ensure_ascii=False) + "\n")
    (cfg.out_dir / "agreement.json").write_text(json.dumps(report, indent=2))
    return report


def table(report: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for which in MODELS:
        if which in report:
            r = report[which]
            fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
            rows.append((which, f"{r['n_parsed']}/{r['n_examples']}", fmt(r["accuracy"]), fmt(r["alpha_interval"]), fmt(r["alpha_ordinal"]), str(r["n_failed"])))
    return rows


def load_report(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
