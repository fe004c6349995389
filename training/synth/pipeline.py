"""A synthesis run: personas in parallel, each one all-or-nothing, resumable, through the cache.

Run directory:
  run.json                 what makes the run (seed, models, prompt versions, caps); a rerun must match
  personas/<id>.json       a finished persona: template, random choices, factors, 13 sessions with
                           dialogues, and every raw model answer; written whole (temp file + rename)
  failed/<id>.json         a failed persona: the step, the reason and the raw answers so far
  instances.jsonl          the CUPID rows of every finished persona, checked by `eval.benchmark.data.load`
  summary.json             counts, failures by step, retries spent, requests sent/cached

A rerun skips finished personas (no request at all) and runs failed and missing ones again; their
earlier steps come back from the request cache, so only what is new costs model time.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cupid.common.config import ConfigError
from cupid.common.files import write_atomic
from cupid.common.verbosity import quiet
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.rundir import OutputDir
from cupid.eval.benchmark.summary import Requests
from cupid.matcher import prompts
from cupid.serving.cache import open_cache
from cupid.serving.client import Client
from cupid.serving.registry import load_endpoints, missing_keys, require
from cupid.training.synth import tables
from cupid.training.synth.ask import Asker, StepFailed, all_of
from cupid.training.synth.config import Role, SynthConfig
from cupid.training.synth.dialogue import simulate
from cupid.training.synth.factors import Factor, change_preference, checklist, generate_factors
from cupid.training.synth.instances import Choices, PersonaRecord, SessionRecord, draw_choices, rows, validated
from cupid.training.synth.parse import sentences
from cupid.training.synth.personas import expand, template
from cupid.training.synth.sessions import SessionSlot, layout, write_requests

ROLES: tuple[Role, ...] = ("generator", "user_simulator", "assistant_simulator")
PROMPTS_USED = (
    "synth_persona",
    "project_synth_persona",
    "project_synth_factor",
    "project_synth_contrastive_factor",
    "project_synth_changed_preference",
    "project_synth_checklist",
    "project_synth_request",
    "synth_assistant_simulator",
    "project_synth_judge",
    "project_synth_feedback",
    "project_synth_closing",
)


def persona_id(seed: int, index: int) -> str:
    return f"synth-{seed}-{index:04d}"


class SynthesisDir(OutputDir):
    """A synthesis run's directory: run.json and instances.jsonl as every run's (here the CUPID rows,
    rewritten whole), plus a file per finished or failed persona."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.personas = self.path / "personas"
        self.failed = self.path / "failed"

    def done_ids(self) -> set[str]:
        return {p.stem for p in self.personas.glob("*.json")} if self.personas.is_dir() else set()

    def persona_records(self) -> list[PersonaRecord]:
        return [
            PersonaRecord.model_validate_json(p.read_text(encoding="utf-8"))
            for p in sorted(self.personas.glob("*.json"))
        ]

    def write_done(self, record: PersonaRecord) -> None:
        write_atomic(self.personas / f"{record.persona_id}.json", record.model_dump_json(indent=1))
        (self.failed / f"{record.persona_id}.json").unlink(missing_ok=True)

    def write_failed(self, pid: str, index: int, step: str, reason: str, raw: list[dict[str, Any]]) -> None:
        failure = {"persona_id": pid, "index": index, "step": step, "reason": reason, "raw": raw}
        write_atomic(self.failed / f"{pid}.json", json.dumps(failure, indent=1, ensure_ascii=False))

    def failures(self) -> dict[str, dict[str, Any]]:
        """Failed personas: the step, the reason, and the retries spent (answers after a step's first)."""
        if not self.failed.is_dir():
            return {}
        out = {}
        for p in sorted(self.failed.glob("*.json")):
            failure = json.loads(p.read_text(encoding="utf-8"))
            out[p.stem] = {"step": failure["step"], "reason": failure["reason"], "retries": retries(failure["raw"])}
        return out

    def write_instances(self) -> int:
        """All finished personas' rows, rewritten whole, then read back through the data layer."""
        lines = [json.dumps(row, ensure_ascii=False) for record in self.persona_records() for row in rows(record)]
        write_atomic(self.records_file, "".join(line + "\n" for line in lines))
        if lines:
            dataset = cupid_data.load(self.records_file)
            if dataset.bad_rows:
                raise ValueError("; ".join(str(bad) for bad in dataset.bad_rows))
        return len(lines)


