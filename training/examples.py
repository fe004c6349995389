"""The match data's format: one line of `train.jsonl` / `validation.jsonl` (`MatchExample`: TRL's conversational
prompt-completion format plus provenance), what the matcher learns to answer (`completion_text`), and the files'
reading (every line validated) and writing. The labelling writes them; the fine-tune, the export's merge check and the
agreement check read them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cupid.common.config import ConfigError
from cupid.matcher.prompts import LABELS

Direction = Literal["infer_to_gt", "gt_to_infer"]
SPLITS = ("train", "validation")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class Match(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int = Field(ge=1)
    entry: str
    label: Literal[LABELS]  # type: ignore[valid-type]


class MatchExample(BaseModel):
    """One line of `train.jsonl` / `validation.jsonl`: TRL's conversational prompt-completion format
    plus provenance. `prompt` and `completion` are all the trainer reads."""

    model_config = ConfigDict(extra="forbid")

    id: str
    prompt: list[ChatMessage] = Field(min_length=2, max_length=2)
    completion: list[ChatMessage] = Field(min_length=1, max_length=1)
    preference: str
    items: list[str] = Field(min_length=1)
    teacher_labels: list[Match] = Field(min_length=1)
    direction: Direction
    persona_id: str
    instance_key: str
    instance_type: str
    setting: str
    candidate: str
    teacher: str
    teacher_prompt: Literal["prefmatcher", "fewshot"]
    teacher_raw: str | None = Field(description="the teacher's answer as sent back (from the run's record)")

    @model_validator(mode="after")
    def _consistent(self) -> MatchExample:
        roles = [m.role for m in self.prompt] + [m.role for m in self.completion]
        if roles != ["system", "user", "assistant"]:
            raise ValueError(f"messages must be system, user | assistant, got {roles}")
        if [m.entry for m in self.teacher_labels] != self.items:
            raise ValueError("teacher_labels must label `items` in order")
        return self


def completion_text(labels: list[dict[str, Any]]) -> str:
    """What the fine-tuned matcher learns to answer: the prefmatcher dialect's fenced JSON list, one
    object per line (indenting every key would add about a third more tokens to learn and to generate)."""
    rows = [
        json.dumps({"index": m["index"], "entry": m["entry"], "label": m["label"]}, ensure_ascii=False) for m in labels
    ]
    return "```json\n[\n" + ",\n".join(rows) + "\n]\n```"


def prompt_key(messages: list[dict[str, str]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def read_examples(path: str | Path) -> list[MatchExample]:
    """Every line validated; a bad line fails with its file, line number and field."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: match-data file not found (`cupid train label` makes it)")
    examples, problems = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            examples.append(MatchExample.model_validate_json(line))
        except ValidationError as e:
            fields = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'line'}: {err['msg']}" for err in e.errors())
            problems.append(f"{path}:{number}: {fields}")
    if problems:
        shown = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise ConfigError(f"{path}: {len(problems)} invalid match-data line(s)\n  {shown}")
    if not examples:
        raise ConfigError(f"{path}: no match-data examples")
    return examples
