"""Reading model answers tolerantly and checking them strictly.

Small models wrap answers in markdown, quotes, labels and chatter, and stop mid-sentence at the token
cap; the readers here strip all that. What is left must then pass the checks of its step, or the
step raises `Unusable` with a reason that the retry prompt quotes back to the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence


class Unusable(ValueError):
    """An answer that cannot be used; the message says why, in words a model can act on."""


_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")
_MARKUP = re.compile(r"^[\s>#*_`-]*(?:\d+[.)]\s*)?[\s*_`]*")
STOPWORDS = frozenset(
    "a an the and or of for to in on at by with from about as is are be this "  # noqa: SIM905 (words, not a list)
    "that these those my our your their his her its new".split()
)
YES_NO_STARTS = frozenset(
    "is are does do did has have can could will would should "  # noqa: SIM905 (words, not a list)
    "was were am may might must shall".split()
)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def normalized(text: str) -> str:
    return " ".join(words(text))


def strip_markup(line: str) -> str:
    """A line without leading bullets, numbering, heading marks and emphasis."""
    return _MARKUP.sub("", line).replace("**", "").replace("__", "").strip()


def unquote(text: str) -> str:
    text = text.strip()
    while len(text) >= 2 and text[0] in "\"'“‘" and text[-1] in "\"'”’":
        text = text[1:-1].strip()
    return text.lstrip('"“').rstrip('"”') if text.count('"') == 1 else text


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def complete_sentences(text: str) -> str:
    """The text without a last sentence cut off by the token cap (unless nothing else is left)."""
    parts = sentences(text)
    if len(parts) > 1 and not parts[-1].rstrip("\"')]").endswith((".", "!", "?")):
        parts = parts[:-1]
    return " ".join(parts)


def labelled(answer: str, labels: Sequence[str]) -> dict[str, str]:
    """Values of `Label: value` lines, for the given labels (case-insensitive, markdown tolerated).

    A value runs on over following lines until the next labelled line; the first occurrence of a
    label wins (small models often repeat the whole block).
    """
    wanted = {label.lower(): label for label in labels}
    pattern = re.compile(
        r"^(" + "|".join(re.escape(label) for label in wanted) + r")\s*(?:name)?\s*[:=\-–]\s*(.*)$", re.IGNORECASE
    )
    values: dict[str, list[str]] = {}
    current: str | None = None
    for line in answer.splitlines():
        stripped = strip_markup(line)
        m = pattern.match(stripped)
        if m:
            label = wanted[m.group(1).lower()]
            current = None if label in values else label
            if current:
                values[current] = [m.group(2)]
        elif current and stripped:
            values[current].append(stripped)
        elif not stripped:
            current = None
    return {label: unquote(" ".join(parts).strip()) for label, parts in values.items() if " ".join(parts).strip()}


def require_fields(answer: str, labels: Sequence[str]) -> dict[str, str]:
    found = labelled(answer, labels)
    missing = [label for label in labels if not found.get(label)]
    if missing:
        raise Unusable(
            f"the answer has no {' and no '.join(repr(m + ':') for m in missing)} line; "
            f"write exactly the lines {', '.join(label + ':' for label in labels)}"
        )
    for label, value in found.items():
        if "<" in value and ">" in value:
            raise Unusable(f"the {label} line still holds a placeholder in angle brackets")
    return found


def free_text(answer: str, prefixes: Sequence[str] = ()) -> str:
    """The answer as plain text: no label prefix such as `Request:`, no chatter line ending in a colon."""
    lines = [line.strip() for line in answer.strip().splitlines()]
    while lines and (not lines[0] or (lines[0].endswith(":") and len(lines) > 1)):
        lines.pop(0)
    text = "\n".join(lines).strip()
    for prefix in prefixes:
        m = re.match(r"^[\s*_#]*(?:the\s+)?" + re.escape(prefix) + r"[\s*_]*[:\-–][\s*_]*", text, flags=re.IGNORECASE)
        if m:
            text = text[m.end() :]
            break
    return unquote(text.strip())


def echoes(text: str, source: str, share: float = 0.6) -> bool:
    """Whether most of `text`'s word trigrams already occur in `source` (a model copying its prompt)."""
    tw, sw = words(text), words(source)
    if len(tw) < 3:  # too short to tell a copy from an answer ("Yes.")
        return False
    grams = {tuple(tw[i : i + 3]) for i in range(len(tw) - 2)}
    source_grams = {tuple(sw[i : i + 3]) for i in range(len(sw) - 2)}
    return len(grams & source_grams) / len(grams) >= share


def mentions(text: str, name: str) -> bool:
    """Whether `text` names `name`: one of its content words (possessive or not), or the whole name if it has none."""
    content = [w for w in words(name) if w not in STOPWORDS and len(w) >= 3]
    have = {w.removesuffix("'s") for w in words(text)}
    if content:
        return any(w in have for w in content)
    return normalized(name) in normalized(text)


def json_value(answer: str):
    """The first JSON value in the answer (inside a ```json fence if there is one), or None."""
    fenced = re.search(r"```(?:json)?\s*\n?(.*?)```", answer, flags=re.DOTALL)
    decoder = json.JSONDecoder()
    for text in ([fenced.group(1)] if fenced else []) + [answer]:
        starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
        if starts:
            try:
                return decoder.raw_decode(text, min(starts))[0]
            except json.JSONDecodeError:
                continue
    return None


def questions(answer: str) -> list[str]:
    """Checklist questions: a JSON {"checklist": [...]} if the model wrote one, else the lines ending in '?'."""
    payload = json_value(answer)
    if isinstance(payload, dict) and isinstance(payload.get("checklist"), list):
        return [str(item).strip() for item in payload["checklist"] if str(item).strip()]
    found = []
    for line in answer.splitlines():
        line = unquote(strip_markup(line).rstrip(","))
        if line.endswith("?"):
            found.append(line)
    return found


def yes_no(answer: str) -> bool:
    first = words(answer[:200])
    if first and first[0] in ("yes", "no"):
        return first[0] == "yes"
    first_line = next((line for line in answer.splitlines() if line.strip()), "")
    present = {w for w in words(first_line) if w in ("yes", "no")}
    if len(present) == 1:
        return present.pop() == "yes"
    raise Unusable("the answer is neither yes nor no; answer with the single word yes or no")
