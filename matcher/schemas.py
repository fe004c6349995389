"""Answer-format constraints (structured outputs) for endpoints whose engine enforces them (vLLM).

Each constraint is a regular expression, sent as vLLM's `structured_outputs: {"regex": ...}`, that
admits exactly the form the model was prompted or trained to write, so a constrained answer always
parses and the model keeps its own way of answering:
- the PrefMatcher matcher: its fenced JSON list of `{index, entry, label}`, one per checklist item in
  order (the entries are the items themselves), a JSON Schema could not keep the fence;
- the few-shot matcher: the fenced `{"results": [...]}` its prompt shows (a `reasoning` field allowed);
- the decomposer: its `**Analysis**`, then the fenced `{"checklist": [...]}` of at most 4 entries;
- the summarizer: the fenced `{"summaries": [{session_id, analysis, context, preferences}]}`;
- the judge: its evaluation, a rubric label, and the score that label stands for (1-10);
- the candidate, only where an endpoint asks for it (`constrain_candidate`): inference answers as
  the prompt's `### Analysis` / `### Most Likely Preference` with one line; generation stays free.
- every step of the synthesis pipeline (`training/synth`), from the building blocks here: prose as
  sentences or one paragraph without markup (`sentence`, `sentences`, `paragraph`), labelled lines,
  numbered questions, yes/no; each step's shape is defined beside its prompt.

Every pattern has a finite longest match, so a constrained answer ends by construction. Where an
endpoint caps answers (`max_tokens`), the free text gets what the cap leaves after the format's fixed
parts (a token is at least one character), and a request whose format alone is longer than the cap
asks for that length instead: a constrained answer is never cut off mid-format. Where an endpoint
sets no cap, free text is bounded generously. A regex over JSON is written out here rather than
sent as a JSON Schema because the prompted forms wrap their JSON in a fence and prose, which
`response_format` cannot express.
"""

from __future__ import annotations

import json
import re
import re._parser as sre  # the stdlib's regex parser: the longest match of a pattern
from collections.abc import Callable, Sequence
from typing import Any

from cupid.matcher.parse import MAX_CHECKLIST_ITEMS, PREFERENCE_HEADER, SCORE_HEADER
from cupid.matcher.prompts import LABELS, MatcherDialect

WS = r"[ \t\n]{0,12}"  # JSON whitespace, bounded: indentation of the nested forms the prompts show
BREAK = r"\n{1,2}"
UNBOUNDED_CHARS = 6000  # free text where the endpoint sets no max_tokens

# The judge's rubric (judge prompt): each label stands for one score.
RUBRIC = {
    10: "Exceptional",
    9: "Excellent",
    8: "Very Good",
    7: "Good",
    6: "Above Average",
    5: "Acceptable",
    4: "Below Average",
    3: "Poor",
    2: "Very Poor",
    1: "Unacceptable",
}


def width(pattern: str) -> int:
    """The longest answer `pattern` admits, in characters."""
    return sre.parse(pattern).getwidth()[1]


def constrained(build: Callable[[int], str], max_tokens: int | None, default: int = UNBOUNDED_CHARS) -> dict[str, Any]:
    """The request fields for the pattern `build(chars)`, `chars` being the free text it may hold."""
    if max_tokens is None:
        return {"structured_outputs": {"regex": build(default)}}
    pattern = build(max(16, min(default, max_tokens - width(build(0)))))
    fields: dict[str, Any] = {"structured_outputs": {"regex": pattern}}
    if width(pattern) > max_tokens:
        fields["max_tokens"] = width(pattern)
    return fields


# Escapes only what is special to a regex: `re.escape` also escapes `#`, spaces, `-`, `&` and `~`, which xgrammar's
# regex reader does not know as escapes and warns about on every request (it then matches them as themselves).
_SPECIAL = re.compile(r"([\\.^$*+?{}\[\]|()])")
_CLASS_SPECIAL = re.compile(r"([\\\]^-])")
_CONTROL = {"\n": r"\n", "\t": r"\t", "\r": r"\r"}


def lit(text: str) -> str:
    """A literal text as a pattern."""
    escaped = _SPECIAL.sub(r"\\\1", text)
    return "".join(_CONTROL.get(c, c) for c in escaped)


def free(max_chars: int, forbid: str = "#") -> str:
    """Prose of 1..max_chars characters; `forbid` holds characters that would start the next part."""
    body = "".join(_CONTROL.get(c, c) for c in _CLASS_SPECIAL.sub(r"\\\1", forbid))
    return f"[^{body}]{{1,{max(1, max_chars)}}}"


PLAIN = r"\n#*`"  # (a character class's body) not in prose: a line break (one paragraph), headings, emphasis, code


def sentence(extra: int, least: int = 1, ends: str = ".!?") -> str:
    """One sentence of plain prose: a capital letter, `least` to `least + extra` characters without
    markup or line break, then its end mark (one of `ends`: "." for a statement). It ends at its first
    . ! or ?, so a pattern of n of them admits n sentences exactly (the price: no "Dr." or "3.5" inside one)."""
    return f"[A-Z][^.!?{PLAIN}]{{{least},{least + max(0, extra)}}}[{ends}]"


