"""JSON schemas for structured output (`response_format`), for endpoints that enforce them.

They describe the shapes the parsers read, so a constrained answer always parses; they are only
sent to endpoints configured with `structured_output: true`.
"""

from __future__ import annotations

from typing import Any

from matcher.parse import MAX_CHECKLIST_ITEMS
from matcher.prompts import LABELS, MatcherDialect

_MATCH = {
    "type": "object",
    "properties": {
        "index": {"type": "integer"},
        "entry": {"type": "string"},
        "label": {"type": "string", "enum": list(LABELS)},
    },
    "required": ["index", "entry", "label"],
}


def _format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def decomposer() -> dict[str, Any]:
    return _format(
        "checklist",
        {
            "type": "object",
            "properties": {"checklist": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_CHECKLIST_ITEMS}},
            "required": ["checklist"],
        },
    )


def matcher(dialect: MatcherDialect, n_items: int) -> dict[str, Any]:
    items = {"type": "array", "items": _MATCH, "minItems": n_items, "maxItems": n_items}
    if dialect == "prefmatcher":
        return _format("matches", items)
    return _format("matches", {"type": "object", "properties": {"results": items}, "required": ["results"]})
