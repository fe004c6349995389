"""Reading model answers: the inferred preference, the decomposer's checklist, the matcher's labels.

Every parser either returns a well-formed value or raises `ParseError` carrying the raw answer, so
that a bad answer is recorded as a failure with its reason and never scored as a zero.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cupid.matcher.prompts import LABELS

MAX_CHECKLIST_ITEMS = 4
PREFERENCE_HEADER = "### Most Likely Preference"


class ParseError(ValueError):
    def __init__(self, message: str, raw: str):
        super().__init__(message)
        self.message = message
        self.raw = raw


@dataclass(frozen=True)
class MatchItem:
    """One checklist item as the matcher labelled it against a preference (a record keeps these as they are)."""

    index: int
    entry: str
    label: str


def preference(answer: str) -> str:
    """The first non-empty line after the header, as the reference reads it."""
    if PREFERENCE_HEADER not in answer:
        raise ParseError(f"no '{PREFERENCE_HEADER}' header in the answer", answer)
    tail = answer.split(PREFERENCE_HEADER, 1)[1]
    for line in tail.splitlines():
        if line.strip():
            return line.strip()
    raise ParseError(f"nothing after '{PREFERENCE_HEADER}'", answer)


def _json_payload(answer: str) -> Any:
    """JSON inside a ```json fence if there is one, else the first JSON value in the text.

    Either way, prose before or after the JSON is tolerated.
    """
    fenced = re.search(r"```(?:json)?\s*\n?(.*?)```", answer, flags=re.DOTALL)
    candidates = [fenced.group(1)] if fenced else []
    candidates.append(answer)
    decoder = json.JSONDecoder()
    for text in candidates:
        starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
        if not starts:
            continue
        try:
            value, _ = decoder.raw_decode(text, min(starts))
            return value
        except json.JSONDecodeError:
            continue
    raise ParseError("no valid JSON in the answer", answer)


def checklist(answer: str) -> list[str]:
    payload = _json_payload(answer)
    if not isinstance(payload, dict) or not isinstance(payload.get("checklist"), list):
        raise ParseError('expected a JSON object {"checklist": [...]}', answer)
    items = payload["checklist"]
    if not all(isinstance(item, str) and item.strip() for item in items):
        raise ParseError("checklist items must be non-empty strings", answer)
    if len(items) > MAX_CHECKLIST_ITEMS:
        raise ParseError(f"checklist has {len(items)} items, at most {MAX_CHECKLIST_ITEMS} allowed", answer)
    return [item.strip() for item in items]


_LABEL_KEYS = {re.sub(r"\s+", "", label.lower()): label for label in LABELS}


def label(text: Any, raw: str) -> str:
    key = re.sub(r"\s+", "", str(text).lower())
    if key not in _LABEL_KEYS:
        raise ParseError(f"label {text!r} is not one of {', '.join(LABELS)}", raw)
    return _LABEL_KEYS[key]


def matches(answer: str, items: Sequence[str]) -> list[MatchItem]:
    """Labels for `items`, in order, from either dialect: `{"results": [...]}` or a bare list.

    The answer must label every item exactly once; entries are keyed by their 1-based `index`
    (falling back to position when the model omits it).
    """
    payload = _json_payload(answer)
    if isinstance(payload, dict) and isinstance(payload.get("results"), list):
        payload = payload["results"]
    if not isinstance(payload, list) or not all(isinstance(r, dict) for r in payload):
        raise ParseError('expected a list of {index, entry, label} or {"results": [...]}', answer)
    if len(payload) != len(items):
        raise ParseError(f"expected {len(items)} labels, got {len(payload)}", answer)
    by_index: dict[int, str] = {}
    for position, result in enumerate(payload, start=1):
        if "label" not in result:
            raise ParseError(f"result {position} has no label", answer)
        try:
            index = int(result.get("index", position))
        except (TypeError, ValueError):
            raise ParseError(f"result {position} has a non-integer index {result.get('index')!r}", answer) from None
        if not 1 <= index <= len(items) or index in by_index:
            raise ParseError(f"result {position} has index {index}: out of range or repeated", answer)
        by_index[index] = label(result["label"], answer)
    return [MatchItem(i, items[i - 1], by_index[i]) for i in range(1, len(items) + 1)]


SCORE_HEADER = "### Evaluation Score"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def score(answer: str) -> float:
    """The judge's 1-10 score: the first number after the last `### Evaluation Score` header.

    Accepts `8`, `8/10`, `**8**`, `8.0`, `Score: 8`. Anything else, or a value outside 1-10, is a
    parse failure: the reference turned such answers into a score of 0 and averaged it in.
    """
    if SCORE_HEADER not in answer:
        raise ParseError(f"no '{SCORE_HEADER}' header in the answer", answer)
    tail = answer.rsplit(SCORE_HEADER, 1)[1]
    found = _NUMBER.search(tail)
    if found is None:
        raise ParseError(f"no number after '{SCORE_HEADER}'", answer)
    value = float(found.group())
    if not 1 <= value <= 10:
        raise ParseError(f"score {found.group()} is outside 1-10", answer)
    return int(value) if value.is_integer() else value


def session_summary(answer: str) -> dict[str, list[str]]:
    """The summarizer's answer for one session: its `context` and `preferences` bullet lists."""
    payload = _json_payload(answer)
    summaries = payload.get("summaries") if isinstance(payload, dict) else None
    if not isinstance(summaries, list) or not summaries or not isinstance(summaries[0], dict):
        raise ParseError('expected a JSON object {"summaries": [{...}]}', answer)
    first = summaries[0]
    out = {}
    for field in ("context", "preferences"):
        items = first.get(field)
        if not isinstance(items, list) or not items or not all(isinstance(i, str) and i.strip() for i in items):
            raise ParseError(f"summary field '{field}' must be a non-empty list of strings", answer)
        out[field] = [i.strip() for i in items]
    return out
