"""The CUPID prompt texts and how they are filled in.

The texts live as data files beside this module (see prompts/NOTICE): results are only comparable
to the paper, and PrefMatcher only behaves as trained, when they are sent byte-for-byte.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

Messages = list[dict[str, str]]
MatcherDialect = Literal["prefmatcher", "fewshot"]

_DIR = resources.files(__package__) / "prompts"


@dataclass(frozen=True)
class Prompt:
    name: str
    system: str
    user: str

    def render(self, **fields: str) -> Messages:
        """Both texts are `str.format` templates; a system text without fields still has `{{`/`}}`."""
        return [
            {"role": "system", "content": self.system.format(**fields)},
            {"role": "user", "content": self.user.format(**fields)},
        ]

    @property
    def version(self) -> str:
        """Short content hash, recorded with every run so that results name the exact texts used."""
        return hashlib.sha256((self.system + "\0" + self.user).encode()).hexdigest()[:12]


@cache
def load(name: str) -> Prompt:
    system = (_DIR / f"{name}.system.txt").read_text(encoding="utf-8")
    user_file = _DIR / f"{name}.user.txt"
    user = user_file.read_text(encoding="utf-8") if user_file.is_file() else ""
    return Prompt(name, system, user)


def format_interaction_log(sessions: Sequence[dict]) -> str:
    """The reference's rendering of prior sessions: `### Session i`, `#### User` / `#### AI Assistant`."""
    out = []
    for i, session in enumerate(sessions, start=1):
        out.append(f"### Session {i}\n\n")
        for message in session["dialogue"]:
            role = "User" if message["role"] == "user" else "AI Assistant"
            out.append(f"#### {role}\n\n{message['content']}\n\n")
        out.append("---\n\n")
    return "".join(out).strip()


def numbered(items: Sequence[str]) -> str:
    return "\n".join(f"{i}. {item}" for i, item in enumerate(items, start=1))


LABELS = ("Fully Covered", "Partially Covered", "Not Covered")


@cache
def fewshot_examples() -> str:
    """The 8 human-labelled matcher examples, rendered exactly as the spec (and the reference) does."""
    examples = json.loads((_DIR / "matcher_fewshot.examples.json").read_text(encoding="utf-8"))
    block = ""
    for example in examples:
        results = {
            "results": [
                {"index": i, "entry": item["entry"], "label": item["label"]}
                for i, item in enumerate(example["checklist"], start=1)
            ]
        }
        block += f"#### Preference\n\n{example['preference']}\n\n#### Output\n\n```json\n"
        block += json.dumps(results, indent=2)
        block += "\n```\n\n---\n\n"
    return block.strip()


def format_summary_log(summaries: Sequence[dict]) -> str:
    """The summary setting's stand-in for the log: one block per session, laid out like the log itself.

    The spec says only that the summaries replace the log; this layout (`### Session i`, then
    `#### Context` and `#### Preferences` bullet lists) is this project's choice.
    """
    out = []
    for i, summary in enumerate(summaries, start=1):
        out.append(f"### Session {i}\n\n")
        for title, field in (("Context", "context"), ("Preferences", "preferences")):
            bullets = "\n".join(f"- {item}" for item in summary[field])
            out.append(f"#### {title}\n\n{bullets}\n\n")
        out.append("---\n\n")
    return "".join(out).strip()


def bulleted(items: Sequence[str]) -> str:
    return "\n".join(f"- {item}" for item in items)


def inference(interaction_log: str, request: str) -> Messages:
    return load("inference").render(interaction_log=interaction_log, curr_request=request)


def generation(interaction_log: str, request: str) -> Messages:
    return load("generation").render(interaction_log=interaction_log, curr_request=request)


ORACLE_PREFERENCE = "project_generation_oracle_preference"


def generation_with_preference(preference: str, request: str) -> Messages:
    """The oracle-preference setting: this project's variant of `generation` (the paper gives no text)."""
    return load(ORACLE_PREFERENCE).render(preference=preference, curr_request=request)


def summarizer(session: dict) -> Messages:
    """One session at a time, so each summary is one cached request shared by every instance that shows it."""
    return load("summarizer").render(interaction_log=format_interaction_log([session]))


def judge(preference: str, checklist: Sequence[str], request: str, response: str) -> Messages:
    return load("judge").render(
        preference=preference, checklist=bulleted(checklist), user_request=request, ai_response=response
    )


def decomposer(preference: str) -> Messages:
    return load("decomposer").render(preferences=preference)


def matcher(preference: str, checklist: Sequence[str], dialect: MatcherDialect) -> Messages:
    if dialect == "prefmatcher":
        return load("prefmatcher").render(preference=preference, checklist=numbered(checklist))
    return load("matcher_fewshot").render(
        examples=fewshot_examples(), preference=preference, checklist=numbered(checklist)
    )


def matcher_dialect_for(model: str) -> MatcherDialect:
    """The reference picks the fine-tuned format by model name; an endpoint may override it."""
    return "prefmatcher" if "prefmatcher" in model.lower() else "fewshot"


def versions(*names: str) -> dict[str, str]:
    return {name: load(name).version for name in names}
