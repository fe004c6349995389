"""After training: how well does a served matcher agree with the teacher on held-out personas?

Each model (the base before training, the export after) is started with the project's serving
lifecycle, asked every validation prompt exactly as PrefMatcher is asked, and its answer parsed
with the same parser the benchmark uses. An answer that does not parse is a failure with its
reason, never a label: agreement (accuracy, Krippendorff's alpha over the label scores 0/0.5/1)
is computed on the answers that parsed, and the report says how many those were.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console

from matcher import parse
from eval.meta import canonical_label, krippendorff_alpha
from serving import lifecycle
from serving.client import Client, RequestFailed
from serving.endpoints import Endpoint
from serving.engines import ServeSpec
from serving.instant import free_port
from training.config import TrainConfig
from training.export import export_dir
from training.matchdata import MatchExample, data_dir, read_examples


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


def measure(model_dir: str, served_name: str, examples: list[MatchExample], cfg: TrainConfig, console: Console) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Serve `model_dir`, ask every example, stop the server (also on failure)."""
    a = cfg.agreement
    spec = ServeSpec(engine=a.engine, model=model_dir, name=served_name, port=free_port(),
                     startup_timeout_s=a.startup_timeout_s, extra_args=list(a.extra_args))  # fmt: skip
    console.print(f"[bold]check[/bold]: serving {model_dir} as '{served_name}' ({a.engine}) for {len(examples)} validation prompts", highlight=False)
    record = lifecycle.up(spec)
    try:
        endpoint = Endpoint(base_url=record["base_url"], model=served_name, max_tokens=a.max_tokens,
                            max_concurrency=a.concurrency, timeout_s=a.timeout_s, max_retries=1)  # fmt: skip
        rows = asyncio.run(_answers(endpoint, examples))
    finally:
        lifecycle.down(served_name)
    return agreement(rows), rows


def check(cfg: TrainConfig, console: Console | None = None) -> dict[str, Any]:
    """Agreement of the base (before) and the export (after) with the teacher; `<out>/agreement.json`."""
    from training.sft import resolve_base

    console = console or Console(stderr=True)
    examples = read_examples(data_dir(cfg) / "validation.jsonl")
    if cfg.agreement.limit:
        examples = examples[: cfg.agreement.limit]
    exported = export_dir(cfg)
    if not (exported / "config.json").is_file():
        from serving.config import ConfigError

        raise ConfigError(f"{exported}: no exported model here; run `cupid train export --config {cfg.source}` first")
    models = {"trained": (str(exported), f"train-{cfg.name}")}
    if cfg.agreement.baseline:
        models = {"base": (resolve_base(cfg), f"train-{cfg.name}-base"), **models}
    report: dict[str, Any] = {"validation": str(data_dir(cfg) / "validation.jsonl"), "teacher_prompt": examples[0].teacher_prompt}
    answers_path = cfg.out_dir / "agreement_answers.jsonl"
    with answers_path.open("w", encoding="utf-8") as sink:
        for which, (model_dir, name) in models.items():
            report[which], rows = measure(model_dir, name, examples, cfg, console)
            report[which]["model"] = model_dir
            for row in rows:
                sink.write(json.dumps({"model": which, **row}, ensure_ascii=False) + "\n")
    (cfg.out_dir / "agreement.json").write_text(json.dumps(report, indent=2))
    return report


def table(report: dict[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    for which in ("base", "trained"):
        if which in report:
            r = report[which]
            fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
            rows.append((which, f"{r['n_parsed']}/{r['n_examples']}", fmt(r["accuracy"]), fmt(r["alpha_interval"]), fmt(r["alpha_ordinal"]), str(r["n_failed"])))
    return rows


def load_report(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
