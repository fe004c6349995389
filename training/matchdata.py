"""Match data for PrefMatcher: candidates' inferred preferences, labelled by a teacher matcher.

The eval runner does the work (candidate -> decompose -> teacher matches both directions, with the
request cache and failure accounting); this module turns its scored records into chat examples:
`prompt` = the `prefmatcher` system + user messages, `completion` = the teacher's labels as a
fenced JSON list of {index, entry, label} in checklist order, which is the shape a drop-in
PrefMatcher must answer (spec §4). Each example keeps the teacher's raw answer and where it came
from. Examples are deduplicated by prompt and split by persona, so that no persona's preferences
are seen in training and then used to measure agreement.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from cupid.common.config import ConfigError
from cupid.common.tls import http_get
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.inference import INFERENCE, matcher_dialect
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.rundir import RunDir
from cupid.eval.benchmark.runner import RunConfig
from cupid.eval.benchmark.runner import run as run_eval
from cupid.matcher import prompts
from cupid.matcher.prompts import LABELS
from cupid.serving.cache import cache_path
from cupid.serving.endpoint import Endpoint
from cupid.serving.registry import load_endpoints, require
from cupid.training.config import Labelling, TrainConfig, is_test_split
from cupid.training.examples import SPLITS, completion_text, prompt_key, write_jsonl
from cupid.training.traindir import TrainDir


class LabellingError(RuntimeError):
    pass


class LabelReport(BaseModel):
    """`<out>/data/report.json`, key for key: what the labelling runs gave, and the match data's balance per split."""

    # a NaN (a diverged loss) is written NaN, as json.dumps of the dict wrote it, also inside free-form fields
    model_config = ConfigDict(ser_json_inf_nan="constants")

    data: str
    n_instances: int
    teacher: str  # "endpoint (model)"
    teacher_prompt: str
    runs: dict[str, dict[str, Any]]  # candidate -> its run's dir, n_scored, n_failed, failures
    n_examples_raw: int
    # A run that labelled nothing has `error` and none of the counts after it; one that did, the reverse.
    error: str | None = Field(default=None, exclude_if=lambda v: v is None)
    n_duplicates: int | None = Field(default=None, exclude_if=lambda v: v is None)
    n_conflicting_duplicates: int | None = Field(default=None, exclude_if=lambda v: v is None)
    n_missing_teacher_raw: int | None = Field(default=None, exclude_if=lambda v: v is None)
    splits: dict[str, dict[str, Any]] | None = Field(default=None, exclude_if=lambda v: v is None)  # label_balance's


def examples_from_record(record: UnitRecord, candidate: str, teacher: str, teacher_prompt: str) -> list[dict[str, Any]]:
    """The (up to) two examples of one scored inference record, each with the teacher's raw answer as the
    record kept it. An empty inferred checklist gives no `infer_to_gt` example: nothing was asked."""
    directions = (
        ("infer_to_gt", record.gt_preference, record.inferred_checklist or []),
        ("gt_to_infer", record.inferred_preference, record.gt_checklist or []),
    )
    raw = record.matcher_answers or {}
    out: list[dict[str, Any]] = []
    for direction, preference, items in directions:
        labels = [asdict(m) for m in getattr(record, direction) or []]
        if not items or not labels or preference is None:
            continue
        if [m["entry"] for m in labels] != list(items):
            raise LabellingError(f"{record.key}: {direction} labels do not follow the checklist order")
        prompt = prompts.matcher(preference, items, "prefmatcher")
        out.append(
            {
                "id": prompt_key(prompt),
                "prompt": prompt,
                "completion": [{"role": "assistant", "content": completion_text(labels)}],
                "preference": preference,
                "items": list(items),
                "teacher_labels": [{"index": m["index"], "entry": m["entry"], "label": m["label"]} for m in labels],
                "direction": direction,
                "persona_id": record.persona_id,
                "instance_key": record.key,
                "instance_type": record.instance_type,
                "setting": record.setting,
                "candidate": candidate,
                "teacher": teacher,
                "teacher_prompt": teacher_prompt,
                "teacher_raw": raw.get(direction),  # type: ignore[call-overload]
            }
        )
    return out


