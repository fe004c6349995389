"""Run directories written straight from records (eval/benchmark/records.py's UnitRecord, validated as they are
written), for tests that need exact labels or scores no server would give."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cupid.eval.benchmark.records import UnitRecord
from cupid.matcher.scores import MatchCounts

LONG = {"Y": "Fully Covered", "P": "Partially Covered", "N": "Not Covered"}


def matches(labels: str, prefix: str) -> list[dict[str, Any]]:
    """'YPN' -> [{index 1, entry 'prefix 1', label 'Fully Covered'}, ...]"""
    return [{"index": i, "entry": f"{prefix} {i}", "label": LONG[c]} for i, c in enumerate(labels, start=1)]


def scoring(infer_to_gt: str, gt_to_infer: str) -> dict[str, Any]:
    a, b = matches(infer_to_gt, "inferred item"), matches(gt_to_infer, "true item")
    counts = MatchCounts.from_labels([m["label"] for m in a], [m["label"] for m in b])
    return {
        "status": "scored",
        "error": None,
        "infer_to_gt": a,
        "gt_to_infer": b,
        "counts": vars(counts),
        "scores": counts.prf().as_dict(),
    }


def inference(
    key: str,
    infer_to_gt: str = "",
    gt_to_infer: str = "",
    *,
    setting: str = "standard",
    failed: str | None = None,
    relevant: Sequence[int] | None = (0,),
    reference: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A scored inference record, or a failed one when `failed` names the stage."""
    persona, instance_type = key.split("/")
    record: dict[str, Any] = {
        "key": key,
        "persona_id": persona,
        "instance_type": instance_type,
        "task": "inference",
        "setting": setting,
        "n_sessions": 8,
        "gt_preference": f"true preference of {key}",
        "gt_checklist": [],
        "candidate_answer": "...",
        "inferred_preference": f"inferred preference of {key}",
    }
    if relevant is not None:
        record["relevant_sessions"] = list(relevant)
    if failed:
        record.update(
            status="failed", error={"stage": failed, "reason": "parse_error", "detail": "no header", "raw": "..."}
        )
    else:
        record.update(scoring(infer_to_gt, gt_to_infer))
    if reference is not None:
        record["reference"] = reference
    return record


def generation(key: str, score: int | None, *, setting: str = "standard") -> dict[str, Any]:
    persona, instance_type = key.split("/")
    record = {
        "key": key,
        "persona_id": persona,
        "instance_type": instance_type,
        "task": "generation",
        "setting": setting,
    }
    if score is None:
        return {
            **record,
            "status": "failed",
            "error": {"stage": "judge", "reason": "parse_error", "detail": "no score", "raw": "?"},
        }
    return {
        **record,
        "status": "scored",
        "error": None,
        "candidate_answer": "...",
        "judge_answer": "...",
        "score": score,
    }


def write_run(path: Path, records: list[dict[str, Any]], roles: dict[str, str], data: str = "sample") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps({"data": data, "roles": roles, "prompts": {}}))
    (path / "instances.jsonl").write_text("".join(UnitRecord.model_validate(r).to_json() + "\n" for r in records))
    return path