def retries(raw: list[dict[str, Any]]) -> int:
    """Requests a persona spent beyond each step's first attempt."""
    return sum(1 for r in raw if r["attempt"] > 1)


def identity(cfg: SynthConfig, endpoints: dict, seeds: tables.Seeds) -> dict[str, Any]:
    """What a rerun must share. Not `retries`: raising it gives failed steps more attempts, and the
    attempts already made come back from the cache unchanged."""
    return {
        "seed": cfg.seed,
        "roles": {role: endpoints[cfg.endpoint(role)].model for role in ROLES},
        "prompts": prompts.versions(*PROMPTS_USED),
        "persona_prompt": cfg.persona_prompt,
        "persona_in_prompts": cfg.persona_in_prompts,
        "max_turns": cfg.max_turns,
        "retry_temperature": cfg.retry_temperature,
        "retry_params": cfg.retry_params,
        "temperature": cfg.temperature.model_dump(),
        "max_tokens": cfg.max_tokens.model_dump(),
        "seed_personas": seeds.digest,
        "tables": tables.digest(),
    }


async def synthesize(asker: Asker, index: int, seeds: tables.Seeds) -> PersonaRecord:
    """One persona end to end: template -> description -> factors -> sessions -> dialogues -> instances."""
    cfg, attrs, pid = asker.cfg, tables.attributes(), asker.persona_id
    tmpl = template(cfg.seed, index, attrs, seeds)
    choices = draw_choices(cfg.seed, pid, attrs)
    description = await expand(asker, tmpl)
    persona = description if cfg.persona_in_prompts == "description" else sentences(description)[0]
    factors = await generate_factors(asker, persona, choices.slots)
    current = factors[choices.current_factor]
    changed = await change_preference(asker, current, factors)
    preferences = [f.preference for f in factors] + [changed]
    slots = layout(choices.positions, choices.current_factor, choices.contrastive_factor)
    both: list[Any] = await all_of(  # the checklists and the requests, side by side
        all_of(*(checklist(asker, f"checklist[{i}]", p) for i, p in enumerate(preferences))),
        write_requests(asker, persona, slots, factors, choices.task_types, preferences),
    )
    checklists: list[list[str]] = both[0]
    requests: dict[int, str] = both[1]
    *factor_checklists, changed_checklist = checklists  # the last is the changed preference's
    for factor, items in zip(factors, factor_checklists, strict=True):
        factor.checklist = items

    sessions = await write_sessions(asker, persona, slots, factors, requests, choices, changed, changed_checklist)
    record = PersonaRecord(
        persona_id=pid,
        index=index,
        seed=cfg.seed,
        template=tmpl,
        description=description,
        choices=choices,
        factors=factors,
        changed_preference=changed,
        changed_checklist=changed_checklist,
        sessions=sessions,
        example_copies=sorted(asker.copies),
        raw=sorted(asker.raw, key=lambda r: (r["step"], r["attempt"])),
    )
    validated(record)
    return record


async def write_sessions(
    asker: Asker,
    persona: str,
    slots: list[SessionSlot],
    factors: list[Factor],
    requests: dict[int, str],
    choices: Choices,
    changed: str,
    changed_checklist: list[str],
) -> list[SessionRecord]:
    """The 13 sessions of the template: each prior session's dialogue simulated (all at once), each with its
    factor, preference and checklist; the final session's request alone."""

    def preference_of(role: str, factor_index: int) -> tuple[str | None, list[str]]:
        if role == "final":
            return None, []
        if role == "current_changed":
            return changed, changed_checklist
        return factors[factor_index].preference, factors[factor_index].checklist

    prior = [s for s in slots if s.role != "final"]
    dialogues = await all_of(
        *(
            simulate(
                asker,
                persona,
                s.position,
                factors[s.factor_index].factor,
                requests[s.position],
                preference_of(s.role, s.factor_index)[1],
            )
            for s in prior
        )
    )
    by_position = {s.position: d for s, d in zip(prior, dialogues, strict=True)}
    sessions = []
    for s in slots:
        preference, items = preference_of(s.role, s.factor_index)
        dialogue, turns, ended = by_position.get(s.position, ([], [], None))
        sessions.append(
            SessionRecord(
                position=s.position,
                role=s.role,
                factor_index=s.factor_index,
                context_factor=factors[s.factor_index].factor,
                contextual_preference=preference,
                checklist=items,
                task_type=choices.task_types[s.position],
                request=requests[s.position],
                dialogue=dialogue,
                turns=turns,
                ended=ended,
            )
        )
    return sessions