def deduplicate(examples: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int, int]:
    """Keep the first example of each prompt. Returns (kept, duplicates, conflicts): a conflict is a
    repeated prompt whose teacher labels differ (kept out too; the first answer stands)."""
    first: dict[str, dict[str, Any]] = {}
    duplicates = conflicts = 0
    for example in examples:
        seen = first.get(example["id"])
        if seen is None:
            first[example["id"]] = example
            continue
        duplicates += 1
        if seen["teacher_labels"] != example["teacher_labels"]:
            conflicts += 1
    return list(first.values()), duplicates, conflicts


def split_by_persona(examples: list[dict[str, Any]], fraction: float, seed: int) -> dict[str, list[dict[str, Any]]]:
    personas = sorted({e["persona_id"] for e in examples})
    if len(personas) < 2:
        raise LabellingError(f"match data covers {len(personas)} persona(s): at least 2 are needed to split by persona")
    random.Random(seed).shuffle(personas)
    n_val = min(max(1, round(fraction * len(personas))), len(personas) - 1)
    held_out = set(personas[:n_val])
    return {
        "train": [e for e in examples if e["persona_id"] not in held_out],
        "validation": [e for e in examples if e["persona_id"] in held_out],
    }


def label_balance(examples: list[dict[str, Any]]) -> dict[str, Any]:
    counts = Counter(m["label"] for e in examples for m in e["teacher_labels"])
    total = sum(counts.values())
    return {
        "n_examples": len(examples),
        "n_items": total,
        "n_personas": len({e["persona_id"] for e in examples}),
        "labels": {label: counts.get(label, 0) for label in LABELS},
        "label_shares": {label: round(counts.get(label, 0) / total, 4) if total else None for label in LABELS},
        "by_direction": dict(Counter(e["direction"] for e in examples)),
    }


# --- labelling -------------------------------------------------------------------------------


@contextlib.contextmanager
def _endpoints_file(labelling: Labelling, path: Path) -> Iterator[Path]:
    """The endpoints the runs use, as one file in the run directory: the configured file, the inline
    ones, and the instant-answer server (started here, stopped on exit) when the config asks for it."""
    found = load_endpoints(labelling.endpoints) if labelling.endpoints else {}
    entries = {
        name: e.model_dump(mode="json", exclude_none=True) for name, e in {**found, **labelling.add_endpoints}.items()
    }
    proc = None
    try:
        if labelling.instant_server:
            from cupid.serving.servers.instant import start

            proc, url = start()
            entries["instant"] = {"base_url": url, "model": "instant", "max_retries": 0, "timeout_s": 60}
        path.write_text(yaml.safe_dump(entries, sort_keys=False))
        yield path
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


def _reachable(name: str, url: str) -> str | None:
    """None if something answers HTTP at the endpoint (any status: a 401 is still a server)."""
    try:
        http_get(url.rstrip("/") + "/models", timeout=10.0)
        return None
    except httpx.HTTPError as e:
        return f"endpoint '{name}' ({url}) cannot be reached: {type(e).__name__}: {e}"


def _input_file(labelling: Labelling, path: Path) -> tuple[Path, int]:
    """The CUPID instances to run, validated and written locally (the runner then needs no split)."""
    dataset = cupid_data.load(labelling.data, split=labelling.split)
    if dataset.bad_rows:
        listed = "\n  ".join(str(b) for b in dataset.bad_rows[:20])
        raise cupid_data.DataError(
            f"{dataset.source}: {len(dataset.bad_rows)} invalid row(s), fix or remove them:\n  {listed}"
        )
    instances = dataset.filter(None, labelling.limit).instances
    if not instances:
        raise cupid_data.DataError(f"{dataset.source}: no instances")
    write_jsonl(path, [i.model_dump() for i in instances])
    return path, len(instances)


def label(cfg: TrainConfig, run: TrainDir, console: Console | None = None) -> LabelReport:
    """Run every candidate on the inference task with the teacher as matcher; write the match data into `run`.

    Resumable: the runner keeps scored instances and the cache answers every request already made.
    """
    console = console or Console(stderr=True)
    labelling = _labelling(cfg)
    run.labelling.mkdir(parents=True, exist_ok=True)
    input_path, n_instances = _input_file(labelling, run.label_input)
    with _endpoints_file(labelling, run.label_endpoints) as endpoints_path:
        teacher, dialect, runs = _label_runs(labelling, endpoints_path, input_path, run, console)
    examples = []
    for candidate in labelling.candidates:
        records = RunDir(runs[candidate]["dir"]).records()
        for (_, task, _), record in sorted(records.items()):
            if task == INFERENCE.name and record.scored:
                examples += examples_from_record(record, candidate, labelling.teacher, dialect)
    report = LabelReport(
        data=labelling.data,
        n_instances=n_instances,
        teacher=f"{labelling.teacher} ({teacher.model})",
        teacher_prompt=dialect,
        runs=runs,
        n_examples_raw=len(examples),
    )
    return _write_match_data(run, labelling, report, examples)


