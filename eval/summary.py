"""Aggregation of finished instance records into `summary.json` and the table people read.

Only scored instances enter the averages; failed ones are counted by stage and reason, and every
block states how many instances it covers.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from eval.data import INSTANCE_TYPES
from matcher.scores import MatchCounts, PRF, macro, micro


def _prf(value: PRF | None) -> dict[str, float] | None:
    return value.as_dict() if value is not None else None


def _block(records: list[dict[str, Any]]) -> dict[str, Any]:
    scored = [r for r in records if r["status"] == "scored"]
    counts = [MatchCounts(**r["counts"]) for r in scored]
    return {
        "micro": _prf(micro(counts)),
        "macro": _prf(macro(counts)),
        "n_scored": len(scored),
        "n_failed": len(records) - len(scored),
    }


def inference_block(records: list[dict[str, Any]]) -> dict[str, Any]:
    block = _block(records)
    block["by_type"] = {t: _block([r for r in records if r["instance_type"] == t]) for t in INSTANCE_TYPES}
    return block


def failures(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Failed instances counted by `stage: reason`."""
    return dict(Counter(f"{r['error']['stage']}: {r['error']['reason']}" for r in records if r["status"] == "failed"))


def summarize(records: list[dict[str, Any]], settings: list[str], n_instances: int, meta: dict[str, Any]) -> dict[str, Any]:
    """`inference.{micro,macro,by_type}` are for the first setting; `inference.settings` holds each one."""
    by_setting = {s: inference_block([r for r in records if r["setting"] == s]) for s in settings}
    inference = {**by_setting[settings[0]], "setting": settings[0], "settings": by_setting}
    n_failed = sum(1 for r in records if r["status"] == "failed")
    return {
        "inference": inference,
        "n_instances": n_instances,
        "n_runs": len(records),
        "n_scored": len(records) - n_failed,
        "n_failed": n_failed,
        "failures": failures(records),
        **meta,
    }


def _pct(value: dict[str, float] | None, name: str) -> str:
    return f"{100 * value[name]:.1f}" if value else "-"


def table_rows(summary: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """(setting, group, cells) rows of the inference table: P/R/F1 micro, P/R/F1 macro, scored, failed."""
    rows = []
    for setting, block in summary["inference"]["settings"].items():
        groups = [("all", block)] + [(t, block["by_type"][t]) for t in INSTANCE_TYPES]
        for group, b in groups:
            cells = [_pct(b["micro"], k) for k in ("precision", "recall", "f1")]
            cells += [_pct(b["macro"], k) for k in ("precision", "recall", "f1")]
            cells += [str(b["n_scored"]), str(b["n_failed"])]
            rows.append((setting, group, cells))
    return rows


HEADERS = ["setting", "instances", "P micro", "R micro", "F1 micro", "P macro", "R macro", "F1 macro", "scored", "failed"]


def markdown(summary: dict[str, Any]) -> str:
    roles = summary.get("roles", {})
    lines = [
        "# CUPID inference task: preference match (%)",
        "",
        f"Candidate: `{roles.get('candidate', '?')}`; decomposer: `{roles.get('decomposer', '?')}`; "
        f"matcher: `{roles.get('matcher', '?')}` ({summary.get('matcher_prompt', '?')} prompt). "
        "Micro = sums over instances (reference code, published numbers); macro = mean of per-instance scores (paper text).",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    for setting, group, cells in table_rows(summary):
        lines.append("| " + " | ".join([setting, group, *cells]) + " |")
    lines += ["", f"{summary['n_scored']} scored, {summary['n_failed']} failed of {summary['n_runs']} instance runs."]
    if summary.get("n_invalid_rows"):
        lines.append(f"{summary['n_invalid_rows']} data rows were invalid and not run (see summary.json).")
    for what, n in summary["failures"].items():
        lines.append(f"- failed at {what}: {n}")
    return "\n".join(lines) + "\n"