def sentences(lo: int, hi: int, chars: int, least: int = 1) -> str:
    """lo..hi sentences in one paragraph, a space apart, sharing `chars` characters beyond their minimum."""
    one = sentence(chars // hi, least)
    return one + (f"( {one}){{{lo - 1},{hi - 1}}}" if hi > 1 else "")


def paragraph(chars: int, least: int = 1) -> str:
    """One paragraph of plain prose, however many sentences: a capital letter first, an end mark last."""
    return f"[A-Z][^{PLAIN}]{{{least},{least + max(0, chars)}}}[.!?]"


def jstring(max_chars: int) -> str:
    return r'"([^"\\\n]|\\["\\/nt])' + f"{{1,{max(1, max_chars)}}}" + '"'


def jlist(items: Sequence[str] | str, lo: int = 1, hi: int = 1) -> str:
    """A JSON list: of the given item patterns in order, or of lo..hi items of one pattern."""
    if isinstance(items, str):
        body = f"{items}({WS},{WS}{items}){{0,{hi - 1}}}"
        body = f"({body})?" if lo == 0 else body
    else:
        body = f"{WS},{WS}".join(items)
    return rf"\[{WS}{body}{WS}\]"


def jobject(fields: Sequence[tuple[str, str]], optional: Sequence[tuple[str, str]] = ()) -> str:
    """A JSON object with `fields` in this order; each of `optional` may come before the last field (the
    few-shot matcher's `reasoning`, between the entry and its label)."""
    parts = [f"{lit(json.dumps(key))}{WS}:{WS}{value}" for key, value in fields]
    extra = "".join(f"({WS},{WS}{lit(json.dumps(key))}{WS}:{WS}{value})?" for key, value in optional)
    body = f"{WS},{WS}".join(parts[:-1]) + extra + (f"{WS},{WS}" if len(parts) > 1 else "") + parts[-1]
    return rf"\{{{WS}{body}{WS}\}}"


def fenced(json_pattern: str) -> str:
    return rf"```json{WS}{json_pattern}{WS}```"


def _label() -> str:
    return "(" + "|".join(lit(json.dumps(label)) for label in LABELS) + ")"


def _labelled(i: int, item: str) -> list[tuple[str, str]]:
    return [("index", str(i)), ("entry", lit(json.dumps(item, ensure_ascii=False))), ("label", _label())]


def matcher(dialect: MatcherDialect, items: Sequence[str], max_tokens: int | None = None) -> dict[str, Any]:
    """One label per checklist item, in order, with the item's own index and text."""
    if dialect == "prefmatcher":
        rows = [jobject(_labelled(i, item)) for i, item in enumerate(items, start=1)]
        return constrained(lambda chars: fenced(jlist(rows)), max_tokens)

    def fewshot(chars: int) -> str:
        reasoning = [("reasoning", jstring(min(1500, chars // max(1, len(items)))))]
        rows = [jobject(_labelled(i, item), optional=reasoning) for i, item in enumerate(items, start=1)]
        return fenced(jobject([("results", jlist(rows))]))

    return constrained(fewshot, max_tokens)


def decomposer(max_tokens: int | None) -> dict[str, Any]:
    def build(chars: int) -> str:  # a third for the analysis, the rest for the entries
        entry = jstring(min(300, chars * 2 // 3 // MAX_CHECKLIST_ITEMS))
        checklist = jobject([("checklist", jlist(entry, 0, MAX_CHECKLIST_ITEMS))])
        return (
            rf"\*\*Analysis\*\*{BREAK}{free(chars // 3, forbid='*#`')}{BREAK}"
            rf"\*\*Checklist\*\*{BREAK}{fenced(checklist)}"
        )

    return constrained(build, max_tokens, default=4200)


def summarizer(max_tokens: int | None) -> dict[str, Any]:
    def build(chars: int) -> str:  # a third each: analysis, context, preferences (up to 6 entries each)
        entries = jlist(jstring(min(500, chars // 3 // 6)), 1, 6)
        fields = [
            ("session_id", r"[0-9]{1,3}"),
            ("analysis", jstring(chars // 3)),
            ("context", entries),
            ("preferences", entries),
        ]
        return fenced(jobject([("summaries", jlist([jobject(fields)]))]))

    return constrained(build, max_tokens)


def judge(max_tokens: int | None) -> dict[str, Any]:
    verdicts = "|".join(f"{lit(label)}{BREAK}{lit(SCORE_HEADER)}{BREAK}{score}" for score, label in RUBRIC.items())
    return constrained(
        lambda chars: (
            rf"### Evaluation of AI Assistant's Response{BREAK}{free(chars)}{BREAK}"
            rf"### Evaluation Label{BREAK}({verdicts})"
        ),
        max_tokens,
    )


def inference_answer(max_tokens: int | None) -> dict[str, Any]:
    """The candidate's inference answer: its analysis, then the header and one line (30 words, ~300 characters)."""
    return constrained(
        lambda chars: (
            rf"### Analysis{BREAK}{free(chars * 2 // 3)}{BREAK}{lit(PREFERENCE_HEADER)}{BREAK}"
            rf"[^#\n]{{1,{max(1, min(300, chars // 3))}}}"
        ),
        max_tokens,
    )