def _labelling(cfg: TrainConfig) -> Labelling:
    """The config's `labelling` section, refused when there is none or when it would train on the benchmark."""
    labelling = cfg.labelling
    if labelling is None:
        raise ConfigError(f"{cfg.source}: no `labelling` section (this config uses match_data: {cfg.match_data})")
    if is_test_split(labelling.data) and not labelling.allow_test_split:
        raise ConfigError(
            f"{cfg.source}: labelling.data is {labelling.data}, the CUPID benchmark itself: training on it "
            "contaminates every later evaluation. Use kixlab/CUPID-Unverified or your own data, or force it with "
            "`allow_test_split: true` / `--force`."
        )
    return labelling


def _label_runs(
    labelling: Labelling, endpoints_path: Path, input_path: Path, run: TrainDir, console: Console
) -> tuple[Endpoint, str, dict[str, dict[str, Any]]]:
    """One evaluation run per candidate with the teacher as matcher (every endpoint reachable first): the teacher,
    its prompt dialect, and each candidate's run (its directory, scored and failed counts, failures)."""
    endpoints = load_endpoints(endpoints_path)
    roles = {*labelling.candidates, labelling.decomposer, labelling.teacher}
    for name in sorted(roles):
        require(endpoints, name, endpoints_path)
    if unreachable := [p for name in sorted(roles) if (p := _reachable(name, endpoints[name].url))]:
        raise LabellingError("nothing was run:\n  " + "\n  ".join(unreachable))
    teacher = endpoints[labelling.teacher]
    dialect = matcher_dialect(teacher)
    cache_file = cache_path(labelling.cache)
    runs: dict[str, dict[str, Any]] = {}
    for candidate in labelling.candidates:
        out = run.label_run(candidate)
        console.print(
            f"[bold]label[/bold]: candidate {candidate}, teacher {labelling.teacher} ({dialect} prompt) -> {out}"
        )
        summary = run_eval(
            RunConfig(
                data=str(input_path),
                endpoints=str(endpoints_path),
                candidate=candidate,
                decomposer=labelling.decomposer,
                matcher=labelling.teacher,
                settings=list(labelling.settings),
                concurrency=labelling.concurrency,
                out=str(out),
                cache=str(cache_file) if cache_file else None,
            ),
            console=console,
        ).summary
        runs[candidate] = {
            "dir": str(out),
            "n_scored": summary.n_scored,
            "n_failed": summary.n_failed,
            "failures": summary.failures,
        }
    return teacher, dialect, runs


def _write_match_data(
    run: TrainDir, labelling: Labelling, report: LabelReport, examples: list[dict[str, Any]]
) -> LabelReport:
    """The examples deduplicated and split by persona into the match data, and the report beside them; with no
    example, the report says why and the labelling fails with the failures by stage."""
    if not examples:
        failures: Counter[str] = Counter()
        for r in report.runs.values():
            failures.update(r["failures"])
        report.error = "no scored instance: no match data"
        run.write_report("label", report)
        listed = "\n  ".join(f"{what}: {n}" for what, n in failures.most_common()) or "(none recorded)"
        raise LabellingError(
            f"no match data: none of the {report.n_instances} instance(s) x {len(labelling.candidates)} candidate(s) "
            f"was scored, so the teacher labelled nothing. Failures by stage:\n  {listed}\n"
            f"records with the raw answers: {run.labelling}/*/instances.jsonl"
        )
    examples.sort(key=lambda e: (e["persona_id"], e["instance_key"], e["setting"], e["candidate"], e["direction"]))
    kept, duplicates, conflicts = deduplicate(examples)
    splits = split_by_persona(kept, labelling.validation_fraction, labelling.seed)
    for split in SPLITS:
        write_jsonl(run.split(split), splits[split])
    report.n_duplicates = duplicates
    report.n_conflicting_duplicates = conflicts
    report.n_missing_teacher_raw = sum(e["teacher_raw"] is None for e in kept)
    report.splits = {split: label_balance(splits[split]) for split in SPLITS}
    run.write_report("label", report)
    return report