async def _run_all(
    cfg: SynthConfig, client: Client, out: SynthesisDir, todo: list[int], seeds: tables.Seeds, console: Console
) -> None:
    slots = asyncio.Semaphore(cfg.parallel_personas)
    columns = (
        TextColumn("synth"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False, disable=quiet()) as progress:
        bar = progress.add_task("personas", total=len(todo), failed=0)
        failed = 0

        async def one(index: int) -> None:
            nonlocal failed
            pid = persona_id(cfg.seed, index)
            asker = Asker(client, cfg, pid)
            async with slots:
                try:
                    out.write_done(await synthesize(asker, index, seeds))
                except StepFailed as e:
                    failed += 1
                    out.write_failed(pid, index, e.step, e.reason, asker.raw)
                except ValueError as e:  # a record or instance that the schema refuses
                    failed += 1
                    out.write_failed(pid, index, "instances", f"invalid record: {e}"[:2000], asker.raw)
            progress.update(bar, advance=1, failed=failed)

        try:
            await asyncio.gather(*(one(i) for i in todo))
        finally:
            await client.aclose()


def _step_kind(step: str) -> str:
    """`dialogue[3].turn[1].judge[0]` -> `dialogue.judge`: what summaries count failures by."""
    parts = [re.sub(r"\[.*?\]", "", part) for part in step.split(".")]
    return ".".join(p for p in (parts[0], parts[-1] if len(parts) > 1 else "") if p)


def run(cfg: SynthConfig, console: Console | None = None) -> dict[str, Any]:
    console = console or Console(stderr=True)
    endpoints = load_endpoints(cfg.endpoints)
    used = {}
    for role in ROLES:
        used[cfg.endpoint(role)] = require(endpoints, cfg.endpoint(role), cfg.endpoints)
    if missing := missing_keys(used):
        raise ConfigError(
            f"set {', '.join(missing)} in the environment: endpoints of this run need it (nothing was sent)"
        )
    seeds = tables.load_seeds(cfg.seeds)
    out = SynthesisDir(cfg.out)
    out.check_same_run(identity(cfg, endpoints, seeds), what="synthesis run")
    done = out.done_ids()
    todo = [i for i in range(cfg.personas) if persona_id(cfg.seed, i) not in done]

    cache = open_cache(cfg.cache)
    client = Client(used, cache)
    started = time.monotonic()
    try:
        asyncio.run(_run_all(cfg, client, out, todo, seeds, console))
    finally:
        if cache is not None:
            cache.close()
    n_rows = out.write_instances()
    failures = out.failures()
    wanted = {persona_id(cfg.seed, i) for i in range(cfg.personas)}
    summary = {
        "personas": cfg.personas,
        "done": len(wanted & out.done_ids()),
        "failed": len(wanted & set(failures)),
        "skipped_as_done": cfg.personas - len(todo),
        "failures": {pid: f for pid, f in failures.items() if pid in wanted},
        "failed_by_step": dict(Counter(_step_kind(f["step"]) for pid, f in failures.items() if pid in wanted)),
        "instances": n_rows,
        "example_copies": sum(len(r.example_copies) for r in out.persona_records() if r.persona_id in wanted),
        "retries": sum(retries(r.raw) for r in out.persona_records() if r.persona_id in wanted)
        + sum(f["retries"] for pid, f in failures.items() if pid in wanted),
        "instances_file": str(out.records_file),
        "requests": Requests.of(client.stats).model_dump(),
        "seconds": round(time.monotonic() - started, 1),
    }
    write_atomic(out.path / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False))
    return summary
